//! LayerNorm and RMSNorm: every width x rows x dtype (weight and bias in f32 and in the
//! input's dtype, f32 written as f16 and bf16), each path forced where the planner takes
//! the call, misaligned views (pack 1), the fusions (residual add, saved statistics), the
//! backward against the analytic f64 reference and against finite differences, the
//! parameter gradients, constant rows, rows far from 0, eps, and bad input.
//!
//! Every case is named `norm/<op>/...` (the ladder's are `norm_ladder/...`), so `norm/`
//! selects these alone.

use crate::harness::{Measured, Suite, view_at, view_mut_at};
use half::{bf16, f16};
use rill::norm::{Backward, Forward, GradParams, Norm, NormKind, PathKind, Plan};
use rill::{DType, Element, Tensor, View, ViewMut};
use rill_kernels_gpu::abi::max_pack;
use rill_tests::check::{Worst, max_error_of, max_error_with_floor, relative_floor};
use rill_tests::paths::{Forced, Paths};
use rill_tests::random::Rng;
use rill_tests::reference::{
    norm_apply_rows, norm_backward_magnitude_rows, norm_backward_rows, norm_param_grads, norm_rows, norm_stats_rows,
};
use rill_tests::shapes::{NORM_TEST_COLS, norm_test_rows};

const EPS: f32 = 1e-5;

/// Relative error bound of a norm output stored as `dtype` (measured against the larger
/// of the value and a floor of about the normalized scale): a few f32 ulps, or half an
/// ulp of f16 (2^-11) and bf16 (2^-8) with room for the f32 math before the rounding.
pub(crate) fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        DType::I64 | DType::U32 | DType::I8 => 0.0,
    }
}

/// dweight and dbias add up to `rows` f32 terms: their error is measured against the sum
/// of the terms' magnitudes.
pub(crate) const PARAM_GRAD_TOLERANCE: f64 = 1e-4;

/// The per-row statistics are f32 whatever the dtypes.
pub(crate) const STATS_TOLERANCE: f64 = 1e-5;

/// Finite differences (f64, central, step 1e-3 of the row's scale) against the backward.
const FINITE_DIFFERENCE_TOLERANCE: f64 = 1e-2;

/// The mean is an f32: its rounding (a few ulps, 2^-22 relative) reaches y multiplied by
/// rstd and the weight. Negligible for ordinary rows (|mean| * rstd of a few), it dominates
/// where the mean dwarfs the spread (constant rows, 1e4 plus noise), and y's floor allows it.
const MEAN_ROUNDING: f64 = 1.0 / (1u64 << 22) as f64;

/// The floor of y's element `i` (relative error is measured against the larger of it and
/// the value), for outputs within `tolerance`: normalized outputs are held to an absolute
/// error below 1, plus the mean's f32 rounding times rstd and the weight.
pub(crate) fn y_floor<'a>(
    stats: &'a [(f64, f64)],
    cols: usize,
    weight: Option<&'a [f64]>,
    tolerance: f64,
) -> impl Fn(usize) -> f64 + 'a {
    move |i| {
        let (mean, rstd) = stats[i / cols];
        1.0 + MEAN_ROUNDING * mean.abs() * rstd * weight.map_or(1.0, |w| w[i % cols].abs()) / tolerance
    }
}

/// Each row's root mean square, the scale of its mean's rounding, which the mean is
/// measured against.
pub(crate) fn mean_scale(input: &[f64], cols: usize) -> Vec<f64> {
    input
        .chunks(cols)
        .map(|row| (row.iter().map(|v| v * v).sum::<f64>() / cols as f64).sqrt().max(f32::MIN_POSITIVE as f64))
        .collect()
}

/// The floor of row `r`'s rstd, for rstd within `tolerance`. A row whose spread is small
/// against its mean loses about `|mean| * rstd` f32 roundings of rstd to the mean's own
/// rounding (rows of two near-equal elements: 1e-5 at a ratio of 300), which no order of
/// summation avoids.
pub(crate) fn rstd_floor(stats: &[(f64, f64)], tolerance: f64) -> impl Fn(usize) -> f64 + '_ {
    move |r| {
        let (mean, rstd) = stats[r];
        rstd.abs() * (MEAN_ROUNDING * mean.abs() * rstd / tolerance).max(1.0)
    }
}

pub fn run(suite: &mut Suite) {
    matrix::<f32, f32, f32>(suite, Coverage::Full);
    matrix::<f16, f16, f16>(suite, Coverage::Full);
    matrix::<bf16, bf16, bf16>(suite, Coverage::Full);
    matrix::<f16, f16, f32>(suite, Coverage::Weights);
    matrix::<bf16, bf16, f32>(suite, Coverage::Weights);
    matrix::<f32, f16, f32>(suite, Coverage::Cast);
    matrix::<f32, bf16, f32>(suite, Coverage::Cast);
    variants::<f32>(suite);
    variants::<f16>(suite);
    variants::<bf16>(suite);
    misaligned::<f32>(suite);
    misaligned::<f16>(suite);
    misaligned::<bf16>(suite);
    special_rows::<f32>(suite);
    special_rows::<f16>(suite);
    special_rows::<bf16>(suite);
    widest_gathering::<f32>(suite);
    widest_gathering::<bf16>(suite);
    staged_gathering::<f32>(suite);
    staged_gathering::<f16>(suite);
    staged_gathering::<bf16>(suite);
    finite_differences(suite);
    bad_input(suite);
    // Last: it faulted before the parameter gradients skipped an absent dweight, and a
    // faulted context fails every case after it.
    dbias_without_dweight(suite);
}

// ---------------------------------------------------------------------------------------------
// What a case runs
// ---------------------------------------------------------------------------------------------

/// Which norm, with which optional parts.
#[derive(Clone, Copy, Debug)]
struct Spec {
    kind: NormKind,
    weight: bool,
    /// LayerNorm's bias (forward only; the backward's dbias comes with `extras`).
    bias: bool,
    /// Normalizes `x + residual`, writing the sum (forward only).
    residual: bool,
    /// The forward saves mean (LayerNorm) and rstd; the backward computes dweight (and
    /// dbias for LayerNorm).
    extras: bool,
    /// Gives the weight after the other parts (forward: the residual, statistics and bias;
    /// backward: the mean, dbias and dweight), so another part fixes the parameter dtype.
    weight_last: bool,
    eps: f32,
}

impl Spec {
    /// LayerNorm with weight and bias, saving its statistics.
    const LAYER: Spec = Spec {
        kind: NormKind::LayerNorm,
        weight: true,
        bias: true,
        residual: false,
        extras: true,
        weight_last: false,
        eps: EPS,
    };
    /// RMSNorm with a weight, saving rstd.
    const RMS: Spec = Spec {
        kind: NormKind::RmsNorm,
        weight: true,
        bias: false,
        residual: false,
        extras: true,
        weight_last: false,
        eps: EPS,
    };

    fn rms(&self) -> bool {
        self.kind == NormKind::RmsNorm
    }

    fn add(self) -> Spec {
        Spec { residual: true, ..self }
    }

    fn plain(self) -> Spec {
        Spec { weight: false, bias: false, extras: false, ..self }
    }

    fn eps(self, eps: f32) -> Spec {
        Spec { eps, ..self }
    }

    fn weight_last(self) -> Spec {
        Spec { weight_last: true, ..self }
    }

    /// An eps other than [`EPS`], for the case's name.
    fn eps_name(&self) -> String {
        if self.eps == EPS { String::new() } else { format!("/eps={}", self.eps) }
    }

    fn forward_op(&self) -> String {
        format!("{}{}", if self.residual { "add_" } else { "" }, self.kind.name())
    }

    /// The optional parts, for the case's name: the weight first or last, as given.
    fn tag(&self, backward: bool) -> String {
        let mut parts = Vec::new();
        if self.bias && !backward {
            parts.push("b");
        }
        if self.extras {
            parts.push(if backward { "grads" } else { "stats" });
        }
        if self.weight {
            parts.insert(if self.weight_last { parts.len() } else { 0 }, "w");
        }
        if parts.is_empty() { "plain".into() } else { parts.join(",") }
    }
}

/// Elements before each array's view (0 or 1: one element makes every pack misaligned).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Offsets {
    /// x, the residual, dy, and the statistics the backward reads.
    input: usize,
    /// y, the sum, dx, the saved statistics, dweight and dbias.
    output: usize,
    /// The weight and the bias.
    param: usize,
}

const ALIGNED: Offsets = Offsets { input: 0, output: 0, param: 0 };
const MISALIGNED: Offsets = Offsets { input: 1, output: 1, param: 1 };

