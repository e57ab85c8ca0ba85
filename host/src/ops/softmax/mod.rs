//! Softmax and log-softmax over the last axis, forward and backward, and the fused
//! variants attention and classification need: scale plus additive mask, scale plus causal
//! mask, and cross entropy (log-softmax gathered at the targets, never materialized).
//!
//! Each call validates its tensors, plans the implementation ([`dispatch::plan`]) and
//! launches; it returns the [`Plan`] it ran, so callers and tests can see the choice.
//! A row of all `-inf` gives NaN, as in PyTorch.

pub mod dispatch;

use crate::Stream;
use crate::error::{Error, Result, invalid};
use crate::launch::{LaunchConfig, launch};
use crate::module::{Kernel, PtxModule};
use crate::tensor::{AsView, AsViewMut, DType, Element, View};
pub use dispatch::{Path, PathKind, Plan};
use dispatch::{Problem, STATIC_SHARED_BYTES, plan};
use rill_kernels_gpu::abi::{SoftmaxArgs, max_pack};
use rill_kernels_gpu::{dtype_of, for_each_softmax_kernel, softmax_symbol};

/// The exported symbol of softmax kernel `kind` on `path`, if there is one.
fn symbol(kind: &str, path: &str, dtype: DType, pack: usize) -> Option<&'static str> {
    macro_rules! find {
        ($kind:ident $path:ident $code:literal $dtype:ident $pack:literal) => {
            if kind == stringify!($kind) && path == stringify!($path) && dtype == dtype_of!($dtype) && pack == $pack {
                return Some(softmax_symbol!($kind, $path, $dtype, $pack));
            }
        };
    }
    for_each_softmax_kernel!(find);
    None
}

/// Rows and columns of a tensor normalized over its last axis.
fn rows_cols(op: &str, shape: &[usize]) -> Result<(usize, usize)> {
    let Some((&cols, outer)) = shape.split_last() else {
        invalid!("`{op}` needs at least one dimension (it normalizes the last); got a scalar");
    };
    let rows = outer.iter().product();
    if rows == 0 || cols == 0 {
        invalid!("`{op}` got an empty tensor of shape {shape:?}");
    }
    Ok((rows, cols))
}

/// Checks that `dim` names the last axis of an `ndim`-dimensional tensor (negative counts
/// from the end, as PyTorch): the only layout these kernels normalize.
pub fn check_last_dim(dim: i64, ndim: usize) -> Result<()> {
    let last = ndim as i64 - 1;
    if dim == -1 || dim == last {
        Ok(())
    } else {
        invalid!(
            "dim {dim}: softmax normalizes the last axis of a row-major tensor (dim -1 or {last}); move the axis last first"
        )
    }
}

/// One softmax-family launch, before planning.
struct Call<'a> {
    op: &'static str,
    kind: &'static str,
    dtype: DType,
    rows: usize,
    cols: usize,
    /// (address, element bytes) of every row-major array, for the pack choice.
    arrays: Vec<(u64, usize)>,
    args: SoftmaxArgs,
    backward: bool,
    force: Option<PathKind>,
    stream: &'a Stream,
}

impl Call<'_> {
    fn run(mut self) -> Result<Plan> {
        let widest = max_pack(self.dtype.size(), self.dtype.size());
        let aligned = self.cols.is_multiple_of(widest)
            && self.arrays.iter().all(|&(address, bytes)| address % (widest * bytes) as u64 == 0);
        let pack = if aligned { widest } else { 1 };
        let gpu = self.stream.gpu();
        gpu.bind()?;
        let kernel_for = |plan: &Plan| -> Result<Kernel> {
            let (path, _) = plan.symbol_path();
            let symbol = symbol(self.kind, path, self.dtype, plan.pack).ok_or_else(|| {
                Error::Unsupported(format!("no `{}` kernel for {} on the {path} path", self.op, self.dtype.name()))
            })?;
            gpu.modules().kernel(PtxModule::Softmax, symbol)
        };
        // Asked only when the planner considers the shared path.
        let occupancy = |block: u32, bytes: u32| {
            let shared = kernel_for(&Plan { path: Path::Shared { block, shared_bytes: bytes }, pack, grid: 1 })?;
            shared.allow_dynamic_shared(bytes.max(STATIC_SHARED_BYTES))?;
            shared.blocks_per_multiprocessor(block, bytes)
        };
        let block_kernel = |path| kernel_for(&Plan { path, pack, grid: 1 }).map(|k| k.max_threads_per_block);
        let block_limit =
            block_kernel(Path::Uncached { block: 0 })?.min(block_kernel(Path::Shared { block: 0, shared_bytes: 0 })?);
        let problem = Problem {
            rows: self.rows,
            cols: self.cols,
            pack,
            cached_arrays: if self.backward { 2 } else { 1 },
            block_limit,
            force: self.force,
        };
        let plan = plan(&problem, gpu.info(), &occupancy)?;
        let kernel = kernel_for(&plan)?;
        if let Path::Shared { shared_bytes, .. } = plan.path {
            kernel.allow_dynamic_shared(shared_bytes.max(STATIC_SHARED_BYTES))?;
        }
        if let Path::Warp { width, .. } = plan.path {
            self.args.width = width;
        }
        self.args.rows = self.rows as u64;
        self.args.cols = self.cols as u64;
        let config = LaunchConfig { grid: plan.grid, block: plan.block(), shared_bytes: plan.shared_bytes() };
        // SAFETY: the symbol takes SoftmaxArgs for this dtype, kind and pack; every array
        // was checked to hold rows x cols elements (per-row arrays `rows`), aligned to the
        // pack; the geometry is the one the plan made for this path.
        unsafe { launch(self.stream, kernel, config, &self.args)? };
        Ok(plan)
    }
}

