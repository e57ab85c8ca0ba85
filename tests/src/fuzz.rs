//! A seeded fuzz of the public API: random calls of the elementwise ops, the softmax family
//! and the norms, each with random shapes (0, 1, primes up to 2^18 columns), views at random
//! offsets, random dtypes and every optional argument present or absent; about a third
//! carry one planted defect (a mismatched shape, a wrong length, an unsupported dtype
//! triple, an output sharing another array's memory, a null or misaligned address, a broken
//! rule of the op). A call with a defect must fail with a typed error before it launches
//! anything; one without must run, and match the f64 reference.
//!
//! This module makes the calls ([`generate`], [`call`]); the CPU tests run them on an
//! offline GPU (`rill::Gpu::offline`, views over made-up addresses), where every defect must
//! be refused and every other call must get as far as the driver, and the GPU suite runs
//! them on the device against the references.

use crate::random::Rng;
use crate::reference::{ELEMENTWISE_OPS, ElementwiseOp};
use half::{bf16, f16};
use rill::norm::{Backward, Forward, GradParams, Norm, NormKind};
use rill::softmax::Softmax;
use rill::{DType, Element, KernelKey, Stream, View, ViewMut};
use rill_kernels_gpu::table::{NormKernelKind, RowPath};

/// What a fuzzed call computes.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Elementwise(&'static ElementwiseOp),
    Cast,
    Softmax { log: bool },
    SoftmaxBackward { log: bool },
    ScaleMask,
    Causal,
    CrossEntropy,
    LogSumExp,
    CrossEntropyBackward,
    NormForward(NormForwardParts),
    NormBackward(NormBackwardParts),
}

/// The optional parts of a norm forward: which are given.
#[derive(Clone, Copy, Debug)]
pub struct NormForwardParts {
    pub kind: NormKind,
    pub weight: bool,
    pub bias: bool,
    pub residual: bool,
    pub mean: bool,
    pub rstd: bool,
    pub eps: f32,
}

/// The optional parts of a norm backward: which are given.
#[derive(Clone, Copy, Debug)]
pub struct NormBackwardParts {
    pub kind: NormKind,
    pub weight: bool,
    pub dweight: bool,
    pub dbias: bool,
    pub mean: bool,
}

/// The scale of the scaled softmax kinds.
pub const SCALE: f32 = 0.125;

/// One array of a call.
#[derive(Clone, Debug)]
pub struct Array {
    pub name: &'static str,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Elements between the allocation's start and the view's first.
    pub offset: usize,
    pub output: bool,
}

impl Array {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where a call finds an array other than in its own allocation.
#[derive(Clone, Copy, Debug)]
pub enum Placement {
    /// At array `under`'s address (an input's, or another output's) plus `shift` elements
    /// of the output's dtype.
    Over { output: usize, under: usize, shift: usize },
    /// At address 0.
    Null(usize),
    /// One byte past its own address.
    Misaligned(usize),
}

/// A fuzzed call: the op, its dtypes, its arrays, and the defect planted in it, if any.
#[derive(Clone, Debug)]
pub struct Case {
    pub op: Op,
    /// The inputs' dtype, the outputs', and the norms' weight's.
    pub dtypes: (DType, DType, DType),
    /// The call's rows and columns as the op sees them (the logical shape).
    pub rows: usize,
    pub cols: usize,
    pub arrays: Vec<Array>,
    pub placement: Option<Placement>,
    /// What makes the call bad: it must be refused.
    pub defect: Option<String>,
}

impl Case {
    /// The index of array `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.arrays.iter().position(|a| a.name == name)
    }

    pub fn array(&self, name: &str) -> Option<&Array> {
        self.index(name).map(|k| &self.arrays[k])
    }