/// The shape, path and offsets of a case.
#[derive(Clone, Copy, Debug)]
struct At {
    rows: usize,
    cols: usize,
    path: Option<PathKind>,
    offsets: Offsets,
}

impl At {
    fn new(rows: usize, cols: usize, path: Option<PathKind>) -> At {
        At { rows, cols, path, offsets: ALIGNED }
    }

    fn offset(self, offsets: Offsets) -> At {
        At { offsets, ..self }
    }

    fn on(self, path: Option<PathKind>) -> At {
        At { path, ..self }
    }

    fn norm(&self) -> Norm {
        norm_on(self.path)
    }

    fn name(&self) -> String {
        let path = self.path.map_or("auto".into(), |p| format!("{p:?}").to_lowercase());
        let o = self.offsets;
        let offsets =
            if o == ALIGNED { String::new() } else { format!("/offset={},{},{}", o.input, o.output, o.param) };
        format!("[{}, {}]/{path}{offsets}", self.rows, self.cols)
    }
}

/// What the rows hold.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Data {
    /// Rows of three scales (1, 100, 0.01, cycling), each around an offset of up to twice
    /// its scale: LayerNorm centers them, RMSNorm sees their mean.
    Mixed,
    /// One value per row (0 in the first row, else a multiple of 1/8 in [-4, 4], so sums are
    /// exact): variance 0.
    Constant,
    /// 1e4 plus N(0, 1) noise: E[x^2] - E[x]^2 would cancel to nothing in f32.
    Offset1e4,
}

impl Data {
    fn generate<T: Element>(self, rng: &mut Rng, rows: usize, cols: usize) -> Vec<T> {
        let mut x = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            match self {
                Data::Mixed => {
                    let scale = [1.0, 100.0, 0.01][r % 3];
                    let offset = rng.uniform(-2.0, 2.0) * scale;
                    x.extend((0..cols).map(|_| T::from_f64(offset + scale * rng.uniform(-1.0, 1.0))));
                }
                Data::Constant => {
                    let eighths = if r == 0 { 0.0 } else { (rng.uniform(-32.0, 32.0).round()).clamp(-32.0, 32.0) };
                    x.extend(std::iter::repeat_n(T::from_f64(eighths / 8.0), cols));
                }
                Data::Offset1e4 => x.extend((0..cols).map(|_| T::from_f64(1e4 + normal(rng)))),
            }
        }
        x
    }

    fn name(self) -> &'static str {
        match self {
            Data::Mixed => "",
            Data::Constant => "/constant",
            Data::Offset1e4 => "/1e4+noise",
        }
    }
}

/// A standard normal sample (Box-Muller).
fn normal(rng: &mut Rng) -> f64 {
    let u = 1.0 - rng.uniform(0.0, 1.0);
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * rng.uniform(0.0, 1.0)).cos()
}

fn values<T: Element>(rng: &mut Rng, len: usize, lo: f64, hi: f64) -> Vec<T> {
    (0..len).map(|_| T::from_f64(rng.uniform(lo, hi))).collect()
}

/// Weights of magnitude 0.5 to 1.5, either sign.
fn weights<G: Element>(rng: &mut Rng, cols: usize) -> Vec<G> {
    (0..cols)
        .map(|_| {
            let m = rng.uniform(0.5, 1.5);
            G::from_f64(if rng.next_u64() & 1 == 0 { m } else { -m })
        })
        .collect()
}

fn f64s<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// `x + residual` as the kernel forms it: added in f32, rounded to nearest even `T`.
fn residual_sum<T: Element>(x: &[T], residual: &[T]) -> Vec<T> {
    x.iter().zip(residual).map(|(a, b)| T::from_f64(round_to::<T>(a.to_f64() as f32 + b.to_f64() as f32))).collect()
}

/// `v` rounded to nearest even `T`, through half's f32 conversions: its f64 ones (half 1.8,
/// behind `Element::from_f64`) drop the bits below the rounding bit, so -135.31259 becomes
/// f16 -135.25 rather than -135.375. `T::from_f64` of the (representable) result is exact.
fn round_to<T: Element>(v: f32) -> f64 {
    match T::DTYPE {
        DType::F16 => f16::from_f32(v).to_f64(),
        DType::BF16 => bf16::from_f32(v).to_f64(),
        DType::F32 | DType::I64 | DType::U32 | DType::I8 => v as f64,
    }
}

fn dtypes<T: Element, U: Element, G: Element>(weight: bool) -> String {
    let mut s = T::DTYPE.name().to_string();
    if U::DTYPE != T::DTYPE {
        s += &format!("->{}", U::DTYPE.name());
    }
    if weight {
        s += &format!(",w={}", G::DTYPE.name());
    }
    s
}

// ---------------------------------------------------------------------------------------------
// Paths
// ---------------------------------------------------------------------------------------------

/// A case's call on its arrays, with the `Norm` given (plan-only or not).
type Call<'c> = dyn FnMut(Norm) -> rill::Result<Plan> + 'c;

fn norm_on(path: Option<PathKind>) -> Norm {
    path.map_or_else(Norm::new, Norm::forced)
}

/// What the planner answers about `call` ([`Paths::ask`]).
fn ask_planner(call: &mut Call<'_>) -> rill::Result<Paths> {
    Paths::ask(|path| call(norm_on(path).plan_only()))
}

/// A case's plans: its call's, plan-only, and the launch's, on the same arrays.
struct Plans {
    predicted: Plan,
    launched: Plan,
}

impl Plans {
    fn of(at: &At, call: &mut Call<'_>) -> rill::Result<Plans> {
        Ok(Plans { predicted: call(at.norm().plan_only())?, launched: call(at.norm())? })
    }
}

/// `forward_case` on the dispatcher's path and, where `forced`, on every other path the
/// planner takes the call on (asked on zeroed arrays: only their shapes and addresses count).
fn forward_cases<T: Element, U: Element, G: Element>(suite: &mut Suite, spec: Spec, at: At, data: Data, forced: bool) {
    let name = |path| forward_name::<T, U, G>(&spec, &at.on(path), data);
    let ask = |suite: &Suite| {
        let (x, params) = (vec![T::default(); at.rows * at.cols], vec![G::default(); at.cols]);
        let inputs = ForwardInputs {
            x: &x,
            residual: spec.residual.then_some(&x[..]),
            weight: spec.weight.then_some(&params[..]),
            bias: spec.bias.then_some(&params[..]),
        };
        with_forward::<T, U, G, _>(suite, &spec, &at, inputs, ask_planner).map(|(paths, _)| paths)
    };
    for path in suite.paths(forced.then_some(Forced::Others), name, ask) {
        forward_case::<T, U, G>(suite, spec, at.on(path), data);
    }
}

/// `backward_case` on the dispatcher's path and, where `forced`, on every other path the
/// planner takes the call on (asked on zeroed arrays: only their shapes and addresses count).
fn backward_cases<T: Element, G: Element>(suite: &mut Suite, spec: Spec, at: At, data: Data, forced: bool) {
    let name = |path| backward_name::<T, G>(&spec, &at.on(path), data);
    let ask = |suite: &Suite| {
        let (x, weight) = (vec![T::default(); at.rows * at.cols], vec![G::default(); at.cols]);
        let stats = vec![(0.0, 0.0); at.rows];
        let inputs = BackwardInputs { x: &x, dy: &x, stats: &stats, weight: spec.weight.then_some(&weight[..]) };
        with_backward::<T, G, _>(suite, &spec, &at, inputs, ask_planner).map(|(paths, _)| paths)
    };
    for path in suite.paths(forced.then_some(Forced::Others), name, ask) {
        backward_case::<T, G>(suite, spec, at.on(path), data);
    }
}

// ---------------------------------------------------------------------------------------------
// Comparisons
// ---------------------------------------------------------------------------------------------

/// One case's comparisons, each against its own tolerance. The case's error is the worst
/// ratio of error to tolerance, times the case's limit: it fails when any comparison does,
/// and the detail names the comparison with its own error and tolerance.
pub(crate) struct Checks {
    limit: f64,
    ratio: f64,
    detail: String,
}

impl Checks {
    pub(crate) fn new(limit: f64) -> Checks {
        Checks { limit, ratio: 0.0, detail: String::new() }
    }

    fn fail(&mut self, detail: String) {
        if self.ratio != f64::INFINITY {
            self.ratio = f64::INFINITY;
            self.detail = detail;
        }
    }

