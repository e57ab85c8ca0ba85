//! BatchNorm over the channel axis, training and eval, with ReLU or Add + ReLU fused, a
//! 1-bit ReLU mask for the backward, and the standalone mask ReLU ops.
//!
//! ```no_run
//! use rill::batch_norm::{Forward, Layout, Options};
//! # fn demo(stream: &rill::Stream, x: &rill::Tensor<half::f16>, y: &mut rill::Tensor<half::f16>,
//! #         mask: &mut rill::Tensor<u32>, mean: &mut rill::Tensor<f32>, invstd: &mut rill::Tensor<f32>)
//! #         -> rill::Result<()> {
//! // relu(bn(x)) over NCHW x, keeping the mask and the saved statistics for the backward.
//! let call = Forward::new(x, y, Layout::ChannelsFirst).relu(Some(mask)).save(mean, invstd);
//! rill::batch_norm::forward(stream, Options::training(), call)?;
//! # Ok(()) }
//! ```
//!
//! Every tensor is contiguous (any start offset): `(N, C, L...)` channels-first (NCHW, and
//! `(N, C)` BatchNorm1d), or `(N, L..., C)` channels-last (NHWC). Inputs are f32, f16 or
//! bf16; statistics, weight and bias are f32. A training call runs three kernels: each
//! channel's sums in parts (rows of `L` per `(n, c)` for channels-first, column sums for
//! channels-last), a block per channel adding the parts in a fixed order (no atomics: the same
//! bits every run) and updating the running statistics, then one pass over the tensor that
//! normalizes, applies the activation and writes the mask (`vote.sync.ballot`). The mask
//! holds bit `i % 32` of word `i / 32` for element `i` in memory order (OneFlow's layout).

use crate::error::{Result, invalid};
use crate::launch::{LaunchConfig, grid_stride_blocks, launch};
use crate::module::KernelKey;
use crate::ops::columns::chunks_filling;
use crate::tensor::{AsView, AsViewMut, DType, Element, View, ViewMut};
use crate::workspace::Workspace;
use crate::{DeviceInfo, Stream};
use rill_kernels_gpu::abi::{
    BATCH_NORM_BLOCK_SIZE, BATCH_NORM_COEFFICIENTS, BatchNormArgs, COLUMN_SUM_WARPS, PACK_BYTES, max_pack,
};
use rill_kernels_gpu::layout::{column_sum_shared_bytes, column_sum_tile_cols};
use rill_kernels_gpu::table::BatchNormKernelKind as Kind;

/// Where the channel axis is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `(N, C, L...)`: NCHW, NCL, and `(N, C)`.
    ChannelsFirst,
    /// `(N, L..., C)`: NHWC and the like.
    ChannelsLast,
}

/// The activation fused after the normalize.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    None,
    Relu,
    /// `relu(bn(x) + addend)`.
    AddRelu,
}

/// The scalar options, as PyTorch's `batch_norm`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Options {
    /// Batch statistics (and the running statistics updated) or the running statistics.
    pub training: bool,
    /// The batch's weight in the running statistics; `None` for a cumulative average (the
    /// weight `1 / batches`, counting this one).
    pub momentum: Option<f32>,
    pub eps: f32,
}

impl Options {
    /// PyTorch's defaults in training: momentum 0.1, eps 1e-5.
    pub fn training() -> Self {
        Options { training: true, momentum: Some(0.1), eps: 1e-5 }
    }

    /// PyTorch's defaults in eval.
    pub fn eval() -> Self {
        Options { training: false, ..Options::training() }
    }
}

/// `(outer, channels, inner)` of a tensor of `shape` in `layout`.
fn extent(shape: &[usize], layout: Layout) -> Result<(usize, usize, usize)> {
    if shape.len() < 2 {
        invalid!("BatchNorm needs at least 2 dimensions (N, C, ...), got shape {shape:?}");
    }
    let product = |dims: &[usize]| dims.iter().product::<usize>();
    Ok(match layout {
        Layout::ChannelsFirst => (shape[0], shape[1], product(&shape[2..])),
        Layout::ChannelsLast => (product(&shape[..shape.len() - 1]), shape[shape.len() - 1], 1),
    })
}

/// Words of the mask of `len` elements.
pub fn mask_words(len: usize) -> usize {
    len.div_ceil(32)
}

