//! LayerNorm and RMSNorm over the last axis, forward and backward, with the fusions a
//! transformer block needs: residual add before the norm (also writing the sum) and an
//! output dtype other than the input's.
//!
//! ```no_run
//! use rill::norm::{Forward, Norm, NormKind};
//! # fn demo(stream: &rill::Stream, x: &rill::Tensor<half::bf16>, w: &rill::Tensor<f32>,
//! #         y: &mut rill::Tensor<half::bf16>) -> rill::Result<()> {
//! let plan = Norm::new().forward(stream, NormKind::RmsNorm, 1e-6, Forward::new(x, y).weight(w))?;
//! println!("{}", plan.describe());
//! # Ok(()) }
//! ```
//!
//! Inputs are f32, f16 or bf16, computed in f32; the weight and bias are f32 or the input's
//! dtype, the same for both (and their gradients): whichever a call gets first fixes it. An
//! f32 input may be written as f16 or bf16. The row kernels share softmax's three
//! paths and dispatch (the row engine). dweight and dbias are column sums over the rows,
//! reduced in two deterministic stages: partial sums into a stream-ordered workspace (each
//! block's, gathered as the backward reads its rows for dx where its kernels have the
//! path; else each chunk's, read again by a kernel of their own), then those added in
//! order. No atomics: the same bits every run.

pub use super::rows::dispatch::{Path, PathKind, Plan};

use super::columns::{ColumnSumArgs, sum_chunks, sum_columns};
use super::rows::dispatch::gathers_columns;
use super::rows::{ColumnArrays, LibraryKernels, OpClass, Prepared, RowCall, RowSpec, check_aligned, same_shape};
use super::{Span, Spans, check_disjoint};
use crate::Stream;
use crate::error::{Error, Result, invalid};
use crate::launch::{LaunchConfig, launch};
use crate::module::{Kernel, KernelKey};
use crate::tensor::{AsView, AsViewMut, DType, Element, View, ViewMut};
use crate::workspace::Workspace;
use rill_kernels_gpu::abi::{
    COLUMN_COPY_BLOCK_SIZE, ColumnCopyArgs, NormArgs, NormParamGradArgs, column_copy_stride, max_pack,
    phased_columns_copied,
};
use rill_kernels_gpu::table::{NormKernelKind, RowPath};

/// Which norm: LayerNorm centers and scales, `(x - mean) * rstd * weight + bias`; RMSNorm
/// only scales, `x * rstd * weight` with `rstd = 1 / sqrt(mean(x^2) + eps)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormKind {
    LayerNorm,
    RmsNorm,
}

impl NormKind {
    pub fn name(self) -> &'static str {
        match self {
            NormKind::LayerNorm => "layer_norm",
            NormKind::RmsNorm => "rms_norm",
        }
    }
}

/// Whether the norm row kernels include `kind` for these (x, y, weight) dtypes.
fn has_kernels(kind: NormKernelKind, dtypes: (DType, DType, DType)) -> bool {
    KernelKey::Norm { kind, path: RowPath::Uncached, dtypes, pack: 1 }.symbol().is_some()
}

/// A forward call: `y = norm(x)` or, with a residual, `sum = x + residual; y = norm(sum)`.
/// Built with [`Forward::new`] and the optional parts below, in any order, each kept. `P`
/// holds the weight and bias: [`NoParams`] until one of them is given, then [`Params`] of
/// its dtype, which the other must share.
///
/// ```no_run
/// # use rill::{Tensor, norm::Forward};
/// # fn demo(x: &Tensor<f32>, y: &mut Tensor<f32>, b: &Tensor<f32>, w: &Tensor<f32>) {
/// let call = Forward::new(x, y).bias(b).weight(w);
/// # }
/// ```
///
/// A weight of another dtype than the bias given before it does not compile:
///
/// ```compile_fail,E0277
/// # use rill::{Tensor, norm::Forward};
/// # fn demo(x: &Tensor<f32>, y: &mut Tensor<f32>, b: &Tensor<f32>, w: &Tensor<half::bf16>) {
/// let call = Forward::new(x, y).bias(b).weight(w);
/// # }
/// ```
pub struct Forward<'a, T: Element, U: Element, P = NoParams> {
    x: View<'a, T>,
    y: ViewMut<'a, U>,
    residual: Option<(View<'a, T>, ViewMut<'a, T>)>,
    mean: Option<ViewMut<'a, f32>>,
    rstd: Option<ViewMut<'a, f32>>,
    params: P,
}

/// No weight, bias or parameter gradient given yet: the parameter dtype is still open, and a
/// call run without any uses the f32 kernels.
#[derive(Clone, Copy, Debug)]
pub struct NoParams;

/// A forward's weight and bias, of one dtype `G` (f32 or the input's).
#[derive(Default)]
pub struct Params<'a, G> {
    weight: Option<View<'a, G>>,
    bias: Option<View<'a, G>>,
}

/// A backward's weight and the gradients it computes, of one dtype `G`.
#[derive(Default)]
pub struct GradParams<'a, G> {
    weight: Option<View<'a, G>>,
    dweight: Option<ViewMut<'a, G>>,
    dbias: Option<ViewMut<'a, G>>,
}

/// A forward without weight or bias runs the f32 kernels with neither.
impl From<NoParams> for Params<'_, f32> {
    fn from(_: NoParams) -> Self {
        Params::default()
    }
}

/// A backward without weight or parameter gradients runs the f32 kernels with none.
impl From<NoParams> for GradParams<'_, f32> {
    fn from(_: NoParams) -> Self {
        GradParams::default()
    }
}