    /// `got` against `want`, errors relative to `max(|want|, floor(i))`; NaN never passes.
    fn compare<T: Element>(
        &mut self,
        what: &str,
        got: &[T],
        want: &[f64],
        tolerance: f64,
        floor: impl Fn(usize) -> f64,
    ) {
        self.record(what, max_error_with_floor(got, want, floor), tolerance);
    }

    /// As [`Checks::compare`], for results already read as f64; a count unlike the
    /// reference's fails.
    pub(crate) fn compare_values(
        &mut self,
        what: &str,
        got: &[f64],
        want: &[f64],
        tolerance: f64,
        floor: impl Fn(usize) -> f64,
    ) {
        if got.len() != want.len() {
            return self.fail(format!("{what}: {} values, the reference has {}", got.len(), want.len()));
        }
        self.record(what, max_error_of(|i| got[i], want, floor), tolerance);
    }

    /// Keeps `worst` if its ratio to `tolerance` is the largest yet.
    fn record(&mut self, what: &str, worst: Option<Worst>, tolerance: f64) {
        if let Some(w) = worst {
            // NaN (0 / 0) counts as infinitely wrong.
            let ratio = if w.error.is_nan() { f64::INFINITY } else { w.error / tolerance };
            if ratio > self.ratio {
                self.ratio = ratio;
                self.detail = format!(
                    "{what} element {}: got {:e}, want {:e}, error {:e} (tolerance {tolerance:e})",
                    w.index, w.got, w.want, w.error
                );
            }
        }
    }

    /// An output without the `offset` elements before its view, which must still hold the
    /// poison.
    fn output<'v, T: Element>(&mut self, what: &str, all: &'v [T], offset: usize) -> &'v [T] {
        if all[..offset].iter().any(|v| !v.to_f64().is_nan()) {
            self.fail(format!("{what}: wrote before its view"));
        }
        &all[offset..]
    }

    /// The launch ran the plan its call planned plan-only, on the forced path (else the
    /// dispatcher's, as the plan-only call gave it), with the widest pack unless a row
    /// length or an address rules it out. Where `from_heads` (an op whose rows share a
    /// dtype), the block paths run rows whose arrays share an offset from their heads, in
    /// the widest packs, whatever the width and the weight's offset.
    fn plan(&mut self, plans: &Plans, at: &At, widest: usize, from_heads: bool) {
        let Plans { predicted, launched } = plans;
        let aligned = at.cols.is_multiple_of(widest) && at.offsets == ALIGNED;
        let shared_phase = from_heads && at.offsets.input % widest == at.offsets.output % widest;
        let pack = if aligned || (shared_phase && launched.kind() != PathKind::Warp) { widest } else { 1 };
        let want = at.path.unwrap_or(predicted.kind());
        if launched != predicted || launched.kind() != want || launched.pack != pack {
            self.fail(format!(
                "planned {} (plan-only: {}); want the {want:?} path with pack {pack}",
                launched.describe(),
                predicted.describe()
            ));
        }
    }

    fn measured(self, plan: &Plan) -> Measured {
        self.measured_in(&plan.describe())
    }

    /// The result, its detail followed by `context`.
    pub(crate) fn measured_in(self, context: &str) -> Measured {
        Measured { error: self.ratio * self.limit, detail: format!("{}; {context}", self.detail) }
    }
}

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------

/// A forward's host inputs.
struct ForwardInputs<'a, T, G> {
    x: &'a [T],
    residual: Option<&'a [T]>,
    weight: Option<&'a [G]>,
    bias: Option<&'a [G]>,
}

/// What a forward wrote, each array with the elements before its view.
struct ForwardRun<T, U> {
    y: Vec<U>,
    sum: Option<Vec<T>>,
    mean: Option<Vec<f32>>,
    rstd: Option<Vec<f32>>,
}

/// Gives `call` the residual and the statistics to save, where asked for.
fn options<'a, T: Element, U: Element, P>(
    mut call: Forward<'a, T, U, P>,
    residual: Option<(&'a View<'_, T>, &'a mut ViewMut<'_, T>)>,
    mean: Option<&'a mut ViewMut<'_, f32>>,
    rstd: Option<&'a mut ViewMut<'_, f32>>,
) -> Forward<'a, T, U, P> {
    if let Some((residual, sum)) = residual {
        call = call.residual(residual, sum);
    }
    if let Some(mean) = mean {
        call = call.save_mean(mean);
    }
    if let Some(rstd) = rstd {
        call = call.save_rstd(rstd);
    }
    call
}

