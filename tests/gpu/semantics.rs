//! Edge semantics: docs/SEMANTICS.md's tables, a case per row, op and dtype (and path, for
//! the row-wise ops). What NaN, ±Inf, rows of `-inf`, results past a dtype's range, empty
//! tensors, one-element rows and `ignore_index` give, against PyTorch's result: exactly
//! where that is NaN, infinite or a structural zero (any NaN for NaN; +0 and -0 alike),
//! within a few roundings elsewhere. Where rill deliberately differs, the case checks rill's
//! stated result. PyTorch's results come from the f64 references (whose special values
//! follow PyTorch's rules) on the inputs rounded to the dtype, and are rounded to the
//! output's dtype as PyTorch stores them.
//!
//! The row-wise cases run on every path the planner takes, each at three widths and
//! offsets that reach every kind of access: 33 columns (single elements on the warp path,
//! a row's last element an edge on the block paths), 1000 aligned (whole packs), and 1000
//! one element past 16 bytes (the block paths run rows from their heads). Rows 0 and 3 are
//! ordinary, rows 1 and 2 hold the special values (the narrowest warp tier reads rows 0
//! and 1 in one access, 2 and 3 in another), so a special row must not leak into its
//! neighbour.

use crate::batch_norm::{Act, batch_stats, channel_of, extent, reference_forward};
use crate::harness::{Measured, Suite};
use crate::runs::{
    BatchNormCall, BatchNormInputs, EPS, NormInputs, NormOp, RawBits, RowOp, SCALE, SoftmaxInputs, Written,
    batch_norm_run, cast_run, elementwise_run, relu_run, row_paths, run_row,
};
use crate::softmax::{Op, f64s, path_name};
use half::{bf16, f16};
use rill::batch_norm::Layout;
use rill::norm::NormKind;
use rill::{DType, Element};
use rill_tests::check::tolerance;
use rill_tests::paths::Forced;
use rill_tests::random::Rng;
use rill_tests::reference::{
    ELEMENTWISE_OPS, ElementwiseOp, cross_entropy_backward_rows, cross_entropy_rows, logsumexp_rows, norm_apply_rows,
    norm_backward_rows, norm_param_grads, norm_stats_rows, softmax_backward_rows, softmax_rows,
};

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

pub fn run(suite: &mut Suite) {
    for_dtype::<f32>(suite);
    for_dtype::<f16>(suite);
    for_dtype::<bf16>(suite);
    casts(suite);
    empty(suite);
}

fn for_dtype<T: RawBits>(suite: &mut Suite) {
    for row in ELEMENTWISE_ROWS {
        elementwise_row::<T>(suite, row);
    }
    for row in SoftmaxRow::ALL {
        for op in row.ops() {
            row_cases::<_, T>(
                suite,
                &format!("semantics/softmax/{}", row.name()),
                op,
                row.widths(),
                |rng, cols| row.inputs(op, rng, cols),
                |inputs, cols| row.expected(op, inputs, cols),
            );
        }
    }
    for row in NormRow::ALL {
        for op in row.ops() {
            row_cases::<_, T>(
                suite,
                &format!("semantics/norm/{}", row.name()),
                op,
                row.widths(),
                |rng, cols| row.inputs(op, rng, cols),
                |inputs, cols| row.expected(op, inputs, cols),
            );
        }
    }
    for row in BatchNormRow::ALL {
        batch_norm_row::<T>(suite, row);
    }
    relu_nan::<T>(suite);
}

// ---------------------------------------------------------------------------------------------
// What an output must be
// ---------------------------------------------------------------------------------------------

/// What one element must be.
#[derive(Clone, Copy, Debug)]
enum Want {
    /// This value: any NaN for NaN, +0 and -0 alike.
    Exact(f64),
    /// This finite value, within the case's tolerance relative to `max(|value|, 1)`.
    Near(f64),
    /// This finite value, within the case's tolerance relative to it (for values far below 1).
    Relative(f64),
    /// Anything: PyTorch's value depends on the order its reduction meets the element.
    Any,
}

impl Want {
    fn holds(self, got: f64, tolerance: f64) -> bool {
        match self {
            Want::Exact(want) if want.is_nan() => got.is_nan(),
            Want::Exact(want) => got == want,
            Want::Near(want) => (got - want).abs() <= tolerance * want.abs().max(1.0),
            Want::Relative(want) => (got - want).abs() <= tolerance * want.abs(),
            Want::Any => true,
        }
    }
}

impl std::fmt::Display for Want {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Want::Exact(want) => write!(f, "{want:e} exactly"),
            Want::Near(want) | Want::Relative(want) => write!(f, "about {want:e}"),
            Want::Any => write!(f, "anything"),
        }
    }
}

/// PyTorch's outputs from an f64 reference, stored as `T`: exact where that is NaN,
/// infinite, or where the reference is exactly 0 (a structural zero); near the reference
/// elsewhere, or exact everywhere where `exact`.
fn from_reference<T: Element>(reference: &[f64], exact: bool) -> Vec<Want> {
    reference
        .iter()
        .map(|&value| {
            let stored = T::from_f64(value).to_f64();
            if exact || value == 0.0 || !stored.is_finite() { Want::Exact(stored) } else { Want::Near(value) }
        })
        .collect()
}

