//! Every op run on host inputs into poisoned outputs, returning what it wrote: the
//! semantics suite compares the values with PyTorch's, the determinism suite the raw bits
//! of two runs. A row-wise run ([`RowOp`]) hands its call to a body, which makes it on any
//! path, plan-only or not, as the other row-wise suites do.

use crate::batch_norm::Act;
use crate::elementwise::launch_op;
use crate::harness::{Suite, view_at, view_mut_at};
use crate::softmax::{Op, softmax_on};
use half::{bf16, f16};
use rill::batch_norm::{self, Layout, Options, mask_words};
use rill::norm::{Backward, Forward, Norm, NormKind, PathKind};
use rill::softmax::Plan;
use rill::{Element, Tensor};
use rill_tests::paths::{Forced, Paths};
use rill_tests::reference::ElementwiseOp;

/// An element type whose raw bits the suites compare.
pub trait RawBits: Element {
    fn raw_bits(self) -> u32;
}

impl RawBits for f32 {
    fn raw_bits(self) -> u32 {
        self.to_bits()
    }
}

impl RawBits for f16 {
    fn raw_bits(self) -> u32 {
        self.to_bits().into()
    }
}

impl RawBits for bf16 {
    fn raw_bits(self) -> u32 {
        self.to_bits().into()
    }
}

impl RawBits for u32 {
    fn raw_bits(self) -> u32 {
        self
    }
}

/// One array a call wrote, without the elements before its view.
pub struct Written {
    pub name: &'static str,
    /// Elements per row, for messages (`None`: a flat array).
    pub cols: Option<usize>,
    pub values: Vec<f64>,
    pub bits: Vec<u32>,
}

impl Written {
    /// `all` past its first `offset` elements.
    pub fn of<T: RawBits>(name: &'static str, cols: Option<usize>, all: &[T], offset: usize) -> Written {
        let data = &all[offset..];
        Written {
            name,
            cols,
            values: data.iter().map(|v| v.to_f64()).collect(),
            bits: data.iter().map(|v| v.raw_bits()).collect(),
        }
    }

    /// Element `i` by name and place: `y[row, col]`, or `dweight[i]` for a flat array.
    pub fn at(&self, i: usize) -> String {
        match self.cols {
            Some(cols) => format!("{}[{}, {}]", self.name, i / cols, i % cols),
            None => format!("{}[{i}]", self.name),
        }
    }
}

/// A row-wise call on a path (the dispatcher's for `None`), plan-only where asked: its plan.
pub type Call<'c> = dyn FnMut(Option<PathKind>, bool) -> rill::Result<Plan> + 'c;

/// A row-wise op of either family (softmax's, the norms'), run on any path.
pub trait RowOp: Copy {
    /// The host inputs of a call in dtype `T`.
    type Inputs<T: Element>;

    /// The op's name in case names.
    fn name(self) -> String;

    /// Zeros for every input: what the planner is asked on, and where cases start.
    fn zeros<T: Element>(self, rows: usize, cols: usize) -> Self::Inputs<T>;

