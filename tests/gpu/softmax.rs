//! Softmax family: every width x rows x dtype, each path forced where it applies, extreme
//! and masked rows, the fused variants, and bad input.

use crate::harness::{Measured, Suite, tolerance_of, view_at, view_mut_at};
use half::{bf16, f16};
use rill::softmax::{PathKind, Plan, Softmax};
use rill::{Element, Tensor};
use rill_tests::check::{max_error_with_floor, relative_floor};
use rill_tests::random::Rng;
use rill_tests::reference::{
    cross_entropy_backward_magnitude_rows, cross_entropy_backward_rows, cross_entropy_rows, logsumexp_rows,
    softmax_backward_magnitude_rows, softmax_backward_rows, softmax_rows,
};
use rill_tests::shapes::{SOFTMAX_TEST_COLS, softmax_test_rows};

pub fn run(suite: &mut Suite) {
    for_dtype::<f32>(suite);
    for_dtype::<f16>(suite);
    for_dtype::<bf16>(suite);
    offset_views::<f32>(suite);
    offset_views::<f16>(suite);
    offset_views::<bf16>(suite);
    bad_input(suite);
}

/// Paths to check for a shape: the dispatcher's choice, then each path forced where the
/// shape fits it (the warp path up to 1024 columns, shared memory for rows that fit, clusters
/// where the GPU has them).
fn paths(suite: &Suite, cols: usize) -> Vec<Option<PathKind>> {
    let mut paths = vec![None, Some(PathKind::Uncached)];
    if cols <= 1024 {
        paths.push(Some(PathKind::Warp));
    }
    if cols <= 16384 {
        paths.push(Some(PathKind::Shared));
    }
    // Thread-block clusters (sm_90) hold every width the suite covers.
    if suite.gpu.info().compute_capability.0 >= 9 {
        paths.push(Some(PathKind::Cluster));
    }
    paths
}

fn path_name(path: Option<PathKind>) -> String {
    path.map_or("auto".into(), |p| format!("{p:?}").to_lowercase())
}

/// Random logits in [-8, 8); one row in four (from the fourth on) holds huge values of both
/// signs, and every seventh element of such rows is `-inf`.
fn logits<T: Element>(rng: &mut Rng, rows: usize, cols: usize) -> Vec<T> {
    (0..rows * cols)
        .map(|i| {
            let (r, c) = (i / cols, i % cols);
            let extreme = r % 4 == 3;
            let v = if extreme && c % 7 == 3 && cols > 1 {
                f64::NEG_INFINITY
            } else if extreme {
                rng.uniform(-3e4, 3e4)
            } else {
                rng.uniform(-8.0, 8.0)
            };
            T::from_f64(v)
        })
        .collect()
}

fn f64s<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Errors of probabilities below this are absolute: f32 math flushes subnormals to zero.
fn probability_floor<T: Element>() -> f64 {
    relative_floor(T::DTYPE).max(1e-30)
}

fn measured<T: Element>(got: &[T], want: &[f64], floor: impl Fn(usize) -> f64, plan: &Plan) -> Measured {
    match max_error_with_floor(got, want, floor) {
        Some(w) => Measured {
            error: w.error,
            detail: format!("element {}: got {:e}, want {:e}; {}", w.index, w.got, w.want, plan.describe()),
        },
        None => Measured { error: 0.0, detail: String::new() },
    }
}

fn for_dtype<T: Element>(suite: &mut Suite) {
    let dtype = T::DTYPE.name();
    for &cols in SOFTMAX_TEST_COLS {
        for rows in softmax_test_rows(cols) {
            for path in paths(suite, cols) {
                // Forced paths on the smallest and largest row counts only.
                if path.is_some() && rows == 2 {
                    continue;
                }
                let softmax = path.map_or_else(Softmax::new, Softmax::forced);
                let at = format!("{dtype}/[{rows}, {cols}]/{}", path_name(path));
                for log in [false, true] {
                    let op = if log { "log_softmax" } else { "softmax" };
                    forward_case::<T>(suite, &format!("softmax/{op}/{at}"), softmax, rows, cols, log);
                    backward_case::<T>(suite, &format!("softmax/{op}_backward/{at}"), softmax, rows, cols, log);
                }
                if path.is_none() || rows > 3 {
                    fused_cases::<T>(suite, &at, softmax, rows, cols);
                }
            }
        }
    }
}

