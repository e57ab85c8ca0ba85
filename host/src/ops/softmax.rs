//! Softmax and log-softmax over the last axis, forward and backward, and the fused
//! variants attention and classification need: scale plus additive mask, scale plus causal
//! mask, cross entropy (log-softmax gathered at the targets, never materialized), and
//! logsumexp.
//!
//! Each call validates its tensors, plans the implementation and
//! launches; it returns the [`Plan`] it ran, so callers and tests can see the choice
//! ([`Softmax::plan_only`] asks for it without launching).
//! A row of all `-inf` gives NaN, as in PyTorch.

pub use super::rows::check_last_dim;
pub use super::rows::dispatch::{Path, PathKind, Plan};
use super::rows::{LibraryKernels, OpClass, RowCall, RowSpec, check_aligned, rows_cols, same_shape};
use crate::Stream;
use crate::error::{DriverContext, Result, invalid};
use crate::ops::{Span, check_disjoint};
use crate::tensor::{AsView, AsViewMut, Element, View};
use crate::workspace::Workspace;
pub use rill_kernels_gpu::abi::MASKED_MAX_ROWS;
use rill_kernels_gpu::abi::{Divisor, PACK_BYTES, SOFTMAX_BACKWARD_HELD_PACKS, SoftmaxArgs};
use rill_kernels_gpu::table::SoftmaxKind;

/// The most of the input's bytes a tiled mask may take ([`Softmax::scale_mask`]): one
/// eighth, so tiling adds little to the call's traffic.
const MASK_TILES_SHARE: usize = 8;

/// The fewest back-to-back copies of a mask of `bytes` that span a whole number of 16 bytes
/// (1, 2, 4 or 8), so that input rows a whole number of tilings apart start as far past 16
/// bytes as each other.
fn mask_tiles(bytes: usize) -> usize {
    PACK_BYTES >> bytes.trailing_zeros().min(PACK_BYTES.trailing_zeros())
}

/// Writes `tiles` (a power of two) back-to-back copies of the `bytes` at `source` from
/// `to`, doubling what is written with each copy, on `stream`.
///
/// # Safety
/// `source` must hold `bytes` of device memory, and `to` `tiles * bytes`, not overlapping it.
unsafe fn tile(stream: &Stream, source: u64, bytes: usize, to: u64, tiles: usize) -> Result<()> {
    let copy = |dst: u64, src: u64, bytes: usize| {
        // SAFETY: the caller's ranges; each copy reads what an earlier one on the stream wrote.
        unsafe { crate::driver::sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream.as_raw()) }
            .during("cuMemcpyDtoDAsync")
    };
    copy(to, source, bytes)?;
    let mut done = 1;
    while done < tiles {
        copy(to + (done * bytes) as u64, to, done * bytes)?;
        done *= 2;
    }
    Ok(())
}

/// Softmax-family ops with a choice of implementation; the free functions of this module
/// use [`Softmax::new`], which lets the dispatcher choose.
#[derive(Clone, Copy, Debug, Default)]
pub struct Softmax {
    force: Option<PathKind>,
    plan_only: bool,
}

impl Softmax {
    pub fn new() -> Self {
        Softmax::default()
    }

    /// Runs every call on `path` (an error where the shape does not fit it).
    pub fn forced(path: PathKind) -> Self {
        Softmax { force: Some(path), ..Softmax::default() }
    }

    /// Makes every call check its tensors and plan exactly as it would, then return the
    /// [`Plan`] without launching anything: tests and tools ask the planner which path a
    /// shape takes, or whether a forced path takes it (an [`Error::Unsupported`] where not),
    /// instead of restating its rules. It asks the driver about occupancy as a launch does,
    /// so it needs the GPU; the tensors' shapes and addresses count, never their values.
    ///
    /// [`Error::Unsupported`]: crate::Error::Unsupported
    pub fn plan_only(self) -> Self {
        Softmax { plan_only: true, ..self }
    }

