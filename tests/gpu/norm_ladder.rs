//! The RMSNorm optimization ladder (the benchmark's comparators): every rung x dtype x
//! width x row count against an f64 reference, rung 4's fallback on misaligned views, and
//! bad input.

use crate::harness::{Measured, Suite, measure, tolerance_of, view_at, view_mut_at};
use half::{bf16, f16};
use rill::norm_ladder::{Rung, rms_norm_rung};
use rill::{Element, Tensor};

/// Row widths: tiny, odd, a warp, past a warp, a pack multiple that is not a power of two,
/// the block's multiples, and a wide odd width (rung 1 stops at 4096).
const COLS: &[usize] = &[1, 3, 32, 33, 1000, 1024, 4096, 12345];
const ROWS: &[usize] = &[1, 3, 257];
const RUNG_1_MAX_COLS: usize = 4096;
const EPS: f32 = 1e-5;

pub fn run(suite: &mut Suite) {
    for_dtype::<f32>(suite);
    for_dtype::<f16>(suite);
    for_dtype::<bf16>(suite);
    bad_input(suite);
}

fn for_dtype<T: Element>(suite: &mut Suite) {
    for rung in Rung::ALL {
        for &cols in COLS {
            if rung == Rung::ThreadPerRow && cols > RUNG_1_MAX_COLS {
                continue;
            }
            for &rows in ROWS {
                case::<T>(suite, rung, &[rows, cols], 0);
            }
        }
        // More than two dimensions; every array one element off (rung 4 runs rung 3).
        case::<T>(suite, rung, &[2, 3, 1000], 0);
        case::<T>(suite, rung, &[3, 1024], 1);
    }
}

/// `x` and `y` of `shape`, `gamma` of its last dimension, each `offset` elements into its
/// allocation; the output poisoned, the elements before it checked untouched.
fn case<T: Element>(suite: &mut Suite, rung: Rung, shape: &[usize], offset: usize) {
    let name = format!("norm_ladder/{}/{}/{shape:?}/offset={offset}", rung.name(), T::DTYPE.name());
    suite.case(&name, tolerance_of::<T>(), |suite, rng| {
        let len: usize = shape.iter().product();
        let cols = *shape.last().unwrap();
        // Rows of three magnitudes, so the mean of squares spans eight orders.
        let x: Vec<T> =
            (0..len).map(|i| T::from_f64(rng.uniform(-2.0, 2.0) * [1.0, 100.0, 0.01][(i / cols) % 3])).collect();
        let gamma: Vec<T> = (0..cols).map(|_| T::from_f64(rng.uniform(-1.5, 1.5))).collect();
        let x_dev = suite.upload(&x, offset)?;
        let gamma_dev = suite.upload(&gamma, offset)?;
        let mut output: Tensor<T> = suite.poisoned(len, offset)?;
        {
            let x_view = view_at(&x_dev, offset, shape)?;
            let gamma_view = view_at(&gamma_dev, offset, &[cols])?;
            let mut y = view_mut_at(&mut output, offset, shape)?;
            rms_norm_rung(&suite.stream, rung, &x_view, &gamma_view, EPS, &mut y)?;
        }
        let all = output.to_vec()?;
        if all[..offset].iter().any(|v| !v.to_f64().is_nan()) {
            return Ok(Measured { error: f64::INFINITY, detail: "wrote before the output view".into() });
        }
        Ok(measure(&all[offset..], &reference(&x, &gamma, cols)))
    });
}

/// `x * 1/sqrt(mean(x^2) + eps) * gamma` per row, in f64.
fn reference<T: Element>(x: &[T], gamma: &[T], cols: usize) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let mean_square = row.iter().map(|v| v.to_f64() * v.to_f64()).sum::<f64>() / cols as f64;
            let rstd = 1.0 / (mean_square + EPS as f64).sqrt();
            row.iter().zip(gamma).map(move |(v, g)| v.to_f64() * rstd * g.to_f64())
        })
        .collect()
}

fn bad_input(suite: &mut Suite) {
    let rung = Rung::WarpStrided;
    suite.rejects("norm_ladder/bad/one_dimension", |suite| {
        let x = Tensor::<f32>::zeros(&suite.gpu, &[8])?;
        let gamma = Tensor::<f32>::zeros(&suite.gpu, &[8])?;
        let mut y = Tensor::<f32>::zeros(&suite.gpu, &[8])?;
        rms_norm_rung(&suite.stream, rung, &x, &gamma, EPS, &mut y)
    });
    suite.rejects("norm_ladder/bad/empty", |suite| {
        let x = Tensor::<f32>::zeros(&suite.gpu, &[0, 8])?;
        let gamma = Tensor::<f32>::zeros(&suite.gpu, &[8])?;
        let mut y = Tensor::<f32>::zeros(&suite.gpu, &[0, 8])?;
        rms_norm_rung(&suite.stream, rung, &x, &gamma, EPS, &mut y)
    });
    suite.rejects("norm_ladder/bad/gamma_shape", |suite| {
        let x = Tensor::<f16>::zeros(&suite.gpu, &[4, 8])?;
        let gamma = Tensor::<f16>::zeros(&suite.gpu, &[4])?;
        let mut y = Tensor::<f16>::zeros(&suite.gpu, &[4, 8])?;
        rms_norm_rung(&suite.stream, rung, &x, &gamma, EPS, &mut y)
    });
    suite.rejects("norm_ladder/bad/output_shape", |suite| {
        let x = Tensor::<bf16>::zeros(&suite.gpu, &[4, 8])?;
        let gamma = Tensor::<bf16>::zeros(&suite.gpu, &[8])?;
        let mut y = Tensor::<bf16>::zeros(&suite.gpu, &[8, 4])?;
        rms_norm_rung(&suite.stream, rung, &x, &gamma, EPS, &mut y)
    });
    suite.rejects("norm_ladder/bad/eps", |suite| {
        let x = Tensor::<f32>::zeros(&suite.gpu, &[4, 8])?;
        let gamma = Tensor::<f32>::zeros(&suite.gpu, &[8])?;
        let mut y = Tensor::<f32>::zeros(&suite.gpu, &[4, 8])?;
        rms_norm_rung(&suite.stream, rung, &x, &gamma, -1.0, &mut y)
    });
}