/// Training's check of the values per channel (`values`), as PyTorch's: exactly one has no
/// variance to normalize by, while none (an empty batch) is an empty result.
fn check_values_per_channel(values: usize, shape: &[usize]) -> Result<()> {
    if values == 1 {
        invalid!("expected more than 1 value per channel when training, got input shape {shape:?}");
    }
    Ok(())
}

fn check_len(what: &str, len: usize, expected: usize, fix: &str) -> Result<()> {
    if len != expected {
        invalid!("{what} has {len} elements, expected {expected} ({fix})");
    }
    Ok(())
}

/// The statistics to update in training: `var` is the unbiased variance, as PyTorch keeps
/// it; `batches` counts the calls (PyTorch's `num_batches_tracked`), and is incremented.
pub struct Running<'a> {
    mean: ViewMut<'a, f32>,
    var: ViewMut<'a, f32>,
    batches: &'a mut u64,
}

/// A forward call: `y = act(bn(x) [+ addend])`. Built with [`Forward::new`] and the
/// optional parts below, in any order.
pub struct Forward<'a, T: Element> {
    x: View<'a, T>,
    y: ViewMut<'a, T>,
    layout: Layout,
    weight: Option<View<'a, f32>>,
    bias: Option<View<'a, f32>>,
    running: Option<Running<'a>>,
    save: Option<(ViewMut<'a, f32>, ViewMut<'a, f32>)>,
    activation: Activation,
    addend: Option<View<'a, T>>,
    mask: Option<ViewMut<'a, u32>>,
}

impl<'a, T: Element> Forward<'a, T> {
    pub fn new(x: &'a impl AsView<T>, y: &'a mut impl AsViewMut<T>, layout: Layout) -> Self {
        Forward {
            x: x.as_view(),
            y: y.as_view_mut(),
            layout,
            weight: None,
            bias: None,
            running: None,
            save: None,
            activation: Activation::None,
            addend: None,
            mask: None,
        }
    }

    /// The per-channel scale (f32, `C` elements).
    pub fn weight(self, weight: &'a impl AsView<f32>) -> Self {
        Forward { weight: Some(weight.as_view()), ..self }
    }

    /// The per-channel shift (f32, `C` elements).
    pub fn bias(self, bias: &'a impl AsView<f32>) -> Self {
        Forward { bias: Some(bias.as_view()), ..self }
    }

    /// The running statistics: read in eval, updated in training.
    pub fn running(
        self,
        mean: &'a mut impl AsViewMut<f32>,
        var: &'a mut impl AsViewMut<f32>,
        batches: &'a mut u64,
    ) -> Self {
        Forward { running: Some(Running { mean: mean.as_view_mut(), var: var.as_view_mut(), batches }), ..self }
    }

    /// Where training writes the batch mean and `1 / sqrt(var + eps)` per channel, as the
    /// backward takes them.
    pub fn save(self, mean: &'a mut impl AsViewMut<f32>, invstd: &'a mut impl AsViewMut<f32>) -> Self {
        Forward { save: Some((mean.as_view_mut(), invstd.as_view_mut())), ..self }
    }

    /// ReLU after the normalize, writing its mask where given (`mask_words(len)` words).
    pub fn relu(self, mask: Option<&'a mut impl AsViewMut<u32>>) -> Self {
        Forward { activation: Activation::Relu, mask: mask.map(|m| m.as_view_mut()), ..self }
    }

    /// `relu(bn(x) + addend)`, the addend of x's shape, writing the mask where given.
    pub fn add_relu(self, addend: &'a impl AsView<T>, mask: Option<&'a mut impl AsViewMut<u32>>) -> Self {
        Forward {
            activation: Activation::AddRelu,
            addend: Some(addend.as_view()),
            mask: mask.map(|m| m.as_view_mut()),
            ..self
        }
    }
}

/// A backward call: `dx` (and `d(addend)` for Add + ReLU) from `dy`, `x`, the saved
/// statistics and, after a ReLU, the forward's mask; `dweight` and `dbias` where asked.
pub struct Backward<'a, T: Element> {
    dy: View<'a, T>,
    x: View<'a, T>,
    dx: ViewMut<'a, T>,
    layout: Layout,
    saved: (View<'a, f32>, View<'a, f32>),
    weight: Option<View<'a, f32>>,
    activation: Activation,
    mask: Option<View<'a, u32>>,
    daddend: Option<ViewMut<'a, T>>,
    dweight: Option<ViewMut<'a, f32>>,
    dbias: Option<ViewMut<'a, f32>>,
}