/// Uploads the inputs and poisons the outputs, each at `at`'s offset into its allocation,
/// and hands `body` the forward of `spec` on them, to make with any `Norm`: the case's own
/// calls, or the planner's questions. Returns what `body` returned, and what the calls wrote.
fn with_forward<T: Element, U: Element, G: Element, R>(
    suite: &Suite,
    spec: &Spec,
    at: &At,
    inputs: ForwardInputs<'_, T, G>,
    body: impl FnOnce(&mut Call<'_>) -> rill::Result<R>,
) -> rill::Result<(R, ForwardRun<T, U>)> {
    let ForwardInputs { x, residual, weight, bias } = inputs;
    let (rows, cols, o) = (at.rows, at.cols, at.offsets);
    let shape = [rows, cols];
    let x_dev = suite.upload(x, o.input)?;
    let residual_dev = residual.map(|r| suite.upload(r, o.input)).transpose()?;
    let weight_dev = weight.map(|w| suite.upload(w, o.param)).transpose()?;
    let bias_dev = bias.map(|b| suite.upload(b, o.param)).transpose()?;
    let mut y_dev = suite.poisoned::<U>(rows * cols, o.output)?;
    let mut sum_dev = residual.map(|_| suite.poisoned::<T>(rows * cols, o.output)).transpose()?;
    let mut mean_dev = (spec.extras && !spec.rms()).then(|| suite.poisoned::<f32>(rows, o.output)).transpose()?;
    let mut rstd_dev = spec.extras.then(|| suite.poisoned::<f32>(rows, o.output)).transpose()?;
    let answer = {
        let x = view_at(&x_dev, o.input, &shape)?;
        let mut y = view_mut_at(&mut y_dev, o.output, &shape)?;
        let residual = residual_dev.as_ref().map(|t| view_at(t, o.input, &shape)).transpose()?;
        let mut sum = sum_dev.as_mut().map(|t| view_mut_at(t, o.output, &shape)).transpose()?;
        let weight = weight_dev.as_ref().map(|t| view_at(t, o.param, &[cols])).transpose()?;
        let bias = bias_dev.as_ref().map(|t| view_at(t, o.param, &[cols])).transpose()?;
        let mut mean = mean_dev.as_mut().map(|t| view_mut_at(t, o.output, &[rows])).transpose()?;
        let mut rstd = rstd_dev.as_mut().map(|t| view_mut_at(t, o.output, &[rows])).transpose()?;
        let stream = &suite.stream;
        let mut call = |norm: Norm| {
            let (residual, mean, rstd) = (residual.as_ref().zip(sum.as_mut()), mean.as_mut(), rstd.as_mut());
            let call = Forward::new(&x, &mut y);
            let (kind, eps) = (spec.kind, spec.eps);
            match (&weight, &bias, spec.weight_last) {
                (None, None, _) => norm.forward(stream, kind, eps, options(call, residual, mean, rstd)),
                (None, Some(b), _) => norm.forward(stream, kind, eps, options(call, residual, mean, rstd).bias(b)),
                (Some(w), None, false) => {
                    norm.forward(stream, kind, eps, options(call.weight(w), residual, mean, rstd))
                }
                (Some(w), None, true) => norm.forward(stream, kind, eps, options(call, residual, mean, rstd).weight(w)),
                (Some(w), Some(b), false) => {
                    norm.forward(stream, kind, eps, options(call.weight(w), residual, mean, rstd).bias(b))
                }
                (Some(w), Some(b), true) => {
                    norm.forward(stream, kind, eps, options(call, residual, mean, rstd).bias(b).weight(w))
                }
            }
        };
        body(&mut call)?
    };
    let run = ForwardRun {
        y: y_dev.to_vec()?,
        sum: sum_dev.map(|t| t.to_vec()).transpose()?,
        mean: mean_dev.map(|t| t.to_vec()).transpose()?,
        rstd: rstd_dev.map(|t| t.to_vec()).transpose()?,
    };
    Ok((answer, run))
}

fn forward_name<T: Element, U: Element, G: Element>(spec: &Spec, at: &At, data: Data) -> String {
    format!(
        "norm/{}/{}/{}/{}{}{}",
        spec.forward_op(),
        spec.tag(false),
        dtypes::<T, U, G>(spec.weight),
        at.name(),
        data.name(),
        spec.eps_name()
    )
}

/// A forward of `spec` on random `data`: y, the sum, mean and rstd against f64.
fn forward_case<T: Element, U: Element, G: Element>(suite: &mut Suite, spec: Spec, at: At, data: Data) {
    let limit = tolerance(U::DTYPE);
    suite.case(&forward_name::<T, U, G>(&spec, &at, data), limit, |suite, rng| {
        let (rows, cols) = (at.rows, at.cols);
        let x: Vec<T> = data.generate(rng, rows, cols);
        let residual: Option<Vec<T>> = spec.residual.then(|| data.generate(rng, rows, cols));
        let weight: Option<Vec<G>> = spec.weight.then(|| weights(rng, cols));
        let bias: Option<Vec<G>> = spec.bias.then(|| values(rng, cols, -1.0, 1.0));
        let inputs =
            ForwardInputs { x: &x, residual: residual.as_deref(), weight: weight.as_deref(), bias: bias.as_deref() };
        let (plans, run) = with_forward::<T, U, G, _>(suite, &spec, &at, inputs, |call| Plans::of(&at, call))?;
        let mut checks = Checks::new(limit);
        checks.plan(&plans, &at, max_pack(size_of::<T>(), size_of::<U>()), size_of::<T>() == size_of::<U>());

        let input: Vec<f64> = match &residual {
            Some(r) => f64s(&residual_sum(&x, r)),
            None => f64s(&x),
        };
        let stats = norm_stats_rows(&input, cols, spec.rms(), spec.eps as f64);
        let (w, b) = (weight.as_deref().map(f64s), bias.as_deref().map(f64s));
        let want = norm_apply_rows(&input, cols, &stats, w.as_deref(), b.as_deref());
        let tol = tolerance(U::DTYPE);
        let y = checks.output("y", &run.y, at.offsets.output);
        checks.compare("y", y, &want, tol, y_floor(&stats, cols, w.as_deref(), tol));
        if let Some(sum) = &run.sum {
            let got = checks.output("sum", sum, at.offsets.output);
            // Bit-exact: the emulation rounds the f32 sum to nearest even, as the kernel does.
            checks.compare("sum", got, &input, f64::MIN_POSITIVE, |_| relative_floor(T::DTYPE));
        }
        // Rows of 1e4 plus N(0, 1) have a condition number of 1e4: the uncached path's
        // one-pass merge of moments loses up to a few 1e-4 of rstd to it (the cached paths,
        // two passes, about 1e-7), where E[x^2] - E[x]^2 would lose everything.
        let stats_tolerance = if data == Data::Offset1e4 { 1e-4 } else { STATS_TOLERANCE };
        if let Some(mean) = &run.mean {
            let got = checks.output("mean", mean, at.offsets.output);
            let want: Vec<f64> = stats.iter().map(|s| s.0).collect();
            let scale = mean_scale(&input, cols);
            checks.compare("mean", got, &want, STATS_TOLERANCE, |r| scale[r]);
            if data == Data::Offset1e4 {
                // y about the kernel's own mean, whose f32 rounding (up to 5e-4 at 1e4) the
                // check above allows for, relative to its normalized term (plus 1).
                let about_saved: Vec<(f64, f64)> =
                    got.iter().zip(&stats).map(|(&m, &(_, rstd))| (m as f64, rstd)).collect();
                let term = norm_apply_rows(&input, cols, &about_saved, w.as_deref(), None);
                let want: Vec<f64> =
                    term.iter().enumerate().map(|(i, v)| v + b.as_ref().map_or(0.0, |b| b[i % cols])).collect();
                // The uncached path's one pass also rounds each pack's mean at 1e4 (an ulp is
                // 1e-3) before Chan's merge squares its distance from the running mean: up to
                // a few 1e-4 of rstd (1.5e-4 seen), where two passes over a cached row keep
                // about 1e-7.
                let tolerance = if at.path == Some(PathKind::Uncached) { 5e-4 } else { 1e-4 };
                checks.compare("y about the saved mean", y, &want, tolerance, |i| 1.0 + term[i].abs());
            }
        }
        if let Some(rstd) = &run.rstd {
            let got = checks.output("rstd", rstd, at.offsets.output);
            let want: Vec<f64> = stats.iter().map(|s| s.1).collect();
            checks.compare("rstd", got, &want, stats_tolerance, rstd_floor(&stats, stats_tolerance));
        }
        Ok(checks.measured(&plans.launched))
    });
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------

/// A backward's host inputs: the statistics in f64, rounded to f32 as the forward saves them.
struct BackwardInputs<'a, T, G> {
    x: &'a [T],
    dy: &'a [T],
    stats: &'a [(f64, f64)],
    weight: Option<&'a [G]>,
}

/// What a backward wrote, each array with the elements before its view; dweight and dbias
/// in f32 (which holds every parameter dtype exactly).
struct BackwardRun<T> {
    dx: Vec<T>,
    dweight: Option<Vec<f32>>,
    dbias: Option<Vec<f32>>,
}

/// Gives `call` the forward's mean, where it saved one (LayerNorm).
fn with_mean<'a, T: Element, P>(call: Backward<'a, T, P>, mean: Option<&'a View<'_, f32>>) -> Backward<'a, T, P> {
    match mean {
        Some(mean) => call.mean(mean),
        None => call,
    }
}

/// Gives `call`, whose parameter dtype is fixed, dweight and dbias where asked for.
fn grads<'a, T: Element, H: Element>(
    mut call: Backward<'a, T, GradParams<'a, H>>,
    dweight: Option<&'a mut ViewMut<'_, H>>,
    dbias: Option<&'a mut ViewMut<'_, H>>,
) -> Backward<'a, T, GradParams<'a, H>> {
    if let Some(dweight) = dweight {
        call = call.dweight(dweight);
    }
    if let Some(dbias) = dbias {
        call = call.dbias(dbias);
    }
    call
}

/// dweight and dbias, where asked for.
type GradBuffers<H> = (Option<Tensor<H>>, Option<Tensor<H>>);

/// dweight (and dbias for LayerNorm) if `spec` asks for them, poisoned.
fn grad_buffers<H: Element>(suite: &Suite, spec: &Spec, cols: usize, offset: usize) -> rill::Result<GradBuffers<H>> {
    let dweight = spec.extras.then(|| suite.poisoned::<H>(cols, offset)).transpose()?;
    let dbias = (spec.extras && !spec.rms()).then(|| suite.poisoned::<H>(cols, offset)).transpose()?;
    Ok((dweight, dbias))
}

fn fetch_f32<H: Element>(tensor: Option<Tensor<H>>) -> rill::Result<Option<Vec<f32>>> {
    match tensor {
        Some(t) => Ok(Some(t.to_vec()?.into_iter().map(|v| v.to_f64() as f32).collect())),
        None => Ok(None),
    }
}