    /// Uploads `inputs` and poisons the outputs, every array `offset` elements into its
    /// allocation (one phase for all, so the block paths run rows of any width from their
    /// heads), and hands `body` the call on them. Returns what `body` returned, and what the
    /// calls wrote.
    fn with_inputs<T: RawBits, R>(
        self,
        suite: &Suite,
        dims: (usize, usize),
        inputs: &Self::Inputs<T>,
        offset: usize,
        body: impl FnOnce(&mut Call<'_>) -> rill::Result<R>,
    ) -> rill::Result<(R, Vec<Written>)>;
}

/// The paths to run `op` on over `dims` at `offset`: [`Suite::paths`], the planner asked on
/// zeros.
pub fn row_paths<O: RowOp, T: RawBits>(
    suite: &mut Suite,
    op: O,
    (dims, offset): ((usize, usize), usize),
    forced: Option<Forced>,
    name: impl Fn(Option<PathKind>) -> String,
) -> Vec<Option<PathKind>> {
    let ask = |suite: &Suite| {
        let zeros = op.zeros::<T>(dims.0, dims.1);
        let asked = op.with_inputs(suite, dims, &zeros, offset, |call| Paths::ask(|path| call(path, true)));
        asked.map(|(paths, _)| paths)
    };
    suite.paths(forced, name, ask)
}

/// `op` on `path` over `inputs`: its plan and what it wrote.
pub fn run_row<O: RowOp, T: RawBits>(
    suite: &Suite,
    op: O,
    dims: (usize, usize),
    inputs: &O::Inputs<T>,
    offset: usize,
    path: Option<PathKind>,
) -> rill::Result<(Plan, Vec<Written>)> {
    op.with_inputs(suite, dims, inputs, offset, |call| call(path, false))
}

/// The norm calls on `path` (the dispatcher's for `None`).
fn norm_on(path: Option<PathKind>) -> Norm {
    path.map_or_else(Norm::new, Norm::forced)
}

// ---------------------------------------------------------------------------------------------
// Softmax family
// ---------------------------------------------------------------------------------------------

/// The scale of the scaled softmax kinds.
pub const SCALE: f32 = 0.125;

/// A softmax-family call's host inputs over `rows x cols`.
#[derive(Clone)]
pub struct SoftmaxInputs<T> {
    /// x, or the backward's y.
    pub x: Vec<T>,
    /// The backward's dy, or the scale + mask's mask (a row for each row of x).
    pub second: Vec<T>,
    /// Cross entropy's class per row.
    pub target: Vec<i64>,
    /// Cross entropy backward's loss gradient per row.
    pub dloss: Vec<f32>,
}

impl Op {
    /// Whether the op writes a value per row (f32) rather than an element per element.
    pub fn per_row(self) -> bool {
        matches!(self, Op::CrossEntropy | Op::LogSumExp)
    }

    /// The name of the array the op writes.
    pub fn output_name(self) -> &'static str {
        match self {
            Op::Forward { .. } | Op::ScaleMask | Op::Causal => "y",
            Op::Backward { .. } => "dx",
            Op::CrossEntropyBackward => "dlogits",
            Op::CrossEntropy => "loss",
            Op::LogSumExp => "logsumexp",
        }
    }
}

/// The causal kind sees one batch of `rows` queries; the mask has a row for each row of x.
impl RowOp for Op {
    type Inputs<T: Element> = SoftmaxInputs<T>;

    fn name(self) -> String {
        Op::name(self).into()
    }

    /// Class 0 every row.
    fn zeros<T: Element>(self, rows: usize, cols: usize) -> SoftmaxInputs<T> {
        SoftmaxInputs {
            x: vec![T::default(); rows * cols],
            second: vec![T::default(); rows * cols],
            target: vec![0; rows],
            dloss: vec![0.0; rows],
        }
    }