fn forward_case<T: Element>(suite: &mut Suite, name: &str, softmax: Softmax, rows: usize, cols: usize, log: bool) {
    suite.case(name, tolerance_of::<T>(), |suite, rng| {
        let x = logits::<T>(rng, rows, cols);
        let input = Tensor::from_slice(&suite.gpu, &x, &[rows, cols])?;
        let mut output = suite.poisoned::<T>(rows * cols, 0)?;
        let mut y = output.view_mut().reshape(&[rows, cols])?;
        let plan = softmax.forward(&suite.stream, &input, &mut y, log)?;
        let got = output.to_vec()?;
        let want = softmax_rows(&f64s(&x), cols, log);
        // Log-probabilities: absolute error below 1 (the log scale), relative above.
        let floor = if log { 1.0 } else { probability_floor::<T>() };
        Ok(measured(&got, &want, |_| floor, &plan))
    });
}

fn backward_case<T: Element>(suite: &mut Suite, name: &str, softmax: Softmax, rows: usize, cols: usize, log: bool) {
    suite.case(name, tolerance_of::<T>(), |suite, rng| {
        // y is a real (log-)softmax output of finite logits; dy is arbitrary.
        let x: Vec<f64> = (0..rows * cols).map(|_| rng.uniform(-8.0, 8.0)).collect();
        let y: Vec<T> = softmax_rows(&x, cols, log).into_iter().map(T::from_f64).collect();
        let dy: Vec<T> = (0..rows * cols).map(|_| T::from_f64(rng.uniform(-1.0, 1.0))).collect();
        let y_dev = Tensor::from_slice(&suite.gpu, &y, &[rows, cols])?;
        let dy_dev = Tensor::from_slice(&suite.gpu, &dy, &[rows, cols])?;
        let mut output = suite.poisoned::<T>(rows * cols, 0)?;
        let mut dx = output.view_mut().reshape(&[rows, cols])?;
        let plan = softmax.backward(&suite.stream, &y_dev, &dy_dev, &mut dx, log)?;
        let got = output.to_vec()?;
        let want = softmax_backward_rows(&f64s(&y), &f64s(&dy), cols, log);
        // Where the terms cancel, the error is measured against their magnitude.
        let magnitude = softmax_backward_magnitude_rows(&f64s(&y), &f64s(&dy), cols, log);
        let floor = relative_floor(T::DTYPE);
        Ok(measured(&got, &want, |i| magnitude[i].max(floor), &plan))
    });
}

