//! Determinism: two runs of every op on the same input write the same bits, on every path
//! the planner takes the call forced onto, in each dtype. Every output is compared word for
//! word, the norms' parameter gradients and BatchNorm's statistics and gradients (sums in
//! parts, added up in a second kernel) included. Each output must also be finite (the inputs
//! are), so an output a run leaves unwritten, its NaN poison both times, fails too.
//!
//! Cases are named `determinism/<family>/<op>/<dtype>/...`.

use crate::batch_norm::Act;
use crate::harness::{Measured, Suite};
use crate::runs::{
    BatchNormCall, BatchNormInputs, EPS, NormInputs, NormOp, RawBits, RowOp, SoftmaxInputs, Written, batch_norm_run,
    cast_run, elementwise_run, relu_run, row_paths, run_row,
};
use crate::softmax::{Op, f64s, path_name};
use half::{bf16, f16};
use rill::Element;
use rill::batch_norm::Layout;
use rill::norm::NormKind;
use rill_tests::paths::Forced;
use rill_tests::random::{Domain, Rng};
use rill_tests::reference::{ELEMENTWISE_OPS, norm_stats_rows};

pub fn run(suite: &mut Suite) {
    for_dtype::<f32>(suite);
    for_dtype::<f16>(suite);
    for_dtype::<bf16>(suite);
    casts(suite);
}

fn for_dtype<T: RawBits>(suite: &mut Suite) {
    elementwise::<T>(suite);
    for op in Op::PLAIN.into_iter().chain(Op::FUSED) {
        row_op::<_, T>(suite, "softmax", op, softmax_inputs::<T>);
    }
    for kind in [NormKind::LayerNorm, NormKind::RmsNorm] {
        for op in [
            NormOp::Forward { kind, residual: false },
            NormOp::Forward { kind, residual: true },
            NormOp::Backward(kind),
        ] {
            row_op::<_, T>(suite, "norm", op, norm_inputs::<T>);
        }
    }
    batch_norm::<T>(suite);
    relu::<T>(suite);
}

/// What one run wrote, and how it ran (the plan, where the op has one).
struct Ran {
    written: Vec<Written>,
    how: String,
}

/// Case `name`: `make` draws the inputs once, and `once` runs the op on them into fresh
/// outputs twice.
fn twice<I>(
    suite: &mut Suite,
    name: &str,
    make: impl FnOnce(&mut Rng) -> I,
    once: impl Fn(&Suite, &I) -> rill::Result<Ran>,
) {
    // Exact: the error is 0 or infinite.
    suite.case(name, 1.0, |suite, rng| {
        let inputs = make(rng);
        let first = once(suite, &inputs)?;
        let second = once(suite, &inputs)?;
        Ok(compare(&first, &second))
    });
}

/// The first element not finite in the first run, or whose bits differ between the runs.
fn compare(first: &Ran, second: &Ran) -> Measured {
    let failed = |detail: String| Measured { error: f64::INFINITY, detail: format!("{detail}; {}", first.how) };
    for (a, b) in first.written.iter().zip(&second.written) {
        if let Some(i) = a.values.iter().position(|v| !v.is_finite()) {
            return failed(format!("{} is {:e} in the first run (not finite)", a.at(i), a.values[i]));
        }
        if let Some(i) = (0..a.bits.len()).find(|&i| a.bits[i] != b.bits[i]) {
            return failed(format!(
                "{}: bits {:#010x} ({:e}) in the first run, {:#010x} ({:e}) in the second",
                a.at(i),
                a.bits[i],
                a.values[i],
                b.bits[i],
                b.values[i]
            ));
        }
    }
    Measured { error: 0.0, detail: String::new() }
}

// ---------------------------------------------------------------------------------------------
// Row-wise ops
// ---------------------------------------------------------------------------------------------

/// Row-wise shapes `(rows, cols)`, the offset of every array, and which paths they run on:
/// each warp tier on the dispatcher's path (8 elements a lane and two rows an access, 16 in
/// lane groups of 8 and of 32, 24, 32; the norm backward gives 700 and 1000 columns the
/// shared path); an odd width one element past 16 bytes, rows run from their heads, on every
/// path the planner takes, with enough rows that each forced cluster works through several
/// (prefetching the next); and rows of 2^17 columns, past an H100's shared memory: the
/// cluster path, and uncached.
const ROW_SHAPES: [((usize, usize), usize, Option<Forced>); 7] = [
    ((256, 33), 0, None),
    ((256, 128), 0, None),
    ((256, 500), 0, None),
    ((256, 700), 0, None),
    ((256, 1000), 0, None),
    ((1000, 4097), 1, Some(Forced::Others)),
    ((16, 1 << 17), 0, Some(Forced::Others)),
];