fn same_shape(op: &str, what: &str, got: &[usize], want: &[usize]) -> Result<()> {
    if got != want {
        invalid!("`{op}`: {what} has shape {got:?} but must have shape {want:?}");
    }
    Ok(())
}

/// Softmax-family ops with a choice of implementation; the free functions of this module
/// use [`Softmax::new`], which lets the dispatcher choose.
#[derive(Clone, Copy, Debug, Default)]
pub struct Softmax {
    force: Option<PathKind>,
}

impl Softmax {
    pub fn new() -> Self {
        Softmax::default()
    }

    /// Runs every call on `path` (an error where the shape does not fit it).
    pub fn forced(path: PathKind) -> Self {
        Softmax { force: Some(path) }
    }

    fn call<'a, T: Element>(
        &self,
        stream: &'a Stream,
        op: &'static str,
        kind: &'static str,
        x: &View<'_, T>,
    ) -> Result<Call<'a>> {
        let (rows, cols) = rows_cols(op, x.shape())?;
        Ok(Call {
            op,
            kind,
            dtype: T::DTYPE,
            rows,
            cols,
            arrays: vec![(x.address(), size_of::<T>())],
            args: SoftmaxArgs { input: x.address(), ..SoftmaxArgs::default() },
            backward: false,
            force: self.force,
            stream,
        })
    }

    /// `y = softmax(x)` over the last axis; `log` for log-softmax.
    pub fn forward<T: Element>(
        &self,
        stream: &Stream,
        x: &impl AsView<T>,
        y: &mut impl AsViewMut<T>,
        log: bool,
    ) -> Result<Plan> {
        let (x, y) = (x.as_view(), y.as_view_mut());
        let op = if log { "log_softmax" } else { "softmax" };
        let mut call = self.call(stream, op, "forward", &x)?;
        same_shape(op, "the output", y.shape(), x.shape())?;
        call.arrays.push((y.address(), size_of::<T>()));
        call.args.output = y.address();
        call.args.log = log as u32;
        call.run()
    }

    /// `dx` from the forward output `y` and its gradient `dy`.
    pub fn backward<T: Element>(
        &self,
        stream: &Stream,
        y: &impl AsView<T>,
        dy: &impl AsView<T>,
        dx: &mut impl AsViewMut<T>,
        log: bool,
    ) -> Result<Plan> {
        let (y, dy, dx) = (y.as_view(), dy.as_view(), dx.as_view_mut());
        let op = if log { "log_softmax_backward" } else { "softmax_backward" };
        let mut call = self.call(stream, op, "backward", &y)?;
        same_shape(op, "the output gradient", dy.shape(), y.shape())?;
        same_shape(op, "the input gradient", dx.shape(), y.shape())?;
        call.arrays.extend([(dy.address(), size_of::<T>()), (dx.address(), size_of::<T>())]);
        call.args.second = dy.address();
        call.args.output = dx.address();
        call.args.log = log as u32;
        call.backward = true;
        call.run()
    }

    /// `y = softmax(x * scale + mask)`; `mask` has the last dimension of `x` and a number
    /// of rows dividing its rows (e.g. `[seq_q, seq_k]` for `x` of `[batch, heads, seq_q,
    /// seq_k]`), broadcast over the rest.
    pub fn scale_mask<T: Element>(
        &self,
        stream: &Stream,
        x: &impl AsView<T>,
        mask: &impl AsView<T>,
        scale: f32,
        y: &mut impl AsViewMut<T>,
    ) -> Result<Plan> {
        let (x, mask, y) = (x.as_view(), mask.as_view(), y.as_view_mut());
        let op = "scaled_masked_softmax";
        let mut call = self.call(stream, op, "scale_mask", &x)?;
        same_shape(op, "the output", y.shape(), x.shape())?;
        let (mask_rows, mask_cols) = rows_cols(op, mask.shape())?;
        if mask_cols != call.cols || call.rows % mask_rows != 0 {
            invalid!(
                "`{op}`: the mask has shape {:?}; it needs the input's last dimension ({}) and a row count dividing the input's {} rows",
                mask.shape(),
                call.cols,
                call.rows
            );
        }
        call.arrays.extend([(mask.address(), size_of::<T>()), (y.address(), size_of::<T>())]);
        call.args.second = mask.address();
        call.args.output = y.address();
        call.args.period = mask_rows as u64;
        call.args.scale = scale;
        call.run()
    }

    /// `y = softmax(x * scale)` with a causal mask over the last two axes: query `i` (the
    /// second-to-last axis) sees keys `0..=i` (PyTorch's `is_causal`).
    pub fn causal<T: Element>(
        &self,
        stream: &Stream,
        x: &impl AsView<T>,
        scale: f32,
        y: &mut impl AsViewMut<T>,
    ) -> Result<Plan> {
        let (x, y) = (x.as_view(), y.as_view_mut());
        let op = "scaled_causal_softmax";
        let mut call = self.call(stream, op, "causal", &x)?;
        same_shape(op, "the output", y.shape(), x.shape())?;
        let queries = match x.shape() {
            [.., q, _] => *q,
            _ => invalid!("`{op}` needs at least two dimensions (queries, keys); got {:?}", x.shape()),
        };
        call.arrays.push((y.address(), size_of::<T>()));
        call.args.output = y.address();
        call.args.period = queries as u64;
        call.args.scale = scale;
        call.run()
    }

    /// Per-row cross entropy `loss[r] = -log_softmax(logits[r])[target[r]]`; rows whose
    /// target is -100 get 0 (PyTorch's `ignore_index`), other targets outside the row NaN.
    pub fn cross_entropy<T: Element>(
        &self,
        stream: &Stream,
        logits: &impl AsView<T>,
        target: &impl AsView<i64>,
        loss: &mut impl AsViewMut<f32>,
    ) -> Result<Plan> {
        let (logits, target, loss) = (logits.as_view(), target.as_view(), loss.as_view_mut());
        let op = "cross_entropy";
        let mut call = self.call(stream, op, "cross_entropy", &logits)?;
        same_shape(op, "the target", target.shape(), &[call.rows])?;
        same_shape(op, "the loss", loss.shape(), &[call.rows])?;
        check_aligned(op, "the target", target.address(), 8)?;
        check_aligned(op, "the loss", loss.address(), 4)?;
        call.args.target = target.address();
        call.args.row_values = loss.address();
        call.args.log = 1;
        call.run()
    }

    /// `dlogits = (softmax(logits) - onehot(target)) * dloss[row]` (0 for ignored rows).
    pub fn cross_entropy_backward<T: Element>(
        &self,
        stream: &Stream,
        logits: &impl AsView<T>,
        target: &impl AsView<i64>,
        dloss: &impl AsView<f32>,
        dlogits: &mut impl AsViewMut<T>,
    ) -> Result<Plan> {
        let (logits, target, dloss, dlogits) =
            (logits.as_view(), target.as_view(), dloss.as_view(), dlogits.as_view_mut());
        let op = "cross_entropy_backward";
        let mut call = self.call(stream, op, "cross_entropy_backward", &logits)?;
        same_shape(op, "the target", target.shape(), &[call.rows])?;
        same_shape(op, "the loss gradient", dloss.shape(), &[call.rows])?;
        same_shape(op, "the logits gradient", dlogits.shape(), logits.shape())?;
        check_aligned(op, "the target", target.address(), 8)?;
        check_aligned(op, "the loss gradient", dloss.address(), 4)?;
        call.arrays.push((dlogits.address(), size_of::<T>()));
        call.args.target = target.address();
        call.args.row_values = dloss.address();
        call.args.output = dlogits.address();
        call.run()
    }
}