impl<'a, T: Element> Backward<'a, T> {
    /// `mean` and `invstd` as the training forward saved them.
    pub fn new(
        dy: &'a impl AsView<T>,
        x: &'a impl AsView<T>,
        dx: &'a mut impl AsViewMut<T>,
        layout: Layout,
        (mean, invstd): (&'a impl AsView<f32>, &'a impl AsView<f32>),
    ) -> Self {
        Backward {
            dy: dy.as_view(),
            x: x.as_view(),
            dx: dx.as_view_mut(),
            layout,
            saved: (mean.as_view(), invstd.as_view()),
            weight: None,
            activation: Activation::None,
            mask: None,
            daddend: None,
            dweight: None,
            dbias: None,
        }
    }

    pub fn weight(self, weight: &'a impl AsView<f32>) -> Self {
        Backward { weight: Some(weight.as_view()), ..self }
    }

    /// The forward had a ReLU: its mask.
    pub fn relu(self, mask: &'a impl AsView<u32>) -> Self {
        Backward { activation: Activation::Relu, mask: Some(mask.as_view()), ..self }
    }

    /// The forward was Add + ReLU: its mask, and where `d(addend)` goes.
    pub fn add_relu(self, mask: &'a impl AsView<u32>, daddend: &'a mut impl AsViewMut<T>) -> Self {
        Backward {
            activation: Activation::AddRelu,
            mask: Some(mask.as_view()),
            daddend: Some(daddend.as_view_mut()),
            ..self
        }
    }

    pub fn dweight(self, dweight: &'a mut impl AsViewMut<f32>) -> Self {
        Backward { dweight: Some(dweight.as_view_mut()), ..self }
    }

    pub fn dbias(self, dbias: &'a mut impl AsViewMut<f32>) -> Self {
        Backward { dbias: Some(dbias.as_view_mut()), ..self }
    }
}

/// The pack every address allows: the dtype's widest where all are 16-byte aligned.
fn pack_for<T: Element>(addresses: &[u64]) -> usize {
    let widest = max_pack(T::DTYPE.size(), T::DTYPE.size());
    if addresses.iter().all(|&a| a % PACK_BYTES as u64 == 0) { widest } else { 1 }
}

fn kernel(stream: &Stream, kind: Kind, dtype: DType, pack: usize) -> Result<crate::module::Kernel> {
    stream.gpu().modules().kernel(KernelKey::BatchNorm { kind, dtype, pack })
}

fn address<T: Element>(view: &Option<impl AsView<T>>) -> u64 {
    view.as_ref().map_or(0, |v| v.as_view().address())
}

/// Threads a finalize block may have (CUDA's most).
const FINALIZE_MOST_THREADS: u64 = 1024;

/// The apply pass: a warp a chunk of 32 packs at a time, grid-strided.
///
/// # Safety
/// `args` must name arrays valid for the kernel's pass over `len` elements at `pack`.
unsafe fn apply(stream: &Stream, kind: Kind, dtype: DType, pack: usize, args: &BatchNormArgs) -> Result<()> {
    let len = args.outer * args.channels * args.inner;
    let chunks = len.div_ceil(32 * pack as u64);
    let kernel = kernel(stream, kind, dtype, pack)?;
    let device = stream.gpu().info();
    let needed = grid_stride_blocks(chunks * 32, BATCH_NORM_BLOCK_SIZE, device);
    // The normalizing passes: one resident wave at most (the occupancy API), so that each
    // warp has chunks enough to keep its pass's chunks in flight at the registers they cost.
    // The standalone ReLU passes (few registers) keep many short waves.
    let grid = if args.coefficients == 0 {
        needed
    } else {
        let resident = kernel.resident_blocks(BATCH_NORM_BLOCK_SIZE, 0, device)?;
        if args.inner == 1 { channel_rows_grid(needed, resident, args.channels, pack) } else { needed.min(resident) }
    };
    let config = LaunchConfig { grid, block: BATCH_NORM_BLOCK_SIZE, shared_bytes: 0, cluster: 1 };
    // SAFETY: forwarded.
    unsafe { launch(stream, kernel, config, args) }
}