    /// Where array `k`'s view lies: the allocation (by array index) and the byte offset in
    /// it. An output placed over another array lies in that array's allocation.
    pub fn landing(&self, k: usize) -> (usize, usize) {
        match self.placement {
            Some(Placement::Over { output, under, shift }) if output == k => {
                let (base, out) = (&self.arrays[under], &self.arrays[output]);
                (under, base.offset * base.dtype.size() + shift * out.dtype.size())
            }
            _ => (k, self.arrays[k].offset * self.arrays[k].dtype.size()),
        }
    }

    /// Whether a changed shape of array `k` still makes a valid call: a broadcast mask whose
    /// row count still divides x's rows, or a wider or narrower x for a per-row output.
    fn op_takes_shape(&self, k: usize) -> bool {
        let array = &self.arrays[k];
        match self.op {
            Op::ScaleMask if array.name == "mask" => {
                let rows: usize = self.arrays[0].shape[..self.arrays[0].shape.len() - 1].iter().product();
                array.shape.len() == 2
                    && array.shape[1] == self.cols
                    && array.shape[0] > 0
                    && rows.is_multiple_of(array.shape[0])
            }
            // Ops that write a value per row take rows of any width.
            Op::CrossEntropy | Op::LogSumExp if array.name == "x" => {
                let (last, outer) = array.shape.split_last().expect("x has axes");
                *last > 0 && outer.iter().product::<usize>() == self.rows
            }
            _ => false,
        }
    }

    /// One line naming the call, for messages.
    pub fn describe(&self) -> String {
        let arrays: Vec<String> =
            self.arrays.iter().map(|a| format!("{} {}{:?}+{}", a.name, a.dtype.name(), a.shape, a.offset)).collect();
        let defect = self.defect.as_deref().map_or(String::new(), |d| format!("; defect: {d}"));
        let placement = self.placement.map_or(String::new(), |p| format!("; placed {p:?}"));
        format!("{:?} [{}]{placement}{defect}", self.op, arrays.join(", "))
    }
}

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

fn pick<T: Copy>(rng: &mut Rng, items: &[T]) -> T {
    items[(rng.next_u64() % items.len() as u64) as usize]
}

fn below(rng: &mut Rng, n: usize) -> usize {
    (rng.next_u64() % n.max(1) as u64) as usize
}

fn chance(rng: &mut Rng, p: f64) -> bool {
    rng.uniform(0.0, 1.0) < p
}

fn is_prime(n: usize) -> bool {
    n >= 2 && (2..).take_while(|d| d * d <= n).all(|d| !n.is_multiple_of(d))
}

/// A width: small, around a pack or warp tier, a prime up to 2^18, or a power of two.
fn width(rng: &mut Rng) -> usize {
    match below(rng, 10) {
        0..=2 => 1 + below(rng, 64),
        3..=4 => 1 + below(rng, 4096),
        5..=7 => {
            let bits = 8 + below(rng, 11);
            let mut n = 2 + below(rng, 1 << bits);
            while !is_prime(n) {
                n += 1;
            }
            n
        }
        8 => 1 << below(rng, 19),
        _ => (1 << (1 + below(rng, 17))) + pick(rng, &[1, 2, 3, 5, 7]),
    }
}

/// Rows for a width, keeping a call under 2^19 elements.
fn rows_for(rng: &mut Rng, cols: usize) -> usize {
    let most = ((1 << 19) / cols.max(1)).clamp(1, 257);
    if chance(rng, 0.3) { 1 } else { 1 + below(rng, most) }
}

/// An offset: none half the time, else up to 7 elements (past every pack's alignment).
fn offset(rng: &mut Rng) -> usize {
    if chance(rng, 0.5) { 0 } else { 1 + below(rng, 7) }
}

/// Whether rill has norm kernels of `kind` for (x, y, weight).
pub fn norm_has_kernels(kind: NormKernelKind, dtypes: (DType, DType, DType)) -> bool {
    KernelKey::Norm { kind, path: RowPath::Uncached, dtypes, pack: 1 }.symbol().is_some()
}