fn check_aligned(op: &str, what: &str, address: u64, bytes: u64) -> Result<()> {
    if !address.is_multiple_of(bytes) {
        invalid!("`{op}`: {what} is not aligned to its {bytes}-byte elements");
    }
    Ok(())
}

/// `y = softmax(x)` over the last axis.
pub fn softmax<T: Element>(stream: &Stream, x: &impl AsView<T>, y: &mut impl AsViewMut<T>) -> Result<Plan> {
    Softmax::new().forward(stream, x, y, false)
}

/// `y = log_softmax(x)` over the last axis.
pub fn log_softmax<T: Element>(stream: &Stream, x: &impl AsView<T>, y: &mut impl AsViewMut<T>) -> Result<Plan> {
    Softmax::new().forward(stream, x, y, true)
}

/// `dx = (dy - sum(dy * y)) * y` from softmax's output `y`.
pub fn softmax_backward<T: Element>(
    stream: &Stream,
    y: &impl AsView<T>,
    dy: &impl AsView<T>,
    dx: &mut impl AsViewMut<T>,
) -> Result<Plan> {
    Softmax::new().backward(stream, y, dy, dx, false)
}

/// `dx = dy - exp(y) * sum(dy)` from log-softmax's output `y`.
pub fn log_softmax_backward<T: Element>(
    stream: &Stream,
    y: &impl AsView<T>,
    dy: &impl AsView<T>,
    dx: &mut impl AsViewMut<T>,
) -> Result<Plan> {
    Softmax::new().backward(stream, y, dy, dx, true)
}

