//! rill on another library's memory and stream: the cudarc example against the f64
//! reference, and views over raw pointers.

use crate::harness::{Measured, Suite, measure, tolerance_of};
use rill::{View, ViewMut};
use rill_example_cudarc::{Inputs, run};
use rill_tests::reference::{cross_entropy_rows, norm_rows, softmax_rows};

pub fn run_cases(suite: &mut Suite) {
    for (rows, cols) in [(1, 1000), (37, 4099)] {
        let name = format!("interop/cudarc/rms_norm+cross_entropy/{rows}x{cols}");
        suite.case(&name, 1e-5, |_, rng| {
            let x: Vec<f32> = (0..rows * cols).map(|_| rng.uniform(-2.0, 2.0) as f32).collect();
            let weight: Vec<f32> = (0..cols).map(|_| rng.uniform(0.5, 1.5) as f32).collect();
            let target: Vec<i64> = (0..rows).map(|_| (rng.next_u64() % cols as u64) as i64).collect();
            let eps = 1e-6;
            let inputs = Inputs { rows, cols, x, weight, target, eps };
            // cudarc allocates the outputs zeroed; random inputs give no zero in either.
            let outputs = match run(&inputs) {
                Ok(outputs) => outputs,
                Err(error) => {
                    return Ok(Measured { error: f64::INFINITY, detail: format!("the example failed: {error}") });
                }
            };
            let f64s = |v: &[f32]| v.iter().map(|&v| v as f64).collect::<Vec<_>>();
            let y = norm_rows(&f64s(&inputs.x), cols, true, eps as f64, Some(&f64s(&inputs.weight)), None);
            // The loss of the rows rill wrote, so that the two errors do not compound.
            let loss = cross_entropy_rows(&f64s(&outputs.y), &inputs.target, cols);
            let (y, loss) = (measure(&outputs.y, &y), measure(&outputs.loss, &loss));
            Ok(if y.error >= loss.error { y } else { loss })
        });
    }
}

/// Views over raw device pointers, as another library hands them out: one a single element
/// past a 16-byte boundary runs narrower packs and matches the reference.
pub fn raw_views(suite: &mut Suite) {
    let (rows, cols) = (7, 4099);
    suite.case("interop/from_raw/one_element_past_16_bytes", tolerance_of::<f32>(), |suite, rng| {
        let x: Vec<f32> = (0..rows * cols).map(|_| rng.uniform(-4.0, 4.0) as f32).collect();
        let padded = suite.upload(&x, 1)?;
        let mut out = suite.poisoned::<f32>(rows * cols, 1)?;
        let (x_at, y_at) = (padded.view().address() + 4, out.view_mut().address() + 4);
        // SAFETY: both point one element into live allocations of `rows * cols + 1` f32,
        // which outlive the synchronous check below.
        let (x_view, mut y_view) =
            unsafe { (View::<f32>::from_raw(x_at, &[rows, cols])?, ViewMut::<f32>::from_raw(y_at, &[rows, cols])?) };
        rill::softmax::softmax(&suite.stream, &x_view, &mut y_view)?;
        let got = out.to_vec()?;
        let want = softmax_rows(&x.iter().map(|&v| v as f64).collect::<Vec<_>>(), cols, false);
        Ok(measure(&got[1..], &want))
    });
}