/// Draws a row-wise op's inputs over `(rows, cols)`.
type MakeInputs<O, T> = fn(&mut Rng, O, (usize, usize)) -> <O as RowOp>::Inputs<T>;

/// `op`'s cases on every shape and path, on inputs `make` draws.
fn row_op<O: RowOp, T: RawBits>(suite: &mut Suite, family: &str, op: O, make: MakeInputs<O, T>) {
    let dtype = T::DTYPE.name();
    for (dims @ (rows, cols), offset, forced) in ROW_SHAPES {
        let name = |path| {
            format!("determinism/{family}/{}/{dtype}/[{rows}, {cols}]/offset={offset}/{}", op.name(), path_name(path))
        };
        for path in row_paths::<O, T>(suite, op, (dims, offset), forced, &name) {
            twice(
                suite,
                &name(path),
                |rng| make(rng, op, dims),
                |suite, inputs| {
                    let (plan, written) = run_row(suite, op, dims, inputs, offset, path)?;
                    Ok(Ran { written, how: plan.describe() })
                },
            );
        }
    }
}

/// Logits in [-8, 8) (the softmax backward's y: any finite values do; the log-softmax
/// backward's y are log-probabilities, in [-8, 0), so `exp(y) * sum(dy)` stays finite in
/// f16), dy or the mask in [-1, 1), one row in five ignored by the cross entropy, loss
/// gradients in [-2, 2).
fn softmax_inputs<T: Element>(rng: &mut Rng, op: Op, (rows, cols): (usize, usize)) -> SoftmaxInputs<T> {
    let mut inputs = op.zeros::<T>(rows, cols);
    inputs.x = Suite::random(rng, Domain::Symmetric(8.0), rows * cols);
    if matches!(op, Op::Backward { log: true }) {
        inputs.x = inputs.x.iter().map(|&y| T::from_f64(-y.to_f64().abs())).collect();
    }
    if matches!(op, Op::Backward { .. } | Op::ScaleMask) {
        inputs.second = Suite::random(rng, Domain::Symmetric(1.0), rows * cols);
    }
    inputs.target = (0..rows).map(|r| if r % 5 == 4 { -100 } else { (rng.next_u64() % cols as u64) as i64 }).collect();
    inputs.dloss = Suite::random(rng, Domain::Symmetric(2.0), rows);
    inputs
}

/// x in [-2, 2), the residual or dy in [-1, 1), weights of magnitude 0.5 to 1.5 either sign,
/// biases in [-1, 1); the backward reads x's statistics as a forward saves them (f32).
fn norm_inputs<T: Element>(rng: &mut Rng, op: NormOp, (rows, cols): (usize, usize)) -> NormInputs<T> {
    let mut inputs = op.zeros::<T>(rows, cols);
    inputs.x = Suite::random(rng, Domain::Symmetric(2.0), rows * cols);
    inputs.second = Suite::random(rng, Domain::Symmetric(1.0), rows * cols);
    inputs.weight = Suite::random(rng, Domain::AwayFromZero(0.5, 1.5), cols);
    inputs.bias = Suite::random(rng, Domain::Symmetric(1.0), cols);
    if let NormOp::Backward(kind) = op {
        let stats = norm_stats_rows(&f64s(&inputs.x), cols, kind == NormKind::RmsNorm, EPS as f64);
        inputs.mean = stats.iter().map(|s| s.0 as f32).collect();
        inputs.rstd = stats.iter().map(|s| s.1 as f32).collect();
    }
    inputs
}

// ---------------------------------------------------------------------------------------------
// BatchNorm and ReLU
// ---------------------------------------------------------------------------------------------

/// BatchNorm shapes and the offset of their element arrays: small odd ones one element past
/// 16 bytes (single elements), and ResNet-sized ones whose channels the sums split into many
/// parts (rows of 3136 per (n, c) in NCHW; 25088 rows of 64 channels in NHWC).
const BATCH_NORM_SHAPES: [(Layout, &[usize], usize); 4] = [
    (Layout::ChannelsFirst, &[3, 5, 7, 9], 1),
    (Layout::ChannelsFirst, &[8, 64, 56, 56], 0),
    (Layout::ChannelsLast, &[33, 7], 1),
    (Layout::ChannelsLast, &[8, 56, 56, 64], 0),
];