/// The channels-last apply grid: at most one resident wave, its stride (`pack` elements a
/// thread) a whole number of rows of `channels`, so that a thread's channels never change
/// and it loads their coefficients once. `needed` (a chunk a warp at most) where that is no
/// more, or where no such grid fits a wave.
fn channel_rows_grid(needed: u32, resident: u32, channels: u64, pack: usize) -> u32 {
    let block_elements = BATCH_NORM_BLOCK_SIZE as u64 * pack as u64;
    let multiple = channels / gcd(channels, block_elements);
    let grid = resident as u64 / multiple * multiple;
    if grid == 0 || grid >= needed as u64 { needed } else { grid as u32 }
}

/// Euclid's greatest common divisor (five lines: not worth a dependency).
fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The finalize kernels' launch: a block per channel, grid-strided, with two f32 a warp of
/// scratch for the block's sums. A block has a thread for about four of a channel's `parts`
/// (one batch of loads in flight), in whole warps, from one where there are few parts and
/// many channels (2048 channels of 66 parts) to a CUDA block's most (64 channels of 2112).
fn finalize_launch(channels: u64, parts: u64, device: &DeviceInfo) -> LaunchConfig {
    let block = (parts.div_ceil(4).next_multiple_of(32)).clamp(32, FINALIZE_MOST_THREADS) as u32;
    LaunchConfig {
        grid: grid_stride_blocks(channels * block as u64, block, device),
        block,
        shared_bytes: 2 * (block / 32) * 4,
        cluster: 1,
    }
}

/// The sums kernel then the finalize kernel, with a stream-ordered workspace for the parts
/// and the coefficients; then `then(args)` with the coefficients in place.
///
/// # Safety
/// `args` must name arrays valid for the kernels, of `dtype`, their addresses aligned to
/// `pack`.
unsafe fn sums_then(
    stream: &Stream,
    (sums, finalize): (Kind, Kind),
    dtype: DType,
    pack: usize,
    mut args: BatchNormArgs,
    then: impl FnOnce(&BatchNormArgs) -> Result<()>,
) -> Result<()> {
    let device = stream.gpu().info();
    let channels = args.channels as usize;
    // Channels-last rows start at multiples of the channels: packs only where those are
    // whole packs.
    let pack = if args.inner == 1 && !channels.is_multiple_of(pack) { 1 } else { pack };
    let sums_kernel = kernel(stream, sums, dtype, pack)?;
    let sums_config = if args.inner > 1 {
        // Parts of whole iterations (four packs a lane), and warps enough for one resident
        // wave of the sums kernel.
        let rows = (args.outer * args.channels) as usize;
        let resident = sums_kernel.resident_blocks(BATCH_NORM_BLOCK_SIZE, 0, device)?;
        let warps_wanted = resident as usize * BATCH_NORM_BLOCK_SIZE as usize / 32;
        let iteration = 32 * 4 * pack;
        let most_parts = (args.inner as usize).div_ceil(iteration);
        let row_parts = warps_wanted.div_ceil(rows).clamp(1, most_parts.max(1));
        let part_len = (args.inner as usize).div_ceil(row_parts).next_multiple_of(iteration);
        args.row_parts = (args.inner as usize).div_ceil(part_len) as u64;
        args.part_len = part_len as u64;
        args.parts = args.outer * args.row_parts;
        args.groups = 1;
        let warps = rows as u64 * args.row_parts;
        LaunchConfig {
            grid: (warps * 32).div_ceil(BATCH_NORM_BLOCK_SIZE as u64) as u32,
            block: BATCH_NORM_BLOCK_SIZE,
            shared_bytes: 0,
            cluster: 1,
        }
    } else {
        // Few channels: rows of the summed view hold several rows of channels, so that every
        // lane of a tile has a column.
        let tile = column_sum_tile_cols(pack);
        args.groups = if channels < tile && tile.is_multiple_of(channels) { (tile / channels) as u64 } else { 1 };
        let width = channels * args.groups as usize;
        let tiles = width.div_ceil(tile) as u32;
        // One resident wave of blocks, each summing every `chunks`-th row: few parts for the
        // finalize to add, and reads that sweep x in order.
        let (block, shared_bytes) = (COLUMN_SUM_WARPS * 32, column_sum_shared_bytes(pack));
        let resident = sums_kernel.resident_blocks(block, shared_bytes, device)?;
        let rows = args.outer.div_ceil(args.groups) as usize;
        let (_, chunks) = chunks_filling(rows, tiles as u64, resident as u64);
        args.part_len = 0;
        args.parts = chunks;
        LaunchConfig { grid: tiles * chunks as u32, block, shared_bytes, cluster: 1 }
    };
    let floats = 2 * (args.parts * args.groups) as usize * channels + BATCH_NORM_COEFFICIENTS * channels;
    let finalize_config = finalize_launch(args.channels, args.parts * args.groups, device);
    // SAFETY: the sums write every part the finalize reads, and the finalize every
    // coefficient the apply pass reads, in stream order.
    Workspace::scoped(stream, floats, |workspace| {
        args.partial = workspace;
        args.coefficients = args.partial + (size_of::<f32>() as u64) * 2 * args.parts * args.groups * args.channels;
        // SAFETY: the caller's promise; the workspace holds the parts and the coefficients.
        unsafe {
            launch(stream, sums_kernel, sums_config, &args)
                .and_then(|()| launch(stream, kernel(stream, finalize, dtype, 1)?, finalize_config, &args))
                .and_then(|()| then(&args))
        }
    })
}

