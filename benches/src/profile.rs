//! `--profile`: one transformer block's worth of the ops on main at Llama-like sizes
//! (hidden 4096, 32 heads, sequence 2048, batch 4, MLP 11008, vocabulary 32000), bf16,
//! each op's device time and its share of the total, slowest first. Each run of an op is an
//! NVTX range named after it, so under nsys or ncu its kernels show which op they were.

use crate::measure::Bench;
use half::bf16;
use rill::norm::{Backward, Forward, Norm, NormKind};
use rill::{Tensor, elementwise as ew, softmax};

const BATCH: usize = 4;
const SEQ: usize = 2048;
const HIDDEN: usize = 4096;
const HEADS: usize = 32;
const MLP: usize = 11008;
const VOCAB: usize = 32000;

pub fn run(bench: &mut Bench) -> rill::Result<()> {
    let gpu = bench.gpu.clone();
    let tokens = BATCH * SEQ;
    let random = |shape: &[usize]| -> rill::Result<Tensor<bf16>> {
        let len: usize = shape.iter().product();
        let host: Vec<bf16> = (0..len).map(|i| bf16::from_f32(((i * 7919 % 2003) as f32 - 1001.0) / 250.0)).collect();
        Tensor::from_slice(&gpu, &host, shape)
    };
    let zeros = |shape: &[usize]| Tensor::<bf16>::zeros(&gpu, shape);
    let scores_shape = [BATCH * HEADS, SEQ, SEQ];
    let (scores, grad_scores) = (random(&scores_shape)?, random(&scores_shape)?);
    let mut probs = zeros(&scores_shape)?;
    let (gate, up) = (random(&[tokens, MLP])?, random(&[tokens, MLP])?);
    let (mut act, mut hidden) = (zeros(&[tokens, MLP])?, zeros(&[tokens, MLP])?);
    let (residual, branch) = (random(&[tokens, HIDDEN])?, random(&[tokens, HIDDEN])?);
    let (mut sum, mut normed, mut dx) =
        (zeros(&[tokens, HIDDEN])?, zeros(&[tokens, HIDDEN])?, zeros(&[tokens, HIDDEN])?);
    let norm_weight = random(&[HIDDEN])?;
    let mut dweight = zeros(&[HIDDEN])?;
    let mut rstd = Tensor::<f32>::zeros(&gpu, &[tokens])?;
    let logits = random(&[tokens, VOCAB])?;
    let mut dlogits = zeros(&[tokens, VOCAB])?;
    let target =
        Tensor::from_slice(&gpu, &(0..tokens).map(|t| (t * 31 % VOCAB) as i64).collect::<Vec<_>>(), &[tokens])?;
    let mut loss = Tensor::<f32>::zeros(&gpu, &[tokens])?;
    let dloss = Tensor::from_slice(&gpu, &vec![1.0f32 / tokens as f32; tokens], &[tokens])?;
    let scale = 1.0 / (HIDDEN as f32 / HEADS as f32).sqrt();

    let mut times = vec![
        time(bench, "attention causal softmax", |s| softmax::scaled_causal_softmax(s, &scores, scale, &mut probs))?,
        time(bench, "attention softmax backward", |s| softmax::softmax_backward(s, &scores, &grad_scores, &mut probs))?,
        time(bench, "mlp silu(gate)", |s| ew::silu(s, &gate, &mut act))?,
        time(bench, "mlp silu(gate) * up", |s| ew::mul(s, &act, &up, &mut hidden))?,
        time(bench, "residual add + rms_norm (x2)", |s| {
            for _ in 0..2 {
                let call = Forward::new(&residual, &mut normed).weight(&norm_weight).residual(&branch, &mut sum);
                Norm::new().forward(s, NormKind::RmsNorm, 1e-6, call.save_rstd(&mut rstd))?;
            }
            Ok(())
        })?,
        time(bench, "rms_norm backward (x2)", |s| {
            for _ in 0..2 {
                let call = Backward::new(&residual, &branch, &rstd, &mut dx).weight(&norm_weight);
                Norm::new().backward(s, NormKind::RmsNorm, call.dweight(&mut dweight))?;
            }
            Ok(())
        })?,
        time(bench, "cross entropy", |s| softmax::cross_entropy(s, &logits, &target, &mut loss))?,
        time(bench, "cross entropy backward", |s| {
            softmax::cross_entropy_backward(s, &logits, &target, &dloss, &mut dlogits)
        })?,
    ];

    times.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = times.iter().map(|t| t.1).sum();
    eprintln!();
    println!(
        "\nprofile: batch {BATCH}, sequence {SEQ}, hidden {HIDDEN}, heads {HEADS}, MLP {MLP}, vocabulary {VOCAB}, bf16"
    );
    println!("{:<28} {:>12} {:>7}", "op", "time (us)", "share");
    for (name, micros) in &times {
        println!("{name:<28} {micros:>12.1} {:>6.1}%", 100.0 * micros / total);
    }
    println!("{:<28} {total:>12.1} {:>6.1}%", "total", 100.0);
    Ok(())
}

/// `name` and the time of one op of the profile, which `launch` queues on the stream it is
/// given, inside an NVTX range named `name`.
fn time<'n, R>(
    bench: &mut Bench,
    name: &'n str,
    mut launch: impl FnMut(&rill::Stream) -> rill::Result<R>,
) -> rill::Result<(&'n str, f64)> {
    let (micros, _) = bench.time(1, 1 << 30, |stream, _| {
        let _range = rill::nvtx::range(name);
        launch(stream)
    })?;
    Ok((name, micros))
}
