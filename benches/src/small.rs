//! The small-shape regime, where inference lives: a few rows per call. Each row reports the
//! device time of one launch (events, as every other row) and two host times per call:
//! - "wall": the wall time of 10,000 back-to-back calls of the same shape, over their count
//!   (the stream synced once, at the end): what a chain of small launches pays, the larger
//!   of the host's cost and the GPU's;
//! - "submit": the host's own cost, the time to queue [`SUBMITTED`] calls on an idle stream
//!   (fewer than the driver's queue holds, so none waits for the GPU).

use crate::measure::Bench;
use half::bf16;
use rill::norm::{Forward, Norm, NormKind};
use rill::{LaunchConfig, Tensor, elementwise, softmax};
use rill_example_fused_dequant_softmax::{DequantKernels, Dequantize};
use rill_tests::random::Rng;
use std::ptr::null_mut;
use std::time::Instant;

/// Calls whose wall time gives the wall time per call.
const CALLS: usize = 10_000;

/// Calls whose queueing time gives the host's cost per call.
const SUBMITTED: usize = 256;

/// Decode blocks whose wall time gives the time per block.
const BLOCKS: usize = 1000;

/// The row ops at `rows x cols` (bf16), and a user's fused kernel through the same planner
/// (the example's softmax of dequantized int8 logits).
const ROW_OPS: &[&str] = &["rms_norm", "layer_norm", "softmax", "cross_entropy", "fused_dequant_softmax"];
const ROWS: &[usize] = &[1, 8, 64];
const COLS: &[usize] = &[4096, 8192];

/// Elementwise lengths: 2^12 to 2^20.
const ELEMENTWISE_LOG2: std::ops::RangeInclusive<u32> = 12..=20;