impl<'a, T: Element, U: Element> Forward<'a, T, U> {
    /// `y = norm(x)`, without weight or bias.
    pub fn new(x: &'a impl AsView<T>, y: &'a mut impl AsViewMut<U>) -> Self {
        Forward { x: x.as_view(), y: y.as_view_mut(), residual: None, mean: None, rstd: None, params: NoParams }
    }

    /// The per-column scale (gamma), `[cols]` of f32 or the input's dtype; a bias must then
    /// have the same dtype.
    pub fn weight<G: Element>(self, weight: &'a impl AsView<G>) -> Forward<'a, T, U, Params<'a, G>> {
        self.open_params().weight(weight)
    }

    /// The per-column shift (beta, LayerNorm only; PyTorch too takes it without a weight),
    /// `[cols]` of f32 or the input's dtype; a weight must then have the same dtype.
    pub fn bias<G: Element>(self, bias: &'a impl AsView<G>) -> Forward<'a, T, U, Params<'a, G>> {
        self.open_params().bias(bias)
    }

    /// This call, every part kept, ready for parameters of dtype `G`.
    fn open_params<G: Element>(self) -> Forward<'a, T, U, Params<'a, G>> {
        let Forward { x, y, residual, mean, rstd, params: NoParams } = self;
        Forward { x, y, residual, mean, rstd, params: Params::default() }
    }
}

impl<'a, T: Element, U: Element, G: Element> Forward<'a, T, U, Params<'a, G>> {
    /// The weight, of the bias's dtype.
    pub fn weight(mut self, weight: &'a impl AsView<G>) -> Self {
        self.params.weight = Some(weight.as_view());
        self
    }

    /// The bias, of the weight's dtype.
    pub fn bias(mut self, bias: &'a impl AsView<G>) -> Self {
        self.params.bias = Some(bias.as_view());
        self
    }
}

impl<'a, T: Element, U: Element, P> Forward<'a, T, U, P> {
    /// Normalizes `x + residual` instead of `x`, writing the sum (the residual stream) too.
    pub fn residual(mut self, residual: &'a impl AsView<T>, sum: &'a mut impl AsViewMut<T>) -> Self {
        self.residual = Some((residual.as_view(), sum.as_view_mut()));
        self
    }

    /// Writes each row's mean (LayerNorm only) and `rstd` (f32, `rows` each) for the backward.
    pub fn save_mean(mut self, mean: &'a mut impl AsViewMut<f32>) -> Self {
        self.mean = Some(mean.as_view_mut());
        self
    }

    pub fn save_rstd(mut self, rstd: &'a mut impl AsViewMut<f32>) -> Self {
        self.rstd = Some(rstd.as_view_mut());
        self
    }
}

/// A backward call: `dx` from `x`, `dy` and the forward's statistics; optionally the
/// weight's and bias's gradients. Its parts may come in any order, each kept; `P` holds the
/// weight, dweight and dbias as in [`Forward`]: the first of them fixes the dtype of the
/// others.
///
/// ```compile_fail,E0277
/// # use rill::{Tensor, norm::Backward};
/// # fn demo(x: &Tensor<f32>, dy: &Tensor<f32>, rstd: &Tensor<f32>, dx: &mut Tensor<f32>,
/// #         dw: &mut Tensor<f32>, w: &Tensor<half::bf16>) {
/// let call = Backward::new(x, dy, rstd, dx).dweight(dw).weight(w);
/// # }
/// ```
pub struct Backward<'a, T: Element, P = NoParams> {
    x: View<'a, T>,
    dy: View<'a, T>,
    mean: Option<View<'a, f32>>,
    rstd: View<'a, f32>,
    dx: ViewMut<'a, T>,
    params: P,
}

impl<'a, T: Element> Backward<'a, T> {
    /// `dx` of RMSNorm, or of LayerNorm once [`Backward::mean`] gives the mean.
    pub fn new(
        x: &'a impl AsView<T>,
        dy: &'a impl AsView<T>,
        rstd: &'a impl AsView<f32>,
        dx: &'a mut impl AsViewMut<T>,
    ) -> Self {
        Backward {
            x: x.as_view(),
            dy: dy.as_view(),
            mean: None,
            rstd: rstd.as_view(),
            dx: dx.as_view_mut(),
            params: NoParams,
        }
    }

    /// The forward's weight, if it had one; the gradients must then have its dtype.
    pub fn weight<G: Element>(self, weight: &'a impl AsView<G>) -> Backward<'a, T, GradParams<'a, G>> {
        self.open_params().weight(weight)
    }

    /// Also computes the weight's gradient, `[cols]` of the weight's dtype (f32 without one).
    pub fn dweight<G: Element>(self, dweight: &'a mut impl AsViewMut<G>) -> Backward<'a, T, GradParams<'a, G>> {
        self.open_params().dweight(dweight)
    }

    /// Also computes the bias's gradient (LayerNorm), of the weight's dtype (f32 without one).
    pub fn dbias<G: Element>(self, dbias: &'a mut impl AsViewMut<G>) -> Backward<'a, T, GradParams<'a, G>> {
        self.open_params().dbias(dbias)
    }

    /// This call, every part kept, ready for parameters of dtype `G`.
    fn open_params<G: Element>(self) -> Backward<'a, T, GradParams<'a, G>> {
        let Backward { x, dy, mean, rstd, dx, params: NoParams } = self;
        Backward { x, dy, mean, rstd, dx, params: GradParams::default() }
    }
}

