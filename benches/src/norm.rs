//! LayerNorm and RMSNorm over the norms' sweep: 49152 rows of 32 to 32768 columns (plus 768
//! and 1000) and 4096 rows of 50257, weights in the input's dtype.
//!
//! Bytes moved: each `rows x cols` array read or written once (x and y forward; x, residual,
//! sum and y with the residual add; x, dy and dx backward), plus the weights and per-row
//! statistics. `*_backward+params` also computes dweight (and dbias) but is counted with the
//! same bytes as dx alone, so its figure shows what the extra pass over x and dy costs.

use crate::measure::Bench;
use rill::norm::{Backward, Forward, Norm, NormKind, Plan};
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

fn shapes(quick: bool) -> Vec<(usize, usize)> {
    if quick {
        return vec![(49152, 1024), (49152, 8192)];
    }
    let mut shapes: Vec<(usize, usize)> = (5..=15).map(|p| (49152, 1 << p)).collect();
    shapes.extend([(49152, 768), (49152, 1000), (4096, 50257)]);
    shapes
}

pub fn sweep<T: Element>(bench: &mut Bench) -> rill::Result<()> {
    let dtype = T::DTYPE.name();
    let ops: Vec<_> = OPS.iter().filter(|(op, _)| bench.wants("norm", op)).collect();
    if ops.is_empty() {
        return Ok(());
    }
    let shapes = bench.keep(shapes(bench.quick));
    bench.plan(shapes.len() * (ops.len() + 1));
    let gpu = bench.gpu.clone();
    for (rows, cols) in shapes {
        let len = rows * cols;
        let size = size_of::<T>();
        let sets = bench.buffer_sets(4 * len * size);
        let mut rng = Rng::new(len as u64);
        let host: Vec<T> = (0..len).map(|_| T::from_f64(rng.uniform(-4.0, 4.0))).collect();
        let params: Vec<T> = (0..cols).map(|_| T::from_f64(rng.uniform(0.5, 1.5))).collect();
        let tensor = |data: &[T], shape: &[usize]| Tensor::from_slice(&gpu, data, shape);
        // Per set: x and a second input (the residual, or dy), and the outputs y and sum
        // (also dx). Distinct buffers, so no read is served from cache.
        let inputs: Vec<[Tensor<T>; 2]> = (0..sets)
            .map(|_| Ok([tensor(&host, &[rows, cols])?, tensor(&host, &[rows, cols])?]))
            .collect::<rill::Result<_>>()?;
        let zeros =
            || -> rill::Result<Vec<Tensor<T>>> { (0..sets).map(|_| Tensor::zeros(&gpu, &[rows, cols])).collect() };
        let (mut ys, mut sums) = (zeros()?, zeros()?);
        let (weight, bias) = (tensor(&params, &[cols])?, tensor(&params, &[cols])?);
        let (mut dweight, mut dbias) = (Tensor::<T>::zeros(&gpu, &[cols])?, Tensor::<T>::zeros(&gpu, &[cols])?);
        let mut mean = Tensor::<f32>::zeros(&gpu, &[rows])?;
        let mut rstd = Tensor::<f32>::zeros(&gpu, &[rows])?;
        let norm = Norm::new();
        // Statistics for the backward: any finite values do for timing.
        norm.forward(
            &bench.stream,
            NormKind::LayerNorm,
            1e-5,
            Forward::new(&inputs[0][0], &mut ys[0]).save_mean(&mut mean).save_rstd(&mut rstd),
        )?;

        let copy_bytes = 2 * len * size;
        let copy_us =
            bench.median_micros(sets, copy_bytes, |stream, s| rill::copy(stream, &inputs[s][0], &mut ys[s]))?;
        let copy = bench.record("copy", dtype, &[rows, cols], "-", copy_bytes, copy_us, None);

        for &&(op, arrays) in &ops {
            let kind = if op.contains("rms") { NormKind::RmsNorm } else { NormKind::LayerNorm };
            let params_bytes = if kind == NormKind::LayerNorm { 2 } else { 1 } * cols * size;
            let bytes = arrays * len * size + params_bytes + rows * 8;
            let mut plan: Option<Plan> = None;
            let micros = bench.median_micros(sets, bytes, |stream, s| {
                let ([x, second], y, sum) = (&inputs[s], &mut ys[s], &mut sums[s]);
                plan = Some(match (op, kind) {
                    ("layer_norm", _) => norm.forward(
                        stream,
                        kind,
                        1e-5,
                        Forward::new(x, y).weight(&weight).bias(&bias).save_mean(&mut mean).save_rstd(&mut rstd),
                    )?,
                    ("rms_norm", _) => {
                        norm.forward(stream, kind, 1e-6, Forward::new(x, y).weight(&weight).save_rstd(&mut rstd))?
                    }
                    ("add_layer_norm", _) => norm.forward(
                        stream,
                        kind,
                        1e-5,
                        Forward::new(x, y)
                            .weight(&weight)
                            .bias(&bias)
                            .residual(second, sum)
                            .save_mean(&mut mean)
                            .save_rstd(&mut rstd),
                    )?,
                    ("add_rms_norm", _) => norm.forward(
                        stream,
                        kind,
                        1e-6,
                        Forward::new(x, y).weight(&weight).residual(second, sum).save_rstd(&mut rstd),
                    )?,
                    (_, NormKind::LayerNorm) => {
                        let call = Backward::new(x, second, &rstd, sum).mean(&mean).weight(&weight);
                        if op.ends_with("+params") {
                            norm.backward(stream, kind, call.dweight(&mut dweight).dbias(&mut dbias))?
                        } else {
                            norm.backward(stream, kind, call)?
                        }
                    }
                    (_, NormKind::RmsNorm) => {
                        let call = Backward::new(x, second, &rstd, sum).weight(&weight);
                        if op.ends_with("+params") {
                            norm.backward(stream, kind, call.dweight(&mut dweight))?
                        } else {
                            norm.backward(stream, kind, call)?
                        }
                    }
                });
                Ok(())
            })?;
            let path = plan.map_or("-".into(), |p| p.describe());
            bench.record(op, dtype, &[rows, cols], &path, bytes, micros, Some(copy));
        }
    }
    Ok(())
}