/// Scale + mask (with a fully masked row), causal, and cross entropy forward and backward.
fn fused_cases<T: Element>(suite: &mut Suite, at: &str, softmax: Softmax, rows: usize, cols: usize) {
    let scale = 0.125f32;
    suite.case(&format!("softmax/scaled_masked/{at}"), tolerance_of::<T>(), |suite, rng| {
        let x = logits::<T>(rng, rows, cols);
        // The mask's rows divide the input's: broadcast like [seq_q, seq_k] over heads.
        let mask_rows = if rows % 3 == 0 { 3 } else { 1 };
        let mask: Vec<T> = (0..mask_rows * cols)
            .map(|i| {
                let fully_masked_row = mask_rows == 3 && i / cols == 1;
                T::from_f64(if fully_masked_row || rng.uniform(0.0, 1.0) < 0.2 { f64::NEG_INFINITY } else { 0.0 })
            })
            .collect();
        let x_dev = Tensor::from_slice(&suite.gpu, &x, &[rows, cols])?;
        let mask_dev = Tensor::from_slice(&suite.gpu, &mask, &[mask_rows, cols])?;
        let mut output = suite.poisoned::<T>(rows * cols, 0)?;
        let mut y = output.view_mut().reshape(&[rows, cols])?;
        let plan = softmax.scale_mask(&suite.stream, &x_dev, &mask_dev, scale, &mut y)?;
        let got = output.to_vec()?;
        let scaled: Vec<f64> = (0..rows * cols)
            .map(|i| {
                let (r, c) = (i / cols, i % cols);
                x[i].to_f64() * scale as f64 + mask[(r % mask_rows) * cols + c].to_f64()
            })
            .collect();
        let want = softmax_rows(&scaled, cols, false);
        Ok(measured(&got, &want, |_| probability_floor::<T>(), &plan))
    });
    suite.case(&format!("softmax/scaled_causal/{at}"), tolerance_of::<T>(), |suite, rng| {
        let x = logits::<T>(rng, rows, cols);
        // [batch, queries, keys] with as many queries as fit the rows evenly.
        let queries = if rows % 3 == 0 { 3 } else { 1 };
        let shape = [rows / queries, queries, cols];
        let x_dev = Tensor::from_slice(&suite.gpu, &x, &shape)?;
        let mut output = suite.poisoned::<T>(rows * cols, 0)?;
        let mut y = output.view_mut().reshape(&shape)?;
        let plan = softmax.causal(&suite.stream, &x_dev, scale, &mut y)?;
        let got = output.to_vec()?;
        let scaled: Vec<f64> = (0..rows * cols)
            .map(|i| {
                let (r, c) = (i / cols, i % cols);
                if c <= r % queries { x[i].to_f64() * scale as f64 } else { f64::NEG_INFINITY }
            })
            .collect();
        let want = softmax_rows(&scaled, cols, false);
        Ok(measured(&got, &want, |_| probability_floor::<T>(), &plan))
    });
    let targets = |rng: &mut Rng| -> Vec<i64> {
        (0..rows).map(|r| if r % 5 == 4 { -100 } else { (rng.next_u64() % cols as u64) as i64 }).collect()
    };
    suite.case(&format!("softmax/cross_entropy/{at}"), tolerance_of::<T>(), |suite, rng| {
        let x = logits::<T>(rng, rows, cols);
        let target = targets(rng);
        let x_dev = Tensor::from_slice(&suite.gpu, &x, &[rows, cols])?;
        let target_dev = Tensor::from_slice(&suite.gpu, &target, &[rows])?;
        let mut loss = suite.poisoned::<f32>(rows, 0)?;
        let plan = softmax.cross_entropy(&suite.stream, &x_dev, &target_dev, &mut loss)?;
        let got = loss.to_vec()?;
        let want = cross_entropy_rows(&f64s(&x), &target, cols);
        // A loss is a log-probability: absolute error below 1.
        Ok(measured(&got, &want, |_| 1.0, &plan))
    });
    suite.case(&format!("softmax/logsumexp/{at}"), tolerance_of::<T>(), |suite, rng| {
        let x = logits::<T>(rng, rows, cols);
        let x_dev = Tensor::from_slice(&suite.gpu, &x, &[rows, cols])?;
        let mut out = suite.poisoned::<f32>(rows, 0)?;
        let plan = softmax.logsumexp(&suite.stream, &x_dev, &mut out)?;
        let want = logsumexp_rows(&f64s(&x), cols);
        // On the log scale: absolute error below 1.
        Ok(measured(&out.to_vec()?, &want, |_| 1.0, &plan))
    });
    suite.case(&format!("softmax/cross_entropy_backward/{at}"), tolerance_of::<T>(), |suite, rng| {
        let x: Vec<T> = (0..rows * cols).map(|_| T::from_f64(rng.uniform(-8.0, 8.0))).collect();
        let target = targets(rng);
        let dloss: Vec<f32> = (0..rows).map(|_| rng.uniform(-2.0, 2.0) as f32).collect();
        let x_dev = Tensor::from_slice(&suite.gpu, &x, &[rows, cols])?;
        let target_dev = Tensor::from_slice(&suite.gpu, &target, &[rows])?;
        let dloss_dev = Tensor::from_slice(&suite.gpu, &dloss, &[rows])?;
        let mut output = suite.poisoned::<T>(rows * cols, 0)?;
        let mut dx = output.view_mut().reshape(&[rows, cols])?;
        let plan = softmax.cross_entropy_backward(&suite.stream, &x_dev, &target_dev, &dloss_dev, &mut dx)?;
        let got = output.to_vec()?;
        let want = cross_entropy_backward_rows(&f64s(&x), &target, &f64s(&dloss), cols);
        let magnitude = cross_entropy_backward_magnitude_rows(&f64s(&x), &target, &f64s(&dloss), cols);
        let floor = probability_floor::<T>();
        Ok(measured(&got, &want, |i| magnitude[i].max(floor), &plan))
    });
}