/// Uploads the inputs and the statistics and poisons the outputs, each at `at`'s offset
/// into its allocation, and hands `body` the backward of `spec` on them, to make with any
/// `Norm`: the case's own calls, or the planner's questions. Returns what `body` returned,
/// and what the calls wrote.
fn with_backward<T: Element, G: Element, R>(
    suite: &Suite,
    spec: &Spec,
    at: &At,
    inputs: BackwardInputs<'_, T, G>,
    body: impl FnOnce(&mut Call<'_>) -> rill::Result<R>,
) -> rill::Result<(R, BackwardRun<T>)> {
    let BackwardInputs { x, dy, stats, weight } = inputs;
    let (rows, cols, o) = (at.rows, at.cols, at.offsets);
    let shape = [rows, cols];
    let x_dev = suite.upload(x, o.input)?;
    let dy_dev = suite.upload(dy, o.input)?;
    let means: Vec<f32> = stats.iter().map(|s| s.0 as f32).collect();
    let rstds: Vec<f32> = stats.iter().map(|s| s.1 as f32).collect();
    let mean_dev = (!spec.rms()).then(|| suite.upload(&means, o.input)).transpose()?;
    let rstd_dev = suite.upload(&rstds, o.input)?;
    let weight_dev = weight.map(|w| suite.upload(w, o.param)).transpose()?;
    let mut dx_dev = suite.poisoned::<T>(rows * cols, o.output)?;
    let (kind, stream) = (spec.kind, &suite.stream);
    let (answer, dweight, dbias) = {
        let x = view_at(&x_dev, o.input, &shape)?;
        let dy = view_at(&dy_dev, o.input, &shape)?;
        let rstd = view_at(&rstd_dev, o.input, &[rows])?;
        let mean = mean_dev.as_ref().map(|t| view_at(t, o.input, &[rows])).transpose()?;
        let mut dx = view_mut_at(&mut dx_dev, o.output, &shape)?;
        match &weight_dev {
            Some(weight_dev) => {
                let weight = view_at(weight_dev, o.param, &[cols])?;
                let (mut dweight_dev, mut dbias_dev) = grad_buffers::<G>(suite, spec, cols, o.output)?;
                let answer = {
                    let mut dweight = dweight_dev.as_mut().map(|t| view_mut_at(t, o.output, &[cols])).transpose()?;
                    let mut dbias = dbias_dev.as_mut().map(|t| view_mut_at(t, o.output, &[cols])).transpose()?;
                    let mut call = |norm: Norm| {
                        let call = with_mean(Backward::new(&x, &dy, &rstd, &mut dx), mean.as_ref());
                        let call = match (spec.weight_last, dweight.as_mut(), dbias.as_mut()) {
                            (true, dweight, Some(dbias)) => grads(call.dbias(dbias), dweight, None).weight(&weight),
                            (true, Some(dweight), None) => call.dweight(dweight).weight(&weight),
                            (_, dweight, dbias) => grads(call.weight(&weight), dweight, dbias),
                        };
                        norm.backward(stream, kind, call)
                    };
                    body(&mut call)?
                };
                (answer, fetch_f32(dweight_dev)?, fetch_f32(dbias_dev)?)
            }
            None => {
                let (mut dweight_dev, mut dbias_dev) = grad_buffers::<f32>(suite, spec, cols, o.output)?;
                let answer = {
                    let mut dweight = dweight_dev.as_mut().map(|t| view_mut_at(t, o.output, &[cols])).transpose()?;
                    let mut dbias = dbias_dev.as_mut().map(|t| view_mut_at(t, o.output, &[cols])).transpose()?;
                    let mut call = |norm: Norm| {
                        let call = with_mean(Backward::new(&x, &dy, &rstd, &mut dx), mean.as_ref());
                        match (dweight.as_mut(), dbias.as_mut()) {
                            (None, None) => norm.backward(stream, kind, call),
                            (Some(dweight), dbias) => {
                                norm.backward(stream, kind, grads(call.dweight(dweight), None, dbias))
                            }
                            (None, Some(dbias)) => norm.backward(stream, kind, call.dbias(dbias)),
                        }
                    };
                    body(&mut call)?
                };
                (answer, fetch_f32(dweight_dev)?, fetch_f32(dbias_dev)?)
            }
        }
    };
    Ok((answer, BackwardRun { dx: dx_dev.to_vec()?, dweight, dbias }))
}

/// Compares dweight and dbias with their f64 column sums, against the sums of the terms'
/// magnitudes; `param` is their dtype (the weight's, or f32 without one).
fn compare_param_grads(checks: &mut Checks, run: &BackwardRun<impl Element>, want: &ParamGradsWant, param: DType) {
    let tol = tolerance(param).max(PARAM_GRAD_TOLERANCE);
    let floor = relative_floor(param);
    if let Some(dweight) = &run.dweight {
        let got = checks.output("dweight", dweight, want.offset);
        checks.compare("dweight", got, &want.grads.dweight, tol, |c| want.grads.dweight_magnitude[c].max(floor));
    }
    if let Some(dbias) = &run.dbias {
        let got = checks.output("dbias", dbias, want.offset);
        checks.compare("dbias", got, &want.grads.dbias, tol, |c| want.grads.dbias_magnitude[c].max(floor));
    }
}

struct ParamGradsWant {
    grads: rill_tests::reference::NormParamGrads,
    offset: usize,
}

fn backward_name<T: Element, G: Element>(spec: &Spec, at: &At, data: Data) -> String {
    format!(
        "norm/{}_backward/{}/{}/{}{}{}",
        spec.kind.name(),
        spec.tag(true),
        dtypes::<T, T, G>(spec.weight),
        at.name(),
        data.name(),
        spec.eps_name()
    )
}

/// A backward of `spec` on random `data` and dy: dx (and dweight, dbias) against f64.
fn backward_case<T: Element, G: Element>(suite: &mut Suite, spec: Spec, at: At, data: Data) {
    let limit = tolerance(T::DTYPE);
    suite.case(&backward_name::<T, G>(&spec, &at, data), limit, |suite, rng| {
        let (rows, cols) = (at.rows, at.cols);
        let x: Vec<T> = data.generate(rng, rows, cols);
        let dy: Vec<T> = values(rng, rows * cols, -1.0, 1.0);
        let weight: Option<Vec<G>> = spec.weight.then(|| weights(rng, cols));
        let x64 = f64s(&x);
        // The forward's statistics as it saves them, in f32: the reference reads what the
        // kernel reads.
        let stats: Vec<(f64, f64)> = norm_stats_rows(&x64, cols, spec.rms(), spec.eps as f64)
            .into_iter()
            .map(|(m, r)| (m as f32 as f64, r as f32 as f64))
            .collect();
        let inputs = BackwardInputs { x: &x, dy: &dy, stats: &stats, weight: weight.as_deref() };
        let (plans, run) = with_backward::<T, G, _>(suite, &spec, &at, inputs, |call| Plans::of(&at, call))?;
        let mut checks = Checks::new(limit);
        checks.plan(&plans, &at, max_pack(size_of::<T>(), size_of::<T>()), true);

        let (dy64, w) = (f64s(&dy), weight.as_deref().map(f64s));
        let want = norm_backward_rows(&x64, &dy64, cols, &stats, spec.rms(), w.as_deref());
        let magnitude = norm_backward_magnitude_rows(&x64, &dy64, cols, &stats, spec.rms(), w.as_deref());
        let dx = checks.output("dx", &run.dx, at.offsets.output);
        let floor = relative_floor(T::DTYPE);
        checks.compare("dx", dx, &want, tolerance(T::DTYPE), |i| magnitude[i].max(floor));
        let param = if spec.weight { G::DTYPE } else { DType::F32 };
        let want = ParamGradsWant { grads: norm_param_grads(&x64, &dy64, cols, &stats), offset: at.offsets.output };
        compare_param_grads(&mut checks, &run, &want, param);
        Ok(checks.measured(&plans.launched))
    });
}

// ---------------------------------------------------------------------------------------------
// The matrix
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq)]
enum Coverage {
    /// Every row count; LayerNorm and RMSNorm, each also with the residual; the backward.
    Full,
    /// A weight of another dtype: rows 3 and many, every path, each kernel once.
    Weights,
    /// An output of another dtype (forward only): rows 3 and many, every path.
    Cast,
}

fn matrix<T: Element, U: Element, G: Element>(suite: &mut Suite, coverage: Coverage) {
    for &cols in NORM_TEST_COLS {
        for rows in norm_test_rows(cols) {
            if coverage != Coverage::Full && rows < 3 {
                continue;
            }
            let at = At::new(rows, cols, None);
            // Forced paths on one, three and many rows.
            let forced = rows != 2;
            forward_cases::<T, U, G>(suite, Spec::LAYER, at, Data::Mixed, forced);
            if coverage == Coverage::Full {
                forward_cases::<T, U, G>(suite, Spec::RMS, at, Data::Mixed, forced);
            }
            if rows != 2 {
                if coverage == Coverage::Full {
                    forward_cases::<T, U, G>(suite, Spec::LAYER.add(), at, Data::Mixed, forced);
                }
                forward_cases::<T, U, G>(suite, Spec::RMS.add(), at, Data::Mixed, forced);
            }
            if coverage == Coverage::Cast {
                continue;
            }
            backward_cases::<T, G>(suite, Spec::LAYER, at, Data::Mixed, forced);
            backward_cases::<T, G>(suite, Spec::RMS, at, Data::Mixed, forced);
            if coverage == Coverage::Weights {
                // dx alone, whose plain kernels the calls above leave where they gather
                // the parameter gradients.
                backward_cases::<T, G>(suite, Spec { extras: false, ..Spec::RMS }, at, Data::Mixed, false);
            }
        }
    }
}

