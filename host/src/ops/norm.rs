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
//! dtype; an f32 input may be written as f16 or bf16. The row kernels share softmax's three
//! paths and dispatch ([`super::rows`]). dweight and dbias are column sums over the rows,
//! reduced in two deterministic stages (chunk sums into a stream-ordered workspace, then
//! the chunks in order): no atomics, the same bits every run.

use super::rows::dispatch::WARP_MAX_COLS;
pub use super::rows::dispatch::{Path, PathKind, Plan};

/// Widest row the backward gives the warp path. Its 32-element tier holds x and dy (64
/// registers of row) and ran at 65-70% of copy at 1024 columns on the H100, where the
/// shared path reached 86-100%.
const BACKWARD_WARP_MAX_COLS: usize = 512;
use super::rows::{RowCall, RowKernels, check_aligned, rows_cols, same_shape};
use crate::error::{DriverContext, Error, Result, invalid};
use crate::launch::{LaunchConfig, grid_stride_blocks, launch};
use crate::module::KernelKey;
use crate::tensor::{AsView, AsViewMut, DType, Element, View, ViewMut};
use crate::{DeviceInfo, Stream};
use cust::memory::DeviceBuffer;
use rill_kernels_gpu::abi::{
    NORM_PARAM_GRAD_WARPS, NormArgs, NormParamGradArgs, max_pack, norm_param_grad_shared_bytes,
    norm_param_grad_tile_cols,
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
/// Built with [`Forward::new`] and the optional parts below.
pub struct Forward<'a, T: Element, U: Element, G: Element> {
    x: View<'a, T>,
    y: ViewMut<'a, U>,
    residual: Option<(View<'a, T>, ViewMut<'a, T>)>,
    weight: Option<View<'a, G>>,
    bias: Option<View<'a, G>>,
    mean: Option<ViewMut<'a, f32>>,
    rstd: Option<ViewMut<'a, f32>>,
}

impl<'a, T: Element, U: Element> Forward<'a, T, U, f32> {
    /// `y = norm(x)`, without weight or bias (give them with [`Forward::weight`] and
    /// [`Forward::bias`], in f32 or the input's dtype).
    pub fn new(x: &'a impl AsView<T>, y: &'a mut impl AsViewMut<U>) -> Self {
        Forward { x: x.as_view(), y: y.as_view_mut(), residual: None, weight: None, bias: None, mean: None, rstd: None }
    }
}

impl<'a, T: Element, U: Element, G: Element> Forward<'a, T, U, G> {
    /// The per-column scale (gamma), `[cols]` of f32 or the input's dtype.
    pub fn weight<H: Element>(self, weight: &'a impl AsView<H>) -> Forward<'a, T, U, H> {
        Forward {
            x: self.x,
            y: self.y,
            residual: self.residual,
            weight: Some(weight.as_view()),
            bias: None,
            mean: self.mean,
            rstd: self.rstd,
        }
    }

    /// The per-column shift (beta, LayerNorm only), `[cols]` of the weight's dtype; give
    /// the weight first.
    pub fn bias(mut self, bias: &'a impl AsView<G>) -> Self {
        self.bias = Some(bias.as_view());
        self
    }

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
/// weight's and bias's gradients.
pub struct Backward<'a, T: Element, G: Element> {
    x: View<'a, T>,
    dy: View<'a, T>,
    mean: Option<View<'a, f32>>,
    rstd: View<'a, f32>,
    dx: ViewMut<'a, T>,
    weight: Option<View<'a, G>>,
    dweight: Option<ViewMut<'a, G>>,
    dbias: Option<ViewMut<'a, G>>,
}

impl<'a, T: Element> Backward<'a, T, f32> {
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
            weight: None,
            dweight: None,
            dbias: None,
        }
    }
}

impl<'a, T: Element, G: Element> Backward<'a, T, G> {
    /// The forward's per-row mean (LayerNorm).
    pub fn mean(mut self, mean: &'a impl AsView<f32>) -> Self {
        self.mean = Some(mean.as_view());
        self
    }