/// A random call; about a third carry a defect.
pub fn generate(rng: &mut Rng) -> Case {
    let mut case = match below(rng, 20) {
        0..=5 => elementwise(rng),
        6 => cast(rng),
        7..=13 => softmax(rng),
        _ => norm(rng),
    };
    if case.defect.is_none() && chance(rng, 0.3) {
        plant(rng, &mut case);
    }
    case
}

fn array(rng: &mut Rng, name: &'static str, dtype: DType, shape: &[usize], output: bool) -> Array {
    Array { name, dtype, shape: shape.to_vec(), offset: offset(rng), output }
}

/// A shape of `rows x cols`, sometimes with the rows split over more axes.
fn row_shape(rng: &mut Rng, rows: usize, cols: usize) -> Vec<usize> {
    if rows % 2 == 0 && chance(rng, 0.3) { vec![2, rows / 2, cols] } else { vec![rows, cols] }
}

fn elementwise(rng: &mut Rng) -> Case {
    let op = &ELEMENTWISE_OPS[below(rng, ELEMENTWISE_OPS.len())];
    let dtype = pick(rng, &FLOATS);
    // Elementwise calls take empty tensors (a no-op).
    let cols = if chance(rng, 0.05) { 0 } else { width(rng) };
    let rows = rows_for(rng, cols);
    let shape = if op.broadcasts_last || chance(rng, 0.5) { row_shape(rng, rows, cols) } else { vec![rows * cols] };
    let mut arrays: Vec<Array> = (0..op.arity)
        .map(|k| {
            let input = if op.broadcasts_last && k + 1 == op.arity { vec![cols] } else { shape.clone() };
            array(rng, ["x", "b", "c"][k], dtype, &input, false)
        })
        .collect();
    arrays.push(array(rng, "y", dtype, &shape, true));
    // In place: the output at the first input's address.
    let placement = (!op.broadcasts_last && chance(rng, 0.1)).then_some(Placement::Over {
        output: arrays.len() - 1,
        under: 0,
        shift: 0,
    });
    Case { op: Op::Elementwise(op), dtypes: (dtype, dtype, dtype), rows, cols, arrays, placement, defect: None }
}

fn cast(rng: &mut Rng) -> Case {
    let (from, to) = (pick(rng, &FLOATS), pick(rng, &FLOATS));
    let len = width(rng);
    let arrays = vec![array(rng, "x", from, &[len], false), array(rng, "y", to, &[len], true)];
    let defect = (from == to).then(|| "a cast to the same dtype".to_string());
    Case { op: Op::Cast, dtypes: (from, to, to), rows: 1, cols: len, arrays, placement: None, defect }
}

fn softmax(rng: &mut Rng) -> Case {
    let dtype = pick(rng, &FLOATS);
    let cols = width(rng);
    let rows = rows_for(rng, cols);
    let op = match below(rng, 9) {
        0 => Op::Softmax { log: false },
        1 => Op::Softmax { log: true },
        2 => Op::SoftmaxBackward { log: false },
        3 => Op::SoftmaxBackward { log: true },
        4 => Op::ScaleMask,
        5 => Op::Causal,
        6 => Op::CrossEntropy,
        7 => Op::LogSumExp,
        _ => Op::CrossEntropyBackward,
    };
    let shape = match op {
        Op::Causal => vec![1, rows, cols],
        Op::LogSumExp => vec![rows, cols],
        _ => row_shape(rng, rows, cols),
    };
    let mut arrays = vec![array(rng, "x", dtype, &shape, false)];
    match op {
        Op::SoftmaxBackward { .. } => arrays.push(array(rng, "dy", dtype, &shape, false)),
        Op::ScaleMask => {
            let divisors: Vec<usize> = (1..=rows).filter(|d| rows.is_multiple_of(*d)).collect();
            let mask_rows = pick(rng, &divisors);
            arrays.push(array(rng, "mask", dtype, &[mask_rows, cols], false));
        }
        Op::CrossEntropy | Op::CrossEntropyBackward => arrays.push(array(rng, "target", DType::I64, &[rows], false)),
        _ => {}
    }
    if matches!(op, Op::CrossEntropyBackward) {
        arrays.push(array(rng, "dloss", DType::F32, &[rows], false));
    }
    let out = match op {
        Op::CrossEntropy | Op::LogSumExp => array(rng, "out", DType::F32, &[rows], true),
        _ => array(rng, "y", dtype, &shape, true),
    };
    arrays.push(out);
    Case { op, dtypes: (dtype, dtype, dtype), rows, cols, arrays, placement: None, defect: None }
}