    fn with_inputs<T: RawBits, R>(
        self,
        suite: &Suite,
        (rows, cols): (usize, usize),
        inputs: &SoftmaxInputs<T>,
        offset: usize,
        body: impl FnOnce(&mut Call<'_>) -> rill::Result<R>,
    ) -> rill::Result<(R, Vec<Written>)> {
        let shape = if matches!(self, Op::Causal) { vec![1, rows, cols] } else { vec![rows, cols] };
        let x_dev = suite.upload(&inputs.x, offset)?;
        let second_dev = suite.upload(&inputs.second, offset)?;
        let target_dev = suite.upload(&inputs.target, offset)?;
        let dloss_dev = suite.upload(&inputs.dloss, offset)?;
        let mut out_dev = suite.poisoned::<T>(rows * cols, offset)?;
        let mut values_dev = suite.poisoned::<f32>(rows, offset)?;
        let answer = {
            let x = view_at(&x_dev, offset, &shape)?;
            let second = view_at(&second_dev, offset, &shape)?;
            let target = view_at(&target_dev, offset, &[rows])?;
            let dloss = view_at(&dloss_dev, offset, &[rows])?;
            let mut out = view_mut_at(&mut out_dev, offset, &shape)?;
            let mut values = view_mut_at(&mut values_dev, offset, &[rows])?;
            let stream = &suite.stream;
            let mut call = |path, plan_only| {
                let softmax = if plan_only { softmax_on(path).plan_only() } else { softmax_on(path) };
                match self {
                    Op::Forward { log } => softmax.forward(stream, &x, &mut out, log),
                    Op::Backward { log } => softmax.backward(stream, &x, &second, &mut out, log),
                    Op::ScaleMask => softmax.scale_mask(stream, &x, &second, SCALE, &mut out),
                    Op::Causal => softmax.causal(stream, &x, SCALE, &mut out),
                    Op::CrossEntropy => softmax.cross_entropy(stream, &x, &target, &mut values),
                    Op::LogSumExp => softmax.logsumexp(stream, &x, &mut values),
                    Op::CrossEntropyBackward => softmax.cross_entropy_backward(stream, &x, &target, &dloss, &mut out),
                }
            };
            body(&mut call)?
        };
        let written = if self.per_row() {
            Written::of(self.output_name(), None, &values_dev.to_vec()?, offset)
        } else {
            Written::of(self.output_name(), Some(cols), &out_dev.to_vec()?, offset)
        };
        Ok((answer, vec![written]))
    }
}

// ---------------------------------------------------------------------------------------------
// Norms
// ---------------------------------------------------------------------------------------------

/// The eps of the norm runs.
pub const EPS: f32 = 1e-5;

/// A norm call: the forward with weight (and LayerNorm's bias) saving its statistics, of
/// x or (`residual`) of x + residual, writing the sum; or the backward with the weight,
/// computing dweight (and LayerNorm's dbias).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NormOp {
    Forward { kind: NormKind, residual: bool },
    Backward(NormKind),
}

impl NormOp {
    pub fn kind(self) -> NormKind {
        match self {
            NormOp::Forward { kind, .. } | NormOp::Backward(kind) => kind,
        }
    }
}

/// The forward writes y, the sum (with the residual), the mean (LayerNorm) and rstd; the
/// backward dx, dweight and dbias (LayerNorm).
impl RowOp for NormOp {
    type Inputs<T: Element> = NormInputs<T>;

    fn name(self) -> String {
        match self {
            NormOp::Forward { kind, residual } => format!("{}{}", if residual { "add_" } else { "" }, kind.name()),
            NormOp::Backward(kind) => format!("{}_backward", kind.name()),
        }
    }

    fn zeros<T: Element>(self, rows: usize, cols: usize) -> NormInputs<T> {
        NormInputs {
            x: vec![T::default(); rows * cols],
            second: vec![T::default(); rows * cols],
            weight: vec![T::default(); cols],
            bias: vec![T::default(); cols],
            mean: vec![0.0; rows],
            rstd: vec![0.0; rows],
        }
    }