impl<'a, T: Element, G: Element> Backward<'a, T, GradParams<'a, G>> {
    /// The forward's weight, of the gradients' dtype.
    pub fn weight(mut self, weight: &'a impl AsView<G>) -> Self {
        self.params.weight = Some(weight.as_view());
        self
    }

    /// The weight's gradient, of the weight's dtype.
    pub fn dweight(mut self, dweight: &'a mut impl AsViewMut<G>) -> Self {
        self.params.dweight = Some(dweight.as_view_mut());
        self
    }

    /// The bias's gradient, of the weight's dtype.
    pub fn dbias(mut self, dbias: &'a mut impl AsViewMut<G>) -> Self {
        self.params.dbias = Some(dbias.as_view_mut());
        self
    }
}

impl<'a, T: Element, P> Backward<'a, T, P> {
    /// The forward's per-row mean (LayerNorm).
    pub fn mean(mut self, mean: &'a impl AsView<f32>) -> Self {
        self.mean = Some(mean.as_view());
        self
    }
}

/// A forward's parts beside its rows: the weight and bias, and the per-row outputs. A user's
/// fused norm (`rill::fuse::FusedNorm`) takes them alone, as its own functors read and
/// write the rows.
///
/// ```no_run
/// # use rill::{Tensor, norm::NormParts};
/// # fn demo(w: &Tensor<f32>, rstd: &mut Tensor<f32>) {
/// let parts = NormParts::new().weight(w).save_rstd(rstd);
/// # }
/// ```
pub struct NormParts<'a, G> {
    params: Params<'a, G>,
    mean: Option<ViewMut<'a, f32>>,
    rstd: Option<ViewMut<'a, f32>>,
}

impl<G> Default for NormParts<'_, G> {
    fn default() -> Self {
        NormParts { params: Params { weight: None, bias: None }, mean: None, rstd: None }
    }
}

impl<'a, G: Element> NormParts<'a, G> {
    /// No weight, bias or per-row output.
    pub fn new() -> Self {
        NormParts::default()
    }

    /// The per-column scale (gamma), `[cols]` of `G`.
    pub fn weight(mut self, weight: &'a impl AsView<G>) -> Self {
        self.params.weight = Some(weight.as_view());
        self
    }

    /// The per-column shift (beta, LayerNorm only), `[cols]` of `G`.
    pub fn bias(mut self, bias: &'a impl AsView<G>) -> Self {
        self.params.bias = Some(bias.as_view());
        self
    }

    /// Writes each row's mean (LayerNorm only), f32, `rows` of them.
    pub fn save_mean(mut self, mean: &'a mut impl AsViewMut<f32>) -> Self {
        self.mean = Some(mean.as_view_mut());
        self
    }

    /// Writes each row's `rstd`, f32, `rows` of them.
    pub fn save_rstd(mut self, rstd: &'a mut impl AsViewMut<f32>) -> Self {
        self.rstd = Some(rstd.as_view_mut());
        self
    }

    /// Adds the memory these parts read (weight, bias) and write (mean, rstd).
    fn spans(&self, reads: &mut Spans<'static>, writes: &mut Spans<'static>) {
        let Params { weight, bias } = &self.params;
        for (what, view) in [("the weight", weight), ("the bias", bias)] {
            reads.extend(view.as_ref().map(|v| Span::of(what, v)));
        }
        for (what, view) in [("the mean", &self.mean), ("rstd", &self.rstd)] {
            writes.extend(view.as_ref().map(|v| Span::of(what, v)));
        }
    }

    /// Checks these parts against a forward of `kind` over `rows x cols`, and writes them
    /// into `args` (with `1 / cols`) and their per-column arrays into `columns`; returns the
    /// bytes of weight and bias every row reads.
    pub(crate) fn fill(
        &self,
        op: &str,
        kind: NormKind,
        (rows, cols): (usize, usize),
        args: &mut NormArgs,
        columns: &mut ColumnArrays,
    ) -> Result<u32> {
        let Params { weight, bias } = &self.params;
        if !(args.eps.is_finite() && args.eps >= 0.0) {
            invalid!("`{op}`: eps must be finite and not negative; got {}", args.eps);
        }
        args.rms = (kind == NormKind::RmsNorm) as u32;
        args.inv_cols = (1.0 / cols as f64) as f32;
        if let Some(weight) = weight {
            args.gamma = column(op, "the weight", weight, cols)?;
            columns.push((args.gamma, size_of::<G>()));
        }
        if let Some(bias) = bias {
            if kind == NormKind::RmsNorm {
                invalid!("`{op}` has no bias; drop it (RMSNorm only scales)");
            }
            args.beta = column(op, "the bias", bias, cols)?;
            columns.push((args.beta, size_of::<G>()));
        }
        if let Some(mean) = &self.mean {
            if kind == NormKind::RmsNorm {
                invalid!("`{op}` computes no mean; save only rstd");
            }
            args.mean = per_row(op, "the mean", mean, rows)?;
        }
        if let Some(rstd) = &self.rstd {
            args.rstd = per_row(op, "rstd", rstd, rows)?;
        }
        Ok(column_bytes(weight, bias))
    }
}

/// Norms with a choice of implementation: [`Norm::new`] lets the dispatcher choose.
#[derive(Clone, Copy, Debug, Default)]
pub struct Norm {
    force: Option<PathKind>,
    plan_only: bool,
}

/// Checks a `[cols]` parameter vector; returns its address.
fn column<G: Element>(op: &str, what: &str, v: &impl AsView<G>, cols: usize) -> Result<u64> {
    let v = v.as_view();
    same_shape(op, what, v.shape(), &[cols])?;
    check_aligned(op, what, v.address(), size_of::<G>() as u64)?;
    Ok(v.address())
}