/// Without weight or bias, weight without bias, bias without weight, the residual without
/// saved statistics, the weight given after the other parts, the backward without weight or
/// without parameter gradients: on widths across the paths and packs, every path on three
/// rows, the dispatcher's on many.
fn variants<T: Element>(suite: &mut Suite) {
    for cols in [1, 32, 33, 1000, 4096, 4097, 50257, 65536] {
        for rows in [3, norm_test_rows(cols)[3]] {
            let (at, forced) = (At::new(rows, cols, None), rows == 3);
            forward_cases::<T, T, T>(suite, Spec::LAYER.plain(), at, Data::Mixed, forced);
            forward_cases::<T, T, T>(suite, Spec { bias: false, ..Spec::LAYER }, at, Data::Mixed, forced);
            forward_cases::<T, T, T>(suite, Spec::RMS.plain(), at, Data::Mixed, forced);
            forward_cases::<T, T, T>(suite, Spec::LAYER.plain().add(), at, Data::Mixed, forced);
            forward_cases::<T, T, T>(suite, Spec { weight: false, ..Spec::LAYER }, at, Data::Mixed, forced);
            forward_cases::<T, T, T>(suite, Spec::LAYER.add().weight_last(), at, Data::Mixed, forced);
            forward_cases::<T, T, T>(suite, Spec::RMS.weight_last(), at, Data::Mixed, forced);
            backward_cases::<T, f32>(suite, Spec { weight: false, ..Spec::LAYER }, at, Data::Mixed, forced);
            backward_cases::<T, T>(suite, Spec { extras: false, ..Spec::LAYER }, at, Data::Mixed, forced);
            backward_cases::<T, f32>(suite, Spec::RMS.plain(), at, Data::Mixed, forced);
            backward_cases::<T, T>(suite, Spec::LAYER.weight_last(), at, Data::Mixed, forced);
            backward_cases::<T, T>(suite, Spec::RMS.weight_last(), at, Data::Mixed, forced);
        }
    }
}

/// Every array one element into its allocation on widths the widest pack divides (so only
/// the addresses force pack 1), then one kind of array at a time.
fn misaligned<T: Element>(suite: &mut Suite) {
    for cols in [32, 768, 1000, 1024, 4096, 32768, 65536] {
        for rows in [3, norm_test_rows(cols)[3]] {
            let at = At::new(rows, cols, None).offset(MISALIGNED);
            forward_cases::<T, T, T>(suite, Spec::LAYER, at, Data::Mixed, true);
            forward_cases::<T, T, T>(suite, Spec::RMS.add(), at, Data::Mixed, true);
            backward_cases::<T, T>(suite, Spec::LAYER, at, Data::Mixed, true);
            backward_cases::<T, T>(suite, Spec::RMS, at, Data::Mixed, true);
        }
    }
    // Arrays at different offsets: rows that cannot run from their heads take pack 1 on
    // every path (the block paths' too, at 4097 columns); a weight alone off its pack runs
    // rows from their heads, at 65536 columns on clusters whose blocks own their parts of
    // rows whose every pack is aligned.
    for offsets in [
        Offsets { input: 1, output: 0, param: 0 },
        Offsets { input: 0, output: 1, param: 0 },
        Offsets { input: 0, output: 0, param: 1 },
    ] {
        for cols in [1024, 4097, 65536] {
            let at = At::new(3, cols, None).offset(offsets);
            forward_cases::<T, T, T>(suite, Spec::LAYER, at, Data::Mixed, true);
            forward_cases::<T, T, T>(suite, Spec::RMS.add(), at, Data::Mixed, true);
            backward_cases::<T, T>(suite, Spec::LAYER, at, Data::Mixed, true);
            backward_cases::<T, T>(suite, Spec::RMS, at, Data::Mixed, true);
            if T::DTYPE != DType::F32 {
                forward_cases::<T, T, f32>(suite, Spec::LAYER, at, Data::Mixed, true);
                forward_cases::<T, T, f32>(suite, Spec::RMS.add(), at, Data::Mixed, true);
                backward_cases::<T, f32>(suite, Spec::LAYER, at, Data::Mixed, true);
                backward_cases::<T, f32>(suite, Spec::RMS, at, Data::Mixed, true);
            }
        }
    }
    if T::DTYPE == DType::F32 {
        let at = At::new(3, 1000, None).offset(MISALIGNED);
        for spec in [Spec::LAYER, Spec::RMS.add()] {
            forward_cases::<f32, f16, f32>(suite, spec, at, Data::Mixed, true);
            forward_cases::<f32, bf16, f32>(suite, spec, at, Data::Mixed, true);
        }
    }
}

/// Constant rows (variance 0: y is the bias, dx has no xhat term, nothing is NaN), rows of
/// 1e4 plus noise (f32: in 16 bits the noise rounds away), and eps 0 and 1e-2.
fn special_rows<T: Element>(suite: &mut Suite) {
    for cols in [1, 3, 32, 33, 1000, 1024, 4097, 65536] {
        let at = At::new(4, cols, None);
        forward_cases::<T, T, T>(suite, Spec::LAYER, at, Data::Constant, true);
        forward_cases::<T, T, T>(suite, Spec::LAYER.add(), at, Data::Constant, true);
        forward_cases::<T, T, T>(suite, Spec::RMS, at, Data::Constant, true);
        backward_cases::<T, T>(suite, Spec::LAYER, at, Data::Constant, true);
        backward_cases::<T, T>(suite, Spec::RMS, at, Data::Constant, true);
    }
    if T::DTYPE == DType::F32 {
        for cols in [33, 1000, 4097, 50257, 65536] {
            let at = At::new(4, cols, None);
            forward_cases::<T, T, T>(suite, Spec::LAYER, at, Data::Offset1e4, true);
            forward_cases::<T, T, T>(suite, Spec::RMS, at, Data::Offset1e4, true);
            backward_cases::<T, T>(suite, Spec::LAYER, at, Data::Offset1e4, true);
        }
    }
    // Rows of scale 0.01 have a variance near 3e-5: eps 1e-2 changes their rstd 17-fold.
    for eps in [0.0, 1e-2] {
        for cols in [33, 1000, 4097, 65536] {
            let at = At::new(3, cols, None);
            forward_case::<T, T, T>(suite, Spec::LAYER.eps(eps), at, Data::Mixed);
            forward_case::<T, T, T>(suite, Spec::RMS.eps(eps), at, Data::Mixed);
            backward_case::<T, T>(suite, Spec::LAYER.eps(eps), at, Data::Mixed);
            backward_case::<T, T>(suite, Spec::RMS.eps(eps), at, Data::Mixed);
        }
    }
}

/// The backward with its parameter gradients on the widest rows whose sums the clusters
/// gather, each of up to 16 blocks its slice's (LayerNorm at 131072 columns, RMSNorm in 16
/// bits at 262144; at 131073 the rows run from their heads, each block taking its part's
/// elements outside its packs), and past them, where a second kernel sums the columns
/// (LayerNorm at 262144), on the dispatcher's plans.
fn widest_gathering<T: Element>(suite: &mut Suite) {
    for cols in [131072, 131073, 262144] {
        for rows in [3, 9] {
            let at = At::new(rows, cols, None);
            backward_case::<T, T>(suite, Spec::LAYER, at, Data::Mixed);
            backward_case::<T, T>(suite, Spec::RMS, at, Data::Mixed);
        }
    }
}

/// The backward with its parameter gradients where the shared path stages its rows in two
/// caches (`Plan::stages`: 16-bit rows at 1000-1024 columns, RMSNorm's at 16384, f32
/// LayerNorm's at 8192) and beside those widths: rows enough for each block of the one-wave
/// grid to work through several, staging each next row while it works on one, the last
/// block's share shorter (row counts no grid divides); a few hundred rows (two or three a
/// block where one block an SM fits) for the sanitizers; on the dispatcher's plans.
fn staged_gathering<T: Element>(suite: &mut Suite) {
    for (rows, cols) in [
        (24593, 1000),
        (16411, 1024),
        (4099, 4096),
        (2053, 8192),
        (523, 16384),
        (2701, 1024),
        (301, 8192),
        (301, 16384),
    ] {
        let at = At::new(rows, cols, None);
        backward_case::<T, T>(suite, Spec::LAYER, at, Data::Mixed);
        backward_case::<T, T>(suite, Spec::RMS, at, Data::Mixed);
    }
}

// ---------------------------------------------------------------------------------------------
// Finite differences
// ---------------------------------------------------------------------------------------------

/// The forward (saving its statistics) then the backward with them, against f64 central
/// differences of `L = sum(y * dy)`: dx, dweight and dbias, on small f32 shapes.
fn finite_differences(suite: &mut Suite) {
    let cases = [
        (Spec::LAYER, 7),
        (Spec::LAYER, 33),
        (Spec::RMS, 7),
        (Spec::RMS, 33),
        (Spec::LAYER.eps(1e-2), 33),
        (Spec::RMS.eps(1e-2), 33),
    ];
    for (spec, cols) in cases {
        for path in [None, Some(PathKind::Shared), Some(PathKind::Uncached)] {
            let at = At::new(3, cols, path);
            let name = format!(
                "norm/{}_backward/finite-differences/f32,w=f32/{}/eps={}",
                spec.kind.name(),
                at.name(),
                spec.eps
            );
            suite.case(&name, FINITE_DIFFERENCE_TOLERANCE, |suite, rng| finite_difference_case(suite, rng, spec, at));
        }
    }
}