    /// The forward's weight, if it had one.
    pub fn weight<H: Element>(self, weight: &'a impl AsView<H>) -> Backward<'a, T, H> {
        Backward {
            x: self.x,
            dy: self.dy,
            mean: self.mean,
            rstd: self.rstd,
            dx: self.dx,
            weight: Some(weight.as_view()),
            dweight: None,
            dbias: None,
        }
    }

    /// Also computes the weight's gradient, `[cols]` of the weight's dtype.
    pub fn dweight(mut self, dweight: &'a mut impl AsViewMut<G>) -> Self {
        self.dweight = Some(dweight.as_view_mut());
        self
    }

    /// Also computes the bias's gradient (LayerNorm).
    pub fn dbias(mut self, dbias: &'a mut impl AsViewMut<G>) -> Self {
        self.dbias = Some(dbias.as_view_mut());
        self
    }
}

/// Norms with a choice of implementation: [`Norm::new`] lets the dispatcher choose.
#[derive(Clone, Copy, Debug, Default)]
pub struct Norm {
    force: Option<PathKind>,
    plan_only: bool,
}

/// Checks a `[cols]` parameter vector.
fn check_column<G: Element>(op: &str, what: &str, v: &View<'_, G>, cols: usize) -> Result<()> {
    same_shape(op, what, v.shape(), &[cols])?;
    check_aligned(op, what, v.address(), size_of::<G>() as u64)
}

/// Checks a per-row f32 array (any shape holding `rows` elements, e.g. `[rows]` or
/// PyTorch's `[..., 1]`).
fn check_per_row(op: &str, what: &str, shape: &[usize], address: u64, rows: usize) -> Result<()> {
    let len: usize = shape.iter().product();
    if len != rows {
        invalid!("`{op}`: {what} has shape {shape:?} ({len} elements) but needs one f32 per row ({rows})");
    }
    check_aligned(op, what, address, 4)
}

/// Bytes of weight and bias every row reads.
fn column_bytes<G: Element>(weight: &Option<View<'_, G>>, bias: &Option<View<'_, G>>) -> u32 {
    [weight, bias].iter().filter_map(|v| v.as_ref()).map(|v| v.len() * size_of::<G>()).sum::<usize>() as u32
}

fn check_eps(op: &str, eps: f32) -> Result<()> {
    if !(eps.is_finite() && eps >= 0.0) {
        invalid!("`{op}`: eps must be finite and not negative; got {eps}");
    }
    Ok(())
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
    pub fn forward<T: Element, U: Element, G: Element>(
        &self,
        stream: &Stream,
        kind: NormKind,
        eps: f32,
        call: Forward<'_, T, U, G>,
    ) -> Result<Plan> {
        let op = match (kind, call.residual.is_some()) {
            (NormKind::LayerNorm, false) => "layer_norm",
            (NormKind::RmsNorm, false) => "rms_norm",
            (NormKind::LayerNorm, true) => "add_layer_norm",
            (NormKind::RmsNorm, true) => "add_rms_norm",
        };
        let (rows, cols) = rows_cols(op, call.x.shape())?;
        check_eps(op, eps)?;
        same_shape(op, "the output", call.y.shape(), call.x.shape())?;
        let dtypes = (T::DTYPE, U::DTYPE, G::DTYPE);
        let kernel_kind = if call.residual.is_some() { NormKernelKind::AddForward } else { NormKernelKind::Forward };
        if !has_kernels(kernel_kind, dtypes) {
            return Err(Error::Unsupported(format!(
                "`{op}` has no kernel for input {}, output {}, weight {}: the output is the input's dtype (or f16/bf16 \
                 from f32), the weight and bias f32 or the input's dtype",
                T::DTYPE.name(),
                U::DTYPE.name(),
                G::DTYPE.name()
            )));
        }
        let mut arrays = vec![(call.x.address(), size_of::<T>()), (call.y.address(), size_of::<U>())];
        let mut args = NormArgs {
            input: call.x.address(),
            output: call.y.address(),
            eps,
            inv_cols: (1.0 / cols as f64) as f32,
            rms: (kind == NormKind::RmsNorm) as u32,
            ..NormArgs::default()
        };
        if let Some((residual, sum)) = &call.residual {
            same_shape(op, "the residual", residual.shape(), call.x.shape())?;
            same_shape(op, "the sum", sum.shape(), call.x.shape())?;
            arrays.extend([(residual.address(), size_of::<T>()), (sum.address(), size_of::<T>())]);
            args.second = residual.address();
            args.sum = sum.address();
        }
        if let Some(weight) = &call.weight {
            check_column(op, "the weight", weight, cols)?;
            arrays.push((weight.address(), size_of::<G>()));
            args.gamma = weight.address();
        }
        if let Some(bias) = &call.bias {
            if kind == NormKind::RmsNorm {
                invalid!("`{op}` has no bias; drop it (RMSNorm only scales)");
            }
            check_column(op, "the bias", bias, cols)?;
            arrays.push((bias.address(), size_of::<G>()));
            args.beta = bias.address();
        }
        if let Some(mean) = &call.mean {
            if kind == NormKind::RmsNorm {
                invalid!("`{op}` computes no mean; save only rstd");
            }
            check_per_row(op, "the mean", mean.shape(), mean.address(), rows)?;
            args.mean = mean.address();
        }
        if let Some(rstd) = &call.rstd {
            check_per_row(op, "rstd", rstd.shape(), rstd.address(), rows)?;
            args.rstd = rstd.address();
        }
        RowCall {
            op,
            kernels: RowKernels::Norm { kind: kernel_kind, dtypes },
            widest: max_pack(size_of::<T>(), size_of::<U>()),
            rows,
            cols,
            arrays,
            // The norm kernels have no unaligned edges (gamma and beta are per column).
            phased: false,
            args,
            // x as its own dtype (a residual sum is rounded to it).
            cache_bytes_per_col: size_of::<T>() as u32,
            cluster_held_packs: 0,
            warp_max_cols: WARP_MAX_COLS,
            column_bytes: column_bytes(&call.weight, &call.bias),
            // The residual add fills its cache through registers (it also writes the sum);
            // measured, it gains more from L1 for gamma and beta than from resident blocks.
            columns_before_blocks: call.residual.is_some(),
            reads_once: false,
            force: self.force,
            launch: !self.plan_only,
            stream,
        }
        .run()
    }

    /// Runs a backward call: `dx`, then dweight and dbias if asked. Returns the plan of
    /// the `dx` kernel.
    pub fn backward<T: Element, G: Element>(
        &self,
        stream: &Stream,
        kind: NormKind,
        call: Backward<'_, T, G>,
    ) -> Result<Plan> {
        let op = match kind {
            NormKind::LayerNorm => "layer_norm_backward",
            NormKind::RmsNorm => "rms_norm_backward",
        };
        let (rows, cols) = rows_cols(op, call.x.shape())?;
        same_shape(op, "dy", call.dy.shape(), call.x.shape())?;
        same_shape(op, "dx", call.dx.shape(), call.x.shape())?;
        let dtypes = (T::DTYPE, T::DTYPE, G::DTYPE);
        if !has_kernels(NormKernelKind::Backward, dtypes) {
            return Err(Error::Unsupported(format!(
                "`{op}` has no kernel for input {} with weight {}: the weight is f32 or the input's dtype",
                T::DTYPE.name(),
                G::DTYPE.name()
            )));
        }
        check_per_row(op, "rstd", call.rstd.shape(), call.rstd.address(), rows)?;
        let mut args = NormArgs {
            input: call.x.address(),
            second: call.dy.address(),
            output: call.dx.address(),
            rstd: call.rstd.address(),
            inv_cols: (1.0 / cols as f64) as f32,
            rms: (kind == NormKind::RmsNorm) as u32,
            ..NormArgs::default()
        };
        match (kind, &call.mean) {
            (NormKind::LayerNorm, Some(mean)) => {
                check_per_row(op, "the mean", mean.shape(), mean.address(), rows)?;
                args.mean = mean.address();
            }
            (NormKind::LayerNorm, None) => invalid!("`{op}` needs the forward's per-row mean"),
            (NormKind::RmsNorm, Some(_)) => invalid!("`{op}` takes no mean (RMSNorm does not center)"),
            (NormKind::RmsNorm, None) => {}
        }
        let mut arrays = vec![
            (call.x.address(), size_of::<T>()),
            (call.dy.address(), size_of::<T>()),
            (call.dx.address(), size_of::<T>()),
        ];
        if let Some(weight) = &call.weight {
            check_column(op, "the weight", weight, cols)?;
            arrays.push((weight.address(), size_of::<G>()));
            args.gamma = weight.address();
        }
        if call.dbias.is_some() && kind == NormKind::RmsNorm {
            invalid!("`{op}` has no bias to differentiate");
        }
        for (what, grad) in [("dweight", &call.dweight), ("dbias", &call.dbias)] {
            if let Some(grad) = grad {
                same_shape(op, what, grad.shape(), &[cols])?;
                check_aligned(op, what, grad.address(), size_of::<G>() as u64)?;
            }
        }
        let plan = RowCall {
            op,
            kernels: RowKernels::Norm { kind: NormKernelKind::Backward, dtypes },
            widest: max_pack(size_of::<T>(), size_of::<T>()),
            rows,
            cols,
            arrays,
            // The norm kernels have no unaligned edges (gamma and beta are per column).
            phased: false,
            args,
            // x and dy as they are (normalized and scaled as they are read).
            cache_bytes_per_col: 2 * size_of::<T>() as u32,
            cluster_held_packs: 0,
            warp_max_cols: BACKWARD_WARP_MAX_COLS,
            column_bytes: column_bytes(&call.weight, &None),
            columns_before_blocks: false,
            reads_once: false,
            force: self.force,
            launch: !self.plan_only,
            stream,
        }
        .run()?;
        if !self.plan_only && (call.dweight.is_some() || call.dbias.is_some()) {
            let grad_args = NormParamGradArgs {
                rows: rows as u64,
                cols: cols as u64,
                input: args.input,
                grad: args.second,
                mean: args.mean,
                rstd: args.rstd,
                dgamma: call.dweight.as_ref().map_or(0, |g| g.address()),
                dbeta: call.dbias.as_ref().map_or(0, |b| b.address()),
                rms: args.rms,
                ..NormParamGradArgs::default()
            };
            // x and dy passed the row kernel's pack check, so its pack serves stage 1.
            param_grads::<T, G>(stream, op, grad_args, plan.pack)?;
        }
        Ok(plan)
    }
}

/// How stage 1 of the parameter gradients splits the rows: enough blocks for two waves,
/// chunks of at least 32 rows (the partial sums stay small beside the input).
pub fn param_grad_chunks(rows: usize, cols: usize, pack: usize, device: &DeviceInfo) -> (u64, u64) {
    let tiles = cols.div_ceil(norm_param_grad_tile_cols(pack)) as u64;
    let threads_per_block = NORM_PARAM_GRAD_WARPS * 32;
    let resident = device.multiprocessors as u64 * (device.max_threads_per_multiprocessor / threads_per_block) as u64;
    let max_chunks = (rows as u64 / 32).max(1);
    let chunks = (2 * resident / tiles).clamp(1, max_chunks);
    let rows_per_chunk = (rows as u64).div_ceil(chunks);
    (rows_per_chunk, (rows as u64).div_ceil(rows_per_chunk))
}

/// dweight (and dbias): stage 1 writes chunk sums to a stream-ordered workspace, stage 2
/// adds them in chunk order.
fn param_grads<T: Element, G: Element>(
    stream: &Stream,
    op: &str,
    mut args: NormParamGradArgs,
    pack: usize,
) -> Result<()> {
    let gpu = stream.gpu();
    let device = gpu.info();
    let (rows, cols) = (args.rows as usize, args.cols as usize);
    (args.rows_per_chunk, args.chunks) = param_grad_chunks(rows, cols, pack, device);
    let unsupported = |_| Error::Unsupported(format!("`{op}`: no parameter-gradient kernel for {}", T::DTYPE.name()));
    let stage1 = gpu.modules().kernel(KernelKey::NormParamGrad { x: T::DTYPE, pack }).map_err(unsupported)?;
    let stage2 = gpu.modules().kernel(KernelKey::NormParamGradSum { param: G::DTYPE }).map_err(unsupported)?;
    let partial_len = 2 * args.chunks as usize * cols;
    // SAFETY: stage 1 writes every partial sum stage 2 reads, before it on the same stream.
    let partial =
        unsafe { DeviceBuffer::<f32>::uninitialized_async(partial_len, stream.raw()) }.during("cuMemAllocAsync")?;
    args.partial = partial.as_device_ptr().as_raw();
    let block = NORM_PARAM_GRAD_WARPS * 32;
    let tiles = cols.div_ceil(norm_param_grad_tile_cols(pack)) as u32;
    let stage1_config = LaunchConfig {
        grid: tiles * args.chunks as u32,
        block,
        shared_bytes: norm_param_grad_shared_bytes(pack),
        cluster: 1,
    };
    let stage2_config =
        LaunchConfig { grid: grid_stride_blocks(cols as u64, 256, device), block: 256, shared_bytes: 0, cluster: 1 };
    // SAFETY: the caller checked x and dy (rows x cols, aligned to `pack`), mean and rstd
    // (rows), dweight and dbias (cols); the partial buffer holds 2 x chunks x cols; the grid
    // is tiles x chunks blocks of the warps stage 1 expects, with its shared memory.
    let launched = unsafe {
        launch(stream, stage1, stage1_config, &args).and_then(|()| launch(stream, stage2, stage2_config, &args))
    };
    partial.drop_async(stream.raw()).during("cuMemFreeAsync")?;
    launched
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let paths = [RowPath::WARP.as_slice(), &[RowPath::Shared, RowPath::Uncached, RowPath::Cluster]].concat();
        for &path in &paths {
            for dtypes in forward {
                let pack = max_pack(dtypes.0.size(), dtypes.1.size());
                let key = |kind, pack| KernelKey::Norm { kind, path, dtypes, pack };
                for kind in [NormKernelKind::Forward, NormKernelKind::AddForward] {
                    assert!(key(kind, pack).symbol().is_some(), "{kind:?} {path:?} {dtypes:?}");
                    assert!(key(kind, 1).symbol().is_some());
                }
                let backward = key(NormKernelKind::Backward, pack).symbol().is_some();
                assert_eq!(backward, dtypes.0 == dtypes.1, "{path:?} {dtypes:?}");
            }
        }
        assert!(!has_kernels(NormKernelKind::Forward, (f16_, f32_, f32_)));
        for (x, pack) in [(f32_, 4), (f16_, 8), (bf16_, 8)] {
            assert!(KernelKey::NormParamGrad { x, pack }.symbol().is_some());
            assert!(KernelKey::NormParamGrad { x, pack: 1 }.symbol().is_some());
        }
        for param in [f32_, f16_, bf16_] {
            assert!(KernelKey::NormParamGradSum { param }.symbol().is_some());
        }
    }

    #[test]
    fn param_grad_chunks_cover_the_rows_in_chunks_of_at_least_32() {
        let device = crate::launch::tests::h100();
        for (rows, cols, pack) in [(49152, 4096, 8), (49152, 128, 8), (1, 1, 1), (33, 5, 1), (4096, 65536, 4)] {
            let (per_chunk, chunks) = param_grad_chunks(rows, cols, pack, &device);
            assert!(per_chunk * chunks >= rows as u64 && per_chunk * (chunks - 1) < rows as u64);
            assert!(per_chunk >= 32 || chunks == 1, "{rows} {cols}: {per_chunk} x {chunks}");
        }
    }
}
