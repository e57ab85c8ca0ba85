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

use super::rows::dispatch::gathers_columns;
use super::rows::{LibraryKernels, OpClass, RowCall, RowSpec, check_aligned, same_shape};
use super::{Span, Spans, check_disjoint};
use crate::Stream;
use crate::error::{Error, Result, invalid};
use crate::module::KernelKey;
use crate::tensor::{AsView, DType, Element, View};
use crate::workspace::Workspace;
use rill_kernels_gpu::abi::{NormArgs, NormParamGradArgs, max_pack};
use rill_kernels_gpu::table::{NormKernelKind, RowPath};

mod call;
mod columns;

pub use call::{Backward, Forward, GradParams, NoParams, NormParts, Params};
use columns::{chunk_totals, launch_reading_copies, param_grads};

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

/// The row engine's description of a norm forward of `class` (`Norm` or `AddNorm`) from rows
/// of `x_bytes` elements to `y_bytes` ones, before its weight and bias are known (their
/// bytes, [`RowSpec::column_bytes`], come from [`NormParts`]): x cached as its own dtype (a
/// residual sum rounded to it); rows run from their heads where their arrays share an
/// offset (odd widths), the phased kernels reading the weight and bias from shifted copies.
/// The residual add fills its cache through registers, and L1 room for gamma and beta
/// comes before its resident blocks.
pub(crate) fn forward_spec(class: OpClass, x_bytes: u32, y_bytes: u32) -> RowSpec {
    RowSpec {
        widest: max_pack(x_bytes as usize, y_bytes as usize),
        columns_before_blocks: class == OpClass::AddNorm,
        runs_from_heads: true,
        ..RowSpec::rows_of(class, x_bytes)
    }
}

/// The row engine's description of the norm backward for dx over rows of `x_bytes`
/// elements, with a weight of (element bytes, bytes a row reads) or none: x and dy cached as
/// they are (normalized and scaled as they are read), dy scaled by the weight on every read
/// of its cache; rows run from their heads where x, dy and dx share an offset.
pub(crate) fn backward_spec(x_bytes: u32, weight: Option<(u32, u32)>) -> RowSpec {
    RowSpec {
        cache_bytes_per_col: 2 * x_bytes,
        passes_column_bytes: weight.map_or(0, |(bytes, _)| bytes),
        column_bytes: weight.map_or(0, |(_, row_bytes)| row_bytes),
        runs_from_heads: true,
        ..RowSpec::rows_of(OpClass::NormBackward, x_bytes)
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
        let spec = forward_spec(class, size_of::<T>() as u32, size_of::<U>() as u32);
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
        let weight_bytes = weight.as_ref().map(|w| (size_of::<G>() as u32, (w.len() * size_of::<G>()) as u32));
        let spec = backward_spec(size_of::<T>() as u32, weight_bytes);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::rows::dispatch::warp_max_cols;

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
}
