//! The softmax family over `(rows, cols)` shapes: the seed articles' sweep of 49152 rows of
//! 32 to 32768 columns (plus 768 and 1000), and 4096 rows of 32001 and 50257 to 262144 columns.

use crate::measure::Bench;
use rill::{Element, Tensor};
use rill_tests::random::Rng;

/// The ops measured, with the arrays of `rows x cols` elements each moves.
const OPS: &[(&str, usize)] = &[
    ("softmax", 2),
    ("log_softmax", 2),
    ("softmax_backward", 3),
    ("log_softmax_backward", 3),
    ("scaled_masked_softmax", 2),
    ("scaled_causal_softmax", 2),
    ("cross_entropy", 1),
    ("cross_entropy_backward", 2),
    ("logsumexp", 1),
];

/// Queries per batch for the causal view `[rows / q, q, cols]`: the largest power of two
/// dividing `rows`, at most `cols`.
pub(crate) fn queries(rows: usize, cols: usize) -> usize {
    let mut q = 1;
    while rows.is_multiple_of(2 * q) && 2 * q <= cols {
        q *= 2;
    }
    q
}

pub fn sweep<T: Element>(bench: &mut Bench) -> rill::Result<()> {
    let shapes = bench.row_shapes(|_, _| true);
    let ops: Vec<_> = OPS.iter().filter(|(op, _)| bench.wants("softmax", op)).collect();
    if ops.is_empty() {
        return Ok(());
    }
    bench.plan(shapes.len() * (ops.len() + 1));
    for (rows, cols) in shapes {
        let (len, size, shape) = (rows * cols, size_of::<T>(), [rows, cols]);
        let sets = bench.buffer_sets(3 * len * size);
        let mut rng = Rng::new(len as u64);
        let host: Vec<T> = (0..len).map(|_| T::from_f64(rng.uniform(-8.0, 8.0))).collect();
        let (xs, dys) = (bench.upload(sets, &host, &shape)?, bench.upload(sets, &host, &shape)?);
        let mut ys = bench.zeros(sets, &shape)?;
        let mask = Tensor::from_slice(&bench.gpu, &host[..cols], &[1, cols])?;
        let target: Vec<i64> = (0..rows).map(|r| (r * 7919 % cols) as i64).collect();
        let target = Tensor::from_slice(&bench.gpu, &target, &[rows])?;
        let mut loss = Tensor::<f32>::zeros(&bench.gpu, &[rows])?;
        let dloss = Tensor::from_slice(&bench.gpu, &vec![1.0f32; rows], &[rows])?;
        let q = queries(rows, cols);
        let copy = bench.copy(&xs, &mut ys)?;

        for &&(op, arrays) in &ops {
            // Per-row arrays (targets, losses) and the mask row count too.
            let bytes = arrays * len * size
                + match op {
                    "scaled_masked_softmax" => cols * size,
                    "cross_entropy" | "cross_entropy_backward" => rows * 12,
                    "logsumexp" => rows * 4,
                    _ => 0,
                };
            let ops = bench.softmax();
            let (micros, plan) = bench.time(sets, bytes, |stream, s| {
                let (x, dy, y) = (&xs[s], &dys[s], &mut ys[s]);
                match op {
                    "softmax" => ops.forward(stream, x, y, false),
                    "log_softmax" => ops.forward(stream, x, y, true),
                    "softmax_backward" => ops.backward(stream, x, dy, y, false),
                    "log_softmax_backward" => ops.backward(stream, x, dy, y, true),
                    "scaled_masked_softmax" => ops.scale_mask(stream, x, &mask, 0.125, y),
                    "scaled_causal_softmax" => ops.causal(
                        stream,
                        &x.view().reshape(&[rows / q, q, cols])?,
                        0.125,
                        &mut y.view_mut().reshape(&[rows / q, q, cols])?,
                    ),
                    "cross_entropy" => ops.cross_entropy(stream, x, &target, &mut loss),
                    "logsumexp" => ops.logsumexp(stream, x, &mut loss),
                    _ => ops.cross_entropy_backward(stream, x, &target, &dloss, y),
                }
            })?;
            bench.record::<T>(op, &shape, &plan.describe(), bytes, micros, Some(copy));
        }
    }
    Ok(())
}