    /// A call of `kind` over the rows of `x`.
    fn call<'a, T: Element>(
        &self,
        stream: &'a Stream,
        op: &'static str,
        kind: SoftmaxKind,
        x: &View<'_, T>,
    ) -> Result<RowCall<'a, SoftmaxArgs>> {
        let args = SoftmaxArgs { input: x.address(), ..SoftmaxArgs::default() };
        let kernels = LibraryKernels::Softmax { kind, dtype: T::DTYPE }.into();
        RowCall::new(stream, op, kernels, spec(kind, size_of::<T>() as u32), x, args, self.force, !self.plan_only)
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
        let mut call = self.call(stream, op, SoftmaxKind::Forward, &x)?;
        same_shape(op, "the output", y.shape(), x.shape())?;
        call.arrays.push((y.address(), size_of::<T>()));
        call.args.output = y.address();
        call.args.log = log as u32;
        input_and_output_disjoint(op, &x, &y)?;
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
        let mut call = self.call(stream, op, SoftmaxKind::Backward, &y)?;
        same_shape(op, "the output gradient", dy.shape(), y.shape())?;
        same_shape(op, "the input gradient", dx.shape(), y.shape())?;
        call.arrays.extend([(dy.address(), size_of::<T>()), (dx.address(), size_of::<T>())]);
        call.args.second = dy.address();
        call.args.output = dx.address();
        call.args.log = log as u32;
        let reads = [Span::of("the output", &y), Span::of("the output gradient", &dy)];
        check_disjoint(op, &reads, &[Span::of("the input gradient", &dx)], false)?;
        call.run()
    }

    /// `y = softmax(x * scale + mask)`; `mask` has the last dimension of `x` and a number
    /// of rows dividing its rows (e.g. `[seq_q, seq_k]` for `x` of `[batch, heads, seq_q,
    /// seq_k]`), broadcast over the rest. At most [`MASKED_MAX_ROWS`] rows (2^32 - 1).
    ///
    /// Where the mask's rows start at other offsets from 16 bytes than the input rows that
    /// read them (a broadcast mask at an odd width), rows too wide for a warp first get the
    /// mask tiled into stream-ordered scratch at the input's offset (up to an eighth of the
    /// input's bytes), so they run in whole 16-byte packs; nothing is allocated for the
    /// caller to keep, so the call can be captured in a graph.
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
        let mut call = self.call(stream, op, SoftmaxKind::ScaleMask, &x)?;
        same_shape(op, "the output", y.shape(), x.shape())?;
        let (rows, cols) = (call.rows, call.cols);
        if rows as u64 > MASKED_MAX_ROWS {
            invalid!(
                "`{op}`: the input has {rows} rows; it takes at most {MASKED_MAX_ROWS} (a row finds its mask row in 32 bits): split the rows over several calls"
            );
        }
        let (mask_rows, mask_cols) = rows_cols(op, mask.shape())?;
        if mask_cols != cols || rows % mask_rows != 0 {
            invalid!(
                "`{op}`: the mask has shape {:?}; it needs the input's last dimension ({cols}) and a row count dividing the input's {rows} rows",
                mask.shape()
            );
        }
        call.args.second = mask.address();
        call.args.output = y.address();
        call.args.period = Divisor::new(mask_rows as u64);
        call.args.scale = scale;
        let reads = [Span::of("the input", &x), Span::of("the mask", &mask)];
        check_disjoint(op, &reads, &[Span::of("the output", &y)], false)?;
        let size = size_of::<T>();
        let mask_bytes = mask_rows * cols * size;
        // Row `r` reads mask row `r % mask_rows`, which starts as far past 16 bytes as row
        // `r` does where the mask's rows repeat every whole 16 bytes of the input.
        let in_phase = (mask_rows == rows || mask_bytes.is_multiple_of(PACK_BYTES))
            && mask.address() % PACK_BYTES as u64 == x.address() % PACK_BYTES as u64;
        let tiles = mask_tiles(mask_bytes);
        let tiled_bytes = tiles * mask_bytes;
        if in_phase || cols <= call.warp_max_cols() || tiled_bytes > rows * cols * size / MASK_TILES_SHARE {
            call.arrays.extend([(mask.address(), size), (y.address(), size)]);
            // A mask whose rows do not keep the input rows' offset is read at rows other
            // than the one worked on.
            call.spec.runs_from_heads = in_phase;
            return call.run();
        }
        // Else the mask is tiled into scratch `tiles` times, starting as far past 16 bytes
        // as x, so that its rows keep the input rows' offset: the planner then sees arrays
        // in one phase, with x standing in for the tiles' address.
        call.arrays.extend([(x.address(), size), (y.address(), size)]);
        call.args.period = Divisor::new((mask_rows * tiles) as u64);
        let mut prepared = call.prepare()?;
        if !prepared.launches() {
            return Ok(prepared.plan);
        }
        if !prepared.plan.phased && prepared.plan.pack == 1 {
            // Element by element, any mask address will do.
            prepared.args.period = Divisor::new(mask_rows as u64);
            return prepared.launch();
        }
        Workspace::scoped(stream, (tiled_bytes + PACK_BYTES).div_ceil(size_of::<f32>()), |scratch| {
            let tiled = scratch + x.address() % PACK_BYTES as u64;
            // SAFETY: the mask holds `mask_bytes`; the scratch holds `tiled_bytes` from `tiled`.
            unsafe { tile(stream, mask.address(), mask_bytes, tiled, tiles) }?;
            prepared.args.second = tiled;
            prepared.launch()
        })
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
        let mut call = self.call(stream, op, SoftmaxKind::Causal, &x)?;
        same_shape(op, "the output", y.shape(), x.shape())?;
        let queries = match x.shape() {
            [.., q, _] => *q,
            _ => invalid!("`{op}` needs at least two dimensions (queries, keys); got {:?}", x.shape()),
        };
        call.arrays.push((y.address(), size_of::<T>()));
        call.args.output = y.address();
        call.args.period = Divisor::new(queries as u64);
        call.args.scale = scale;
        input_and_output_disjoint(op, &x, &y)?;
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
        let mut call = self.call(stream, op, SoftmaxKind::CrossEntropy, &logits)?;
        same_shape(op, "the target", target.shape(), &[call.rows])?;
        same_shape(op, "the loss", loss.shape(), &[call.rows])?;
        check_aligned(op, "the target", target.address(), 8)?;
        check_aligned(op, "the loss", loss.address(), 4)?;
        call.args.target = target.address();
        call.args.row_values = loss.address();
        let reads = [Span::of("the logits", &logits), Span::of("the target", &target)];
        check_disjoint(op, &reads, &[Span::of("the loss", &loss)], false)?;
        call.run()
    }

    /// `out[r] = ln(sum(e^x[r]))` over the last axis, in f32 (`torch.logsumexp(x, -1)`);
    /// `out` has the shape of `x` without its last axis. Reads each row once.
    pub fn logsumexp<T: Element>(
        &self,
        stream: &Stream,
        x: &impl AsView<T>,
        out: &mut impl AsViewMut<f32>,
    ) -> Result<Plan> {
        let (x, out) = (x.as_view(), out.as_view_mut());
        let op = "logsumexp";
        let mut call = self.call(stream, op, SoftmaxKind::LogSumExp, &x)?;
        same_shape(op, "the output", out.shape(), &x.shape()[..x.shape().len() - 1])?;
        check_aligned(op, "the output", out.address(), 4)?;
        call.args.row_values = out.address();
        input_and_output_disjoint(op, &x, &out)?;
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
        let mut call = self.call(stream, op, SoftmaxKind::CrossEntropyBackward, &logits)?;
        same_shape(op, "the target", target.shape(), &[call.rows])?;
        same_shape(op, "the loss gradient", dloss.shape(), &[call.rows])?;
        same_shape(op, "the logits gradient", dlogits.shape(), logits.shape())?;
        check_aligned(op, "the target", target.address(), 8)?;
        check_aligned(op, "the loss gradient", dloss.address(), 4)?;
        call.arrays.push((dlogits.address(), size_of::<T>()));
        call.args.target = target.address();
        call.args.row_values = dloss.address();
        call.args.output = dlogits.address();
        let reads =
            [Span::of("the logits", &logits), Span::of("the target", &target), Span::of("the loss gradient", &dloss)];
        check_disjoint(op, &reads, &[Span::of("the logits gradient", &dlogits)], false)?;
        call.run()
    }
}

