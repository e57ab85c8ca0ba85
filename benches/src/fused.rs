//! A user's fused kernels (`examples/fused-dequant-softmax`): softmax and RMSNorm of
//! dequantized int8 logits (a scale per row, a bf16 bias per column) written as bf16 in one
//! kernel, against the unfused chains (a dequantize kernel writing bf16, then rill's softmax
//! or RMSNorm).
//!
//! Bytes moved: a fused kernel reads the int8 logits and writes bf16 (3 bytes an element);
//! a chain also writes and re-reads the bf16 logits (7). Each is reported over
//! its own bytes, against the copy of the bf16 output in the same run; the path column
//! gives the fused kernel's speed-up over the chain. The chain's dequantize kernel is also
//! timed alone: it moves the fused kernel's bytes with no softmax, so it shows what that
//! mix of reads and writes reaches.

use crate::measure::Bench;
use half::bf16;
use rill::Tensor;
use rill::norm::{Forward, Norm, NormKind, NormParts};
use rill_example_fused_dequant_softmax::DequantKernels;
use rill_tests::random::Rng;

const SHAPES: &[(usize, usize)] = &[(4096, 32000), (4096, 4096), (32768, 1024)];

pub fn sweep(bench: &mut Bench) -> rill::Result<()> {
    let ops = [
        "fused_dequant_softmax",
        "dequantize_then_softmax",
        "fused_dequant_rms_norm",
        "dequantize_then_rms_norm",
        "dequantize",
    ];
    if !ops.iter().any(|op| bench.wants("fused", op)) || bench.quick {
        return Ok(());
    }
    bench.plan(SHAPES.len() * 7);
    let kernels = DequantKernels::load(&bench.gpu)?;
    for &(rows, cols) in SHAPES {
        let len = rows * cols;
        let sets = bench.buffer_sets(len * (1 + 2 + 2));
        let mut rng = Rng::new(len as u64);
        let q: Vec<i8> = (0..len).map(|_| (rng.next_u64() % 256) as u8 as i8).collect();
        let scale: Vec<f32> = (0..rows).map(|_| rng.uniform(0.005, 0.05) as f32).collect();
        let bias: Vec<bf16> = (0..cols).map(|_| bf16::from_f32(rng.uniform(-1.0, 1.0) as f32)).collect();
        let qs = bench.upload(sets, &q, &[rows, cols])?;
        let (scale, bias) =
            (Tensor::from_slice(&bench.gpu, &scale, &[rows])?, Tensor::from_slice(&bench.gpu, &bias, &[cols])?);
        let (mut dequantized, mut outs) =
            (bench.zeros::<bf16>(sets, &[rows, cols])?, bench.zeros::<bf16>(sets, &[rows, cols])?);
        let copy = bench.copy(&dequantized, &mut outs)?;
        let shape = [rows, cols];
        let fused_bytes = 3 * len;
        let (fused, plan) =
            bench.time(sets, fused_bytes, |s, i| kernels.dequant_softmax(s, &qs[i], &scale, &bias, &mut outs[i]))?;
        let uncached = DequantKernels::load(&bench.gpu)?.forced(rill::softmax::PathKind::Uncached);
        let (reread, _) =
            bench.time(sets, fused_bytes, |s, i| uncached.dequant_softmax(s, &qs[i], &scale, &bias, &mut outs[i]))?;
        bench.record::<bf16>("fused_dequant_softmax_uncached", &shape, "uncached", fused_bytes, reread, Some(copy));
        // The chain's first kernel alone moves the fused kernel's bytes with no softmax: the
        // reference for what this mix of reads and writes (1 byte in, 2 out) reaches.
        let (alone, _) = bench
            .time(sets, fused_bytes, |s, i| kernels.dequantize(s, (&qs[i], &scale, &bias), &mut dequantized[i]))?;
        bench.record::<bf16>("dequantize", &shape, "the chain's first kernel alone", fused_bytes, alone, Some(copy));
        let chain_bytes = 7 * len;
        let (chain, _) = bench.time(sets, chain_bytes, |s, i| {
            kernels.dequantize_then_softmax(s, (&qs[i], &scale, &bias), &mut dequantized[i], &mut outs[i])
        })?;
        let speedup = format!("{}; {:.2}x the chain", plan.describe(), chain / fused);
        bench.record::<bf16>(ops[0], &shape, &speedup, fused_bytes, fused, Some(copy));
        bench.record::<bf16>(ops[1], &shape, "dequantize, then softmax", chain_bytes, chain, Some(copy));

        let weight = Tensor::from_slice(&bench.gpu, &vec![1.0f32; cols], &[cols])?;
        let (norm, plan) = bench.time(sets, fused_bytes, |s, i| {
            let parts = NormParts::new().weight(&weight);
            kernels.dequant_norm(s, NormKind::RmsNorm, (&qs[i], &scale, &bias), parts, &mut outs[i])
        })?;
        let (chain, _) = bench.time(sets, chain_bytes, |s, i| {
            kernels.dequantize(s, (&qs[i], &scale, &bias), &mut dequantized[i])?;
            let call = Forward::new(&dequantized[i], &mut outs[i]).weight(&weight);
            Norm::new().forward(s, NormKind::RmsNorm, 1e-5, call)
        })?;
        let speedup = format!("{}; {:.2}x the chain", plan.describe(), chain / norm);
        bench.record::<bf16>(ops[2], &shape, &speedup, fused_bytes, norm, Some(copy));
        bench.record::<bf16>(ops[3], &shape, "dequantize, then rms_norm", chain_bytes, chain, Some(copy));
    }
    Ok(())
}