/// Offsets (in elements) of the input, second input and output of the offset-view cases:
/// all one phase past 16 bytes (the block paths run each row from its head in full packs),
/// another shared phase, and mixed phases (packs of one).
const OFFSETS: [[usize; 3]; 3] = [[1, 1, 1], [3, 11, 3], [1, 1, 2]];

/// Views that start past a 16-byte boundary, on every path that takes the width. 2000 rows
/// of 4097 give each forced cluster several rows, so its prefetch of the next row (whose
/// head differs) is checked too.
fn offset_views<T: Element>(suite: &mut Suite) {
    let dtype = T::DTYPE.name();
    let widest = 16 / size_of::<T>();
    for (rows, cols) in [(7, 33), (5, 1000), (2000, 4097), (3, 12345), (6, 50257)] {
        for path in paths(suite, cols) {
            let softmax = path.map_or_else(Softmax::new, Softmax::forced);
            for offsets in OFFSETS {
                let at = format!("{dtype}/[{rows}, {cols}]/{}/offset={offsets:?}", path_name(path));
                let aligned = cols.is_multiple_of(widest) && offsets.iter().all(|o| o.is_multiple_of(widest));
                let shared = offsets.iter().all(|o| o % widest == offsets[0] % widest);
                let want_pack =
                    move |plan: &Plan| if aligned || (shared && plan.kind() != PathKind::Warp) { widest } else { 1 };
                offset_forward::<T>(suite, &at, softmax, rows, cols, offsets, want_pack);
                offset_logsumexp::<T>(suite, &at, softmax, rows, cols, offsets[0], want_pack);
                offset_backward::<T>(suite, &at, softmax, rows, cols, offsets, want_pack);
            }
        }
    }
}

/// `measured`, failing where the plan's pack is not `want_pack` or anything was written
/// before the output's view.
fn measured_view<T: Element>(
    all: &[T],
    offset: usize,
    want: &[f64],
    floor: impl Fn(usize) -> f64,
    plan: &Plan,
    want_pack: usize,
) -> Measured {
    if plan.pack != want_pack {
        return Measured { error: f64::INFINITY, detail: format!("pack {want_pack} expected; {}", plan.describe()) };
    }
    if all[..offset].iter().any(|v| !v.to_f64().is_nan()) {
        return Measured { error: f64::INFINITY, detail: format!("wrote before the output view; {}", plan.describe()) };
    }
    measured(&all[offset..], want, floor, plan)
}

fn offset_forward<T: Element>(
    suite: &mut Suite,
    at: &str,
    softmax: Softmax,
    rows: usize,
    cols: usize,
    [input, _, output]: [usize; 3],
    want_pack: impl Fn(&Plan) -> usize,
) {
    suite.case(&format!("softmax/offset_forward/{at}"), tolerance_of::<T>(), |suite, rng| {
        let x = logits::<T>(rng, rows, cols);
        let x_dev = suite.upload(&x, input)?;
        let mut out = suite.poisoned::<T>(rows * cols, output)?;
        let mut y = view_mut_at(&mut out, output, &[rows, cols])?;
        let plan = softmax.forward(&suite.stream, &view_at(&x_dev, input, &[rows, cols])?, &mut y, false)?;
        let want = softmax_rows(&f64s(&x), cols, false);
        Ok(measured_view(&out.to_vec()?, output, &want, |_| probability_floor::<T>(), &plan, want_pack(&plan)))
    });
}