pub fn sweep(bench: &mut Bench) -> rill::Result<()> {
    if !(bench.wants("small", "small") && !bench.quick) {
        return Ok(());
    }
    bench.plan((ROW_OPS.len() + 1) * ROWS.len() * COLS.len() + 2 * ELEMENTWISE_LOG2.count() + 6);
    let mut rng = Rng::new(7);
    let fused = DequantKernels::load(&bench.gpu)?;
    for &cols in COLS {
        for &rows in ROWS {
            let shape = [rows, cols];
            let host: Vec<bf16> = (0..rows * cols).map(|_| bf16::from_f64(rng.uniform(-4.0, 4.0))).collect();
            let (xs, mut ys) = (bench.upload(1, &host, &shape)?, bench.zeros::<bf16>(1, &shape)?);
            let copy = bench.copy(&xs, &mut ys)?;
            let (x, y) = (&xs[0], &mut ys[0]);
            let weight = Tensor::from_slice(&bench.gpu, &vec![1.0f32; cols], &[cols])?;
            let target: Vec<i64> = (0..rows).map(|r| (r * 7919 % cols) as i64).collect();
            let target = Tensor::from_slice(&bench.gpu, &target, &[rows])?;
            let mut loss = Tensor::<f32>::zeros(&bench.gpu, &[rows])?;
            let q: Vec<i8> = (0..rows * cols).map(|_| (rng.next_u64() % 256) as u8 as i8).collect();
            let q = Tensor::from_slice(&bench.gpu, &q, &shape)?;
            let scale = Tensor::from_slice(&bench.gpu, &vec![0.02f32; rows], &[rows])?;
            let bias = Tensor::from_slice(&bench.gpu, &vec![bf16::ZERO; cols], &[cols])?;
            for &op in ROW_OPS {
                let bytes = match op {
                    "cross_entropy" => rows * cols * 2 + rows * 12,
                    "fused_dequant_softmax" => rows * cols * 3,
                    _ => 2 * rows * cols * 2,
                };
                let mut call = |s: &rill::Stream| -> rill::Result<()> {
                    match op {
                        "rms_norm" | "layer_norm" => {
                            let kind = if op == "rms_norm" { NormKind::RmsNorm } else { NormKind::LayerNorm };
                            Norm::new().forward(s, kind, 1e-5, Forward::new(x, y).weight(&weight)).map(drop)
                        }
                        "softmax" => softmax::softmax(s, x, y).map(drop),
                        "fused_dequant_softmax" => fused.dequant_softmax(s, &q, &scale, &bias, y).map(drop),
                        _ => softmax::cross_entropy(s, x, &target, &mut loss).map(drop),
                    }
                };
                record(bench, &format!("small_{op}"), &shape, bytes, copy, &mut call)?;
            }
            // Where a row op's host time goes beyond the launch: everything but the launch
            // (the checks, the kernel lookups, the plan), at the smallest shape.
            if (rows, cols) == (ROWS[0], COLS[0]) {
                let mut plans = |s: &rill::Stream| -> rill::Result<()> {
                    let call = Forward::new(x, y).weight(&weight);
                    Norm::new().plan_only().forward(s, NormKind::RmsNorm, 1e-5, call)?;
                    softmax::Softmax::new().plan_only().forward(s, x, y, false).map(drop)
                };
                record(bench, "small_rms_norm_and_softmax_plan_only", &shape, 0, copy, &mut plans)?;
            }
        }
    }
    // The floor under every op: one launch of a kernel that does nothing (the example's
    // dequantize over no rows), through rill's thinnest path (a looked-up kernel, the
    // context made current, the driver's launch), no planner and no checks.
    let nothing = Dequantize::default();
    let config = LaunchConfig { grid: 1, block: 32, shared_bytes: 0, cluster: 1 };
    // SAFETY: the kernel takes `Dequantize` and, over no rows, reads and writes nothing.
    let mut launch = |s: &rill::Stream| unsafe { fused.module().launch(s, "dequantize", config, &nothing) };
    let (xs, mut ys) = (bench.upload(1, &[bf16::ZERO; 32], &[32])?, bench.zeros::<bf16>(1, &[32])?);
    let copy = bench.copy(&xs, &mut ys)?;
    record(bench, "small_empty_launch", &[0], 0, copy, &mut launch)?;
    // The same kernel launched by the driver alone: `cuLaunchKernel` on a handle looked up
    // once, the context left current by the calls above. What rill's thinnest path adds is
    // the difference.
    use cudarc::driver::sys::{self, CUresult};
    let checked = |call, code: CUresult| match code {
        CUresult::CUDA_SUCCESS => Ok(()),
        _ => Err(rill::Error::Driver { call, code: code as u32, message: format!("{code:?}") }),
    };
    let ptx = std::ffi::CString::new(rill_example_fused_dequant_softmax::PTX).expect("PTX holds no NUL");
    let (mut module, mut function) = (null_mut(), null_mut());
    // SAFETY: NUL-terminated PTX and name; each call writes one handle (in rill's context,
    // current after the calls above).
    unsafe {
        checked("cuModuleLoadData", sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()))?;
        checked("cuModuleGetFunction", sys::cuModuleGetFunction(&mut function, module, c"dequantize".as_ptr()))?;
    }
    let mut driver = |s: &rill::Stream| {
        let mut params = [&nothing as *const Dequantize as *mut std::ffi::c_void];
        // SAFETY: the handle is the loaded module's, the kernel takes `Dequantize` by value,
        // and over no rows it reads and writes nothing.
        let code =
            unsafe { sys::cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, s.as_raw(), params.as_mut_ptr(), null_mut()) };
        checked("cuLaunchKernel", code)
    };
    record(bench, "small_driver_launch", &[0], 0, copy, &mut driver)?;
    // SAFETY: the module is loaded above, and its function is not used after this.
    unsafe { checked("cuModuleUnload", sys::cuModuleUnload(module))? };
    decode_block(bench)?;
    for log2 in ELEMENTWISE_LOG2 {
        let len = 1usize << log2;
        let host: Vec<bf16> = (0..len).map(|_| bf16::from_f64(rng.uniform(-4.0, 4.0))).collect();
        let (xs, mut ys) = (bench.upload(1, &host, &[len])?, bench.zeros::<bf16>(1, &[len])?);
        let copy = bench.copy(&xs, &mut ys)?;
        let (x, y) = (&xs[0], &mut ys[0]);
        record(bench, "small_relu", &[len], 2 * len * 2, copy, &mut |s| elementwise::relu(s, x, y))?;
    }
    Ok(())
}

