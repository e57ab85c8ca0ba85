//! Elementwise ops over lengths 2^16 to 2^28.

use crate::measure::Bench;
use rill::{Element, Tensor};
use rill_tests::random::{Domain, Rng};
use rill_tests::reference::ELEMENTWISE_OPS;
use rill_tests::shapes::ELEMENTWISE_BENCH_LENGTHS;

/// Columns of the `[n / cols, cols]` view `bias_add_gelu` runs on.
const BIAS_COLS: usize = 4096;

pub fn sweep<T: Element>(bench: &mut Bench) -> rill::Result<()> {
    let dtype = T::DTYPE.name();
    let lengths: Vec<usize> = if bench.quick { vec![1 << 20, 1 << 24] } else { ELEMENTWISE_BENCH_LENGTHS.to_vec() };
    let ops: Vec<_> = ELEMENTWISE_OPS.iter().filter(|op| bench.wants("elementwise", op.name)).collect();
    if ops.is_empty() {
        return Ok(());
    }
    bench.plan(lengths.len() * (ops.len() + 1));
    for len in lengths {
        let size = size_of::<T>();
        let sets = bench.buffer_sets(4 * len * size);
        // Inputs kept away from zero so divisions stay finite.
        let mut rng = Rng::new(len as u64);
        let host: Vec<T> = (0..len).map(|_| T::from_f64(Domain::AwayFromZero(0.5, 2.0).sample(&mut rng))).collect();
        let inputs: Vec<[Tensor<T>; 3]> = (0..sets)
            .map(|_| -> rill::Result<[Tensor<T>; 3]> {
                let t = || Tensor::from_slice(&bench.gpu, &host, &[len]);
                Ok([t()?, t()?, t()?])
            })
            .collect::<rill::Result<_>>()?;
        let mut outputs: Vec<Tensor<T>> =
            (0..sets).map(|_| Tensor::zeros(&bench.gpu, &[len])).collect::<rill::Result<_>>()?;

        let copy_bytes = 2 * len * size;
        let copy_us =
            bench.median_micros(sets, copy_bytes, |stream, s| rill::copy(stream, &inputs[s][0], &mut outputs[s]))?;
        let copy = bench.record("copy", dtype, &[len], "-", copy_bytes, copy_us, None);

        for op in &ops {
            let cols = BIAS_COLS.min(len);
            let bytes = if op.broadcasts_last { 2 * len * size + cols * size } else { (op.arity + 1) * len * size };
            let micros = bench.median_micros(sets, bytes, |stream, s| {
                let [a, b, c] = &inputs[s];
                let y = &mut outputs[s];
                if op.broadcasts_last {
                    let x = [a.view().reshape(&[len / cols, cols])?, b.view().slice(0..cols)?];
                    rill_tests::ops::elementwise(stream, op.name, &x, &mut y.view_mut().reshape(&[len / cols, cols])?)
                } else {
                    rill_tests::ops::elementwise(
                        stream,
                        op.name,
                        &[a.view(), b.view(), c.view()][..op.arity],
                        &mut y.view_mut(),
                    )
                }
            })?;
            bench.record(op.name, dtype, &[len], "-", bytes, micros, Some(copy));
        }
    }
    Ok(())
}