/// Runs the forward. Training needs more than one value per channel, or none (an empty
/// batch: nothing to write, and the running statistics stay); eval needs the running
/// statistics.
///
/// ```no_run
/// # use rill::Tensor;
/// # use rill::batch_norm::{self, Forward, Layout, Options};
/// # fn main() -> rill::Result<()> {
/// # let gpu = rill::Gpu::new(0)?;
/// # let stream = gpu.stream()?;
/// // relu(bn(x)) in training over NCHW x, keeping the mask for the backward:
/// let (n, c, hw) = (8, 16, 49);
/// let x = Tensor::<f32>::from_slice(&gpu, &vec![0.5; n * c * hw], &[n, c, hw])?;
/// let mut y = Tensor::<f32>::zeros(&gpu, &[n, c, hw])?;
/// let mut mask = Tensor::<u32>::zeros(&gpu, &[batch_norm::mask_words(n * c * hw)])?;
/// let (mut mean, mut invstd) = (Tensor::<f32>::zeros(&gpu, &[c])?, Tensor::<f32>::zeros(&gpu, &[c])?);
/// let call = Forward::new(&x, &mut y, Layout::ChannelsFirst).save(&mut mean, &mut invstd).relu(Some(&mut mask));
/// batch_norm::forward(&stream, Options::training(), call)?;
/// # Ok(())
/// # }
/// ```
pub fn forward<T: Element>(stream: &Stream, options: Options, call: Forward<'_, T>) -> Result<()> {
    let Forward { x, y, layout, weight, bias, mut running, save, activation, addend, mut mask } = call;
    let (outer, channels, inner) = extent(x.shape(), layout)?;
    if y.shape() != x.shape() {
        invalid!("y has shape {:?}, x {:?}: give y x's shape", y.shape(), x.shape());
    }
    if let Some(addend) = &addend
        && addend.shape() != x.shape()
    {
        invalid!("the addend has shape {:?}, x {:?}: give it x's shape", addend.shape(), x.shape());
    }
    for (what, v) in [("weight", &weight), ("bias", &bias)] {
        if let Some(v) = v {
            check_len(what, v.len(), channels, "one f32 per channel")?;
        }
    }
    if let Some(r) = &running {
        check_len("running_mean", r.mean.len(), channels, "one f32 per channel")?;
        check_len("running_var", r.var.len(), channels, "one f32 per channel")?;
    }
    if let Some((m, s)) = &save {
        check_len("the saved mean", m.len(), channels, "one f32 per channel")?;
        check_len("the saved invstd", s.len(), channels, "one f32 per channel")?;
    }
    if let Some(m) = &mask {
        check_len("the mask", m.len(), mask_words(x.len()), "one bit per element of x, in u32 words")?;
    }
    if options.training {
        check_values_per_channel(outer * inner, x.shape())?;
    }
    if !options.training && running.is_none() {
        invalid!("eval mode reads the running statistics: give them with .running()");
    }
    // An empty batch still counts (PyTorch's module adds to `num_batches_tracked` before
    // `batch_norm`, which returns at once), but updates no statistic: nothing to launch.
    let momentum = match (&mut running, options.momentum) {
        (Some(r), momentum) if options.training => {
            *r.batches += 1;
            momentum.unwrap_or(1.0 / *r.batches as f32)
        }
        _ => 0.0,
    };
    if x.is_empty() {
        return Ok(());
    }
    let pack = pack_for::<T>(&[x.address(), y.address(), addend.as_ref().map_or(0, |a| a.address())]);
    let args = BatchNormArgs {
        outer: outer as u64,
        channels: channels as u64,
        inner: inner as u64,
        x: x.address(),
        second: addend.as_ref().map_or(0, |a| a.address()),
        output: y.address(),
        mask: mask.as_mut().map_or(0, |m| m.address()),
        weight: address(&weight),
        bias: address(&bias),
        running_mean: running.as_ref().map_or(0, |r| r.mean.address()),
        running_var: running.as_ref().map_or(0, |r| r.var.address()),
        save_mean: save.as_ref().map_or(0, |s| s.0.address()),
        save_invstd: save.as_ref().map_or(0, |s| s.1.address()),
        eps: options.eps,
        momentum,
        ..BatchNormArgs::default()
    };
    let kind = match activation {
        Activation::None => Kind::Forward,
        Activation::Relu => Kind::ForwardRelu,
        Activation::AddRelu => Kind::ForwardAddRelu,
    };
    let dtype = T::DTYPE;
    let run_apply = |args: &BatchNormArgs| {
        let args = BatchNormArgs { x: x.address(), ..*args };
        // SAFETY: every array was checked against x's shape, the mask's words and the
        // per-channel lengths; the coefficients are in the workspace.
        unsafe { apply(stream, kind, dtype, pack, &args) }
    };
    if options.training {
        // SAFETY: as above; every address is aligned to `pack`.
        unsafe { sums_then(stream, (Kind::Stats, Kind::FinalizeForward), dtype, pack, args, run_apply) }
    } else {
        let mut args = args;
        // The finalize reads the running statistics where there are no parts.
        let config = finalize_launch(channels as u64, 0, stream.gpu().info());
        Workspace::scoped(stream, BATCH_NORM_COEFFICIENTS * channels, |coefficients| {
            args.coefficients = coefficients;
            // SAFETY: as above.
            unsafe { launch(stream, kernel(stream, Kind::FinalizeForward, dtype, 1)?, config, &args) }
                .and_then(|()| run_apply(&args))
        })
    }
}