/// What a call must have written, array by array (arrays not named are not checked).
type Expected = Vec<(&'static str, Vec<Want>)>;

/// The first element of `written` that is not what `expected` says, described.
fn mismatch(written: &[Written], expected: &Expected, tolerance: f64) -> Option<String> {
    for (name, wants) in expected {
        let Some(array) = written.iter().find(|w| w.name == *name) else {
            return Some(format!("{name} was not written"));
        };
        if array.values.len() != wants.len() {
            return Some(format!("{name} has {} elements, not {}", array.values.len(), wants.len()));
        }
        if let Some(i) = (0..wants.len()).find(|&i| !wants[i].holds(array.values[i], tolerance)) {
            return Some(format!("{} is {:e}, want {}", array.at(i), array.values[i], wants[i]));
        }
    }
    None
}

/// A case's outcome: exact, so its error is 0 or infinite.
fn verdict(mismatch: Option<String>) -> Measured {
    match mismatch {
        Some(detail) => Measured { error: f64::INFINITY, detail },
        None => Measured { error: 0.0, detail: String::new() },
    }
}

/// The tolerance of `Want::Near` for outputs of `T`.
fn near<T: Element>() -> f64 {
    4.0 * tolerance(T::DTYPE)
}

/// A magnitude whose double overflows `T`: 6e4 for f16, 3e38 for the types with f32's range.
fn big<T: Element>() -> f64 {
    if T::DTYPE == DType::F16 { 6e4 } else { 3e38 }
}

/// Values cycled along a row or channel: normalized (LayerNorm, RMSNorm, BatchNorm), they
/// are about -1.2 to -1.3, -0.3 to -0.4, 0.5 to 0.65 and 1.4 to 1.55, so times [`big`] the
/// outer two are well past every dtype's range and the inner two well inside. Their mean is
/// not 0, which would be checked exactly.
const PATTERN: [f64; 4] = [-1.375, -0.375, 0.625, 1.625];

/// Values in 19000..43000 (sums and squares pass f16's 65504), by [`PATTERN`].
fn past_f16(k: usize) -> f64 {
    30000.0 + 8000.0 * PATTERN[k % 4]
}

fn rounded<T: Element>(values: &[f64]) -> Vec<T> {
    values.iter().map(|&v| T::from_f64(v)).collect()
}

// ---------------------------------------------------------------------------------------------
// Row-wise cases
// ---------------------------------------------------------------------------------------------

/// Rows of every row-wise case.
const ROWS: usize = 4;

/// Widths and offsets of the row-wise cases (see the module's doc).
const WIDTHS: [(usize, usize); 3] = [(33, 0), (1000, 0), (1000, 1)];

/// One-element rows, aligned and one element past 16 bytes.
const ONE_ELEMENT: [(usize, usize); 2] = [(1, 0), (1, 1)];

/// Where the special rows hold a special value: the first `min(cols, 8)` columns of row 1
/// (a whole pack at its head, where a thread's share of the row starts) and the middle
/// column of row 2 (a lone element on the paths that read single elements).
fn special_places(cols: usize) -> impl Iterator<Item = usize> {
    (cols..cols + cols.min(8)).chain([2 * cols + cols / 2])
}

/// The first column of row 1 and the middle of row 2.
fn first_and_middle(cols: usize) -> [usize; 2] {
    [cols, 2 * cols + cols / 2]
}

/// A table row's cases for `op`, one per path the planner takes (the dispatcher's and each
/// other forced), each running every width and offset of `widths`: `make` draws the inputs
/// for a width, `expected` says what they must give.
fn row_cases<O: RowOp, T: RawBits>(
    suite: &mut Suite,
    prefix: &str,
    op: O,
    widths: &[(usize, usize)],
    make: impl Fn(&mut Rng, usize) -> O::Inputs<T>,
    expected: impl Fn(&O::Inputs<T>, usize) -> Expected,
) {
    let dtype = T::DTYPE.name();
    let name = |path| format!("{prefix}/{}/{dtype}/{}", op.name(), path_name(path));
    let (cols, offset) = widths[0];
    for path in row_paths::<O, T>(suite, op, ((ROWS, cols), offset), Some(Forced::Others), &name) {
        suite.case(&name(path), 1.0, |suite, rng| {
            for &(cols, offset) in widths {
                let inputs = make(rng, cols);
                let (plan, written) = run_row(suite, op, (ROWS, cols), &inputs, offset, path)?;
                if let Some(found) = mismatch(&written, &expected(&inputs, cols), near::<T>()) {
                    let detail = format!("[{ROWS}, {cols}] offset {offset}: {found}; {}", plan.describe());
                    return Ok(verdict(Some(detail)));
                }
            }
            Ok(verdict(None))
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Softmax family
// ---------------------------------------------------------------------------------------------

/// The softmax family's table rows.
#[derive(Clone, Copy, Debug, PartialEq)]
enum SoftmaxRow {
    /// NaN in the logits (a whole leading pack of row 1, one element of row 2), or in dy.
    Nan,
    /// `+inf` in the logits.
    PosInf,
    /// Some `-inf` logits: every third of row 1, all but the middle of row 2.
    NegInf,
    /// Rows of `-inf` only (fully masked rows of the scale + mask).
    AllNegInf,
    /// Log-probabilities below the dtype's range.
    LogBelowRange,
    OneElement,
    IgnoreIndex,
    /// Classes neither in the row nor -100.
    TargetOutOfRange,
}

impl SoftmaxRow {
    const ALL: [SoftmaxRow; 8] = [
        SoftmaxRow::Nan,
        SoftmaxRow::PosInf,
        SoftmaxRow::NegInf,
        SoftmaxRow::AllNegInf,
        SoftmaxRow::LogBelowRange,
        SoftmaxRow::OneElement,
        SoftmaxRow::IgnoreIndex,
        SoftmaxRow::TargetOutOfRange,
    ];

    fn name(self) -> &'static str {
        match self {
            SoftmaxRow::Nan => "nan",
            SoftmaxRow::PosInf => "pos_inf",
            SoftmaxRow::NegInf => "neg_inf",
            SoftmaxRow::AllNegInf => "all_neg_inf",
            SoftmaxRow::LogBelowRange => "log_below_range",
            SoftmaxRow::OneElement => "one_element",
            SoftmaxRow::IgnoreIndex => "ignore_index",
            SoftmaxRow::TargetOutOfRange => "target_out_of_range",
        }
    }

    fn ops(self) -> Vec<Op> {
        let logits =
            [Op::Forward { log: false }, Op::Forward { log: true }, Op::ScaleMask, Op::LogSumExp, Op::CrossEntropy];
        match self {
            // The causal kind: row 1 sees its first two columns (NaN), row 2 none of its NaN.
            SoftmaxRow::Nan => logits
                .into_iter()
                .chain([Op::Causal, Op::CrossEntropyBackward, Op::Backward { log: false }, Op::Backward { log: true }])
                .collect(),
            SoftmaxRow::PosInf | SoftmaxRow::NegInf | SoftmaxRow::AllNegInf => {
                logits.into_iter().chain([Op::CrossEntropyBackward]).collect()
            }
            SoftmaxRow::LogBelowRange => vec![Op::Forward { log: true }],
            SoftmaxRow::OneElement => Op::PLAIN.into_iter().chain(Op::FUSED).collect(),
            SoftmaxRow::IgnoreIndex | SoftmaxRow::TargetOutOfRange => vec![Op::CrossEntropy, Op::CrossEntropyBackward],
        }
    }

    fn widths(self) -> &'static [(usize, usize)] {
        if self == SoftmaxRow::OneElement { &ONE_ELEMENT } else { &WIDTHS }
    }

    /// Logits in [-4, 4) (for the backward: a real (log-)softmax output, and dy in
    /// [-1, 1)), a zero mask, classes inside the rows and loss gradients in [0.5, 2); then
    /// this row's special values: in dy for the backward, in the mask for the `-inf` rows of
    /// the scale + mask, else in the logits.
    fn inputs<T: Element>(self, op: Op, rng: &mut Rng, cols: usize) -> SoftmaxInputs<T> {
        let len = ROWS * cols;
        let logits: Vec<f64> = (0..len).map(|_| rng.uniform(-4.0, 4.0)).collect();
        let (mut x, mut second) = match op {
            Op::Backward { log } => {
                (softmax_rows(&logits, cols, log), (0..len).map(|_| rng.uniform(-1.0, 1.0)).collect())
            }
            _ => (logits, vec![0.0; len]),
        };
        let mut target: Vec<i64> = (0..ROWS).map(|_| (rng.next_u64() % cols as u64) as i64).collect();
        let dloss: Vec<f32> = (0..ROWS).map(|_| rng.uniform(0.5, 2.0) as f32).collect();
        let special = match (self, op) {
            (SoftmaxRow::Nan, Op::Backward { .. }) => &mut second,
            (SoftmaxRow::NegInf | SoftmaxRow::AllNegInf, Op::ScaleMask) => &mut second,
            _ => &mut x,
        };
        let middle = cols / 2;
        match self {
            SoftmaxRow::Nan => special_places(cols).for_each(|i| special[i] = NAN),
            SoftmaxRow::PosInf => first_and_middle(cols).into_iter().for_each(|i| special[i] = INF),
            SoftmaxRow::NegInf => {
                for c in 0..cols {
                    if c % 3 == 1 {
                        special[cols + c] = -INF;
                    }
                    if c != middle {
                        special[2 * cols + c] = -INF;
                    }
                }
                // Row 1's class has probability 0 (loss +inf), row 2's probability 1.
                (target[1], target[2]) = (1, middle as i64);
            }
            SoftmaxRow::AllNegInf => special[cols..3 * cols].fill(-INF),
            SoftmaxRow::LogBelowRange => {
                // Row 1: big first, -big in the middle (2 big below the max); row 2: -big.
                let big = big::<T>();
                let [row1, row2] = first_and_middle(cols);
                (special[row1], special[cols + middle], special[row2]) = (big, -big, -big);
            }
            SoftmaxRow::OneElement => {}
            SoftmaxRow::IgnoreIndex => (target[1], target[2]) = (-100, -100),
            SoftmaxRow::TargetOutOfRange => (target[1], target[2]) = (cols as i64, -1),
        }
        SoftmaxInputs { x: rounded(&x), second: rounded(&second), target, dloss }
    }

    /// PyTorch's outputs, exact everywhere for one-element rows (1, 0, x or 0).
    fn expected<T: Element>(self, op: Op, inputs: &SoftmaxInputs<T>, cols: usize) -> Expected {
        let (x, second, dloss) = (f64s(&inputs.x), f64s(&inputs.second), f64s(&inputs.dloss));
        let scaled = |visible: &dyn Fn(usize) -> Option<f64>| -> Vec<f64> {
            (0..x.len()).map(|i| visible(i).map_or(-INF, |mask| x[i] * SCALE as f64 + mask)).collect()
        };
        let reference = match op {
            Op::Forward { log } => softmax_rows(&x, cols, log),
            Op::Backward { log } => softmax_backward_rows(&x, &second, cols, log),
            Op::ScaleMask => softmax_rows(&scaled(&|i| Some(second[i])), cols, false),
            // One batch: query `r` sees keys `0..=r`.
            Op::Causal => softmax_rows(&scaled(&|i| (i % cols <= i / cols).then_some(0.0)), cols, false),
            Op::LogSumExp => logsumexp_rows(&x, cols),
            Op::CrossEntropy => cross_entropy_reference(&x, &inputs.target, &dloss, cols, false),
            Op::CrossEntropyBackward => cross_entropy_reference(&x, &inputs.target, &dloss, cols, true),
        };
        let exact = self == SoftmaxRow::OneElement;
        let wants = if op.per_row() {
            from_reference::<f32>(&reference, exact)
        } else {
            from_reference::<T>(&reference, exact)
        };
        vec![(op.output_name(), wants)]
    }
}

/// Cross entropy's loss, or its gradient, as rill gives them: PyTorch's where each class is
/// inside its row or -100; where a class is neither (PyTorch stops with a device-side
/// assert), a NaN loss and the gradient `p * dloss`, the class matching no column.
fn cross_entropy_reference(logits: &[f64], target: &[i64], dloss: &[f64], cols: usize, backward: bool) -> Vec<f64> {
    let outside = |t: i64| t != -100 && !(0..cols as i64).contains(&t);
    let inside: Vec<i64> = target.iter().map(|&t| if outside(t) { -100 } else { t }).collect();
    if backward {
        let p = softmax_rows(logits, cols, false);
        let mut grad = cross_entropy_backward_rows(logits, &inside, dloss, cols);
        for (i, g) in grad.iter_mut().enumerate() {
            if outside(target[i / cols]) {
                *g = p[i] * dloss[i / cols];
            }
        }
        grad
    } else {
        let mut loss = cross_entropy_rows(logits, &inside, cols);
        for (l, &t) in loss.iter_mut().zip(target) {
            if outside(t) {
                *l = NAN;
            }
        }
        loss
    }
}

// ---------------------------------------------------------------------------------------------
// Norms
// ---------------------------------------------------------------------------------------------

/// The norms' table rows.
#[derive(Clone, Copy, Debug, PartialEq)]
enum NormRow {
    /// NaN in x (a whole leading pack of row 1, one element of row 2), or in dy.
    Nan,
    /// `+inf` first in row 1, `-inf` in the middle of row 2.
    Inf,
    OneElement,
    /// y past the dtype's range: weights of [`big`].
    OutputPastRange,
    /// 16-bit rows whose sums and squares pass f16's range.
    SumsPastF16,
    /// `x + residual` past the dtype's range.
    ResidualPastRange,
}

impl NormRow {
    const ALL: [NormRow; 6] = [
        NormRow::Nan,
        NormRow::Inf,
        NormRow::OneElement,
        NormRow::OutputPastRange,
        NormRow::SumsPastF16,
        NormRow::ResidualPastRange,
    ];

    fn name(self) -> &'static str {
        match self {
            NormRow::Nan => "nan",
            NormRow::Inf => "inf",
            NormRow::OneElement => "one_element",
            NormRow::OutputPastRange => "output_past_range",
            NormRow::SumsPastF16 => "sums_past_f16_range",
            NormRow::ResidualPastRange => "residual_sum_past_range",
        }
    }

    fn ops(self) -> Vec<NormOp> {
        let forward =
            |residual| [NormKind::LayerNorm, NormKind::RmsNorm].map(|kind| NormOp::Forward { kind, residual }).to_vec();
        let backward = [NormOp::Backward(NormKind::LayerNorm), NormOp::Backward(NormKind::RmsNorm)];
        match self {
            NormRow::Nan | NormRow::OneElement => forward(false).into_iter().chain(backward).collect(),
            NormRow::Inf | NormRow::OutputPastRange | NormRow::SumsPastF16 => forward(false),
            NormRow::ResidualPastRange => forward(true),
        }
    }

    fn widths(self) -> &'static [(usize, usize)] {
        if self == NormRow::OneElement { &ONE_ELEMENT } else { &WIDTHS }
    }

    /// x in [-2, 2), the residual and dy in [-1, 1), weights of magnitude 0.5 to 1.5 either
    /// sign, biases in [-1, 1), then this row's values; the backward reads x's statistics as
    /// a forward saves them (f32).
    fn inputs<T: Element>(self, op: NormOp, rng: &mut Rng, cols: usize) -> NormInputs<T> {
        let len = ROWS * cols;
        let mut x: Vec<f64> = (0..len).map(|_| rng.uniform(-2.0, 2.0)).collect();
        let mut second: Vec<f64> = (0..len).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let mut weight: Vec<f64> = (0..cols)
            .map(|_| {
                let m = rng.uniform(0.5, 1.5);
                if rng.next_u64() & 1 == 0 { m } else { -m }
            })
            .collect();
        let mut bias: Vec<f64> = (0..cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let big = big::<T>();
        match self {
            NormRow::Nan => {
                let special = if matches!(op, NormOp::Backward(_)) { &mut second } else { &mut x };
                special_places(cols).for_each(|i| special[i] = NAN);
            }
            NormRow::Inf => {
                let [first, middle] = first_and_middle(cols);
                (x[first], x[middle]) = (INF, -INF);
            }
            NormRow::OneElement => {}
            NormRow::OutputPastRange => {
                x = (0..len).map(|i| PATTERN[i % cols % 4]).collect();
                weight.fill(big);
                bias.fill(0.0);
            }
            NormRow::SumsPastF16 => x = (0..len).map(|i| past_f16(i % cols)).collect(),
            NormRow::ResidualPastRange => {
                for (i, v) in first_and_middle(cols).into_iter().zip([big, -big]) {
                    (x[i], second[i]) = (v, v);
                }
            }
        }
        let x: Vec<T> = rounded(&x);
        let (mut mean, mut rstd) = (vec![0.0; ROWS], vec![0.0; ROWS]);
        if let NormOp::Backward(kind) = op {
            let stats = norm_stats_rows(&f64s(&x), cols, kind == NormKind::RmsNorm, EPS as f64);
            mean = stats.iter().map(|s| s.0 as f32).collect();
            rstd = stats.iter().map(|s| s.1 as f32).collect();
        }
        NormInputs { x, second: rounded(&second), weight: rounded(&weight), bias: rounded(&bias), mean, rstd }
    }

    /// PyTorch's outputs. One-element LayerNorm rows give exactly the bias (x - mean is 0)
    /// and save x as the mean. The mean of a row holding an infinity is not checked: PyTorch's
    /// Welford mean is ±inf or NaN as the order of its updates meets the infinity.
    fn expected<T: Element>(self, op: NormOp, inputs: &NormInputs<T>, cols: usize) -> Expected {
        let rms = op.kind() == NormKind::RmsNorm;
        let (x, second, weight, bias) =
            (f64s(&inputs.x), f64s(&inputs.second), f64s(&inputs.weight), f64s(&inputs.bias));
        let one = self == NormRow::OneElement;
        match op {
            NormOp::Forward { residual, .. } => {
                let input: Vec<f64> = if residual {
                    x.iter().zip(&second).map(|(a, b)| T::from_f64(a + b).to_f64()).collect()
                } else {
                    x
                };
                let stats = norm_stats_rows(&input, cols, rms, EPS as f64);
                let y = norm_apply_rows(&input, cols, &stats, Some(&weight), (!rms).then_some(&bias[..]));
                let mut expected = vec![("y", from_reference::<T>(&y, one && !rms))];
                if residual {
                    expected.push(("sum", from_reference::<T>(&input, false)));
                }
                if !rms {
                    let mean: Vec<f64> = stats.iter().map(|s| s.0).collect();
                    let mut wants = from_reference::<f32>(&mean, one);
                    for (row, want) in input.chunks(cols).zip(&mut wants) {
                        if row.iter().any(|v| v.is_infinite()) {
                            *want = Want::Any;
                        }
                    }
                    expected.push(("mean", wants));
                }
                let rstd: Vec<f64> = stats.iter().map(|s| s.1).collect();
                expected.push(("rstd", from_reference::<f32>(&rstd, false)));
                expected
            }
            NormOp::Backward(_) => {
                let stats: Vec<(f64, f64)> =
                    inputs.mean.iter().zip(&inputs.rstd).map(|(&m, &r)| (m as f64, r as f64)).collect();
                let dx = norm_backward_rows(&x, &second, cols, &stats, rms, Some(&weight));
                let grads = norm_param_grads(&x, &second, cols, &stats);
                let mut expected = vec![
                    ("dx", from_reference::<T>(&dx, false)),
                    ("dweight", from_reference::<T>(&grads.dweight, false)),
                ];
                if !rms {
                    expected.push(("dbias", from_reference::<T>(&grads.dbias, false)));
                }
                expected
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// BatchNorm
// ---------------------------------------------------------------------------------------------

/// The BatchNorm cases' shapes: 3 channels of 10 values, in each layout.
const BATCH_NORM_SHAPES: [(Layout, &[usize]); 2] =
    [(Layout::ChannelsFirst, &[2, 3, 5]), (Layout::ChannelsLast, &[10, 3])];

/// BatchNorm's table rows.
#[derive(Clone, Copy, Debug, PartialEq)]
enum BatchNormRow {
    /// Training, NaN in channel 1.
    Nan,
    /// Training, `+inf` in channel 1 and `-inf` in channel 2 (neither first).
    Inf,
    /// Eval, NaN in channel 0, `+inf` in channel 1, `-inf` in channel 2.
    EvalSpecials,
    /// Training, y past the dtype's range: weights of [`big`].
    OutputPastRange,
    /// Training, 16-bit channels whose sums pass f16's range.
    SumsPastF16,
    /// Training with Add + ReLU, NaN in the addend of channel 1: y NaN there alone (the
    /// statistics are x's), and the fused backward lets dy through at that NaN y.
    AddReluNan,
}

impl BatchNormRow {
    const ALL: [BatchNormRow; 6] = [
        BatchNormRow::Nan,
        BatchNormRow::Inf,
        BatchNormRow::EvalSpecials,
        BatchNormRow::OutputPastRange,
        BatchNormRow::SumsPastF16,
        BatchNormRow::AddReluNan,
    ];

    fn name(self) -> &'static str {
        match self {
            BatchNormRow::Nan => "nan_training",
            BatchNormRow::Inf => "inf_training",
            BatchNormRow::EvalSpecials => "nan_inf_eval",
            BatchNormRow::OutputPastRange => "output_past_range",
            BatchNormRow::SumsPastF16 => "sums_past_f16_range",
            BatchNormRow::AddReluNan => "relu_nan/add_relu",
        }
    }

    fn training(self) -> bool {
        self != BatchNormRow::EvalSpecials
    }

    fn act(self) -> Act {
        if self == BatchNormRow::AddReluNan { Act::AddRelu } else { Act::None }
    }

    /// x in [-2, 2), weights of magnitude 0.5 to 1.5 either sign, biases in [-0.5, 0.5),
    /// running means in [-1, 1) and variances in [0.5, 2), then this row's values (with Add +
    /// ReLU: the addend and dy in [-1, 1)).
    fn inputs<T: Element>(self, rng: &mut Rng, layout: Layout, shape: &[usize]) -> BatchNormInputs<T> {
        let ext @ (_, channels, _) = extent(shape, layout);
        let len: usize = shape.iter().product();
        let members: Vec<Vec<usize>> =
            (0..channels).map(|c| (0..len).filter(|&i| channel_of(i, ext) == c).collect()).collect();
        let mut x: Vec<f64> = (0..len).map(|_| rng.uniform(-2.0, 2.0)).collect();
        let mut weight: Vec<f32> = (0..channels)
            .map(|_| {
                let m = rng.uniform(0.5, 1.5) as f32;
                if rng.next_u64() & 1 == 0 { m } else { -m }
            })
            .collect();
        let mut bias: Vec<f32> = (0..channels).map(|_| rng.uniform(-0.5, 0.5) as f32).collect();
        let running_mean = (0..channels).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
        let running_var = (0..channels).map(|_| rng.uniform(0.5, 2.0) as f32).collect();
        let (mut addend, mut dy) = (vec![0.0; len], vec![0.0; len]);
        match self {
            BatchNormRow::Nan => x[members[1][2]] = NAN,
            BatchNormRow::Inf => (x[members[1][2]], x[members[2][2]]) = (INF, -INF),
            BatchNormRow::EvalSpecials => {
                (x[members[0][1]], x[members[1][1]], x[members[2][1]]) = (NAN, INF, -INF);
            }
            BatchNormRow::OutputPastRange | BatchNormRow::SumsPastF16 => {
                for channel in &members {
                    for (k, &i) in channel.iter().enumerate() {
                        x[i] = if self == BatchNormRow::SumsPastF16 { past_f16(k) } else { PATTERN[k % 4] };
                    }
                }
                if self == BatchNormRow::OutputPastRange {
                    weight.fill(big::<T>() as f32);
                    bias.fill(0.0);
                }
            }
            BatchNormRow::AddReluNan => {
                addend = (0..len).map(|_| rng.uniform(-1.0, 1.0)).collect();
                dy = (0..len).map(|_| rng.uniform(-1.0, 1.0)).collect();
                addend[members[1][2]] = NAN;
            }
        }
        BatchNormInputs {
            x: rounded(&x),
            addend: rounded(&addend),
            dy: rounded(&dy),
            weight,
            bias,
            running_mean,
            running_var,
        }
    }

    /// PyTorch's outputs. In training, the mean (saved and running) of a channel holding an
    /// infinity is not checked: PyTorch's Welford mean is ±inf or NaN as the order of its
    /// updates meets it.
    fn expected<T: Element>(self, inputs: &BatchNormInputs<T>, layout: Layout, shape: &[usize]) -> Expected {
        let ext @ (_, channels, _) = extent(shape, layout);
        let x = f64s(&inputs.x);
        let (running_mean, running_var) = (f64s(&inputs.running_mean), f64s(&inputs.running_var));
        if !self.training() {
            let y: Vec<f64> = (0..x.len())
                .map(|i| {
                    let c = channel_of(i, ext);
                    (x[i] - running_mean[c]) / (running_var[c] + 1e-5).sqrt() * inputs.weight[c] as f64
                        + inputs.bias[c] as f64
                })
                .collect();
            return vec![
                ("y", from_reference::<T>(&y, false)),
                ("running_mean", from_reference::<f32>(&running_mean, true)),
                ("running_var", from_reference::<f32>(&running_var, true)),
            ];
        }
        if self == BatchNormRow::AddReluNan {
            return add_relu_expected(inputs, ext);
        }
        let stats = batch_stats(&x, ext);
        let y = reference_forward(&x, &[], (&inputs.weight, &inputs.bias), ext, Act::None);
        let count = (x.len() / channels) as f64;
        let invstd: Vec<f64> = stats.var.iter().map(|v| 1.0 / (v + 1e-5).sqrt()).collect();
        let updated_mean: Vec<f64> = (0..channels).map(|c| 0.9 * running_mean[c] + 0.1 * stats.mean[c]).collect();
        let updated_var: Vec<f64> =
            (0..channels).map(|c| 0.9 * running_var[c] + 0.1 * stats.var[c] * count / (count - 1.0)).collect();
        let infinite: Vec<bool> =
            (0..channels).map(|c| (0..x.len()).any(|i| channel_of(i, ext) == c && x[i].is_infinite())).collect();
        let mean_wants = |means: &[f64]| -> Vec<Want> {
            from_reference::<f32>(means, false)
                .into_iter()
                .zip(&infinite)
                .map(|(want, &infinite)| if infinite { Want::Any } else { want })
                .collect()
        };
        vec![
            ("y", from_reference::<T>(&y, false)),
            ("saved_mean", mean_wants(&stats.mean)),
            ("saved_invstd", from_reference::<f32>(&invstd, false)),
            ("running_mean", mean_wants(&updated_mean)),
            ("running_var", from_reference::<f32>(&updated_var, false)),
        ]
    }
}

/// Add + ReLU in training, as PyTorch: `y = relu(bn(x) + addend)` (NaN where the addend is),
/// then `g = threshold_backward(dy, y, 0)`, `y <= 0 ? 0 : dy` of y as stored, which passes dy
/// at a NaN y; `d(addend) = g` (exactly), `dbias = sum g`, `dweight = sum g x̂` over each
/// channel, x̂ from the exact batch statistics.
fn add_relu_expected<T: Element>(inputs: &BatchNormInputs<T>, ext: (usize, usize, usize)) -> Expected {
    let (_, channels, _) = ext;
    let (x, addend, dy) = (f64s(&inputs.x), f64s(&inputs.addend), f64s(&inputs.dy));
    let y = reference_forward(&x, &addend, (&inputs.weight, &inputs.bias), ext, Act::AddRelu);
    let g: Vec<f64> =
        y.iter().zip(&dy).map(|(&y, &dy)| if T::from_f64(y).to_f64() <= 0.0 { 0.0 } else { dy }).collect();
    let stats = batch_stats(&x, ext);
    let (mut dbias, mut dweight) = (vec![0.0; channels], vec![0.0; channels]);
    for i in 0..x.len() {
        let c = channel_of(i, ext);
        dbias[c] += g[i];
        dweight[c] += g[i] * (x[i] - stats.mean[c]) / (stats.var[c] + EPS as f64).sqrt();
    }
    vec![
        ("y", from_reference::<T>(&y, false)),
        ("daddend", from_reference::<T>(&g, true)),
        ("dbias", from_reference::<f32>(&dbias, false)),
        ("dweight", from_reference::<f32>(&dweight, false)),
    ]
}

fn batch_norm_row<T: RawBits>(suite: &mut Suite, row: BatchNormRow) {
    for (layout, shape) in BATCH_NORM_SHAPES {
        let name = format!("semantics/batch_norm/{}/{layout:?}/{}", row.name(), T::DTYPE.name());
        suite.case(&name, 1.0, |suite, rng| {
            let inputs = row.inputs::<T>(rng, layout, shape);
            let call = BatchNormCall { layout, shape, act: row.act(), training: row.training() };
            let written = batch_norm_run(suite, call, &inputs, 0)?;
            Ok(verdict(mismatch(&written, &row.expected(&inputs, layout, shape), near::<T>())))
        });
    }
}

/// Values the ReLU case cycles through.
const RELU_INPUTS: [f64; 8] = [NAN, 2.0, -2.0, INF, -INF, 0.5, -0.5, 0.0];

/// The standalone ReLU at NaN and ±inf: y as PyTorch's `relu`, dx as its backward,
/// `threshold_backward(dy, y, 0)`: `y <= 0 ? 0 : dy`, which passes dy at a NaN y.
fn relu_nan<T: RawBits>(suite: &mut Suite) {
    let name = format!("semantics/batch_norm/relu_nan/{}", T::DTYPE.name());
    suite.case(&name, 1.0, |suite, rng| {
        let len = 37;
        let x: Vec<f64> = (0..len).map(|i| RELU_INPUTS[i % RELU_INPUTS.len()]).collect();
        let dy: Vec<f64> = (0..len).map(|_| rng.uniform(0.5, 1.5)).collect();
        let (x_t, dy_t): (Vec<T>, Vec<T>) = (rounded(&x), rounded(&dy));
        let y: Vec<f64> = x.iter().map(|&v| if v <= 0.0 { 0.0 } else { v }).collect();
        let dx: Vec<f64> = y.iter().zip(f64s(&dy_t)).map(|(&y, dy)| if y <= 0.0 { 0.0 } else { dy }).collect();
        let expected = vec![
            ("y", from_reference::<T>(&y, true)),
            ("dx_from_mask", from_reference::<T>(&dx, true)),
            ("dx_from_y", from_reference::<T>(&dx, true)),
        ];
        for offset in [0, 1] {
            let written = relu_run(suite, &x_t, &dy_t, offset)?;
            if let Some(found) = mismatch(&written, &expected, 0.0) {
                return Ok(verdict(Some(format!("offset {offset}: {found}"))));
            }
        }
        Ok(verdict(None))
    });
}

// ---------------------------------------------------------------------------------------------
// Elementwise
// ---------------------------------------------------------------------------------------------

/// One elementwise table row for one op: input tuples and the output of each (PyTorch's,
/// but where the row says rill differs).
struct Specials {
    row: &'static str,
    op: &'static str,
    /// The inputs are in units of the dtype's [`big`].
    big: bool,
    /// Only for the dtypes with f32's exponent range (f16 has no such values).
    f32_range: bool,
    cases: &'static [(&'static [f64], f64)],
}

impl Specials {
    const fn new(row: &'static str, op: &'static str, cases: &'static [(&'static [f64], f64)]) -> Specials {
        Specials { row, op, big: false, f32_range: false, cases }
    }
}

const ELEMENTWISE_ROWS: &[Specials] = &[
    Specials::new("nan", "relu", &[(&[NAN], NAN)]),
    Specials::new("nan", "gelu", &[(&[NAN], NAN)]),
    Specials::new("nan", "gelu_tanh", &[(&[NAN], NAN)]),
    Specials::new("nan", "silu", &[(&[NAN], NAN)]),
    Specials::new("nan", "sigmoid", &[(&[NAN], NAN)]),
    Specials::new("nan", "add", &[(&[NAN, 1.0], NAN), (&[1.0, NAN], NAN)]),
    Specials::new("nan", "sub", &[(&[NAN, 1.0], NAN), (&[1.0, NAN], NAN)]),
    Specials::new("nan", "mul", &[(&[NAN, 0.0], NAN), (&[1.0, NAN], NAN)]),
    Specials::new("nan", "div", &[(&[NAN, 1.0], NAN), (&[1.0, NAN], NAN)]),
    Specials::new("nan", "fma", &[(&[NAN, 1.0, 1.0], NAN), (&[1.0, NAN, 1.0], NAN), (&[1.0, 1.0, NAN], NAN)]),
    Specials::new("nan", "bias_add_gelu", &[(&[NAN, 1.0], NAN), (&[1.0, NAN], NAN)]),
    Specials::new("pos_inf", "relu", &[(&[INF], INF)]),
    Specials::new("pos_inf", "gelu", &[(&[INF], INF)]),
    Specials::new("pos_inf", "gelu_tanh", &[(&[INF], INF)]),
    Specials::new("pos_inf", "silu", &[(&[INF], INF)]),
    Specials::new("pos_inf", "sigmoid", &[(&[INF], 1.0)]),
    Specials::new("pos_inf", "bias_add_gelu", &[(&[INF, -1.0], INF)]),
    Specials::new("neg_inf", "relu", &[(&[-INF], 0.0)]),
    Specials::new("neg_inf", "gelu", &[(&[-INF], NAN)]),
    Specials::new("neg_inf", "gelu_tanh", &[(&[-INF], NAN)]),
    Specials::new("neg_inf", "silu", &[(&[-INF], NAN)]),
    Specials::new("neg_inf", "sigmoid", &[(&[-INF], 0.0)]),
    Specials::new("neg_inf", "bias_add_gelu", &[(&[-INF, 1.0], NAN)]),
    Specials::new("inf_arithmetic", "add", &[(&[INF, -INF], NAN), (&[INF, 1.0], INF), (&[-INF, -1.0], -INF)]),
    Specials::new("inf_arithmetic", "sub", &[(&[INF, INF], NAN), (&[-INF, INF], -INF), (&[1.0, -INF], INF)]),
    Specials::new("inf_arithmetic", "mul", &[(&[0.0, INF], NAN), (&[-2.0, INF], -INF), (&[-INF, -INF], INF)]),
    Specials::new(
        "inf_arithmetic",
        "div",
        &[
            (&[1.0, 0.0], INF),
            (&[-1.0, 0.0], -INF),
            (&[1.0, -0.0], -INF),
            (&[0.0, 0.0], NAN),
            (&[1.0, INF], 0.0),
            (&[INF, INF], NAN),
            (&[INF, 2.0], INF),
        ],
    ),
    Specials::new(
        "inf_arithmetic",
        "fma",
        &[(&[0.0, INF, 1.0], NAN), (&[INF, 1.0, -INF], NAN), (&[2.0, 3.0, INF], INF), (&[INF, -1.0, 1.0], -INF)],
    ),
    Specials { big: true, ..Specials::new("past_range", "add", &[(&[1.0, 1.0], INF), (&[-1.0, -1.0], -INF)]) },
    Specials { big: true, ..Specials::new("past_range", "sub", &[(&[-1.0, 1.0], -INF)]) },
    Specials { big: true, ..Specials::new("past_range", "mul", &[(&[1.0, -1.0], -INF)]) },
    Specials { big: true, ..Specials::new("past_range", "fma", &[(&[1.0, 1.0, 1.0], INF)]) },
    Specials { big: true, ..Specials::new("past_range", "bias_add_gelu", &[(&[1.0, 1.0], INF)]) },
    // 2^126 / 2^127 and -3 * 2^126 / (3 * 2^126); silu(-88) = -88 / (1 + e^88).
    Specials {
        f32_range: true,
        ..Specials::new(
            "large_divisor",
            "div",
            &[
                (&[8.507_059_173_023_462e37, 1.701_411_834_604_692_3e38], 0.5),
                (&[-2.552_117_751_907_038_6e38, 2.552_117_751_907_038_6e38], -1.0),
            ],
        )
    },
    Specials { f32_range: true, ..Specials::new("large_divisor", "silu", &[(&[-88.0], -5.328_049_667_953_044e-37)]) },
    // rill's value: PyTorch gives 6.05e-39, a subnormal of f32 and bf16 (and 0 in f16).
    Specials::new("subnormal_result", "sigmoid", &[(&[-88.0], 0.0)]),
];

/// `row`'s cases for `T`: the input tuples cycled over an array of eight times their count
/// plus 3 (whole packs and a tail; the broadcast bias: a tuple a column, 5 rows), aligned
/// and one element past 16 bytes.
fn elementwise_row<T: RawBits>(suite: &mut Suite, row: &Specials) {
    if row.f32_range && T::DTYPE == DType::F16 {
        return;
    }
    let name = format!("semantics/elementwise/{}/{}/{}", row.row, row.op, T::DTYPE.name());
    let scale = if row.big { big::<T>() } else { 1.0 };
    suite.case(&name, 1.0, |suite, _| {
        let op = elementwise_op(row.op)?;
        let tuples = row.cases.len();
        let (shape, len) =
            if op.broadcasts_last { (vec![5, tuples], 5 * tuples) } else { (vec![8 * tuples + 3], 8 * tuples + 3) };
        let tuple_of = |i: usize| &row.cases[i % tuples];
        let inputs: Vec<Vec<T>> = (0..op.arity)
            .map(|k| {
                let n = if op.broadcasts_last && k == op.arity - 1 { tuples } else { len };
                (0..n).map(|i| T::from_f64(tuple_of(i).0[k] * scale)).collect()
            })
            .collect();
        let outputs: Vec<f64> = (0..len).map(|i| tuple_of(i).1).collect();
        // Relative to the value: the large-divisor row's silu is about 5e-37.
        let wants = from_reference::<T>(&outputs, false).into_iter().map(|want| match want {
            Want::Near(value) => Want::Relative(value),
            other => other,
        });
        let expected = vec![("y", wants.collect())];
        for offset in [0, 1] {
            let written = elementwise_run(suite, op, &inputs, &shape, offset)?;
            if let Some(found) = mismatch(&written, &expected, near::<T>()) {
                return Ok(verdict(Some(format!("{shape:?} offset {offset}: {found}"))));
            }
        }
        Ok(verdict(None))
    });
}

/// The elementwise op named `name` in the reference table.
fn elementwise_op(name: &str) -> rill::Result<&'static ElementwiseOp> {
    ELEMENTWISE_OPS
        .iter()
        .find(|op| op.name == name)
        .ok_or_else(|| rill::Error::Unsupported(format!("no elementwise op `{name}` in the reference table")))
}