/// One transformer block's row-wise and elementwise ops at a decode step (the `--profile`
/// set's forward ops; batch 4, one token each, hidden 4096, 32 heads over 2048 keys, MLP
/// 11008): launched one by one, and replayed as one recorded graph ([`rill::Graph`]). Each
/// is the wall time of [`BLOCKS`] blocks back to back, over their count.
fn decode_block(bench: &mut Bench) -> rill::Result<()> {
    let (tokens, hidden, heads, keys, mlp) = (4, 4096, 32, 2048, 11008);
    let gpu = bench.gpu.clone();
    let random = |shape: &[usize]| -> rill::Result<Tensor<bf16>> {
        let len: usize = shape.iter().product();
        let host: Vec<bf16> = (0..len).map(|i| bf16::from_f32(((i * 7919 % 2003) as f32 - 1001.0) / 250.0)).collect();
        Tensor::from_slice(&gpu, &host, shape)
    };
    let zeros = |shape: &[usize]| Tensor::<bf16>::zeros(&gpu, shape);
    let (scores, mut probs) = (random(&[tokens * heads, keys])?, zeros(&[tokens * heads, keys])?);
    let (gate, up) = (random(&[tokens, mlp])?, random(&[tokens, mlp])?);
    let (mut act, mut mixed) = (zeros(&[tokens, mlp])?, zeros(&[tokens, mlp])?);
    let (residual, branch) = (random(&[tokens, hidden])?, random(&[tokens, hidden])?);
    let (mut sum, mut normed) = (zeros(&[tokens, hidden])?, zeros(&[tokens, hidden])?);
    let weight = random(&[hidden])?;
    let mut block = |s: &rill::Stream| -> rill::Result<()> {
        softmax::softmax(s, &scores, &mut probs)?;
        elementwise::silu(s, &gate, &mut act)?;
        elementwise::mul(s, &act, &up, &mut mixed)?;
        for _ in 0..2 {
            let call = Forward::new(&residual, &mut normed).weight(&weight).residual(&branch, &mut sum);
            Norm::new().forward(s, NormKind::RmsNorm, 1e-6, call)?;
        }
        Ok(())
    };
    let stream = &bench.stream;
    let wall = |run: &mut dyn FnMut() -> rill::Result<()>| -> rill::Result<f64> {
        run()?;
        stream.synchronize()?;
        let start = Instant::now();
        for _ in 0..BLOCKS {
            run()?;
        }
        stream.synchronize()?;
        Ok(start.elapsed().as_secs_f64() * 1e6 / BLOCKS as f64)
    };
    let one_by_one = wall(&mut || block(stream))?;
    let graph = stream.capture(&mut block)?;
    let replayed = wall(&mut || graph.launch(stream))?;
    let shape = [tokens, hidden];
    let speedup =
        format!("5 launches; graph {replayed:.2} us, one by one {one_by_one:.2} us: {:.2}x", one_by_one / replayed);
    // Launch-bound rows: no bytes to set against a copy (0% in that column).
    bench.record::<bf16>("small_decode_block_one_by_one", &shape, "5 launches", 0, one_by_one, Some(f64::INFINITY));
    bench.record::<bf16>("small_decode_block_graph", &shape, &speedup, 0, replayed, Some(f64::INFINITY));
    Ok(())
}

/// Times `call` on the device (events) and on the host (wall time of [`CALLS`] calls) and
/// records both, against the copy of the same shape (`copy` GB/s).
fn record(
    bench: &mut Bench,
    op: &str,
    shape: &[usize],
    bytes: usize,
    copy: f64,
    call: &mut impl FnMut(&rill::Stream) -> rill::Result<()>,
) -> rill::Result<()> {
    let (device, ()) = bench.time(1, bytes, |s, _| call(s))?;
    let stream = &bench.stream;
    stream.synchronize()?;
    let start = Instant::now();
    for _ in 0..CALLS {
        call(stream)?;
    }
    stream.synchronize()?;
    let wall = start.elapsed().as_secs_f64() * 1e6 / CALLS as f64;
    // The median of 15 batches of queueing, each on an idle stream.
    let mut submit = Vec::with_capacity(15);
    for _ in 0..15 {
        stream.synchronize()?;
        let start = Instant::now();
        for _ in 0..SUBMITTED {
            call(stream)?;
        }
        submit.push(start.elapsed().as_secs_f64() * 1e6 / SUBMITTED as f64);
    }
    stream.synchronize()?;
    submit.sort_by(f64::total_cmp);
    let host = format!("wall {wall:.2} us/call, submit {:.2}", submit[submit.len() / 2]);
    bench.record::<bf16>(op, shape, &host, bytes, device, Some(copy));
    Ok(())
}