/// A norm call; about one in eight breaks one of the ops' rules or has a dtype triple with
/// no kernel (its defect says which).
fn norm(rng: &mut Rng) -> Case {
    let kind = pick(rng, &[NormKind::LayerNorm, NormKind::RmsNorm]);
    let layer = kind == NormKind::LayerNorm;
    let cols = width(rng);
    let rows = rows_for(rng, cols);
    let forward = chance(rng, 0.5);
    let x = pick(rng, &FLOATS);
    let mut defect = None;
    let bends = chance(rng, 0.12);
    let (op, mut dtypes) = if forward {
        let parts = NormForwardParts {
            kind,
            weight: chance(rng, 0.7),
            bias: layer && chance(rng, 0.6),
            residual: chance(rng, 0.3),
            mean: layer && chance(rng, 0.5),
            rstd: chance(rng, 0.5),
            eps: pick(rng, &[1e-5, 1e-6, 1e-3]),
        };
        let y = if x == DType::F32 && chance(rng, 0.3) { pick(rng, &FLOATS) } else { x };
        (Op::NormForward(parts), (x, y, pick(rng, &[DType::F32, x])))
    } else {
        let parts = NormBackwardParts {
            kind,
            weight: chance(rng, 0.7),
            dweight: chance(rng, 0.6),
            dbias: layer && chance(rng, 0.4),
            mean: layer,
        };
        (Op::NormBackward(parts), (x, x, pick(rng, &[DType::F32, x])))
    };
    let mut op = op;
    if bends {
        match &mut op {
            Op::NormForward(p) => match below(rng, 4) {
                0 if !layer => (p.bias, defect) = (true, Some("RMSNorm with a bias".to_string())),
                1 if !layer => (p.mean, defect) = (true, Some("RMSNorm saving a mean".to_string())),
                2 => (p.eps, defect) = (-1e-5, Some("a negative eps".to_string())),
                _ => dtypes.2 = pick(rng, &FLOATS),
            },
            Op::NormBackward(p) => match below(rng, 3) {
                0 => {
                    p.mean = !p.mean;
                    defect = Some(if layer { "LayerNorm without the mean" } else { "RMSNorm with a mean" }.into());
                }
                1 if !layer => (p.dbias, defect) = (true, Some("RMSNorm with dbias".to_string())),
                _ => dtypes.2 = pick(rng, &FLOATS),
            },
            _ => unreachable!(),
        }
    }
    let (has_params, kernel_kind) = match op {
        Op::NormForward(p) => {
            (p.weight || p.bias, if p.residual { NormKernelKind::AddForward } else { NormKernelKind::Forward })
        }
        Op::NormBackward(p) => (p.weight || p.dweight || p.dbias, NormKernelKind::Backward),
        _ => unreachable!(),
    };
    if !has_params {
        // Without weight, bias or their gradients a call runs the f32-parameter kernels.
        dtypes.2 = DType::F32;
    }
    if defect.is_none() && !norm_has_kernels(kernel_kind, dtypes) {
        defect = Some(format!("no kernel for {:?}", dtypes));
    }
    let (t, u, g) = dtypes;
    let shape = row_shape(rng, rows, cols);
    let mut arrays = vec![array(rng, "x", t, &shape, false)];
    match op {
        Op::NormForward(p) => {
            if p.weight {
                arrays.push(array(rng, "weight", g, &[cols], false));
            }
            if p.bias {
                arrays.push(array(rng, "bias", g, &[cols], false));
            }
            if p.residual {
                arrays.push(array(rng, "residual", t, &shape, false));
                arrays.push(array(rng, "sum", t, &shape, true));
            }
            arrays.push(array(rng, "y", u, &shape, true));
            if p.mean {
                arrays.push(array(rng, "mean", DType::F32, &[rows], true));
            }
            if p.rstd {
                arrays.push(array(rng, "rstd", DType::F32, &[rows], true));
            }
        }
        Op::NormBackward(p) => {
            arrays.push(array(rng, "dy", t, &shape, false));
            arrays.push(array(rng, "rstd", DType::F32, &[rows], false));
            if p.mean {
                arrays.push(array(rng, "mean", DType::F32, &[rows], false));
            }
            if p.weight {
                arrays.push(array(rng, "weight", g, &[cols], false));
            }
            arrays.push(array(rng, "dx", t, &shape, true));
            if p.dweight {
                arrays.push(array(rng, "dweight", g, &[cols], true));
            }
            if p.dbias {
                arrays.push(array(rng, "dbias", g, &[cols], true));
            }
        }
        _ => unreachable!(),
    }
    Case { op, dtypes, rows, cols, arrays, placement: None, defect }
}