/// Checks a per-row f32 array (any shape holding `rows` elements, e.g. `[rows]` or
/// PyTorch's `[..., 1]`); returns its address.
fn per_row(op: &str, what: &str, v: &impl AsView<f32>, rows: usize) -> Result<u64> {
    let v = v.as_view();
    let (shape, len) = (v.shape(), v.len());
    if len != rows {
        invalid!("`{op}`: {what} has shape {shape:?} ({len} elements) but needs one f32 per row ({rows})");
    }
    check_aligned(op, what, v.address(), 4)?;
    Ok(v.address())
}

/// Bytes of weight and bias every row reads.
fn column_bytes<G: Element>(weight: &Option<View<'_, G>>, bias: &Option<View<'_, G>>) -> u32 {
    [weight, bias].iter().filter_map(|v| v.as_ref()).map(|v| v.len() * size_of::<G>()).sum::<usize>() as u32
}

impl Norm {
    pub fn new() -> Self {
        Norm::default()
    }

    /// Runs every row kernel on `path` (an error where the shape does not fit it).
    pub fn forced(path: PathKind) -> Self {
        Norm { force: Some(path), ..Norm::default() }
    }

    /// Makes every call check its tensors and plan its row kernel exactly as it would, then
    /// return the [`Plan`] without launching anything (nor, in the backward, the parameter
    /// gradients' kernels, which the plan does not describe): tests and tools ask the
    /// planner which path a shape takes, or whether a forced path takes it (an
    /// [`Error::Unsupported`] where not), instead of restating its rules. It asks the driver
    /// about occupancy as a launch does, so it needs the GPU; the tensors' shapes and
    /// addresses count, never their values.
    pub fn plan_only(self) -> Self {
        Norm { plan_only: true, ..self }
    }