/// Runs the backward of a training forward.
///
/// ```no_run
/// # use rill::Tensor;
/// # use rill::batch_norm::{self, Backward, Layout};
/// # fn main() -> rill::Result<()> {
/// # let gpu = rill::Gpu::new(0)?;
/// # let stream = gpu.stream()?;
/// let (n, c, hw) = (8, 16, 49);
/// let (x, dy) = (Tensor::<f32>::zeros(&gpu, &[n, c, hw])?, Tensor::<f32>::zeros(&gpu, &[n, c, hw])?);
/// let mut dx = Tensor::<f32>::zeros(&gpu, &[n, c, hw])?;
/// // The forward's saved statistics and mask:
/// let (mean, invstd) = (Tensor::<f32>::zeros(&gpu, &[c])?, Tensor::<f32>::zeros(&gpu, &[c])?);
/// let mask = Tensor::<u32>::zeros(&gpu, &[batch_norm::mask_words(n * c * hw)])?;
/// let (mut dw, mut db) = (Tensor::<f32>::zeros(&gpu, &[c])?, Tensor::<f32>::zeros(&gpu, &[c])?);
/// let w = Tensor::<f32>::from_slice(&gpu, &vec![1.0; c], &[c])?;
/// let call = Backward::new(&dy, &x, &mut dx, Layout::ChannelsFirst, (&mean, &invstd)).weight(&w);
/// batch_norm::backward(&stream, call.relu(&mask).dweight(&mut dw).dbias(&mut db))?;
/// # Ok(())
/// # }
/// ```
pub fn backward<T: Element>(stream: &Stream, call: Backward<'_, T>) -> Result<()> {
    let Backward { dy, x, dx, layout, saved, weight, activation, mask, mut daddend, mut dweight, mut dbias } = call;
    let (outer, channels, inner) = extent(x.shape(), layout)?;
    for (what, shape) in [("dy", dy.shape()), ("dx", dx.shape())] {
        if shape != x.shape() {
            invalid!("{what} has shape {shape:?}, x {:?}: give it x's shape", x.shape());
        }
    }
    if let Some(d) = &daddend
        && d.shape() != x.shape()
    {
        invalid!("d(addend) has shape {:?}, x {:?}: give it x's shape", d.shape(), x.shape());
    }
    check_len("the saved mean", saved.0.len(), channels, "one f32 per channel")?;
    check_len("the saved invstd", saved.1.len(), channels, "one f32 per channel")?;
    for (what, len) in [
        ("weight", weight.as_ref().map(|w| w.len())),
        ("dweight", dweight.as_ref().map(|w| w.len())),
        ("dbias", dbias.as_ref().map(|w| w.len())),
    ] {
        if let Some(len) = len {
            check_len(what, len, channels, "one f32 per channel")?;
        }
    }
    if let Some(m) = &mask {
        check_len("the mask", m.len(), mask_words(x.len()), "the forward's mask of x")?;
    }
    if x.is_empty() {
        return Ok(());
    }
    let pack = pack_for::<T>(&[dy.address(), x.address(), dx.address(), daddend.as_mut().map_or(0, |d| d.address())]);
    let args = BatchNormArgs {
        outer: outer as u64,
        channels: channels as u64,
        inner: inner as u64,
        x: x.address(),
        second: dy.address(),
        output: dx.address(),
        second_output: daddend.as_mut().map_or(0, |d| d.address()),
        mask: mask.as_ref().map_or(0, |m| m.address()),
        weight: address(&weight),
        save_mean: saved.0.address(),
        save_invstd: saved.1.address(),
        dweight: dweight.as_mut().map_or(0, |d| d.address()),
        dbias: dbias.as_mut().map_or(0, |d| d.address()),
        ..BatchNormArgs::default()
    };
    let kind = match activation {
        Activation::None => Kind::Backward,
        Activation::Relu => Kind::BackwardRelu,
        Activation::AddRelu => Kind::BackwardAddRelu,
    };
    let dtype = T::DTYPE;
    // SAFETY: every array was checked against x's shape, the mask's words and the
    // per-channel lengths; every address is aligned to `pack`.
    unsafe {
        sums_then(stream, (Kind::GradSums, Kind::FinalizeBackward), dtype, pack, args, |args| {
            apply(stream, kind, dtype, pack, args)
        })
    }
}