/// NaN, the infinities and -0 through every cast.
const CAST_SPECIALS: &[(f64, f64)] = &[(NAN, NAN), (INF, INF), (-INF, -INF), (-0.0, -0.0), (1.5, 1.5)];

fn casts(suite: &mut Suite) {
    cast_row::<f32, f16>(suite, "specials", CAST_SPECIALS);
    cast_row::<f32, bf16>(suite, "specials", CAST_SPECIALS);
    cast_row::<f16, f32>(suite, "specials", CAST_SPECIALS);
    cast_row::<bf16, f32>(suite, "specials", CAST_SPECIALS);
    cast_row::<f16, bf16>(suite, "specials", CAST_SPECIALS);
    cast_row::<bf16, f16>(suite, "specials", CAST_SPECIALS);
    // Rounded to nearest even: f16's largest is 65504, 65520 is halfway to the next power.
    cast_row::<f32, f16>(suite, "past_range", &[(1e5, INF), (-1e5, -INF), (65519.0, 65504.0), (65520.0, INF)]);
    let (f32_max, bf16_max) = (f32::MAX as f64, bf16::MAX.to_f64());
    cast_row::<f32, bf16>(suite, "past_range", &[(f32_max, INF), (-f32_max, -INF), (bf16_max, bf16_max)]);
    cast_row::<bf16, f16>(suite, "past_range", &[(1e5, INF), (-1e5, -INF), (256.0, 256.0)]);
}