/// Plants one defect the op must refuse, if the call has room for one.
fn plant(rng: &mut Rng, case: &mut Case) {
    let row_op = !matches!(case.op, Op::Elementwise(_) | Op::Cast);
    let outputs: Vec<usize> = (0..case.arrays.len()).filter(|&k| case.arrays[k].output).collect();
    let k = below(rng, case.arrays.len());
    let name = case.arrays[k].name;
    let defect = match below(rng, 6) {
        // A dimension one longer or shorter.
        0 | 1 if !case.arrays[k].shape.is_empty() => {
            let shape = &mut case.arrays[k].shape;
            let axis = below(rng, shape.len());
            shape[axis] = if shape[axis] > 1 && chance(rng, 0.5) { shape[axis] - 1 } else { shape[axis] + 1 };
            if case.op_takes_shape(k) {
                // Still valid: the case takes the new width as its own.
                case.cols = *case.arrays[0].shape.last().expect("x has axes");
                return;
            }
            format!("{name} of shape {:?}", case.arrays[k].shape)
        }
        // An output over another array's memory (an input's or another output's), exactly
        // or shifted.
        2 if !case.arrays[k].is_empty() => {
            let output = pick(rng, &outputs);
            let others: Vec<usize> = (0..case.arrays.len()).filter(|&j| j != output).collect();
            let under = pick(rng, &others);
            let (out, base) = (&case.arrays[output], &case.arrays[under]);
            if out.is_empty() || base.is_empty() {
                return;
            }
            // In the output's elements, inside the other array's bytes.
            let room = base.len() * base.dtype.size() / out.dtype.size();
            let shift = if chance(rng, 0.5) { 0 } else { below(rng, room) };
            let exact = shift == 0 && out.dtype.size() * out.len() == base.dtype.size() * base.len();
            if !row_op && exact {
                return; // In place: allowed.
            }
            case.placement = Some(Placement::Over { output, under, shift });
            format!("{} over {}'s memory (+{shift})", out.name, base.name)
        }
        3 if !case.arrays[k].is_empty() => {
            case.placement = Some(Placement::Null(k));
            format!("{name} at a null address")
        }
        4 if !case.arrays[k].is_empty() && case.arrays[k].dtype.size() > 1 => {
            case.placement = Some(Placement::Misaligned(k));
            format!("{name} at an address not aligned to its elements")
        }
        // An empty row-wise call, or one with no axes.
        _ if row_op => {
            let empty: Vec<usize> = if chance(rng, 0.5) { vec![0, case.cols] } else { vec![] };
            case.arrays[0].shape = empty.clone();
            format!("x of shape {empty:?}")
        }
        _ => return,
    };
    case.defect = Some(defect);
}

/// The views of a call's arrays at the addresses `address` gives, made as a caller with
/// foreign memory makes them.
struct Views<'c> {
    case: &'c Case,
    addresses: Vec<u64>,
}