/// `y = softmax(x * scale + mask)`; see [`Softmax::scale_mask`].
pub fn scaled_masked_softmax<T: Element>(
    stream: &Stream,
    x: &impl AsView<T>,
    mask: &impl AsView<T>,
    scale: f32,
    y: &mut impl AsViewMut<T>,
) -> Result<Plan> {
    Softmax::new().scale_mask(stream, x, mask, scale, y)
}

/// `y = softmax(x * scale)` under a causal mask; see [`Softmax::causal`].
pub fn scaled_causal_softmax<T: Element>(
    stream: &Stream,
    x: &impl AsView<T>,
    scale: f32,
    y: &mut impl AsViewMut<T>,
) -> Result<Plan> {
    Softmax::new().causal(stream, x, scale, y)
}

/// Per-row cross entropy; see [`Softmax::cross_entropy`].
pub fn cross_entropy<T: Element>(
    stream: &Stream,
    logits: &impl AsView<T>,
    target: &impl AsView<i64>,
    loss: &mut impl AsViewMut<f32>,
) -> Result<Plan> {
    Softmax::new().cross_entropy(stream, logits, target, loss)
}

/// Gradient of [`cross_entropy`]; see [`Softmax::cross_entropy_backward`].
pub fn cross_entropy_backward<T: Element>(
    stream: &Stream,
    logits: &impl AsView<T>,
    target: &impl AsView<i64>,
    dloss: &impl AsView<f32>,
    dlogits: &mut impl AsViewMut<T>,
) -> Result<Plan> {
    Softmax::new().cross_entropy_backward(stream, logits, target, dloss, dlogits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_path_dtype_and_pack_has_a_kernel() {
        for kind in ["forward", "backward", "scale_mask", "causal", "cross_entropy", "cross_entropy_backward"] {
            for path in ["warp8", "warp16", "warp32", "shared", "uncached"] {
                for (dtype, pack) in [(DType::F32, 4), (DType::F16, 8), (DType::BF16, 8)] {
                    assert!(symbol(kind, path, dtype, pack).is_some());
                    assert!(symbol(kind, path, dtype, 1).is_some());
                }
            }
        }
        assert!(symbol("forward", "warp8", DType::F32, 2).is_none());
    }

    #[test]
    fn only_the_last_axis_is_accepted() {
        assert!(check_last_dim(-1, 3).is_ok());
        assert!(check_last_dim(2, 3).is_ok());
        assert!(check_last_dim(1, 3).is_err());
        assert!(check_last_dim(-2, 3).is_err());
    }

    #[test]
    fn empty_and_scalar_tensors_are_rejected() {
        assert!(rows_cols("softmax", &[]).is_err());
        assert!(rows_cols("softmax", &[4, 0]).is_err());
        assert!(rows_cols("softmax", &[0, 4]).is_err());
        assert_eq!(rows_cols("softmax", &[2, 3, 5]).unwrap(), (6, 5));
    }
}