/// `y = relu(x)` and its mask (`mask_words(len)` u32 words), for any shape.
///
/// ```no_run
/// # use rill::{Tensor, batch_norm};
/// # fn main() -> rill::Result<()> {
/// # let gpu = rill::Gpu::new(0)?;
/// # let stream = gpu.stream()?;
/// let x = Tensor::<f32>::from_slice(&gpu, &[-1.0, 2.0, 0.5], &[3])?;
/// let mut y = Tensor::<f32>::zeros(&gpu, &[3])?;
/// let mut mask = Tensor::<u32>::zeros(&gpu, &[batch_norm::mask_words(3)])?;
/// batch_norm::relu_with_mask(&stream, &x, &mut y, &mut mask)?;
/// # Ok(())
/// # }
/// ```
pub fn relu_with_mask<T: Element>(
    stream: &Stream,
    x: &impl AsView<T>,
    y: &mut impl AsViewMut<T>,
    mask: &mut impl AsViewMut<u32>,
) -> Result<()> {
    let (x, y, mask) = (x.as_view(), y.as_view_mut(), mask.as_view_mut());
    flat::<T>(
        stream,
        Kind::ReluWithMask,
        [x.address(), 0, y.address()],
        (x.len(), y.len()),
        Some((mask.address(), mask.len())),
    )
}

/// `dx = dy` where the mask's bit is set, else 0.
///
/// ```no_run
/// # use rill::{Tensor, batch_norm};
/// # fn main() -> rill::Result<()> {
/// # let gpu = rill::Gpu::new(0)?;
/// # let stream = gpu.stream()?;
/// let dy = Tensor::<f32>::from_slice(&gpu, &[1.0, 1.0, 1.0], &[3])?;
/// let mask = Tensor::<u32>::from_slice(&gpu, &[0b110], &[batch_norm::mask_words(3)])?;
/// let mut dx = Tensor::<f32>::zeros(&gpu, &[3])?;
/// batch_norm::relu_backward_from_mask(&stream, &dy, &mask, &mut dx)?;
/// # Ok(())
/// # }
/// ```
pub fn relu_backward_from_mask<T: Element>(
    stream: &Stream,
    dy: &impl AsView<T>,
    mask: &impl AsView<u32>,
    dx: &mut impl AsViewMut<T>,
) -> Result<()> {
    let (dy, mask, dx) = (dy.as_view(), mask.as_view(), dx.as_view_mut());
    flat::<T>(
        stream,
        Kind::ReluBackwardFromMask,
        [0, dy.address(), dx.address()],
        (dy.len(), dx.len()),
        Some((mask.address(), mask.len())),
    )
}