/// The row engine's description of softmax `kind` over rows of `bytes`-byte elements. Every kind reads its
/// arrays at the row it works on, so rows may run from their heads (but the masked kind's
/// where its mask's rows keep another offset: [`Softmax::scale_mask`]).
pub(crate) fn spec(kind: SoftmaxKind, bytes: u32) -> RowSpec {
    let rows = |class| RowSpec { runs_from_heads: true, ..RowSpec::rows_of(class, bytes) };
    match kind {
        SoftmaxKind::Forward => rows(OpClass::Softmax),
        // y and dy cached; the cluster kernel holds packs of both in registers.
        SoftmaxKind::Backward => RowSpec {
            cache_bytes_per_col: 2 * bytes,
            cluster_held_packs: SOFTMAX_BACKWARD_HELD_PACKS as u32,
            ..rows(OpClass::SoftmaxBackward)
        },
        // x cached as it is, the mask added on every read of the cache (the f32 clusters
        // cache the sum, in as many bytes).
        SoftmaxKind::ScaleMask => {
            RowSpec { cache_transformed: true, cache_reads_memory: true, ..rows(OpClass::MaskedSoftmax) }
        }
        SoftmaxKind::Causal => rows(OpClass::CausalSoftmax),
        SoftmaxKind::CrossEntropy | SoftmaxKind::LogSumExp => {
            RowSpec { reads_once: true, ..rows(OpClass::RowStatistics) }
        }
        SoftmaxKind::CrossEntropyBackward => rows(OpClass::CrossEntropyBackward),
    }
}