    /// Runs a forward call; returns the plan it ran.
    ///
    /// ```no_run
    /// # use rill::Tensor;
    /// # use rill::norm::{Forward, Norm, NormKind};
    /// # fn main() -> rill::Result<()> {
    /// # let gpu = rill::Gpu::new(0)?;
    /// # let stream = gpu.stream()?;
    /// let (rows, cols) = (4, 4096);
    /// let x = Tensor::<f32>::from_slice(&gpu, &vec![0.5; rows * cols], &[rows, cols])?;
    /// let w = Tensor::<f32>::from_slice(&gpu, &vec![1.0; cols], &[cols])?;
    /// let mut y = Tensor::<f32>::zeros(&gpu, &[rows, cols])?;
    /// let mut rstd = Tensor::<f32>::zeros(&gpu, &[rows])?;
    /// let call = Forward::new(&x, &mut y).weight(&w).save_rstd(&mut rstd);
    /// Norm::new().forward(&stream, NormKind::RmsNorm, 1e-6, call)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn forward<'a, T: Element, U: Element, G: Element>(
        &self,
        stream: &Stream,
        kind: NormKind,
        eps: f32,
        call: Forward<'a, T, U, impl Into<Params<'a, G>>>,
    ) -> Result<Plan> {
        let Params { weight, bias } = call.params.into();
        let op = match (kind, call.residual.is_some()) {
            (NormKind::LayerNorm, false) => "layer_norm",
            (NormKind::RmsNorm, false) => "rms_norm",
            (NormKind::LayerNorm, true) => "add_layer_norm",
            (NormKind::RmsNorm, true) => "add_rms_norm",
        };
        let kernel_kind = if call.residual.is_some() { NormKernelKind::AddForward } else { NormKernelKind::Forward };
        let dtypes = (T::DTYPE, U::DTYPE, G::DTYPE);
        let args = NormArgs { input: call.x.address(), output: call.y.address(), eps, ..NormArgs::default() };
        let kernels = LibraryKernels::Norm { kind: kernel_kind, dtypes }.into();
        let class = if call.residual.is_some() { OpClass::AddNorm } else { OpClass::Norm };
        // The shared path caches x as its own dtype (a residual sum is rounded to it). Rows
        // run from their heads where their arrays share an offset and an element size (odd
        // widths; `RowCall::run` checks both): the phased kernels read the weight and bias
        // from shifted copies. The residual add fills its cache through registers, and
        // gains more from L1 for gamma and beta than from resident blocks.
        let spec = RowSpec {
            widest: max_pack(size_of::<T>(), size_of::<U>()),
            columns_before_blocks: call.residual.is_some(),
            runs_from_heads: true,
            ..RowSpec::rows_of(class, size_of::<T>() as u32)
        };
        let mut row = RowCall::new(stream, op, kernels, spec, &call.x, args, self.force, !self.plan_only)?;
        let (rows, cols) = (row.rows, row.cols);
        same_shape(op, "the output", call.y.shape(), call.x.shape())?;
        if !has_kernels(kernel_kind, dtypes) {
            return Err(Error::Unsupported(format!(
                "`{op}` has no kernel for input {}, output {}, weight {}: the output is the input's dtype (or f16/bf16 \
                 from f32), the weight and bias f32 or the input's dtype",
                T::DTYPE.name(),
                U::DTYPE.name(),
                G::DTYPE.name()
            )));
        }
        row.arrays.push((call.y.address(), size_of::<U>()));
        if let Some((residual, sum)) = &call.residual {
            same_shape(op, "the residual", residual.shape(), call.x.shape())?;
            same_shape(op, "the sum", sum.shape(), call.x.shape())?;
            row.arrays.extend([(residual.address(), size_of::<T>()), (sum.address(), size_of::<T>())]);
            row.args.second = residual.address();
            row.args.sum = sum.address();
        }
        let parts = NormParts { params: Params { weight, bias }, mean: call.mean, rstd: call.rstd };
        row.spec.column_bytes = parts.fill(op, kind, (rows, cols), &mut row.args, &mut row.columns)?;
        let mut reads = Spans::from_iter([Span::of("the input", &call.x)]);
        let mut writes = Spans::from_iter([Span::of("the output", &call.y)]);
        if let Some((residual, sum)) = &call.residual {
            reads.push(Span::of("the residual", residual));
            writes.push(Span::of("the sum", sum));
        }
        parts.spans(&mut reads, &mut writes);
        check_disjoint(op, &reads, &writes, false)?;
        launch_reading_copies::<G>(stream, op, row.prepare()?)
    }

    /// Runs a backward call: `dx`, then dweight and dbias if asked. Returns the plan of
    /// the `dx` kernel.
    ///
    /// ```no_run
    /// # use rill::Tensor;
    /// # use rill::norm::{Backward, Norm, NormKind};
    /// # fn main() -> rill::Result<()> {
    /// # let gpu = rill::Gpu::new(0)?;
    /// # let stream = gpu.stream()?;
    /// let (rows, cols) = (4, 4096);
    /// let (x, dy) = (Tensor::<f32>::zeros(&gpu, &[rows, cols])?, Tensor::<f32>::zeros(&gpu, &[rows, cols])?);
    /// let rstd = Tensor::<f32>::zeros(&gpu, &[rows])?; // the forward's saved statistic
    /// let w = Tensor::<f32>::from_slice(&gpu, &vec![1.0; cols], &[cols])?;
    /// let (mut dx, mut dw) = (Tensor::<f32>::zeros(&gpu, &[rows, cols])?, Tensor::<f32>::zeros(&gpu, &[cols])?);
    /// let call = Backward::new(&x, &dy, &rstd, &mut dx).weight(&w).dweight(&mut dw);
    /// Norm::new().backward(&stream, NormKind::RmsNorm, call)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn backward<'a, T: Element, G: Element>(
        &self,
        stream: &Stream,
        kind: NormKind,
        call: Backward<'a, T, impl Into<GradParams<'a, G>>>,
    ) -> Result<Plan> {
        let GradParams { weight, dweight, dbias } = call.params.into();
        let op = match kind {
            NormKind::LayerNorm => "layer_norm_backward",
            NormKind::RmsNorm => "rms_norm_backward",
        };
        let dtypes = (T::DTYPE, T::DTYPE, G::DTYPE);
        let args = NormArgs {
            input: call.x.address(),
            second: call.dy.address(),
            output: call.dx.address(),
            rstd: call.rstd.address(),
            rms: (kind == NormKind::RmsNorm) as u32,
            ..NormArgs::default()
        };
        let kernels = LibraryKernels::Norm { kind: NormKernelKind::Backward, dtypes }.into();
        // x and dy cached as they are (normalized and scaled as they are read), dy scaled by
        // the weight on every read of its cache. Rows run from their heads where x, dy and
        // dx share an offset (odd widths): the phased kernels read the weight from shifted
        // copies.
        let spec = RowSpec {
            cache_bytes_per_col: 2 * size_of::<T>() as u32,
            passes_column_bytes: if weight.is_some() { size_of::<G>() as u32 } else { 0 },
            column_bytes: column_bytes(&weight, &None),
            runs_from_heads: true,
            ..RowSpec::rows_of(OpClass::NormBackward, size_of::<T>() as u32)
        };
        let mut row = RowCall::new(stream, op, kernels, spec, &call.x, args, self.force, !self.plan_only)?;
        let (rows, cols) = (row.rows, row.cols);
        same_shape(op, "dy", call.dy.shape(), call.x.shape())?;
        same_shape(op, "dx", call.dx.shape(), call.x.shape())?;
        if !has_kernels(NormKernelKind::Backward, dtypes) {
            return Err(Error::Unsupported(format!(
                "`{op}` has no kernel for input {} with weight {}: the weight is f32 or the input's dtype",
                T::DTYPE.name(),
                G::DTYPE.name()
            )));
        }
        per_row(op, "rstd", &call.rstd, rows)?;
        row.args.inv_cols = (1.0 / cols as f64) as f32;
        match (kind, &call.mean) {
            (NormKind::LayerNorm, Some(mean)) => row.args.mean = per_row(op, "the mean", mean, rows)?,
            (NormKind::LayerNorm, None) => invalid!("`{op}` needs the forward's per-row mean"),
            (NormKind::RmsNorm, Some(_)) => invalid!("`{op}` takes no mean (RMSNorm does not center)"),
            (NormKind::RmsNorm, None) => {}
        }
        row.arrays.extend([(call.dy.address(), size_of::<T>()), (call.dx.address(), size_of::<T>())]);
        if let Some(weight) = &weight {
            row.args.gamma = column(op, "the weight", weight, cols)?;
            row.columns.push((row.args.gamma, size_of::<G>()));
        }
        if dbias.is_some() && kind == NormKind::RmsNorm {
            invalid!("`{op}` has no bias to differentiate");
        }
        for (what, grad) in [("dweight", &dweight), ("dbias", &dbias)] {
            if let Some(grad) = grad {
                column(op, what, grad, cols)?;
            }
        }
        // The parameter gradients gathered from the rows as dx reads them, where that
        // kernel has a path (`gathers_columns`): aligned rows on the warp path, or aligned
        // rows or rows run from their heads in one block's shared memory or a cluster's
        // (each block its slice's sums). Elsewhere (rows too wide, a forced path, or a
        // plan off those paths on this device: `Prepared::gathers`) `param_grad` reads x
        // and dy again.
        let sums = match kind {
            NormKind::LayerNorm => 2,
            NormKind::RmsNorm => 1,
        };
        let wants_params = dweight.is_some() || dbias.is_some();
        let aligned = row.aligned();
        let gathering = RowSpec { class: OpClass::NormBackwardParams, column_sums: sums, ..row.spec };
        let gathers = wants_params
            && self.force.is_none()
            && (aligned || (cols > row.warp_max_cols() && row.shares_phase()))
            && gathers_columns(&gathering, cols, !aligned, row.stream.gpu().info());
        if gathers {
            row.ungathered = Some(row.kernels);
            row.kernels = LibraryKernels::Norm { kind: NormKernelKind::BackwardParams, dtypes }.into();
            row.spec = gathering;
        }
        let grad_args = NormParamGradArgs {
            rows: rows as u64,
            cols: cols as u64,
            input: row.args.input,
            grad: row.args.second,
            mean: row.args.mean,
            rstd: row.args.rstd,
            dgamma: dweight.as_ref().map_or(0, |g| g.address()),
            dbeta: dbias.as_ref().map_or(0, |b| b.address()),
            rms: row.args.rms,
            ..NormParamGradArgs::default()
        };
        let mut reads =
            Spans::from_iter([Span::of("the input", &call.x), Span::of("dy", &call.dy), Span::of("rstd", &call.rstd)]);
        reads.extend(call.mean.as_ref().map(|m| Span::of("the mean", m)));
        reads.extend(weight.as_ref().map(|w| Span::of("the weight", w)));
        let mut writes = Spans::from_iter([Span::of("dx", &call.dx)]);
        for (what, grad) in [("dweight", &dweight), ("dbias", &dbias)] {
            writes.extend(grad.as_ref().map(|g| Span::of(what, g)));
        }
        check_disjoint(op, &reads, &writes, false)?;
        let mut prepared = row.prepare()?;
        if !prepared.launches() || !wants_params {
            return launch_reading_copies::<G>(stream, op, prepared);
        }
        if !prepared.gathers {
            let plan = launch_reading_copies::<G>(stream, op, prepared)?;
            // x and dy passed the row kernel's pack check, so its pack serves stage 1, unless
            // the rows ran from their heads (stage 1 reads whole packs of columns).
            let pack = if plan.phased { 1 } else { plan.pack };
            param_grads::<T, G>(stream, op, grad_args, pack)?;
            return Ok(plan);
        }
        // A partial row per block (or cluster) of the grid, each column's sums then added in
        // block order.
        let chunks = prepared.plan.partial_rows() as u64;
        Workspace::scoped(stream, sums as usize * chunks as usize * cols, |partial| {
            prepared.args.partial = partial;
            let grad_args = NormParamGradArgs { chunks, partial, ..grad_args };
            // SAFETY: the row kernel writes `sums` rows of `cols` f32 per partial row of its
            // plan into `partial` before the totals read them, on the same stream.
            launch_reading_copies::<G>(stream, op, prepared)
                .and_then(|plan| unsafe { chunk_totals::<G>(stream, op, grad_args) }.map(|()| plan))
        })
    }
}