    fn with_inputs<T: RawBits, R>(
        self,
        suite: &Suite,
        (rows, cols): (usize, usize),
        inputs: &NormInputs<T>,
        offset: usize,
        body: impl FnOnce(&mut Call<'_>) -> rill::Result<R>,
    ) -> rill::Result<(R, Vec<Written>)> {
        let (shape, kind) = ([rows, cols], self.kind());
        let layer = kind == NormKind::LayerNorm;
        let upload_rows = |data: &[T]| suite.upload(data, offset);
        let (x_dev, second_dev) = (upload_rows(&inputs.x)?, upload_rows(&inputs.second)?);
        let (weight_dev, bias_dev) = (upload_rows(&inputs.weight)?, upload_rows(&inputs.bias)?);
        let (mean_dev, rstd_dev) = (suite.upload(&inputs.mean, offset)?, suite.upload(&inputs.rstd, offset)?);
        let mut out_dev = suite.poisoned::<T>(rows * cols, offset)?;
        let mut sum_dev = suite.poisoned::<T>(rows * cols, offset)?;
        let mut saved_mean_dev = suite.poisoned::<f32>(rows, offset)?;
        let mut saved_rstd_dev = suite.poisoned::<f32>(rows, offset)?;
        let mut dweight_dev = suite.poisoned::<T>(cols, offset)?;
        let mut dbias_dev = suite.poisoned::<T>(cols, offset)?;
        let answer = {
            let x = view_at(&x_dev, offset, &shape)?;
            let second = view_at(&second_dev, offset, &shape)?;
            let weight = view_at(&weight_dev, offset, &[cols])?;
            let bias = view_at(&bias_dev, offset, &[cols])?;
            let mean = view_at(&mean_dev, offset, &[rows])?;
            let rstd = view_at(&rstd_dev, offset, &[rows])?;
            let mut out = view_mut_at(&mut out_dev, offset, &shape)?;
            let mut sum = view_mut_at(&mut sum_dev, offset, &shape)?;
            let mut saved_mean = view_mut_at(&mut saved_mean_dev, offset, &[rows])?;
            let mut saved_rstd = view_mut_at(&mut saved_rstd_dev, offset, &[rows])?;
            let mut dweight = view_mut_at(&mut dweight_dev, offset, &[cols])?;
            let mut dbias = view_mut_at(&mut dbias_dev, offset, &[cols])?;
            let stream = &suite.stream;
            let mut call = |path, plan_only| {
                let norm = if plan_only { norm_on(path).plan_only() } else { norm_on(path) };
                match self {
                    NormOp::Forward { residual, .. } => {
                        let call = Forward::new(&x, &mut out).weight(&weight).save_rstd(&mut saved_rstd);
                        let call = if layer { call.bias(&bias).save_mean(&mut saved_mean) } else { call };
                        let call = if residual { call.residual(&second, &mut sum) } else { call };
                        norm.forward(stream, kind, EPS, call)
                    }
                    NormOp::Backward(_) => {
                        let call = Backward::new(&x, &second, &rstd, &mut out).weight(&weight).dweight(&mut dweight);
                        let call = if layer { call.mean(&mean).dbias(&mut dbias) } else { call };
                        norm.backward(stream, kind, call)
                    }
                }
            };
            body(&mut call)?
        };
        let mut written = Vec::new();
        match self {
            NormOp::Forward { residual, .. } => {
                written.push(Written::of("y", Some(cols), &out_dev.to_vec()?, offset));
                if residual {
                    written.push(Written::of("sum", Some(cols), &sum_dev.to_vec()?, offset));
                }
                if layer {
                    written.push(Written::of("mean", None, &saved_mean_dev.to_vec()?, offset));
                }
                written.push(Written::of("rstd", None, &saved_rstd_dev.to_vec()?, offset));
            }
            NormOp::Backward(_) => {
                written.push(Written::of("dx", Some(cols), &out_dev.to_vec()?, offset));
                written.push(Written::of("dweight", None, &dweight_dev.to_vec()?, offset));
                if layer {
                    written.push(Written::of("dbias", None, &dbias_dev.to_vec()?, offset));
                }
            }
        }
        Ok((answer, written))
    }
}

/// A norm call's host inputs over `rows x cols` (the weight and bias in x's dtype).
#[derive(Clone)]
pub struct NormInputs<T> {
    pub x: Vec<T>,
    /// The forward's residual, or the backward's dy.
    pub second: Vec<T>,
    pub weight: Vec<T>,
    pub bias: Vec<T>,
    /// The forward's statistics, which the backward reads.
    pub mean: Vec<f32>,
    pub rstd: Vec<f32>,
}

// ---------------------------------------------------------------------------------------------
// BatchNorm
// ---------------------------------------------------------------------------------------------

/// Fills a mask before the forward writes every word of it (the bits past the last element
/// 0), so a word left unwritten shows.
const MASK_POISON: u32 = 0xA5A5_A5A5;

/// A BatchNorm call: layout, shape, the fused activation, and training or eval.
#[derive(Clone, Copy, Debug)]
pub struct BatchNormCall<'s> {
    pub layout: Layout,
    pub shape: &'s [usize],
    pub act: Act,
    pub training: bool,
}

/// BatchNorm's host inputs: x, the addend and dy of x's shape; f32 per channel.
#[derive(Clone)]
pub struct BatchNormInputs<T> {
    pub x: Vec<T>,
    pub addend: Vec<T>,
    pub dy: Vec<T>,
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
    pub running_mean: Vec<f32>,
    pub running_var: Vec<f32>,
}