/// Checks that an op's one output does not overlap its one input.
fn input_and_output_disjoint<T: Element, U: Element>(
    op: &str,
    input: &impl AsView<T>,
    output: &impl AsView<U>,
) -> Result<()> {
    check_disjoint(op, &[Span::of("the input", input)], &[Span::of("the output", output)], false)
}

/// The module's free functions: each runs its [`Softmax`] method with the dispatcher's choice.
macro_rules! with_default_choice {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),+) = $method:ident($($pass:expr),+);)+) => {$(
        $(#[$doc])*
        pub fn $name<T: Element>(stream: &Stream, $($arg: $ty),+) -> Result<Plan> {
            Softmax::new().$method(stream, $($pass),+)
        }
    )+};
}

with_default_choice! {
    /// `y = softmax(x)` over the last axis.
    ///
    /// ```no_run
    /// # fn main() -> rill::Result<()> {
    /// # let gpu = rill::Gpu::new(0)?;
    /// # let stream = gpu.stream()?;
    /// let x = rill::Tensor::<f32>::from_slice(&gpu, &vec![0.5; 4 * 1000], &[4, 1000])?;
    /// let mut y = rill::Tensor::<f32>::zeros(&gpu, &[4, 1000])?;
    /// rill::softmax::softmax(&stream, &x, &mut y)?;
    /// # Ok(())
    /// # }
    /// ```
    fn softmax(x: &impl AsView<T>, y: &mut impl AsViewMut<T>) = forward(x, y, false);

    /// `y = log_softmax(x)` over the last axis.
    ///
    /// ```no_run
    /// # fn main() -> rill::Result<()> {
    /// # let gpu = rill::Gpu::new(0)?;
    /// # let stream = gpu.stream()?;
    /// let x = rill::Tensor::<f32>::from_slice(&gpu, &vec![0.5; 4 * 1000], &[4, 1000])?;
    /// let mut y = rill::Tensor::<f32>::zeros(&gpu, &[4, 1000])?;
    /// rill::softmax::log_softmax(&stream, &x, &mut y)?;
    /// # Ok(())
    /// # }
    /// ```
    fn log_softmax(x: &impl AsView<T>, y: &mut impl AsViewMut<T>) = forward(x, y, true);

    /// `dx = (dy - sum(dy * y)) * y` from softmax's output `y`.
    ///
    /// ```no_run
    /// # fn main() -> rill::Result<()> {
    /// # let gpu = rill::Gpu::new(0)?;
    /// # let stream = gpu.stream()?;
    /// let y = rill::Tensor::<f32>::from_slice(&gpu, &vec![0.001; 4 * 1000], &[4, 1000])?;
    /// let dy = rill::Tensor::<f32>::from_slice(&gpu, &vec![1.0; 4 * 1000], &[4, 1000])?;
    /// let mut dx = rill::Tensor::<f32>::zeros(&gpu, &[4, 1000])?;
    /// rill::softmax::softmax_backward(&stream, &y, &dy, &mut dx)?;
    /// # Ok(())
    /// # }
    /// ```
    fn softmax_backward(y: &impl AsView<T>, dy: &impl AsView<T>, dx: &mut impl AsViewMut<T>)
        = backward(y, dy, dx, false);

    /// `dx = dy - exp(y) * sum(dy)` from log-softmax's output `y`.
    ///
    /// ```no_run
    /// # fn main() -> rill::Result<()> {
    /// # let gpu = rill::Gpu::new(0)?;
    /// # let stream = gpu.stream()?;
    /// let y = rill::Tensor::<f32>::from_slice(&gpu, &vec![-6.9; 4 * 1000], &[4, 1000])?;
    /// let dy = rill::Tensor::<f32>::from_slice(&gpu, &vec![1.0; 4 * 1000], &[4, 1000])?;
    /// let mut dx = rill::Tensor::<f32>::zeros(&gpu, &[4, 1000])?;
    /// rill::softmax::log_softmax_backward(&stream, &y, &dy, &mut dx)?;
    /// # Ok(())
    /// # }
    /// ```
    fn log_softmax_backward(y: &impl AsView<T>, dy: &impl AsView<T>, dx: &mut impl AsViewMut<T>)
        = backward(y, dy, dx, true);

    /// `y = softmax(x * scale + mask)`; see [`Softmax::scale_mask`].
    ///
    /// ```no_run
    /// # fn main() -> rill::Result<()> {
    /// # let gpu = rill::Gpu::new(0)?;
    /// # let stream = gpu.stream()?;
    /// // Scores of 2 batches x 8 heads x 128 queries, one mask of 128 x 128 for all.
    /// let x = rill::Tensor::<f32>::zeros(&gpu, &[2, 8, 128, 128])?;
    /// let mask = rill::Tensor::<f32>::zeros(&gpu, &[128, 128])?;
    /// let mut y = rill::Tensor::<f32>::zeros(&gpu, &[2, 8, 128, 128])?;
    /// rill::softmax::scaled_masked_softmax(&stream, &x, &mask, 0.125, &mut y)?;
    /// # Ok(())
    /// # }
    /// ```
    fn scaled_masked_softmax(x: &impl AsView<T>, mask: &impl AsView<T>, scale: f32, y: &mut impl AsViewMut<T>)
        = scale_mask(x, mask, scale, y);

    /// `y = softmax(x * scale)` under a causal mask; see [`Softmax::causal`].
    ///
    /// ```no_run
    /// # fn main() -> rill::Result<()> {
    /// # let gpu = rill::Gpu::new(0)?;
    /// # let stream = gpu.stream()?;
    /// let x = rill::Tensor::<f32>::zeros(&gpu, &[2, 8, 128, 128])?;
    /// let mut y = rill::Tensor::<f32>::zeros(&gpu, &[2, 8, 128, 128])?;
    /// rill::softmax::scaled_causal_softmax(&stream, &x, 0.125, &mut y)?;
    /// # Ok(())
    /// # }
    /// ```
    fn scaled_causal_softmax(x: &impl AsView<T>, scale: f32, y: &mut impl AsViewMut<T>) = causal(x, scale, y);

    /// Per-row cross entropy; see [`Softmax::cross_entropy`].
    ///
    /// ```no_run
    /// # fn main() -> rill::Result<()> {
    /// # let gpu = rill::Gpu::new(0)?;
    /// # let stream = gpu.stream()?;
    /// let logits = rill::Tensor::<f32>::zeros(&gpu, &[4, 32000])?;
    /// let target = rill::Tensor::<i64>::from_slice(&gpu, &[3, 17, -100, 31999], &[4])?;
    /// let mut loss = rill::Tensor::<f32>::zeros(&gpu, &[4])?;
    /// rill::softmax::cross_entropy(&stream, &logits, &target, &mut loss)?;
    /// # Ok(())
    /// # }
    /// ```
    fn cross_entropy(logits: &impl AsView<T>, target: &impl AsView<i64>, loss: &mut impl AsViewMut<f32>)
        = cross_entropy(logits, target, loss);

    /// `ln(sum(e^x))` over the last axis, in f32; see [`Softmax::logsumexp`].
    ///
    /// ```no_run
    /// # fn main() -> rill::Result<()> {
    /// # let gpu = rill::Gpu::new(0)?;
    /// # let stream = gpu.stream()?;
    /// let x = rill::Tensor::<f32>::zeros(&gpu, &[4, 1000])?;
    /// let mut out = rill::Tensor::<f32>::zeros(&gpu, &[4])?;
    /// rill::softmax::logsumexp(&stream, &x, &mut out)?;
    /// # Ok(())
    /// # }
    /// ```
    fn logsumexp(x: &impl AsView<T>, out: &mut impl AsViewMut<f32>) = logsumexp(x, out);

    /// Gradient of [`cross_entropy`]; see [`Softmax::cross_entropy_backward`].
    ///
    /// ```no_run
    /// # fn main() -> rill::Result<()> {
    /// # let gpu = rill::Gpu::new(0)?;
    /// # let stream = gpu.stream()?;
    /// let logits = rill::Tensor::<f32>::zeros(&gpu, &[4, 32000])?;
    /// let target = rill::Tensor::<i64>::from_slice(&gpu, &[3, 17, -100, 31999], &[4])?;
    /// let dloss = rill::Tensor::<f32>::from_slice(&gpu, &[0.25; 4], &[4])?;
    /// let mut dlogits = rill::Tensor::<f32>::zeros(&gpu, &[4, 32000])?;
    /// rill::softmax::cross_entropy_backward(&stream, &logits, &target, &dloss, &mut dlogits)?;
    /// # Ok(())
    /// # }
    /// ```
    fn cross_entropy_backward(
        logits: &impl AsView<T>,
        target: &impl AsView<i64>,
        dloss: &impl AsView<f32>,
        dlogits: &mut impl AsViewMut<T>
    ) = cross_entropy_backward(logits, target, dloss, dlogits);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::module::KernelKey;
    use crate::tensor::DType;
    use rill_kernels_gpu::table::RowPath;

    #[test]
    fn a_tiled_mask_spans_the_fewest_whole_16_bytes() {
        for bytes in [1, 2, 6, 8, 12, 16, 24, 48, 2 * 50257, 4 * 50257, 2 * 32001, 3 * 2 * 1025] {
            let tiles = mask_tiles(bytes);
            assert!(tiles.is_power_of_two() && (tiles * bytes).is_multiple_of(PACK_BYTES), "{bytes}: {tiles}");
            assert!(tiles == 1 || !(tiles / 2 * bytes).is_multiple_of(PACK_BYTES), "{bytes}: {tiles}");
        }
        assert_eq!((mask_tiles(2 * 50257), mask_tiles(4 * 50257), mask_tiles(2 * 4096)), (8, 4, 1));
    }

    #[test]
    fn every_kind_path_dtype_and_pack_has_a_kernel() {
        let paths = [RowPath::WARP.as_slice(), &[RowPath::Shared, RowPath::Uncached, RowPath::Cluster]].concat();
        for kind in SoftmaxKind::ALL {
            for (dtype, pack) in [(DType::F32, 4), (DType::F16, 8), (DType::BF16, 8)] {
                let key = |path, pack| KernelKey::Softmax { kind, path, dtype, pack };
                // Cross entropy and logsumexp read a single row array, which the block paths
                // always run from each row's head: those have no pack-1 kernels.
                let one_row = matches!(kind, SoftmaxKind::CrossEntropy | SoftmaxKind::LogSumExp);
                for &path in &paths {
                    let pack_one = !one_row || RowPath::WARP.contains(&path);
                    assert!(key(path, pack).symbol().is_some(), "{kind:?} {path:?}");
                    assert_eq!(key(path, 1).symbol().is_some(), pack_one, "{kind:?} {path:?} at pack 1");
                }
                // Rows run from their heads: the block paths at the widest pack only.
                for path in [RowPath::SharedPhased, RowPath::UncachedPhased, RowPath::ClusterPhased] {
                    assert!(key(path, pack).symbol().is_some() && key(path, 1).symbol().is_none(), "{kind:?} {path:?}");
                }
            }
        }
        let odd_pack =
            KernelKey::Softmax { kind: SoftmaxKind::Forward, path: RowPath::Warp8, dtype: DType::F32, pack: 2 };
        assert!(odd_pack.symbol().is_none());
    }
}
