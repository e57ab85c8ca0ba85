//! LayerNorm and RMSNorm over the norms' sweep: 49152 rows of 32 to 32768 columns (plus 768
//! and 1000) and 4096 rows of 32001 and 50257, weights in the input's dtype.
//!
//! Bytes moved: each `rows x cols` array read or written once (x and y forward; x, residual,
//! sum and y with the residual add; x, dy and dx backward), plus the weights and per-row
//! statistics. `*_backward+params` also computes dweight (and dbias) but is counted with the
//! same bytes as dx alone, so its figure shows what the extra pass over x and dy costs.

use crate::measure::Bench;
use rill::norm::{Backward, Forward, NormKind};
use rill::{Element, Tensor};
use rill_tests::random::Rng;

/// The ops measured, with the `rows x cols` arrays each moves.
const OPS: &[(&str, usize)] = &[
    ("layer_norm", 2),
    ("rms_norm", 2),
    ("add_layer_norm", 4),
    ("add_rms_norm", 4),
    ("layer_norm_backward", 3),
    ("rms_norm_backward", 3),
    ("layer_norm_backward+params", 3),
    ("rms_norm_backward+params", 3),
];

pub fn sweep<T: Element>(bench: &mut Bench) -> rill::Result<()> {
    let ops: Vec<_> = OPS.iter().filter(|(op, _)| bench.wants("norm", op)).collect();
    if ops.is_empty() {
        return Ok(());
    }
    // The softmax family's shapes up to 4096 rows of 50257, and wider where `--cols` asks.
    let shapes = bench.row_shapes(|_, cols| cols <= 50257 || bench.asks_for(cols));
    bench.plan(shapes.len() * (ops.len() + 1));
    let gpu = bench.gpu.clone();
    for (rows, cols) in shapes {
        let (len, size, shape) = (rows * cols, size_of::<T>(), [rows, cols]);
        let sets = bench.buffer_sets(4 * len * size);
        let mut rng = Rng::new(len as u64);
        let host: Vec<T> = (0..len).map(|_| T::from_f64(rng.uniform(-4.0, 4.0))).collect();
        let params: Vec<T> = (0..cols).map(|_| T::from_f64(rng.uniform(0.5, 1.5))).collect();
        // Per set: x and a second input (the residual, or dy), and the outputs y and sum
        // (also dx). Distinct buffers, so no read is served from cache.
        let (xs, seconds) = (bench.upload(sets, &host, &shape)?, bench.upload(sets, &host, &shape)?);
        let (mut ys, mut sums) = (bench.zeros(sets, &shape)?, bench.zeros(sets, &shape)?);
        let (weight, bias) = (Tensor::from_slice(&gpu, &params, &[cols])?, Tensor::from_slice(&gpu, &params, &[cols])?);
        let (mut dweight, mut dbias) = (Tensor::<T>::zeros(&gpu, &[cols])?, Tensor::<T>::zeros(&gpu, &[cols])?);
        let (mut mean, mut rstd) = (Tensor::<f32>::zeros(&gpu, &[rows])?, Tensor::<f32>::zeros(&gpu, &[rows])?);
        let norm = bench.norm();
        // Statistics for the backward: any finite values do for timing.
        let call = Forward::new(&xs[0], &mut ys[0]).save_mean(&mut mean).save_rstd(&mut rstd);
        norm.forward(&bench.stream, NormKind::LayerNorm, 1e-5, call)?;
        let copy = bench.copy(&xs, &mut ys)?;

        for &&(op, arrays) in &ops {
            let (kind, eps) = if op.contains("rms") { (NormKind::RmsNorm, 1e-6) } else { (NormKind::LayerNorm, 1e-5) };
            let params_bytes = if kind == NormKind::LayerNorm { 2 } else { 1 } * cols * size;
            let bytes = arrays * len * size + params_bytes + rows * 8;
            let (micros, plan) = bench.time(sets, bytes, |stream, s| {
                let (x, second, y, sum) = (&xs[s], &seconds[s], &mut ys[s], &mut sums[s]);
                if !op.contains("backward") {
                    let mut call = Forward::new(x, y).weight(&weight).save_rstd(&mut rstd);
                    if op.starts_with("add_") {
                        call = call.residual(second, sum);
                    }
                    if kind == NormKind::LayerNorm {
                        call = call.bias(&bias).save_mean(&mut mean);
                    }
                    return norm.forward(stream, kind, eps, call);
                }
                let call = Backward::new(x, second, &rstd, sum).weight(&weight);
                let call = if kind == NormKind::LayerNorm { call.mean(&mean) } else { call };
                match (kind, op.ends_with("+params")) {
                    (NormKind::LayerNorm, true) => {
                        norm.backward(stream, kind, call.dweight(&mut dweight).dbias(&mut dbias))
                    }
                    (NormKind::RmsNorm, true) => norm.backward(stream, kind, call.dweight(&mut dweight)),
                    (_, false) => norm.backward(stream, kind, call),
                }
            })?;
            bench.record::<T>(op, &shape, &plan.describe(), bytes, micros, Some(copy));
        }
    }
    Ok(())
}