impl Views<'_> {
    fn view<T: Element>(&self, name: &str) -> rill::Result<View<'static, T>> {
        let k = self.case.index(name).expect("the op's array");
        // SAFETY: the fuzz's caller promises the addresses hold the arrays (on an offline
        // GPU nothing is dereferenced).
        unsafe { View::from_raw(self.addresses[k], &self.case.arrays[k].shape) }
    }

    fn view_mut<T: Element>(&self, name: &str) -> rill::Result<ViewMut<'static, T>> {
        let k = self.case.index(name).expect("the op's array");
        // SAFETY: as `view`.
        unsafe { ViewMut::from_raw(self.addresses[k], &self.case.arrays[k].shape) }
    }

    fn optional<T: Element>(&self, name: &str) -> rill::Result<Option<View<'static, T>>> {
        self.case.index(name).map(|_| self.view(name)).transpose()
    }

    fn optional_mut<T: Element>(&self, name: &str) -> rill::Result<Option<ViewMut<'static, T>>> {
        self.case.index(name).map(|_| self.view_mut(name)).transpose()
    }
}

/// The address of each array of `case`: `own(k)`, where array `k`'s view starts in its
/// allocation, unless the case places it elsewhere.
pub fn addresses(case: &Case, own: impl Fn(usize) -> u64) -> Vec<u64> {
    (0..case.arrays.len())
        .map(|k| match case.placement {
            Some(Placement::Over { output, under, shift }) if output == k => {
                own(under) + (shift * case.arrays[output].dtype.size()) as u64
            }
            Some(Placement::Null(j)) if j == k => 0,
            Some(Placement::Misaligned(j)) if j == k => own(k) + 1,
            _ => own(k),
        })
        .collect()
}

/// Runs `f::<T>()` for the float dtype `dtype`.
macro_rules! with_float {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F16 => {
                type $t = f16;
                $body
            }
            DType::BF16 => {
                type $t = bf16;
                $body
            }
            other => unreachable!("the fuzz makes no {other:?} data"),
        }
    };
}

/// Makes `case`'s call on `stream`, array `k` at `addresses[k]` ([`addresses`]).
pub fn call(stream: &Stream, case: &Case, addresses: Vec<u64>) -> rill::Result<()> {
    let v = Views { case, addresses };
    let (t, u, g) = case.dtypes;
    match case.op {
        Op::Elementwise(op) => with_float!(t, T => {
            let names = ["x", "b", "c"];
            let inputs = names[..op.arity].iter().map(|n| v.view::<T>(n)).collect::<rill::Result<Vec<_>>>()?;
            crate::ops::elementwise(stream, op.name, &inputs, &mut v.view_mut::<T>("y")?)
        }),
        Op::Cast => with_float!(t, I => with_float!(u, O => {
            rill::elementwise::cast(stream, &v.view::<I>("x")?, &mut v.view_mut::<O>("y")?)
        })),
        Op::NormForward(parts) => with_float!(t, T => with_float!(u, U => with_float!(g, G => {
            norm_forward::<T, U, G>(stream, &v, parts)
        }))),
        Op::NormBackward(parts) => with_float!(t, T => with_float!(g, G => {
            norm_backward::<T, G>(stream, &v, parts)
        })),
        op => with_float!(t, T => softmax_call::<T>(stream, &v, op)),
    }
}

