//! Softmax family: every width x rows x dtype, each path forced where the planner takes the
//! call, extreme and masked rows, the fused variants, and bad input.

use crate::harness::{Measured, Suite, tolerance_of, view_at, view_mut_at};
use half::{bf16, f16};
use rill::softmax::{PathKind, Plan, Softmax};
use rill::{Element, Tensor};
use rill_tests::check::{max_error_with_floor, relative_floor};
use rill_tests::paths::{Forced, Paths};
use rill_tests::random::Rng;
use rill_tests::reference::{
    cross_entropy_backward_magnitude_rows, cross_entropy_backward_rows, cross_entropy_rows, logsumexp_rows,
    softmax_backward_magnitude_rows, softmax_backward_rows, softmax_rows,
};
use rill_tests::shapes::{AHEAD_TEST_SHAPES, SOFTMAX_TEST_COLS, softmax_test_rows};

pub fn run(suite: &mut Suite) {
    for_dtype::<f32>(suite);
    for_dtype::<f16>(suite);
    for_dtype::<bf16>(suite);
    offset_views::<f32>(suite);
    offset_views::<f16>(suite);
    offset_views::<bf16>(suite);
    bad_input(suite);
}

/// A softmax-family call the suite makes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    Forward { log: bool },
    Backward { log: bool },
    ScaleMask,
    Causal,
    CrossEntropy,
    LogSumExp,
    CrossEntropyBackward,
}

impl Op {
    /// The forward and backward, each with and without the log.
    pub(crate) const PLAIN: [Op; 4] = [
        Op::Forward { log: false },
        Op::Backward { log: false },
        Op::Forward { log: true },
        Op::Backward { log: true },
    ];
    pub(crate) const FUSED: [Op; 5] =
        [Op::ScaleMask, Op::Causal, Op::CrossEntropy, Op::LogSumExp, Op::CrossEntropyBackward];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Forward { log: false } => "softmax",
            Op::Forward { log: true } => "log_softmax",
            Op::Backward { log: false } => "softmax_backward",
            Op::Backward { log: true } => "log_softmax_backward",
            Op::ScaleMask => "scaled_masked",
            Op::Causal => "scaled_causal",
            Op::CrossEntropy => "cross_entropy",
            Op::LogSumExp => "logsumexp",
            Op::CrossEntropyBackward => "cross_entropy_backward",
        }
    }

    /// The case named `name`: `softmax`'s call on random rows against f64.
    fn case<T: Element>(self, suite: &mut Suite, name: &str, softmax: Softmax, rows: usize, cols: usize) {
        match self {
            Op::Forward { log } => forward_case::<T>(suite, name, softmax, rows, cols, log),
            Op::Backward { log } => backward_case::<T>(suite, name, softmax, rows, cols, log),
            Op::ScaleMask => scale_mask_case::<T>(suite, name, softmax, rows, cols),
            Op::Causal => causal_case::<T>(suite, name, softmax, rows, cols),
            Op::CrossEntropy => cross_entropy_case::<T>(suite, name, softmax, rows, cols),
            Op::LogSumExp => logsumexp_case::<T>(suite, name, softmax, rows, cols),
            Op::CrossEntropyBackward => cross_entropy_backward_case::<T>(suite, name, softmax, rows, cols),
        }
    }

    /// Asks the planner about the call on zeroed arrays of its case's shapes (only their
    /// shapes and addresses count), x, the second input and the output (logsumexp's: its f32
    /// per-row values) `offsets` elements into their allocations.
    fn ask<T: Element>(self, suite: &Suite, rows: usize, cols: usize, offsets: [usize; 3]) -> rill::Result<Paths> {
        let [input, second, output] = offsets;
        let gpu = &suite.gpu;
        let zeros = |offset: usize| Tensor::<T>::zeros(gpu, &[rows * cols + offset]);
        let shape = [rows, cols];
        let (x_dev, mut out_dev) = (zeros(input)?, zeros(output)?);
        let x = view_at(&x_dev, input, &shape)?;
        let mut y = view_mut_at(&mut out_dev, output, &shape)?;
        let target = Tensor::<i64>::zeros(gpu, &[rows])?;
        let mut row_values = Tensor::<f32>::zeros(gpu, &[rows])?;
        let stream = &suite.stream;
        let plan_only = |path| softmax_on(path).plan_only();
        match self {
            Op::Forward { log } => Paths::ask(|path| plan_only(path).forward(stream, &x, &mut y, log)),
            Op::Backward { log } => {
                let dy_dev = zeros(second)?;
                let dy = view_at(&dy_dev, second, &shape)?;
                Paths::ask(|path| plan_only(path).backward(stream, &x, &dy, &mut y, log))
            }
            Op::ScaleMask => {
                let mask = Tensor::<T>::zeros(gpu, &[mask_rows(rows), cols])?;
                Paths::ask(|path| plan_only(path).scale_mask(stream, &x, &mask, SCALE, &mut y))
            }
            Op::Causal => {
                let shape = causal_shape(rows, cols);
                let (x, mut y) = (x.reshape(&shape)?, y.reshape(&shape)?);
                Paths::ask(|path| plan_only(path).causal(stream, &x, SCALE, &mut y))
            }
            Op::CrossEntropy => Paths::ask(|path| plan_only(path).cross_entropy(stream, &x, &target, &mut row_values)),
            Op::LogSumExp => {
                let mut values_dev = Tensor::<f32>::zeros(gpu, &[rows + output])?;
                let mut values = view_mut_at(&mut values_dev, output, &[rows])?;
                Paths::ask(|path| plan_only(path).logsumexp(stream, &x, &mut values))
            }
            Op::CrossEntropyBackward => {
                Paths::ask(|path| plan_only(path).cross_entropy_backward(stream, &x, &target, &row_values, &mut y))
            }
        }
    }
}