fn finite_difference_case(suite: &mut Suite, rng: &mut Rng, spec: Spec, at: At) -> rill::Result<Measured> {
    let (rows, cols, rms, eps) = (at.rows, at.cols, spec.rms(), spec.eps as f64);
    let x: Vec<f32> = Data::Mixed.generate(rng, rows, cols);
    let weight: Vec<f32> = weights(rng, cols);
    let bias: Option<Vec<f32>> = spec.bias.then(|| values(rng, cols, -1.0, 1.0));
    let dy: Vec<f32> = values(rng, rows * cols, -1.0, 1.0);
    let inputs = ForwardInputs { x: &x, residual: None, weight: Some(&weight), bias: bias.as_deref() };
    let (_, forward) = with_forward::<f32, f32, f32, _>(suite, &spec, &at, inputs, |call| call(at.norm()))?;
    let saved: Vec<(f64, f64)> = (0..rows)
        .map(|r| (forward.mean.as_ref().map_or(0.0, |m| m[r] as f64), forward.rstd.as_ref().unwrap()[r] as f64))
        .collect();
    let inputs = BackwardInputs { x: &x, dy: &dy, stats: &saved, weight: Some(&weight) };
    let (plan, run) = with_backward::<f32, f32, _>(suite, &spec, &at, inputs, |call| call(at.norm()))?;

    let (x64, w64, dy64) = (f64s(&x), f64s(&weight), f64s(&dy));
    let b64 = bias.as_deref().map(f64s);
    let loss = |x: &[f64], w: &[f64], b: Option<&[f64]>| -> f64 {
        norm_rows(x, cols, rms, eps, Some(w), b).iter().zip(&dy64).map(|(y, d)| y * d).sum()
    };
    let central = |h: f64, f: &dyn Fn(f64) -> f64| (f(h) - f(-h)) / (2.0 * h);
    let exact = norm_stats_rows(&x64, cols, rms, eps);
    let dx_fd: Vec<f64> = (0..rows * cols)
        .map(|i| {
            // A step of 1e-3 of the row's scale, sqrt(var + eps).
            let h = 1e-3 / exact[i / cols].1;
            central(h, &|d| {
                let mut x = x64.clone();
                x[i] += d;
                loss(&x, &w64, b64.as_deref())
            })
        })
        .collect();
    let dweight_fd: Vec<f64> = (0..cols)
        .map(|c| {
            central(1e-3 * w64[c].abs(), &|d| {
                let mut w = w64.clone();
                w[c] += d;
                loss(&x64, &w, b64.as_deref())
            })
        })
        .collect();
    let dbias_fd: Option<Vec<f64>> = b64.as_ref().map(|b64| {
        (0..cols)
            .map(|c| {
                central(1e-3 * b64[c].abs().max(1e-2), &|d| {
                    let mut b = b64.clone();
                    b[c] += d;
                    loss(&x64, &w64, Some(&b))
                })
            })
            .collect()
    });

    let mut checks = Checks::new(FINITE_DIFFERENCE_TOLERANCE);
    let magnitude = norm_backward_magnitude_rows(&x64, &dy64, cols, &exact, rms, Some(&w64));
    checks.compare("dx", &run.dx, &dx_fd, FINITE_DIFFERENCE_TOLERANCE, |i| magnitude[i]);
    let grads = norm_param_grads(&x64, &dy64, cols, &exact);
    if let Some(dweight) = &run.dweight {
        checks.compare("dweight", dweight, &dweight_fd, FINITE_DIFFERENCE_TOLERANCE, |c| grads.dweight_magnitude[c]);
    } else {
        checks.fail("no dweight".into());
    }
    match (&run.dbias, &dbias_fd) {
        (Some(got), Some(want)) => {
            checks.compare("dbias", got, want, FINITE_DIFFERENCE_TOLERANCE, |c| grads.dbias_magnitude[c])
        }
        (None, None) => {}
        _ => checks.fail("dbias present where it should not be, or missing".into()),
    }
    Ok(checks.measured(&plan))
}

// ---------------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------------