/// The forward (PyTorch's momentum 0.1 and eps 1e-5) and, in training, the backward from its saved
/// statistics and mask; x, the addend, dy, y, dx and d(addend) `offset` elements into their
/// allocations. Returns y, the mask (with a ReLU), the running statistics, and in training
/// the saved ones, dx, d(addend) (with Add + ReLU), dweight and dbias.
pub fn batch_norm_run<T: RawBits>(
    suite: &Suite,
    call: BatchNormCall<'_>,
    inputs: &BatchNormInputs<T>,
    offset: usize,
) -> rill::Result<Vec<Written>> {
    let BatchNormCall { layout, shape, act, training } = call;
    let (len, channels) = (shape.iter().product::<usize>(), inputs.weight.len());
    let gpu = &suite.gpu;
    let per_channel = |data: &[f32]| Tensor::from_slice(gpu, data, &[channels]);
    let (x_dev, addend_dev, dy_dev) =
        (suite.upload(&inputs.x, offset)?, suite.upload(&inputs.addend, offset)?, suite.upload(&inputs.dy, offset)?);
    let (weight_dev, bias_dev) = (per_channel(&inputs.weight)?, per_channel(&inputs.bias)?);
    let (mut running_mean_dev, mut running_var_dev) =
        (per_channel(&inputs.running_mean)?, per_channel(&inputs.running_var)?);
    let mut y_dev = suite.poisoned::<T>(len, offset)?;
    let mut mask_dev = Tensor::from_slice(gpu, &vec![MASK_POISON; mask_words(len)], &[mask_words(len)])?;
    let (mut mean_dev, mut invstd_dev) = (suite.poisoned::<f32>(channels, 0)?, suite.poisoned::<f32>(channels, 0)?);
    let (x, addend) = (view_at(&x_dev, offset, shape)?, view_at(&addend_dev, offset, shape)?);
    let mut batches = 0;
    {
        let mut y = view_mut_at(&mut y_dev, offset, shape)?;
        let forward = batch_norm::Forward::new(&x, &mut y, layout).weight(&weight_dev).bias(&bias_dev);
        let forward = forward.running(&mut running_mean_dev, &mut running_var_dev, &mut batches);
        let forward = if training { forward.save(&mut mean_dev, &mut invstd_dev) } else { forward };
        let forward = match act {
            Act::None => forward,
            Act::Relu => forward.relu(Some(&mut mask_dev)),
            Act::AddRelu => forward.add_relu(&addend, Some(&mut mask_dev)),
        };
        let options = if training { Options::training() } else { Options::eval() };
        batch_norm::forward(&suite.stream, options, forward)?;
    }
    let mut written = vec![
        Written::of("y", None, &y_dev.to_vec()?, offset),
        Written::of("running_mean", None, &running_mean_dev.to_vec()?, 0),
        Written::of("running_var", None, &running_var_dev.to_vec()?, 0),
    ];
    if act != Act::None {
        written.push(Written::of("mask", None, &mask_dev.to_vec()?, 0));
    }
    if !training {
        return Ok(written);
    }
    written.push(Written::of("saved_mean", None, &mean_dev.to_vec()?, 0));
    written.push(Written::of("saved_invstd", None, &invstd_dev.to_vec()?, 0));
    let mut dx_dev = suite.poisoned::<T>(len, offset)?;
    let mut daddend_dev = suite.poisoned::<T>(len, offset)?;
    let (mut dweight_dev, mut dbias_dev) = (suite.poisoned::<f32>(channels, 0)?, suite.poisoned::<f32>(channels, 0)?);
    {
        let dy = view_at(&dy_dev, offset, shape)?;
        let mut dx = view_mut_at(&mut dx_dev, offset, shape)?;
        let mut daddend = view_mut_at(&mut daddend_dev, offset, shape)?;
        let backward = batch_norm::Backward::new(&dy, &x, &mut dx, layout, (&mean_dev, &invstd_dev))
            .weight(&weight_dev)
            .dweight(&mut dweight_dev)
            .dbias(&mut dbias_dev);
        let backward = match act {
            Act::None => backward,
            Act::Relu => backward.relu(&mask_dev),
            Act::AddRelu => backward.add_relu(&mask_dev, &mut daddend),
        };
        batch_norm::backward(&suite.stream, backward)?;
    }
    written.push(Written::of("dx", None, &dx_dev.to_vec()?, offset));
    if act == Act::AddRelu {
        written.push(Written::of("daddend", None, &daddend_dev.to_vec()?, offset));
    }
    written.push(Written::of("dweight", None, &dweight_dev.to_vec()?, 0));
    written.push(Written::of("dbias", None, &dbias_dev.to_vec()?, 0));
    Ok(written)
}

