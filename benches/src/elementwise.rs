//! Elementwise ops over lengths 2^16 to 2^28.

use crate::measure::Bench;
use rill::Element;
use rill_tests::random::{Domain, Rng};
use rill_tests::reference::ELEMENTWISE_OPS;
use rill_tests::shapes::ELEMENTWISE_BENCH_LENGTHS;

/// Columns of the `[n / cols, cols]` view `bias_add_gelu` runs on.
const BIAS_COLS: usize = 4096;

pub fn sweep<T: Element>(bench: &mut Bench) -> rill::Result<()> {
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
        let upload = || bench.upload(sets, &host, &[len]);
        let (a, b, c) = (upload()?, upload()?, upload()?);
        let mut ys = bench.zeros(sets, &[len])?;
        let copy = bench.copy(&a, &mut ys)?;

        for op in &ops {
            let cols = BIAS_COLS.min(len);
            let bytes = if op.broadcasts_last { 2 * len * size + cols * size } else { (op.arity + 1) * len * size };
            let (micros, ()) = bench.time(sets, bytes, |stream, s| {
                let (a, b, c, y) = (&a[s], &b[s], &c[s], &mut ys[s]);
                if op.broadcasts_last {
                    let x = [a.view().reshape(&[len / cols, cols])?, b.view().slice(0..cols)?];
                    rill_tests::ops::elementwise(stream, op.name, &x, &mut y.view_mut().reshape(&[len / cols, cols])?)
                } else {
                    let x = [a.view(), b.view(), c.view()];
                    rill_tests::ops::elementwise(stream, op.name, &x[..op.arity], &mut y.view_mut())
                }
            })?;
            bench.record::<T>(op.name, &[len], "-", bytes, micros, Some(copy));
        }
    }
    Ok(())
}