/// Training (forward and backward) with each activation, and eval with a ReLU.
fn batch_norm<T: RawBits>(suite: &mut Suite) {
    let dtype = T::DTYPE.name();
    for (layout, shape, offset) in BATCH_NORM_SHAPES {
        let calls = [Act::None, Act::Relu, Act::AddRelu]
            .map(|act| BatchNormCall { layout, shape, act, training: true })
            .into_iter()
            .chain([BatchNormCall { layout, shape, act: Act::Relu, training: false }]);
        for call in calls {
            let mode = if call.training { "training" } else { "eval" };
            let name = format!("determinism/batch_norm/{layout:?}/{dtype}/{shape:?}/{:?}/{mode}", call.act);
            twice(
                suite,
                &name,
                |rng| batch_norm_inputs::<T>(rng, layout, shape),
                |suite, inputs| {
                    let written = batch_norm_run(suite, call, inputs, offset)?;
                    Ok(Ran { written, how: format!("offset {offset}") })
                },
            );
        }
    }
}

fn batch_norm_inputs<T: Element>(rng: &mut Rng, layout: Layout, shape: &[usize]) -> BatchNormInputs<T> {
    let len = shape.iter().product();
    let channels = if layout == Layout::ChannelsFirst { shape[1] } else { shape[shape.len() - 1] };
    BatchNormInputs {
        x: Suite::random(rng, Domain::Symmetric(2.0), len),
        addend: Suite::random(rng, Domain::Symmetric(1.0), len),
        dy: Suite::random(rng, Domain::Symmetric(1.0), len),
        weight: Suite::random(rng, Domain::AwayFromZero(0.5, 1.5), channels),
        bias: Suite::random(rng, Domain::Symmetric(0.5), channels),
        running_mean: Suite::random(rng, Domain::Symmetric(1.0), channels),
        running_var: Suite::random::<f32>(rng, Domain::AwayFromZero(0.5, 2.0), channels)
            .iter()
            .map(|v| v.abs())
            .collect(),
    }
}

/// The standalone ReLU with its mask and both its backwards, one element past 16 bytes.
fn relu<T: RawBits>(suite: &mut Suite) {
    let len = (1 << 20) + 3;
    let name = format!("determinism/relu/{}/[{len}]", T::DTYPE.name());
    twice(
        suite,
        &name,
        |rng| {
            (Suite::random::<T>(rng, Domain::Symmetric(1.0), len), Suite::random::<T>(rng, Domain::Symmetric(1.0), len))
        },
        |suite, (x, dy)| Ok(Ran { written: relu_run(suite, x, dy, 1)?, how: "offset 1".into() }),
    );
}

// ---------------------------------------------------------------------------------------------
// Elementwise
// ---------------------------------------------------------------------------------------------

/// Every elementwise op over 2^20 + 3 elements (rows of 4097 for the broadcast bias), on
/// inputs from its domains.
fn elementwise<T: RawBits>(suite: &mut Suite) {
    for op in ELEMENTWISE_OPS {
        let shape = if op.broadcasts_last { vec![257, 4097] } else { vec![(1 << 20) + 3] };
        let name = format!("determinism/elementwise/{}/{}/{shape:?}", op.name, T::DTYPE.name());
        let lens: Vec<usize> =
            (0..op.arity)
                .map(|k| {
                    if op.broadcasts_last && k == op.arity - 1 {
                        shape[shape.len() - 1]
                    } else {
                        shape.iter().product()
                    }
                })
                .collect();
        twice(
            suite,
            &name,
            |rng| lens.iter().zip(op.domains).map(|(&len, &domain)| Suite::random::<T>(rng, domain, len)).collect(),
            |suite, inputs: &Vec<Vec<T>>| {
                Ok(Ran { written: elementwise_run(suite, op, inputs, &shape, 0)?, how: "offset 0".into() })
            },
        );
    }
}

fn casts(suite: &mut Suite) {
    cast::<f32, f16>(suite);
    cast::<f32, bf16>(suite);
    cast::<f16, f32>(suite);
    cast::<bf16, f32>(suite);
    cast::<f16, bf16>(suite);
    cast::<bf16, f16>(suite);
}

/// Values in [-1000, 1000], inside every dtype's range.
fn cast<I: Element, O: RawBits>(suite: &mut Suite) {
    let len = (1 << 20) + 3;
    let name = format!("determinism/elementwise/cast/{}->{}/[{len}]", I::DTYPE.name(), O::DTYPE.name());
    twice(
        suite,
        &name,
        |rng| Suite::random::<I>(rng, Domain::Symmetric(1000.0), len),
        |suite, x| Ok(Ran { written: cast_run::<I, O>(suite, x, 0)?, how: "offset 0".into() }),
    );
}