/// `dx = 0` where `y <= 0`, else `dy` (so dy passes at a NaN y, as PyTorch's
/// `threshold_backward`): the ReLU backward the mask replaces.
///
/// ```no_run
/// # use rill::{Tensor, batch_norm};
/// # fn main() -> rill::Result<()> {
/// # let gpu = rill::Gpu::new(0)?;
/// # let stream = gpu.stream()?;
/// let dy = Tensor::<f32>::from_slice(&gpu, &[1.0, 1.0, 1.0], &[3])?;
/// let y = Tensor::<f32>::from_slice(&gpu, &[0.0, 2.0, 0.5], &[3])?;
/// let mut dx = Tensor::<f32>::zeros(&gpu, &[3])?;
/// batch_norm::relu_backward(&stream, &dy, &y, &mut dx)?;
/// # Ok(())
/// # }
/// ```
pub fn relu_backward<T: Element>(
    stream: &Stream,
    dy: &impl AsView<T>,
    y: &impl AsView<T>,
    dx: &mut impl AsViewMut<T>,
) -> Result<()> {
    let (dy, y, dx) = (dy.as_view(), y.as_view(), dx.as_view_mut());
    if y.len() != dy.len() {
        invalid!("y has {} elements, dy {}: give them the same length", y.len(), dy.len());
    }
    flat::<T>(stream, Kind::ReluBackward, [y.address(), dy.address(), dx.address()], (dy.len(), dx.len()), None)
}

/// An apply pass without coefficients over `len` elements: `[x, second, output]`, the mask
/// as `(address, words)`.
fn flat<T: Element>(
    stream: &Stream,
    kind: Kind,
    [x, second, output]: [u64; 3],
    (len, output_len): (usize, usize),
    mask: Option<(u64, usize)>,
) -> Result<()> {
    if output_len != len {
        invalid!("the output has {output_len} elements, the input {len}: give them the same length");
    }
    if let Some((_, words)) = mask {
        check_len("the mask", words, mask_words(len), "one bit per element, in u32 words")?;
    }
    if len == 0 {
        return Ok(());
    }
    let pack = pack_for::<T>(&[x, second, output]);
    let args = BatchNormArgs {
        outer: len as u64,
        channels: 1,
        inner: 1,
        x,
        second,
        output,
        mask: mask.map_or(0, |(address, _)| address),
        ..BatchNormArgs::default()
    };
    // SAFETY: the arrays hold `len` elements and the mask its words (checked above).
    unsafe { apply(stream, kind, T::DTYPE, pack, &args) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_rejects_one_value_per_channel_and_takes_an_empty_batch() {
        assert!(matches!(check_values_per_channel(1, &[1, 3]), Err(crate::Error::InvalidInput(_))));
        for values in [0, 2, 10] {
            assert!(check_values_per_channel(values, &[values, 3]).is_ok(), "{values} values per channel");
        }
        // N = 0 with spatial dimensions, in either layout.
        for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
            let (outer, _, inner) = extent(&[0, 3, 5], layout).expect("3 dimensions");
            assert!(check_values_per_channel(outer * inner, &[0, 3, 5]).is_ok(), "{layout:?}");
        }
    }

    #[test]
    fn channels_last_grids_stride_whole_rows_of_channels_within_a_wave() {
        let resident = 132 * 3;
        for (channels, pack) in [(64, 8), (2048, 8), (512, 8), (256, 8), (3, 1), (17, 1), (96, 4), (1000, 8)] {
            let needed = 33792;
            let grid = channel_rows_grid(needed, resident, channels, pack);
            let stride = grid as u64 * BATCH_NORM_BLOCK_SIZE as u64 * pack as u64;
            assert!(grid <= resident, "{channels}: {grid} blocks past a wave");
            assert_eq!(stride % channels, 0, "{channels} channels, {grid} blocks");
        }
        // A chunk a warp at most: the grid the tensor needs.
        assert_eq!(channel_rows_grid(40, resident, 64, 8), 40);
        // No whole number of rows fits a wave: the grid the tensor needs.
        assert_eq!(channel_rows_grid(33792, 396, 100_003, 1), 33792);
    }
}