/// `cases` (input, output) cast from `I` to `O`, cycled as [`elementwise_row`]'s tuples.
fn cast_row<I: Element, O: RawBits>(suite: &mut Suite, row: &str, cases: &[(f64, f64)]) {
    let name = format!("semantics/elementwise/{row}/cast/{}->{}", I::DTYPE.name(), O::DTYPE.name());
    let len = 8 * cases.len() + 3;
    let x: Vec<I> = (0..len).map(|i| I::from_f64(cases[i % cases.len()].0)).collect();
    let outputs: Vec<f64> = (0..len).map(|i| cases[i % cases.len()].1).collect();
    let expected = vec![("y", from_reference::<O>(&outputs, true))];
    suite.case(&name, 1.0, |suite, _| {
        for offset in [0, 1] {
            if let Some(found) = mismatch(&cast_run::<I, O>(suite, &x, offset)?, &expected, 0.0) {
                return Ok(verdict(Some(format!("[{len}] offset {offset}: {found}"))));
            }
        }
        Ok(verdict(None))
    });
}

// ---------------------------------------------------------------------------------------------
// Empty tensors
// ---------------------------------------------------------------------------------------------

/// Elementwise ops, casts and the standalone ReLU are no-ops on empty tensors, as PyTorch
/// returns empty results; BatchNorm in eval too. The row-wise ops reject zero rows or zero
/// columns with `InvalidInput` (docs/SEMANTICS.md says why). BatchNorm in training over zero
/// values per channel: PyTorch returns an empty y and leaves the running statistics.
fn empty(suite: &mut Suite) {
    for (name, shape) in [("relu", &[0][..]), ("add", &[0, 4]), ("fma", &[0]), ("bias_add_gelu", &[0, 8])] {
        suite.case(&format!("semantics/elementwise/empty/{name}/{shape:?}"), 1.0, |suite, _| {
            let op = elementwise_op(name)?;
            let inputs: Vec<Vec<f32>> = (0..op.arity)
                .map(|k| vec![0.0; if op.broadcasts_last && k == op.arity - 1 { shape[shape.len() - 1] } else { 0 }])
                .collect();
            let written = elementwise_run(suite, op, &inputs, shape, 0)?;
            Ok(verdict(mismatch(&written, &vec![("y", Vec::new())], 0.0)))
        });
    }
    suite.case("semantics/elementwise/empty/cast/f32->f16", 1.0, |suite, _| {
        Ok(verdict(mismatch(&cast_run::<f32, f16>(suite, &[], 0)?, &vec![("y", Vec::new())], 0.0)))
    });
    suite.case("semantics/batch_norm/empty/relu", 1.0, |suite, _| {
        Ok(verdict(mismatch(&relu_run::<f32>(suite, &[], &[], 0)?, &vec![("y", Vec::new())], 0.0)))
    });
    for (rows, cols) in [(0, 8), (4, 0)] {
        for op in Op::PLAIN.into_iter().chain(Op::FUSED) {
            empty_rows(suite, &format!("semantics/softmax/empty/{}/[{rows}, {cols}]", op.name()), op, (rows, cols));
        }
        for kind in [NormKind::LayerNorm, NormKind::RmsNorm] {
            for op in [NormOp::Forward { kind, residual: false }, NormOp::Backward(kind)] {
                empty_rows(suite, &format!("semantics/norm/empty/{}/[{rows}, {cols}]", op.name()), op, (rows, cols));
            }
        }
    }
    for training in [false, true] {
        let mode = if training { "training" } else { "eval" };
        suite.case(&format!("semantics/batch_norm/empty/{mode}"), 1.0, |suite, _| {
            let shape = [0, 3, 5];
            let inputs = BatchNormInputs::<f32> {
                x: Vec::new(),
                addend: Vec::new(),
                dy: Vec::new(),
                weight: vec![1.0; 3],
                bias: vec![0.0; 3],
                running_mean: vec![0.25; 3],
                running_var: vec![2.0; 3],
            };
            let call = BatchNormCall { layout: Layout::ChannelsFirst, shape: &shape, act: Act::None, training };
            let written = batch_norm_run(suite, call, &inputs, 0)?;
            let unchanged = vec![
                ("y", Vec::new()),
                ("running_mean", vec![Want::Exact(0.25); 3]),
                ("running_var", vec![Want::Exact(2.0); 3]),
            ];
            Ok(verdict(mismatch(&written, &unchanged, 0.0)))
        });
    }
    // The same in both: more than one value per channel in training.
    suite.rejects("semantics/batch_norm/one_value_per_channel", |suite| {
        let inputs = BatchNormInputs::<f32> {
            x: vec![1.0; 3],
            addend: vec![0.0; 3],
            dy: vec![0.0; 3],
            weight: vec![1.0; 3],
            bias: vec![0.0; 3],
            running_mean: vec![0.0; 3],
            running_var: vec![1.0; 3],
        };
        let call = BatchNormCall { layout: Layout::ChannelsLast, shape: &[1, 3], act: Act::None, training: true };
        batch_norm_run(suite, call, &inputs, 0).map(|_| ())
    });
}

/// `op` over `dims` with zero rows or columns, which must be rejected.
fn empty_rows<O: RowOp>(suite: &mut Suite, name: &str, op: O, (rows, cols): (usize, usize)) {
    suite.rejects(name, |suite| {
        run_row::<O, f32>(suite, op, (rows, cols), &op.zeros::<f32>(rows, cols), 0, None).map(|_| ())
    });
}