fn bad_input(suite: &mut Suite) {
    use NormKind::{LayerNorm, RmsNorm};
    let gpu = suite.gpu.clone();
    let make = move |shape: &[usize]| Tensor::<f32>::zeros(&gpu, shape);
    let norm = Norm::new();
    let forward = |s: &Suite, kind, eps, x: &[usize], y: &[usize]| -> rill::Result<()> {
        let (x, mut y) = (make(x)?, make(y)?);
        norm.forward(&s.stream, kind, eps, Forward::new(&x, &mut y)).map(|_| ())
    };
    suite.rejects("norm/errors/output-shape", |s| forward(s, LayerNorm, EPS, &[4, 8], &[4, 9]));
    suite.rejects("norm/errors/output-transposed", |s| forward(s, RmsNorm, EPS, &[4, 8], &[8, 4]));
    suite.rejects("norm/errors/empty-rows", |s| forward(s, LayerNorm, EPS, &[0, 8], &[0, 8]));
    suite.rejects("norm/errors/empty-cols", |s| forward(s, RmsNorm, EPS, &[4, 0], &[4, 0]));
    suite.rejects("norm/errors/scalar", |s| forward(s, LayerNorm, EPS, &[], &[]));
    suite.rejects("norm/errors/eps-negative", |s| forward(s, LayerNorm, -1e-5, &[4, 8], &[4, 8]));
    suite.rejects("norm/errors/eps-nan", |s| forward(s, RmsNorm, f32::NAN, &[4, 8], &[4, 8]));
    suite.rejects("norm/errors/eps-infinite", |s| forward(s, LayerNorm, f32::INFINITY, &[4, 8], &[4, 8]));
    suite.rejects("norm/errors/weight-length", |s| {
        let (x, w, mut y) = (make(&[4, 8])?, make(&[7])?, make(&[4, 8])?);
        norm.forward(&s.stream, LayerNorm, EPS, Forward::new(&x, &mut y).weight(&w)).map(|_| ())
    });
    suite.rejects("norm/errors/weight-2d", |s| {
        let (x, w, mut y) = (make(&[4, 8])?, make(&[1, 8])?, make(&[4, 8])?);
        norm.forward(&s.stream, RmsNorm, EPS, Forward::new(&x, &mut y).weight(&w)).map(|_| ())
    });
    suite.rejects("norm/errors/bias-length", |s| {
        let (x, w, b, mut y) = (make(&[4, 8])?, make(&[8])?, make(&[9])?, make(&[4, 8])?);
        norm.forward(&s.stream, LayerNorm, EPS, Forward::new(&x, &mut y).weight(&w).bias(&b)).map(|_| ())
    });
    suite.rejects("norm/errors/rms-norm-bias", |s| {
        let (x, w, b, mut y) = (make(&[4, 8])?, make(&[8])?, make(&[8])?, make(&[4, 8])?);
        norm.forward(&s.stream, RmsNorm, EPS, Forward::new(&x, &mut y).weight(&w).bias(&b)).map(|_| ())
    });
    suite.rejects("norm/errors/rms-norm-save-mean", |s| {
        let (x, mut y, mut mean) = (make(&[4, 8])?, make(&[4, 8])?, make(&[4])?);
        norm.forward(&s.stream, RmsNorm, EPS, Forward::new(&x, &mut y).save_mean(&mut mean)).map(|_| ())
    });
    suite.rejects("norm/errors/mean-length", |s| {
        let (x, mut y, mut mean) = (make(&[4, 8])?, make(&[4, 8])?, make(&[3])?);
        norm.forward(&s.stream, LayerNorm, EPS, Forward::new(&x, &mut y).save_mean(&mut mean)).map(|_| ())
    });
    suite.rejects("norm/errors/rstd-length", |s| {
        let (x, mut y, mut rstd) = (make(&[4, 8])?, make(&[4, 8])?, make(&[5])?);
        norm.forward(&s.stream, RmsNorm, EPS, Forward::new(&x, &mut y).save_rstd(&mut rstd)).map(|_| ())
    });
    suite.rejects("norm/errors/residual-shape", |s| {
        let (x, r, mut sum, mut y) = (make(&[4, 8])?, make(&[4, 9])?, make(&[4, 8])?, make(&[4, 8])?);
        norm.forward(&s.stream, LayerNorm, EPS, Forward::new(&x, &mut y).residual(&r, &mut sum)).map(|_| ())
    });
    suite.rejects("norm/errors/sum-shape", |s| {
        let (x, r, mut sum, mut y) = (make(&[4, 8])?, make(&[4, 8])?, make(&[8, 4])?, make(&[4, 8])?);
        norm.forward(&s.stream, RmsNorm, EPS, Forward::new(&x, &mut y).residual(&r, &mut sum)).map(|_| ())
    });
    suite.rejects("norm/errors/output-dtype", |s| {
        let x = Tensor::<f16>::zeros(&s.gpu, &[4, 8])?;
        let mut y = make(&[4, 8])?;
        norm.forward(&s.stream, LayerNorm, EPS, Forward::new(&x, &mut y)).map(|_| ())
    });
    suite.rejects("norm/errors/weight-dtype", |s| {
        let x = Tensor::<f16>::zeros(&s.gpu, &[4, 8])?;
        let w = Tensor::<bf16>::zeros(&s.gpu, &[8])?;
        let mut y = Tensor::<f16>::zeros(&s.gpu, &[4, 8])?;
        norm.forward(&s.stream, RmsNorm, EPS, Forward::new(&x, &mut y).weight(&w)).map(|_| ())
    });
    suite.rejects("norm/errors/forced-warp-too-wide", |s| {
        let (x, mut y) = (make(&[2, 2048])?, make(&[2, 2048])?);
        Norm::forced(PathKind::Warp).forward(&s.stream, LayerNorm, EPS, Forward::new(&x, &mut y)).map(|_| ())
    });
    suite.rejects("norm/errors/forced-shared-too-wide", |s| {
        let (x, mut y) = (make(&[2, 1 << 17])?, make(&[2, 1 << 17])?);
        Norm::forced(PathKind::Shared).forward(&s.stream, RmsNorm, EPS, Forward::new(&x, &mut y)).map(|_| ())
    });

    // The backward.
    let backward = |s: &Suite, kind, shapes: [&[usize]; 5], mean: Option<&[usize]>| -> rill::Result<()> {
        let [x, dy, rstd, dx, weight] = shapes;
        let (x, dy, rstd, mut dx, weight) = (make(x)?, make(dy)?, make(rstd)?, make(dx)?, make(weight)?);
        let mean = mean.map(&make).transpose()?;
        let call = Backward::new(&x, &dy, &rstd, &mut dx).weight(&weight);
        let call = match &mean {
            Some(mean) => call.mean(mean),
            None => call,
        };
        norm.backward(&s.stream, kind, call).map(|_| ())
    };
    let ok: [&[usize]; 5] = [&[4, 8], &[4, 8], &[4], &[4, 8], &[8]];
    suite.rejects("norm/errors/backward-layer-norm-without-mean", |s| backward(s, LayerNorm, ok, None));
    suite.rejects("norm/errors/backward-rms-norm-with-mean", |s| backward(s, RmsNorm, ok, Some(&[4][..])));
    suite.rejects("norm/errors/backward-mean-length", |s| backward(s, LayerNorm, ok, Some(&[5][..])));
    suite.rejects("norm/errors/backward-dy-shape", |s| {
        backward(s, RmsNorm, [&[4, 8], &[4, 9], &[4], &[4, 8], &[8]], None)
    });
    suite.rejects("norm/errors/backward-dx-shape", |s| {
        backward(s, LayerNorm, [&[4, 8], &[4, 8], &[4], &[2, 16], &[8]], Some(&[4][..]))
    });
    suite.rejects("norm/errors/backward-rstd-length", |s| {
        backward(s, RmsNorm, [&[4, 8], &[4, 8], &[3], &[4, 8], &[8]], None)
    });
    suite.rejects("norm/errors/backward-weight-length", |s| {
        backward(s, LayerNorm, [&[4, 8], &[4, 8], &[4], &[4, 8], &[9]], Some(&[4][..]))
    });
    suite
        .rejects("norm/errors/backward-empty", |s| backward(s, RmsNorm, [&[0, 8], &[0, 8], &[0], &[0, 8], &[8]], None));
    suite.rejects("norm/errors/backward-dweight-length", |s| {
        let (x, dy, rstd, mut dx, mut dw) = (make(&[4, 8])?, make(&[4, 8])?, make(&[4])?, make(&[4, 8])?, make(&[7])?);
        norm.backward(&s.stream, RmsNorm, Backward::new(&x, &dy, &rstd, &mut dx).dweight(&mut dw)).map(|_| ())
    });
    suite.rejects("norm/errors/backward-rms-norm-dbias", |s| {
        let (x, dy, rstd, mut dx, mut db) = (make(&[4, 8])?, make(&[4, 8])?, make(&[4])?, make(&[4, 8])?, make(&[8])?);
        norm.backward(&s.stream, RmsNorm, Backward::new(&x, &dy, &rstd, &mut dx).dbias(&mut db)).map(|_| ())
    });
    suite.rejects("norm/errors/backward-weight-dtype", |s| {
        let x = Tensor::<f16>::zeros(&s.gpu, &[4, 8])?;
        let dy = Tensor::<f16>::zeros(&s.gpu, &[4, 8])?;
        let mut dx = Tensor::<f16>::zeros(&s.gpu, &[4, 8])?;
        let w = Tensor::<bf16>::zeros(&s.gpu, &[8])?;
        let rstd = make(&[4])?;
        norm.backward(&s.stream, RmsNorm, Backward::new(&x, &dy, &rstd, &mut dx).weight(&w)).map(|_| ())
    });
    suite.rejects("norm/errors/backward-forced-shared-too-wide", |s| {
        let (x, dy, rstd, mut dx) = (make(&[2, 1 << 16])?, make(&[2, 1 << 16])?, make(&[2])?, make(&[2, 1 << 16])?);
        Norm::forced(PathKind::Shared).backward(&s.stream, RmsNorm, Backward::new(&x, &dy, &rstd, &mut dx)).map(|_| ())
    });
}

/// The LayerNorm backward asked for dbias alone (no weight, no dweight).
fn dbias_without_dweight(suite: &mut Suite) {
    let at = At::new(64, 256, None);
    let name = format!("norm/layer_norm_backward/dbias-only/f32/{}", at.name());
    suite.case(&name, tolerance(DType::F32), |suite, rng| {
        let (rows, cols) = (at.rows, at.cols);
        let x: Vec<f32> = Data::Mixed.generate(rng, rows, cols);
        let dy: Vec<f32> = values(rng, rows * cols, -1.0, 1.0);
        let x64 = f64s(&x);
        let stats: Vec<(f64, f64)> = norm_stats_rows(&x64, cols, false, EPS as f64)
            .into_iter()
            .map(|(m, r)| (m as f32 as f64, r as f32 as f64))
            .collect();
        let x_dev = Tensor::from_slice(&suite.gpu, &x, &[rows, cols])?;
        let dy_dev = Tensor::from_slice(&suite.gpu, &dy, &[rows, cols])?;
        let mean_dev = Tensor::from_slice(&suite.gpu, &stats.iter().map(|s| s.0 as f32).collect::<Vec<_>>(), &[rows])?;
        let rstd_dev = Tensor::from_slice(&suite.gpu, &stats.iter().map(|s| s.1 as f32).collect::<Vec<_>>(), &[rows])?;
        let mut dx_dev = suite.poisoned::<f32>(rows * cols, 0)?;
        let mut dbias_dev = suite.poisoned::<f32>(cols, 0)?;
        let plan = {
            let mut dx = dx_dev.view_mut().reshape(&[rows, cols])?;
            let call = Backward::new(&x_dev, &dy_dev, &rstd_dev, &mut dx).mean(&mean_dev).dbias(&mut dbias_dev);
            Norm::new().backward(&suite.stream, NormKind::LayerNorm, call)?
        };
        let run = BackwardRun { dx: dx_dev.to_vec()?, dweight: None, dbias: Some(dbias_dev.to_vec()?) };
        let mut checks = Checks::new(tolerance(DType::F32));
        let dy64 = f64s(&dy);
        let want = norm_backward_rows(&x64, &dy64, cols, &stats, false, None);
        let magnitude = norm_backward_magnitude_rows(&x64, &dy64, cols, &stats, false, None);
        checks.compare("dx", &run.dx, &want, tolerance(DType::F32), |i| magnitude[i].max(f32::MIN_POSITIVE as f64));
        let want = ParamGradsWant { grads: norm_param_grads(&x64, &dy64, cols, &stats), offset: 0 };
        compare_param_grads(&mut checks, &run, &want, DType::F32);
        Ok(checks.measured(&plan))
    });
}