pub(crate) fn softmax_on(path: Option<PathKind>) -> Softmax {
    path.map_or_else(Softmax::new, Softmax::forced)
}

pub(crate) fn path_name(path: Option<PathKind>) -> String {
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

pub(crate) fn f64s<T: Element>(v: &[T]) -> Vec<f64> {
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
    let swept = SOFTMAX_TEST_COLS.iter().flat_map(|&cols| softmax_test_rows(cols).map(|rows| (rows, cols)));
    for (rows, cols) in swept.chain(AHEAD_TEST_SHAPES.iter().copied()) {
        // Forced paths on the smallest and largest row counts of the sweep only (the fused
        // ops' on the largest).
        let largest = rows == softmax_test_rows(cols)[3];
        let plain = Op::PLAIN.map(|op| (op, rows != 2 && (rows < 4 || largest)));
        let fused = Op::FUSED.map(|op| (op, largest));
        for (op, forced) in plain.into_iter().chain(fused) {
            let name = |path| format!("softmax/{}/{dtype}/[{rows}, {cols}]/{}", op.name(), path_name(path));
            let ask = |suite: &Suite| op.ask::<T>(suite, rows, cols, [0; 3]);
            for path in suite.paths(forced.then_some(Forced::All), name, ask) {
                op.case::<T>(suite, &name(path), softmax_on(path), rows, cols);
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

/// Scale of the scaled ops' logits.
const SCALE: f32 = 0.125;

/// Rows of the mask for `rows` rows of input: a divisor, broadcast like `[seq_q, seq_k]`
/// over heads.
fn mask_rows(rows: usize) -> usize {
    if rows % 3 == 0 { 3 } else { 1 }
}

/// `[batch, queries, keys]` for `rows` rows of `cols`, with as many queries as fit the rows
/// evenly.
fn causal_shape(rows: usize, cols: usize) -> [usize; 3] {
    let queries = if rows % 3 == 0 { 3 } else { 1 };
    [rows / queries, queries, cols]
}

/// A target per row: every fifth ignored (-100), the rest in the row.
fn targets(rng: &mut Rng, rows: usize, cols: usize) -> Vec<i64> {
    (0..rows).map(|r| if r % 5 == 4 { -100 } else { (rng.next_u64() % cols as u64) as i64 }).collect()
}

/// Scale + mask, with a fully masked row where the mask has three.
fn scale_mask_case<T: Element>(suite: &mut Suite, name: &str, softmax: Softmax, rows: usize, cols: usize) {
    suite.case(name, tolerance_of::<T>(), |suite, rng| {
        let x = logits::<T>(rng, rows, cols);
        let mask_rows = mask_rows(rows);
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
        let plan = softmax.scale_mask(&suite.stream, &x_dev, &mask_dev, SCALE, &mut y)?;
        let got = output.to_vec()?;
        let scaled: Vec<f64> = (0..rows * cols)
            .map(|i| {
                let (r, c) = (i / cols, i % cols);
                x[i].to_f64() * SCALE as f64 + mask[(r % mask_rows) * cols + c].to_f64()
            })
            .collect();
        let want = softmax_rows(&scaled, cols, false);
        Ok(measured(&got, &want, |_| probability_floor::<T>(), &plan))
    });
}

fn causal_case<T: Element>(suite: &mut Suite, name: &str, softmax: Softmax, rows: usize, cols: usize) {
    suite.case(name, tolerance_of::<T>(), |suite, rng| {
        let x = logits::<T>(rng, rows, cols);
        let shape = causal_shape(rows, cols);
        let x_dev = Tensor::from_slice(&suite.gpu, &x, &shape)?;
        let mut output = suite.poisoned::<T>(rows * cols, 0)?;
        let mut y = output.view_mut().reshape(&shape)?;
        let plan = softmax.causal(&suite.stream, &x_dev, SCALE, &mut y)?;
        let got = output.to_vec()?;
        Ok(measured(&got, &causal_want(&x, rows, cols), |_| probability_floor::<T>(), &plan))
    });
}

/// The causal softmax of `x` (`rows x cols`, shaped by [`causal_shape`]) in f64.
fn causal_want<T: Element>(x: &[T], rows: usize, cols: usize) -> Vec<f64> {
    let queries = causal_shape(rows, cols)[1];
    let scaled: Vec<f64> = (0..rows * cols)
        .map(|i| {
            let (r, c) = (i / cols, i % cols);
            if c <= r % queries { x[i].to_f64() * SCALE as f64 } else { f64::NEG_INFINITY }
        })
        .collect();
    softmax_rows(&scaled, cols, false)
}

fn cross_entropy_case<T: Element>(suite: &mut Suite, name: &str, softmax: Softmax, rows: usize, cols: usize) {
    suite.case(name, tolerance_of::<T>(), |suite, rng| {
        let x = logits::<T>(rng, rows, cols);
        let target = targets(rng, rows, cols);
        let x_dev = Tensor::from_slice(&suite.gpu, &x, &[rows, cols])?;
        let target_dev = Tensor::from_slice(&suite.gpu, &target, &[rows])?;
        let mut loss = suite.poisoned::<f32>(rows, 0)?;
        let plan = softmax.cross_entropy(&suite.stream, &x_dev, &target_dev, &mut loss)?;
        let got = loss.to_vec()?;
        let want = cross_entropy_rows(&f64s(&x), &target, cols);
        // A loss is a log-probability: absolute error below 1.
        Ok(measured(&got, &want, |_| 1.0, &plan))
    });
}

fn logsumexp_case<T: Element>(suite: &mut Suite, name: &str, softmax: Softmax, rows: usize, cols: usize) {
    suite.case(name, tolerance_of::<T>(), |suite, rng| {
        let x = logits::<T>(rng, rows, cols);
        let x_dev = Tensor::from_slice(&suite.gpu, &x, &[rows, cols])?;
        let mut out = suite.poisoned::<f32>(rows, 0)?;
        let plan = softmax.logsumexp(&suite.stream, &x_dev, &mut out)?;
        let want = logsumexp_rows(&f64s(&x), cols);
        // On the log scale: absolute error below 1.
        Ok(measured(&out.to_vec()?, &want, |_| 1.0, &plan))
    });
}

fn cross_entropy_backward_case<T: Element>(suite: &mut Suite, name: &str, softmax: Softmax, rows: usize, cols: usize) {
    suite.case(name, tolerance_of::<T>(), |suite, rng| {
        let grad = CrossEntropyGrad::<T>::random(rng, rows, cols);
        let x_dev = Tensor::from_slice(&suite.gpu, &grad.x, &[rows, cols])?;
        let target_dev = Tensor::from_slice(&suite.gpu, &grad.target, &[rows])?;
        let dloss_dev = Tensor::from_slice(&suite.gpu, &grad.dloss, &[rows])?;
        let mut output = suite.poisoned::<T>(rows * cols, 0)?;
        let mut dx = output.view_mut().reshape(&[rows, cols])?;
        let plan = softmax.cross_entropy_backward(&suite.stream, &x_dev, &target_dev, &dloss_dev, &mut dx)?;
        let got = output.to_vec()?;
        let (want, floors) = grad.want(cols);
        Ok(measured(&got, &want, |i| floors[i], &plan))
    });
}

/// Cross entropy backward's inputs: logits in [-8, 8), a target per row and a loss
/// gradient per row in [-2, 2).
struct CrossEntropyGrad<T> {
    x: Vec<T>,
    target: Vec<i64>,
    dloss: Vec<f32>,
}

impl<T: Element> CrossEntropyGrad<T> {
    fn random(rng: &mut Rng, rows: usize, cols: usize) -> Self {
        let x = (0..rows * cols).map(|_| T::from_f64(rng.uniform(-8.0, 8.0))).collect();
        let target = targets(rng, rows, cols);
        let dloss = (0..rows).map(|_| rng.uniform(-2.0, 2.0) as f32).collect();
        CrossEntropyGrad { x, target, dloss }
    }

    /// dlogits in f64, and each element's error floor: the magnitude of its terms (they
    /// cancel), at least the probability floor.
    fn want(&self, cols: usize) -> (Vec<f64>, Vec<f64>) {
        let (x, dloss) = (f64s(&self.x), f64s(&self.dloss));
        let want = cross_entropy_backward_rows(&x, &self.target, &dloss, cols);
        let magnitude = cross_entropy_backward_magnitude_rows(&x, &self.target, &dloss, cols);
        (want, magnitude.into_iter().map(|m| m.max(probability_floor::<T>())).collect())
    }
}

/// Offsets (in elements) of the input, second input and output of the offset-view cases:
/// all one phase past 16 bytes (the block paths run each row from its head in full packs),
/// another shared phase, and mixed phases (packs of one).
const OFFSETS: [[usize; 3]; 3] = [[1, 1, 1], [3, 11, 3], [1, 1, 2]];

/// Views that start past a 16-byte boundary, on every path the planner takes them on.
/// 2000 rows of 4097 give each forced cluster several rows, so its prefetch of the next row
/// (whose head differs) is checked too.
fn offset_views<T: Element>(suite: &mut Suite) {
    let dtype = T::DTYPE.name();
    for (rows, cols) in [(7usize, 33usize), (5, 1000), (2000, 4097), (3, 12345), (6, 50257)] {
        for offsets in OFFSETS {
            let pack = want_pack::<T>(cols, &offsets);
            let at = |path| format!("{dtype}/[{rows}, {cols}]/{}/offset={offsets:?}", path_name(path));
            let forward = |path| format!("softmax/offset_forward/{}", at(path));
            let ask = |suite: &Suite| Op::Forward { log: false }.ask::<T>(suite, rows, cols, offsets);
            for path in suite.paths(Some(Forced::All), forward, ask) {
                offset_forward::<T>(suite, &forward(path), softmax_on(path), false, rows, cols, offsets, pack);
            }
            // logsumexp's only row array is x (its pack is x's alone); its f32 values start one
            // element in.
            let logsumexp_offsets = [offsets[0], 0, 1];
            let logsumexp_pack = want_pack::<T>(cols, &offsets[..1]);
            let logsumexp = |path| format!("softmax/offset_logsumexp/{}", at(path));
            let ask = |suite: &Suite| Op::LogSumExp.ask::<T>(suite, rows, cols, logsumexp_offsets);
            for path in suite.paths(Some(Forced::All), logsumexp, ask) {
                let softmax = softmax_on(path);
                offset_logsumexp::<T>(suite, &logsumexp(path), softmax, rows, cols, logsumexp_offsets, logsumexp_pack);
            }
            let backward = |path| format!("softmax/offset_log_backward/{}", at(path));
            let ask = |suite: &Suite| Op::Backward { log: true }.ask::<T>(suite, rows, cols, offsets);
            for path in suite.paths(Some(Forced::All), backward, ask) {
                offset_backward::<T>(suite, &backward(path), softmax_on(path), rows, cols, offsets, pack);
            }
            // Causal and cross entropy backward read x and write one output: their pack is
            // theirs alone (mixed, they are the only cases of their pack-1 block kernels).
            let x_and_output = want_pack::<T>(cols, &[offsets[0], offsets[2]]);
            let causal = |path| format!("softmax/offset_causal/{}", at(path));
            let ask = |suite: &Suite| Op::Causal.ask::<T>(suite, rows, cols, offsets);
            for path in suite.paths(Some(Forced::All), causal, ask) {
                offset_forward::<T>(suite, &causal(path), softmax_on(path), true, rows, cols, offsets, x_and_output);
            }
            let grad = |path| format!("softmax/offset_cross_entropy_backward/{}", at(path));
            let ask = |suite: &Suite| Op::CrossEntropyBackward.ask::<T>(suite, rows, cols, offsets);
            for path in suite.paths(Some(Forced::All), grad, ask) {
                let softmax = softmax_on(path);
                offset_cross_entropy_backward::<T>(suite, &grad(path), softmax, rows, cols, offsets, x_and_output);
            }
        }
    }
}

/// The pack a plan should have for rows of `cols` whose row arrays start `offsets` elements
/// into their allocations: the widest where the rows and every array are aligned to it, or
/// on the block paths where the arrays share one phase (they run each row from its head);
/// else 1.
fn want_pack<T: Element>(cols: usize, offsets: &[usize]) -> impl Fn(&Plan) -> usize + Copy + use<T> {
    let widest = 16 / size_of::<T>();
    let aligned = cols.is_multiple_of(widest) && offsets.iter().all(|o| o.is_multiple_of(widest));
    let shared = offsets.iter().all(|o| o % widest == offsets[0] % widest);
    move |plan: &Plan| if aligned || (shared && plan.kind() != PathKind::Warp) { widest } else { 1 }
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

/// Softmax (or, where `causal`, the causal softmax) of x `input` elements into its
/// allocation, into y `output` elements into its own.
#[allow(clippy::too_many_arguments)]
fn offset_forward<T: Element>(
    suite: &mut Suite,
    name: &str,
    softmax: Softmax,
    causal: bool,
    rows: usize,
    cols: usize,
    [input, _, output]: [usize; 3],
    want_pack: impl Fn(&Plan) -> usize,
) {
    suite.case(name, tolerance_of::<T>(), |suite, rng| {
        let x = logits::<T>(rng, rows, cols);
        let shape = if causal { causal_shape(rows, cols).to_vec() } else { vec![rows, cols] };
        let x_dev = suite.upload(&x, input)?;
        let mut out = suite.poisoned::<T>(rows * cols, output)?;
        let mut y = view_mut_at(&mut out, output, &shape)?;
        let x_view = view_at(&x_dev, input, &shape)?;
        let (plan, want) = if causal {
            (softmax.causal(&suite.stream, &x_view, SCALE, &mut y)?, causal_want(&x, rows, cols))
        } else {
            (softmax.forward(&suite.stream, &x_view, &mut y, false)?, softmax_rows(&f64s(&x), cols, false))
        };
        Ok(measured_view(&out.to_vec()?, output, &want, |_| probability_floor::<T>(), &plan, want_pack(&plan)))
    });
}

fn offset_logsumexp<T: Element>(
    suite: &mut Suite,
    name: &str,
    softmax: Softmax,
    rows: usize,
    cols: usize,
    [input, _, output]: [usize; 3],
    want_pack: impl Fn(&Plan) -> usize,
) {
    suite.case(name, tolerance_of::<T>(), |suite, rng| {
        let x = logits::<T>(rng, rows, cols);
        let x_dev = suite.upload(&x, input)?;
        let mut out = suite.poisoned::<f32>(rows, output)?;
        let mut values = view_mut_at(&mut out, output, &[rows])?;
        let plan = softmax.logsumexp(&suite.stream, &view_at(&x_dev, input, &[rows, cols])?, &mut values)?;
        let want = logsumexp_rows(&f64s(&x), cols);
        Ok(measured_view(&out.to_vec()?, output, &want, |_| 1.0, &plan, want_pack(&plan)))
    });
}

fn offset_backward<T: Element>(
    suite: &mut Suite,
    name: &str,
    softmax: Softmax,
    rows: usize,
    cols: usize,
    [input, second, output]: [usize; 3],
    want_pack: impl Fn(&Plan) -> usize,
) {
    suite.case(name, tolerance_of::<T>(), |suite, rng| {
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

fn offset_cross_entropy_backward<T: Element>(
    suite: &mut Suite,
    name: &str,
    softmax: Softmax,
    rows: usize,
    cols: usize,
    [input, _, output]: [usize; 3],
    want_pack: impl Fn(&Plan) -> usize,
) {
    suite.case(name, tolerance_of::<T>(), |suite, rng| {
        let grad = CrossEntropyGrad::<T>::random(rng, rows, cols);
        let x_dev = suite.upload(&grad.x, input)?;
        let target_dev = Tensor::from_slice(&suite.gpu, &grad.target, &[rows])?;
        let dloss_dev = Tensor::from_slice(&suite.gpu, &grad.dloss, &[rows])?;
        let mut out = suite.poisoned::<T>(rows * cols, output)?;
        let mut dx = view_mut_at(&mut out, output, &[rows, cols])?;
        let x = view_at(&x_dev, input, &[rows, cols])?;
        let plan = softmax.cross_entropy_backward(&suite.stream, &x, &target_dev, &dloss_dev, &mut dx)?;
        let (want, floors) = grad.want(cols);
        Ok(measured_view(&out.to_vec()?, output, &want, |i| floors[i], &plan, want_pack(&plan)))
    });
}

/// The case refusing a masked call over more rows than the kernels index.
const MASK_OVER_MAX_ROWS: &str = "softmax/errors/mask-over-max-rows";

/// The driver's `CUDA_ERROR_OUT_OF_MEMORY`.
const OUT_OF_MEMORY: u32 = 2;

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
    if suite.wants(MASK_OVER_MAX_ROWS) {
        // 2^32 rows of one bf16 element: 8 GiB each for x and y, real memory, refused
        // before any launch. A GPU that cannot hold them skips the case in one line.
        let rows = rill::softmax::MASKED_MAX_ROWS as usize + 1;
        let gpu = suite.gpu.clone();
        let zeros = |shape: &[usize]| Tensor::<bf16>::zeros(&gpu, shape);
        match (|| Ok((zeros(&[rows, 1])?, zeros(&[1, 1])?, zeros(&[rows, 1])?)))() {
            Err(rill::Error::Driver { code: OUT_OF_MEMORY, .. }) => {
                println!("{MASK_OVER_MAX_ROWS}: skipped, the GPU cannot hold two 8 GiB arrays")
            }
            arrays => suite.rejects(MASK_OVER_MAX_ROWS, |s| {
                let (x, mask, mut y) = arrays?;
                rill::softmax::scaled_masked_softmax(&s.stream, &x, &mask, 1.0, &mut y).map(|_| ())
            }),
        }
    }
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