fn offset_logsumexp<T: Element>(
    suite: &mut Suite,
    at: &str,
    softmax: Softmax,
    rows: usize,
    cols: usize,
    input: usize,
    want_pack: impl Fn(&Plan) -> usize,
) {
    suite.case(&format!("softmax/offset_logsumexp/{at}"), tolerance_of::<T>(), |suite, rng| {
        let x = logits::<T>(rng, rows, cols);
        let x_dev = suite.upload(&x, input)?;
        let mut out = suite.poisoned::<f32>(rows, 1)?;
        let mut values = view_mut_at(&mut out, 1, &[rows])?;
        let plan = softmax.logsumexp(&suite.stream, &view_at(&x_dev, input, &[rows, cols])?, &mut values)?;
        let want = logsumexp_rows(&f64s(&x), cols);
        Ok(measured_view(&out.to_vec()?, 1, &want, |_| 1.0, &plan, want_pack(&plan)))
    });
}

fn offset_backward<T: Element>(
    suite: &mut Suite,
    at: &str,
    softmax: Softmax,
    rows: usize,
    cols: usize,
    [input, second, output]: [usize; 3],
    want_pack: impl Fn(&Plan) -> usize,
) {
    suite.case(&format!("softmax/offset_log_backward/{at}"), tolerance_of::<T>(), |suite, rng| {
        let x: Vec<f64> = (0..rows * cols).map(|_| rng.uniform(-8.0, 8.0)).collect();
        let y: Vec<T> = softmax_rows(&x, cols, true).into_iter().map(T::from_f64).collect();
        let dy: Vec<T> = (0..rows * cols).map(|_| T::from_f64(rng.uniform(-1.0, 1.0))).collect();
        let (y_dev, dy_dev) = (suite.upload(&y, input)?, suite.upload(&dy, second)?);
        let mut out = suite.poisoned::<T>(rows * cols, output)?;
        let mut dx = view_mut_at(&mut out, output, &[rows, cols])?;
        let (y_view, dy_view) = (view_at(&y_dev, input, &[rows, cols])?, view_at(&dy_dev, second, &[rows, cols])?);
        let plan = softmax.backward(&suite.stream, &y_view, &dy_view, &mut dx, true)?;
        let want = softmax_backward_rows(&f64s(&y), &f64s(&dy), cols, true);
        let magnitude = softmax_backward_magnitude_rows(&f64s(&y), &f64s(&dy), cols, true);
        let floor = relative_floor(T::DTYPE);
        Ok(measured_view(&out.to_vec()?, output, &want, |i| magnitude[i].max(floor), &plan, want_pack(&plan)))
    });
}

fn bad_input(suite: &mut Suite) {
    let gpu = suite.gpu.clone();
    let make = move |shape: &[usize]| Tensor::<f32>::zeros(&gpu, shape);
    suite.rejects("softmax/errors/output-shape", |s| {
        let (x, mut y) = (make(&[4, 8])?, make(&[4, 9])?);
        rill::softmax::softmax(&s.stream, &x, &mut y).map(|_| ())
    });
    suite.rejects("softmax/errors/empty", |s| {
        let (x, mut y) = (make(&[0, 8])?, make(&[0, 8])?);
        rill::softmax::softmax(&s.stream, &x, &mut y).map(|_| ())
    });
    suite.rejects("softmax/errors/scalar", |s| {
        let (x, mut y) = (make(&[])?, make(&[])?);
        rill::softmax::softmax(&s.stream, &x, &mut y).map(|_| ())
    });
    suite.rejects("softmax/errors/mask-rows", |s| {
        let (x, mask, mut y) = (make(&[6, 8])?, make(&[4, 8])?, make(&[6, 8])?);
        rill::softmax::scaled_masked_softmax(&s.stream, &x, &mask, 1.0, &mut y).map(|_| ())
    });
    suite.rejects("softmax/errors/forced-warp-too-wide", |s| {
        let (x, mut y) = (make(&[2, 4096])?, make(&[2, 4096])?);
        Softmax::forced(PathKind::Warp).forward(&s.stream, &x, &mut y, false).map(|_| ())
    });
    suite.rejects("softmax/errors/target-shape", |s| {
        let x = make(&[4, 8])?;
        let target = Tensor::<i64>::zeros(&s.gpu, &[3])?;
        let mut loss = make(&[4])?;
        rill::softmax::cross_entropy(&s.stream, &x, &target, &mut loss).map(|_| ())
    });
}