/// The standalone ReLU with its mask, then its backward from the mask and from y, every
/// array but the mask `offset` elements into its allocation: y, the mask, dx from the mask
/// and dx from y.
pub fn relu_run<T: RawBits>(suite: &Suite, x: &[T], dy: &[T], offset: usize) -> rill::Result<Vec<Written>> {
    let shape = [x.len()];
    let (x_dev, dy_dev) = (suite.upload(x, offset)?, suite.upload(dy, offset)?);
    let mut y_dev = suite.poisoned::<T>(x.len(), offset)?;
    let words = mask_words(x.len());
    let mut mask_dev = Tensor::from_slice(&suite.gpu, &vec![MASK_POISON; words], &[words])?;
    let (mut from_mask_dev, mut from_y_dev) =
        (suite.poisoned::<T>(x.len(), offset)?, suite.poisoned::<T>(x.len(), offset)?);
    batch_norm::relu_with_mask(
        &suite.stream,
        &view_at(&x_dev, offset, &shape)?,
        &mut view_mut_at(&mut y_dev, offset, &shape)?,
        &mut mask_dev,
    )?;
    let dy = view_at(&dy_dev, offset, &shape)?;
    let mut from_mask = view_mut_at(&mut from_mask_dev, offset, &shape)?;
    batch_norm::relu_backward_from_mask(&suite.stream, &dy, &mask_dev, &mut from_mask)?;
    let mut from_y = view_mut_at(&mut from_y_dev, offset, &shape)?;
    batch_norm::relu_backward(&suite.stream, &dy, &view_at(&y_dev, offset, &shape)?, &mut from_y)?;
    Ok(vec![
        Written::of("y", None, &y_dev.to_vec()?, offset),
        Written::of("mask", None, &mask_dev.to_vec()?, 0),
        Written::of("dx_from_mask", None, &from_mask_dev.to_vec()?, offset),
        Written::of("dx_from_y", None, &from_y_dev.to_vec()?, offset),
    ])
}

// ---------------------------------------------------------------------------------------------
// Elementwise
// ---------------------------------------------------------------------------------------------

/// `op` on `inputs` (the last a row of `shape`'s last dimension where the op broadcasts it)
/// into an output of `shape`, every array `offset` elements into its allocation: y.
pub fn elementwise_run<T: RawBits>(
    suite: &Suite,
    op: &ElementwiseOp,
    inputs: &[Vec<T>],
    shape: &[usize],
    offset: usize,
) -> rill::Result<Vec<Written>> {
    let y = launch_op(suite, op, inputs, shape, offset, offset)?;
    Ok(vec![Written::of("y", shape.last().copied().filter(|_| shape.len() > 1), &y, 0)])
}

/// `x` cast to `O`, both `offset` elements into their allocations: y.
pub fn cast_run<I: Element, O: RawBits>(suite: &Suite, x: &[I], offset: usize) -> rill::Result<Vec<Written>> {
    let shape = [x.len()];
    let x_dev = suite.upload(x, offset)?;
    let mut y_dev = suite.poisoned::<O>(x.len(), offset)?;
    rill::elementwise::cast(
        &suite.stream,
        &view_at(&x_dev, offset, &shape)?,
        &mut view_mut_at(&mut y_dev, offset, &shape)?,
    )?;
    Ok(vec![Written::of("y", None, &y_dev.to_vec()?, offset)])
}