fn softmax_call<T: Element>(stream: &Stream, v: &Views<'_>, op: Op) -> rill::Result<()> {
    let s = Softmax::new();
    let x = v.view::<T>("x")?;
    match op {
        Op::Softmax { log } => s.forward(stream, &x, &mut v.view_mut::<T>("y")?, log),
        Op::SoftmaxBackward { log } => s.backward(stream, &x, &v.view::<T>("dy")?, &mut v.view_mut::<T>("y")?, log),
        Op::ScaleMask => s.scale_mask(stream, &x, &v.view::<T>("mask")?, SCALE, &mut v.view_mut::<T>("y")?),
        Op::Causal => s.causal(stream, &x, SCALE, &mut v.view_mut::<T>("y")?),
        Op::CrossEntropy => s.cross_entropy(stream, &x, &v.view::<i64>("target")?, &mut v.view_mut::<f32>("out")?),
        Op::LogSumExp => s.logsumexp(stream, &x, &mut v.view_mut::<f32>("out")?),
        Op::CrossEntropyBackward => s.cross_entropy_backward(
            stream,
            &x,
            &v.view::<i64>("target")?,
            &v.view::<f32>("dloss")?,
            &mut v.view_mut::<T>("y")?,
        ),
        _ => unreachable!(),
    }
    .map(|_| ())
}

fn norm_forward<T: Element, U: Element, G: Element>(
    stream: &Stream,
    v: &Views<'_>,
    p: NormForwardParts,
) -> rill::Result<()> {
    let (x, mut y) = (v.view::<T>("x")?, v.view_mut::<U>("y")?);
    let (weight, bias) = (v.optional::<G>("weight")?, v.optional::<G>("bias")?);
    let (residual, mut sum) = (v.optional::<T>("residual")?, v.optional_mut::<T>("sum")?);
    let (mut mean, mut rstd) = (v.optional_mut::<f32>("mean")?, v.optional_mut::<f32>("rstd")?);
    let call = Forward::new(&x, &mut y);
    let call = match (&residual, &mut sum) {
        (Some(r), Some(s)) => call.residual(r, s),
        _ => call,
    };
    let call = match &mut mean {
        Some(m) => call.save_mean(m),
        None => call,
    };
    let call = match &mut rstd {
        Some(r) => call.save_rstd(r),
        None => call,
    };
    let norm = Norm::new();
    match (&weight, &bias) {
        (None, None) => {
            // Without parameters the call's parameter dtype is f32 (the generator sees to it).
            norm.forward::<T, U, f32>(stream, p.kind, p.eps, call)
        }
        (Some(w), None) => norm.forward::<T, U, G>(stream, p.kind, p.eps, call.weight(w)),
        (None, Some(b)) => norm.forward::<T, U, G>(stream, p.kind, p.eps, call.bias(b)),
        (Some(w), Some(b)) => norm.forward::<T, U, G>(stream, p.kind, p.eps, call.weight(w).bias(b)),
    }
    .map(|_| ())
}

fn norm_backward<T: Element, G: Element>(stream: &Stream, v: &Views<'_>, p: NormBackwardParts) -> rill::Result<()> {
    let (x, dy, rstd, mut dx) = (v.view::<T>("x")?, v.view::<T>("dy")?, v.view::<f32>("rstd")?, v.view_mut::<T>("dx")?);
    let (mean, weight) = (v.optional::<f32>("mean")?, v.optional::<G>("weight")?);
    let (mut dweight, mut dbias) = (v.optional_mut::<G>("dweight")?, v.optional_mut::<G>("dbias")?);
    let call = Backward::new(&x, &dy, &rstd, &mut dx);
    let call = match &mean {
        Some(m) => call.mean(m),
        None => call,
    };
    let norm = Norm::new();
    if weight.is_none() && dweight.is_none() && dbias.is_none() {
        return norm.backward::<T, f32>(stream, p.kind, call).map(|_| ());
    }
    // The first part given opens the parameters' dtype; the others follow.
    let (mut dweight, mut dbias) = (dweight.as_mut(), dbias.as_mut());
    let mut call: Backward<'_, T, GradParams<'_, G>> = match (&weight, dweight.take()) {
        (Some(w), taken) => {
            dweight = taken;
            call.weight(w)
        }
        (None, Some(d)) => call.dweight(d),
        (None, None) => call.dbias(dbias.take().expect("a parameter gradient")),
    };
    if let Some(d) = dweight {
        call = call.dweight(d);
    }
    if let Some(d) = dbias {
        call = call.dbias(d);
    }
    norm.backward::<T, G>(stream, p.kind, call).map(|_| ())
}