impl ColumnSumArgs for NormParamGradArgs {
    fn set_chunking(&mut self, rows_per_chunk: u64, chunks: u64, partial: u64) {
        (self.rows_per_chunk, self.chunks, self.partial) = (rows_per_chunk, chunks, partial);
    }
}

/// Launches a norm's row kernel. Where its rows run from their heads (a phased plan), each
/// row's packs start at another column; where the pack is one that
/// [`phased_columns_copied`], the weight and bias (where given) are first copied once
/// shifted by each column a pack can start at, into stream-ordered scratch that the kernel
/// then reads them from in whole aligned accesses
/// (the device's `ColumnLoad::shifted`).
fn launch_reading_copies<G: Element>(stream: &Stream, op: &str, mut prepared: Prepared<'_, NormArgs>) -> Result<Plan> {
    if !prepared.launches() || !prepared.plan.phased || !phased_columns_copied(prepared.plan.pack) {
        return prepared.launch();
    }
    // The given vectors, gamma before beta, 0 past them.
    let (mut sources, mut vectors) = ([0; 2], 0);
    for vector in [prepared.args.gamma, prepared.args.beta].into_iter().filter(|&v| v != 0) {
        (sources[vectors], vectors) = (vector, vectors + 1);
    }
    if vectors == 0 {
        return prepared.launch();
    }
    let kernel = column_kernel(stream, op, KernelKey::NormColumnCopies { param: G::DTYPE }, G::DTYPE)?;
    let cols = prepared.args.shape.cols;
    let (copies, stride) = (prepared.plan.pack, column_copy_stride(cols) as usize);
    let copy_bytes = copies * stride * size_of::<G>();
    let config = LaunchConfig {
        grid: stride.div_ceil(COLUMN_COPY_BLOCK_SIZE as usize) as u32,
        block: COLUMN_COPY_BLOCK_SIZE,
        shared_bytes: 0,
        cluster: 1,
    };
    Workspace::scoped(stream, (vectors * copy_bytes).div_ceil(size_of::<f32>()), |scratch| {
        let args = ColumnCopyArgs { sources, output: scratch, cols, copies: copies as u32, vectors: vectors as u32 };
        let mut next = scratch;
        for vector in [&mut prepared.args.gamma, &mut prepared.args.beta] {
            if *vector != 0 {
                (*vector, next) = (next, next + copy_bytes as u64);
            }
        }
        // SAFETY: the kernel takes ColumnCopyArgs; the op checked each vector to hold `cols`
        // elements of `G`, and the scratch holds every copy of each, 16-byte aligned (the pool
        // aligns allocations, and a copy's bytes are a multiple of 16); the row kernel then
        // reads the copies on the same stream.
        unsafe { launch(stream, kernel, config, &args) }.and_then(|()| prepared.launch())
    })
}

/// The per-column kernel `key` (parameter gradients, shifted copies); `Unsupported` naming
/// `op` and `dtype` where there is none.
fn column_kernel(stream: &Stream, op: &str, key: KernelKey, dtype: DType) -> Result<Kernel> {
    stream
        .gpu()
        .modules()
        .kernel(key)
        .map_err(|error| error.reword_unsupported(|| format!("`{op}`: no per-column kernel for {}", dtype.name())))
}

/// Stage 2 alone: dweight (and dbias) as the sums of `args.chunks` partial rows, in order.
///
/// # Safety
/// `args.partial` must hold the `[sums, chunks, cols]` f32 rows, written before this call on
/// `stream`; dweight and dbias, where not 0, `cols` elements of `G`.
unsafe fn chunk_totals<G: Element>(stream: &Stream, op: &str, args: NormParamGradArgs) -> Result<()> {
    let totals = column_kernel(stream, op, KernelKey::NormParamGradSum { param: G::DTYPE }, G::DTYPE)?;
    // SAFETY: forwarded to the caller.
    unsafe { sum_chunks(stream, totals, args, args.cols as usize) }
}

/// dweight (and dbias): the column sums of `dy * x̂` (and `dy`).
fn param_grads<T: Element, G: Element>(stream: &Stream, op: &str, args: NormParamGradArgs, pack: usize) -> Result<()> {
    let chunks = column_kernel(stream, op, KernelKey::NormParamGrad { x: T::DTYPE, pack }, T::DTYPE)?;
    let totals = column_kernel(stream, op, KernelKey::NormParamGradSum { param: G::DTYPE }, T::DTYPE)?;
    // SAFETY: both kernels take NormParamGradArgs; the caller checked x and dy (rows x cols,
    // aligned to `pack`), mean and rstd (rows), dweight and dbias (cols).
    unsafe { sum_columns(stream, (chunks, totals), args, (args.rows as usize, args.cols as usize, pack)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::rows::dispatch::warp_max_cols;
    use half::bf16;

    #[test]
    fn every_kind_path_and_dtype_triple_has_a_kernel() {
        let (f32_, f16_, bf16_) = (DType::F32, DType::F16, DType::BF16);
        let forward = [
            (f32_, f32_, f32_),
            (f16_, f16_, f16_),
            (f16_, f16_, f32_),
            (bf16_, bf16_, bf16_),
            (bf16_, bf16_, f32_),
            (f32_, f16_, f32_),
            (f32_, bf16_, f32_),
        ];
        let paths = [
            RowPath::WARP.as_slice(),
            &[RowPath::Shared, RowPath::Uncached, RowPath::Cluster, RowPath::SharedPhased, RowPath::ClusterPhased],
        ]
        .concat();
        for &path in &paths {
            for dtypes in forward {
                let pack = max_pack(dtypes.0.size(), dtypes.1.size());
                let key = |kind, pack| KernelKey::Norm { kind, path, dtypes, pack };
                // The phased paths run rows of one element size, at the widest pack only.
                let phased_kernels = dtypes.0.size() == dtypes.1.size();
                for kind in [NormKernelKind::Forward, NormKernelKind::AddForward] {
                    let expected = !path.phased() || phased_kernels;
                    assert_eq!(key(kind, pack).symbol().is_some(), expected, "{kind:?} {path:?} {dtypes:?}");
                    assert_eq!(key(kind, 1).symbol().is_some(), !path.phased());
                }
                let backward = key(NormKernelKind::Backward, pack).symbol().is_some();
                assert_eq!(backward, dtypes.0 == dtypes.1, "{path:?} {dtypes:?}");
                // The gathering backward on the paths its calls plan: the warp tiers of
                // aligned rows up to the backward's widest warp row, the shared and cluster
                // paths, and their phased forms.
                let warp_max_cols = warp_max_cols(&RowSpec::rows_of(OpClass::NormBackwardParams, 2));
                let gathers = RowPath::WARP.iter().any(|p| *p == path && 32 * path.warp_elements() <= warp_max_cols)
                    || matches!(path, RowPath::Shared | RowPath::Cluster)
                    || (path.phased() && path != RowPath::UncachedPhased);
                let params = key(NormKernelKind::BackwardParams, pack).symbol().is_some();
                assert_eq!(params, gathers && backward, "{path:?} {dtypes:?}");
                assert!(key(NormKernelKind::BackwardParams, 1).symbol().is_none());
            }
        }
        assert!(!has_kernels(NormKernelKind::Forward, (f16_, f32_, f32_)));
        for (x, pack) in [(f32_, 4), (f16_, 8), (bf16_, 8)] {
            assert!(KernelKey::NormParamGrad { x, pack }.symbol().is_some());
            assert!(KernelKey::NormParamGrad { x, pack: 1 }.symbol().is_some());
        }
        for param in [f32_, f16_, bf16_] {
            assert!(KernelKey::NormParamGradSum { param }.symbol().is_some());
            assert!(KernelKey::NormColumnCopies { param }.symbol().is_some());
        }
    }

    /// The parameter dtype and the addresses a forward call holds: weight, bias, residual,
    /// sum, mean, rstd (0 where absent).
    fn forward_parts<'a, G: Element>(call: Forward<'a, bf16, bf16, impl Into<Params<'a, G>>>) -> (DType, [u64; 6]) {
        let Params { weight, bias } = call.params.into();
        let (residual, sum) = call.residual.map_or((0, 0), |(r, s)| (r.address(), s.address()));
        let (mean, rstd) = (call.mean.map_or(0, |v| v.address()), call.rstd.map_or(0, |v| v.address()));
        (G::DTYPE, [weight.map_or(0, |v| v.address()), bias.map_or(0, |v| v.address()), residual, sum, mean, rstd])
    }

    /// The parameter dtype and the addresses a backward call holds: weight, dweight, dbias,
    /// mean (0 where absent).
    fn backward_parts<'a, G: Element>(call: Backward<'a, bf16, impl Into<GradParams<'a, G>>>) -> (DType, [u64; 4]) {
        let GradParams { weight, dweight, dbias } = call.params.into();
        let mean = call.mean.map_or(0, |v| v.address());
        (
            G::DTYPE,
            [
                weight.map_or(0, |v| v.address()),
                dweight.map_or(0, |v| v.address()),
                dbias.map_or(0, |v| v.address()),
                mean,
            ],
        )
    }

    #[test]
    fn forward_keeps_every_part_whatever_the_order() {
        let x = View::<bf16>::detached(0x10, &[4, 8]);
        let mut y = ViewMut::<bf16>::detached(0x20, &[4, 8]);
        let (w, b) = (View::<bf16>::detached(0x30, &[8]), View::<bf16>::detached(0x40, &[8]));
        let r = View::<bf16>::detached(0x50, &[4, 8]);
        let mut sum = ViewMut::<bf16>::detached(0x60, &[4, 8]);
        let mut mean = ViewMut::<f32>::detached(0x70, &[4]);
        let mut rstd = ViewMut::<f32>::detached(0x80, &[4]);
        let all = (DType::BF16, [0x30, 0x40, 0x50, 0x60, 0x70, 0x80]);
        let call = Forward::new(&x, &mut y).weight(&w).bias(&b).residual(&r, &mut sum);
        assert_eq!(forward_parts(call.save_mean(&mut mean).save_rstd(&mut rstd)), all);
        let call = Forward::new(&x, &mut y).save_rstd(&mut rstd).residual(&r, &mut sum).save_mean(&mut mean);
        assert_eq!(forward_parts(call.bias(&b).weight(&w)), all);
        // The bias alone fixes the dtype; without weight or bias the f32 kernels run.
        assert_eq!(forward_parts(Forward::new(&x, &mut y).bias(&b)), (DType::BF16, [0, 0x40, 0, 0, 0, 0]));
        assert_eq!(forward_parts(Forward::new(&x, &mut y).save_rstd(&mut rstd)), (DType::F32, [0, 0, 0, 0, 0, 0x80]));
    }

    /// The shifted copies as the copy kernel lays them out hold, for every pack a phased row
    /// reads (from each row's head), the vector's elements where the kernel's read of that
    /// pack looks: copy `col % pack`, element `col - col % pack`, from a 16-byte boundary.
    #[test]
    fn shifted_copies_hold_every_pack_a_phased_row_reads() {
        use rill_kernels_gpu::abi::RowShape;
        for (cols, pack) in [(50257u64, 8u64), (32001, 8), (4099, 8), (9, 8), (17, 4)] {
            let stride = column_copy_stride(cols);
            assert!((stride * 2).is_multiple_of(16) && stride >= cols);
            let copies: Vec<Option<u64>> = (0..pack * stride)
                .map(|at| {
                    let (copy, i) = (at / stride, at % stride);
                    (i + copy < cols).then_some(i + copy)
                })
                .collect();
            for phase in 0..pack as u32 {
                let shape = RowShape { rows: 0, cols, width: 0, phase, ahead: 0, stages: 0 };
                for row in 0..pack {
                    let head = shape.head(row, pack);
                    for k in 0..shape.aligned_packs(pack) {
                        let col = head + k * pack;
                        let first = (col % pack) * stride + col - col % pack;
                        assert!(first.is_multiple_of(pack), "{cols} {pack}: column {col}");
                        for j in 0..pack {
                            assert_eq!(copies[(first + j) as usize], Some(col + j), "{cols} {pack}: column {col}");
                        }
                    }
                }
            }
        }
        assert!(phased_columns_copied(8) && !phased_columns_copied(4) && !phased_columns_copied(1));
    }

    #[test]
    fn backward_keeps_every_part_whatever_the_order() {
        let (x, dy) = (View::<bf16>::detached(0x10, &[4, 8]), View::<bf16>::detached(0x20, &[4, 8]));
        let (mean, rstd) = (View::<f32>::detached(0x30, &[4]), View::<f32>::detached(0x40, &[4]));
        let mut dx = ViewMut::<bf16>::detached(0x50, &[4, 8]);
        let w = View::<bf16>::detached(0x60, &[8]);
        let mut dw = ViewMut::<bf16>::detached(0x70, &[8]);
        let mut db = ViewMut::<bf16>::detached(0x80, &[8]);
        let all = (DType::BF16, [0x60, 0x70, 0x80, 0x30]);
        let call = Backward::new(&x, &dy, &rstd, &mut dx).weight(&w).dweight(&mut dw).dbias(&mut db);
        assert_eq!(backward_parts(call.mean(&mean)), all);
        let call = Backward::new(&x, &dy, &rstd, &mut dx).dbias(&mut db).mean(&mean).dweight(&mut dw);
        assert_eq!(backward_parts(call.weight(&w)), all);
        let call = Backward::new(&x, &dy, &rstd, &mut dx).dweight(&mut dw).weight(&w);
        assert_eq!(backward_parts(call.dbias(&mut db).mean(&mean)), all);
        // Gradients without a weight fix the dtype; without any the f32 kernels run.
        assert_eq!(
            backward_parts(Backward::new(&x, &dy, &rstd, &mut dx).dbias(&mut db)),
            (DType::BF16, [0, 0, 0x80, 0])
        );
        assert_eq!(backward_parts(Backward::new(&x, &dy, &rstd, &mut dx).mean(&mean)), (DType::F32, [0, 0, 0, 0x30]));
    }
}
