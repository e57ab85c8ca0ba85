//! BatchNorm over the channels of an `(outer, channels, inner)` view, with ReLU or
//! Add + ReLU fused, and the standalone mask ReLU ops.
//!
//! Training runs each direction as three kernels:
//! 1. **sums**: each channel's two sums, in parts. NCHW-like views (`inner > 1`) sum each
//!    `(n, c)` row in parts of `part_len` elements, a warp a part ([`row_sums`]);
//!    channels-last views (`inner == 1`) are column sums ([`crate::ops::columns`]). The
//!    forward sums `x - k` and `(x - k)^2` about a shift `k` per channel (its first element,
//!    so the variance loses no bits to a large mean); the backward sums `g` and
//!    `g (x - mean)`, `g` being `dy` where the ReLU let the element through.
//! 2. **finalize** ([`finalize_forward`], [`finalize_backward`]): a thread per channel adds
//!    its parts in order (no atomics: the same bits every run) and writes the saved
//!    statistics, the running statistics, the parameter gradients and the per-channel
//!    coefficients of pass 3.
//! 3. **apply** ([`apply`]): one pass of 16-byte packs over the tensor in memory order, a
//!    warp a chunk of 32 packs: `y = act(a x + b [+ addend])` and the ReLU mask built by
//!    `vote.sync.ballot`, or `dx = a g + b x + c` (and `d(addend) = g`) with `g` from the
//!    mask.
//!
//! The mask holds bit `i % 32` of word `i / 32` for element `i` (OneFlow's layout). A lane
//! holds `P` consecutive elements, so a ballot per pack slot `j` gathers bit `j` of every
//! lane; word `w` of the chunk is those ballots' bits of lanes `w * 32 / P ..`, spread `P`
//! apart ([`spread`]).

use super::columns::{self, ColumnTerms, Columns};
use crate::abi::{BATCH_NORM_COEFFICIENTS, BatchNormArgs};
use crate::arch::{
    GlobalAddr, WARP_SIZE, ballot, block_dim_x, block_idx_x, grid_dim_x, lane_id, rsqrt, shfl_down, thread_idx_x,
};
use crate::pack::{ColumnLoad, Pack};
use crate::scalar::Scalar;
use crate::unroll::{unroll, unrolled_array};

/// Every lane of a warp.
const ALL_LANES: u32 = u32::MAX;

/// A channel's coefficients and statistics: f32 vectors of `channels`, read through the
/// read-only path (they are small and re-read by every warp).
#[derive(Clone, Copy)]
struct PerChannel(Option<ColumnLoad<f32>>);

impl PerChannel {
    /// # Safety
    /// A non-zero `address` must be a generic address of `channels` f32s.
    #[inline(always)]
    unsafe fn new(address: u64) -> Self {
        // SAFETY: forwarded.
        PerChannel(if address == 0 { None } else { Some(unsafe { ColumnLoad::new(address) }) })
    }

    /// Channel `c`'s value, `absent` where there is no vector.
    ///
    /// # Safety
    /// `c` must be a channel.
    #[inline(always)]
    unsafe fn get(&self, c: u32, absent: f32) -> f32 {
        // SAFETY: forwarded.
        self.0.as_ref().map_or(absent, |v| unsafe { v.load::<1>(c as u64) }[0])
    }
}

/// The channel of a walk along the tensor in memory order: element `(n, c, s)`, as `c` and
/// `s`, stepped without dividing.
#[derive(Clone, Copy)]
struct ChannelWalk {
    s: u32,
    c: u32,
}

/// The view's sizes as a walk steps through them.
#[derive(Clone, Copy)]
struct Extent {
    inner: u32,
    channels: u32,
}

impl Extent {
    #[inline(always)]
    fn of(args: &BatchNormArgs) -> Self {
        Extent { inner: args.inner as u32, channels: args.channels as u32 }
    }

    /// The walk at element `i` (two divisions: once per thread, or per tail element).
    #[inline(always)]
    fn at(self, i: u64) -> ChannelWalk {
        let row = i / self.inner.max(1) as u64;
        ChannelWalk { s: (i - row * self.inner as u64) as u32, c: (row % self.channels.max(1) as u64) as u32 }
    }

    /// The next element's walk.
    #[inline(always)]
    fn step(self, mut walk: ChannelWalk) -> ChannelWalk {
        walk.s += 1;
        if walk.s == self.inner {
            walk.s = 0;
            walk.c += 1;
            if walk.c == self.channels {
                walk.c = 0;
            }
        }
        walk
    }

    /// The channels of `P` consecutive elements from `walk`.
    #[inline(always)]
    fn channels<const P: usize>(self, walk: ChannelWalk) -> [u32; P] {
        let mut at = walk;
        unrolled_array(|j| {
            if j > 0 {
                at = self.step(at);
            }
            at.c
        })
    }
}

/// A fixed stride of a walk: `delta = rows * inner + s` elements, `rows % channels`
/// channels.
#[derive(Clone, Copy)]
struct Stride {
    s: u32,
    c: u32,
}

impl Extent {
    #[inline(always)]
    fn stride(self, delta: u64) -> Stride {
        let walk = self.at(delta);
        Stride { s: walk.s, c: walk.c }
    }

    /// `walk` moved on by `stride` (one compare per wrap: `s, c` stay below their extents).
    #[inline(always)]
    fn advance(self, mut walk: ChannelWalk, stride: Stride) -> ChannelWalk {
        walk.s += stride.s;
        walk.c += stride.c;
        if walk.s >= self.inner {
            walk.s -= self.inner;
            walk.c += 1;
        }
        if walk.c >= self.channels {
            walk.c -= self.channels;
        }
        walk
    }
}

/// Bits `0..32 / P` of `bits` moved to bits `0, P, 2P, ...`.
#[inline(always)]
const fn spread<const P: usize>(bits: u32) -> u32 {
    let mut x = bits;
    match P {
        2 => {
            x &= 0xFFFF;
            x = (x | (x << 8)) & 0x00FF_00FF;
            x = (x | (x << 4)) & 0x0F0F_0F0F;
            x = (x | (x << 2)) & 0x3333_3333;
            (x | (x << 1)) & 0x5555_5555
        }
        4 => {
            x &= 0xFF;
            x = (x | (x << 12)) & 0x000F_000F;
            x = (x | (x << 6)) & 0x0303_0303;
            (x | (x << 3)) & 0x1111_1111
        }
        8 => {
            x &= 0xF;
            x = (x | (x << 14)) & 0x0003_0003;
            (x | (x << 7)) & 0x0101_0101
        }
        _ => x,
    }
}

/// Mask word `w` of a chunk whose lanes each hold `P` consecutive elements, from the
/// ballots of each pack slot (`slots[j]`: bit `l` set where lane `l`'s element `j` passed).
#[inline(always)]
fn chunk_word<const P: usize>(slots: &[u32; P], w: u32) -> u32 {
    let lanes = (WARP_SIZE as usize / P) as u32;
    let mut word = 0;
    unroll::<P>(|j| word |= spread::<P>(slots[j].checked_shr(w * lanes).unwrap_or(0)) << j);
    word
}

/// An elementwise pass of the apply kernel: what it reads and writes for `P` consecutive
/// elements from element `i`, whose channels are `channels`.
trait ApplyPass {
    /// Whether the pass writes the mask (forward) or reads it (backward).
    const WRITES_MASK: bool;
    /// Whether the pass reads the mask.
    const READS_MASK: bool;

    /// Processes the elements; `bits` are their mask bits (bit `j` for element `j`) where
    /// the pass reads the mask. Returns the bits to set where it writes it.
    ///
    /// # Safety
    /// The elements must be inside the view; `i` aligned to `P` where `P > 1`.
    unsafe fn pack<const P: usize>(&self, i: u64, channels: [u32; P], bits: u32) -> u32;
}

/// The tensors of an apply pass, as flat arrays of `T`.
#[derive(Clone, Copy)]
struct Flat<T> {
    base: GlobalAddr,
    _element: core::marker::PhantomData<T>,
}

impl<T: Scalar> Flat<T> {
    /// # Safety
    /// `address` must be a generic address of global memory (unused if the pass never
    /// touches it).
    #[inline(always)]
    unsafe fn new(address: u64) -> Self {
        // SAFETY: forwarded.
        Flat { base: unsafe { GlobalAddr::from_generic(address) }, _element: core::marker::PhantomData }
    }

    /// # Safety
    /// Elements `i..i + P` must be inside the array, `i` aligned to `P` where `P > 1`.
    #[inline(always)]
    unsafe fn load<const P: usize>(&self, i: u64) -> [f32; P] {
        // SAFETY: forwarded.
        unsafe { Pack::<T, P>::load(self.base, i / P as u64) }.to_f32()
    }

    /// # Safety
    /// As [`Flat::load`], for a writable array.
    #[inline(always)]
    unsafe fn store<const P: usize>(&self, i: u64, values: [f32; P]) {
        let mut pack = Pack::<T, P>::new();
        unroll::<P>(|j| pack.set(j, T::from_f32(values[j])));
        // SAFETY: forwarded.
        unsafe { pack.store(self.base, i / P as u64) }
    }
}

/// The fused activation after the normalize.
#[derive(Clone, Copy, PartialEq, Eq, core::marker::ConstParamTy)]
pub enum Activation {
    None,
    Relu,
    AddRelu,
}

/// ReLU as PyTorch: NaN stays NaN (`max` would give 0).
#[inline(always)]
fn relu(y: f32) -> f32 {
    if y <= 0.0 { 0.0 } else { y }
}

/// The forward apply: `y = act(a x + b [+ addend])`, its mask bits where `y > 0`. Without
/// coefficients (`affine == false`) it is `act(x)`: the standalone ReLU with a mask.
struct ForwardPass<T, const ACT: Activation> {
    x: Flat<T>,
    addend: Flat<T>,
    y: Flat<T>,
    coefficients: [PerChannel; BATCH_NORM_COEFFICIENTS],
}

impl<T: Scalar, const ACT: Activation> ApplyPass for ForwardPass<T, ACT> {
    const WRITES_MASK: bool = !matches!(ACT, Activation::None);
    const READS_MASK: bool = false;

    #[inline(always)]
    unsafe fn pack<const P: usize>(&self, i: u64, channels: [u32; P], _bits: u32) -> u32 {
        // SAFETY: forwarded; the addend has x's shape.
        unsafe {
            let x = self.x.load::<P>(i);
            let addend = if ACT == Activation::AddRelu { self.addend.load::<P>(i) } else { [0.0; P] };
            let mut bits = 0;
            let y = unrolled_array(|j| {
                let [scale, center, shift, _] = &self.coefficients;
                let c = channels[j];
                let mut y = scale.get(c, 1.0) * (x[j] - center.get(c, 0.0)) + shift.get(c, 0.0);
                if ACT == Activation::AddRelu {
                    y += addend[j];
                }
                if ACT != Activation::None {
                    y = relu(y);
                    bits |= ((y > 0.0) as u32) << j;
                }
                y
            });
            self.y.store::<P>(i, y);
            bits
        }
    }
}

/// The backward apply: `g = dy` where the mask lets the element through (else 0), then
/// `dx = a g + b x + c` and, with Add + ReLU, `d(addend) = g`. Without coefficients it is
/// the ReLU backward from the mask, `dx = g`.
struct BackwardPass<T, const ACT: Activation> {
    dy: Flat<T>,
    x: Flat<T>,
    dx: Flat<T>,
    daddend: Flat<T>,
    coefficients: [PerChannel; BATCH_NORM_COEFFICIENTS],
    affine: bool,
}

impl<T: Scalar, const ACT: Activation> ApplyPass for BackwardPass<T, ACT> {
    const WRITES_MASK: bool = false;
    const READS_MASK: bool = !matches!(ACT, Activation::None);

    #[inline(always)]
    unsafe fn pack<const P: usize>(&self, i: u64, channels: [u32; P], bits: u32) -> u32 {
        // SAFETY: forwarded; every array has x's shape.
        unsafe {
            let dy = self.dy.load::<P>(i);
            let x = if self.affine { self.x.load::<P>(i) } else { [0.0; P] };
            let g: [f32; P] = unrolled_array(|j| if Self::READS_MASK && bits & (1 << j) == 0 { 0.0 } else { dy[j] });
            if ACT == Activation::AddRelu {
                self.daddend.store::<P>(i, g);
            }
            let dx = if self.affine {
                let [scale, center, shift, slope] = &self.coefficients;
                unrolled_array(|j| {
                    let c = channels[j];
                    scale.get(c, 0.0) * g[j] + slope.get(c, 0.0) * (x[j] - center.get(c, 0.0)) + shift.get(c, 0.0)
                })
            } else {
                g
            };
            self.dx.store::<P>(i, dx);
            0
        }
    }
}

/// The ReLU backward from `y`: `dx = dy` where `y > 0`, else 0 (what the mask replaces).
struct ReluBackwardPass<T> {
    dy: Flat<T>,
    y: Flat<T>,
    dx: Flat<T>,
}

impl<T: Scalar> ApplyPass for ReluBackwardPass<T> {
    const WRITES_MASK: bool = false;
    const READS_MASK: bool = false;

    #[inline(always)]
    unsafe fn pack<const P: usize>(&self, i: u64, _channels: [u32; P], _bits: u32) -> u32 {
        // SAFETY: forwarded.
        unsafe {
            let (dy, y) = (self.dy.load::<P>(i), self.y.load::<P>(i));
            self.dx.store::<P>(i, unrolled_array(|j| if y[j] > 0.0 { dy[j] } else { 0.0 }));
        }
        0
    }
}

/// Runs `pass` over the `len` elements of the view: full chunks of 32 packs a warp,
/// grid-strided, then the last partial chunk element by element (lane `l` of slot `t` takes
/// element `32 t + l` of it, so each slot's ballot is a mask word as it stands).
///
/// # Safety
/// The pass's arrays must hold `len` elements aligned to `P`; the mask `ceil(len / 32)`
/// words; the grid a whole number of warps.
#[inline(always)]
unsafe fn apply<A: ApplyPass, const P: usize>(pass: &A, extent: Extent, len: u64, mask: u64) {
    let chunk = (WARP_SIZE as usize * P) as u64;
    let lane = lane_id();
    let warp = (block_idx_x() * block_dim_x() + thread_idx_x()) as u64 / WARP_SIZE as u64;
    let warps = (grid_dim_x() * block_dim_x()) as u64 / WARP_SIZE as u64;
    let chunks = len / chunk;
    let words = mask as *mut u32;
    let has_mask = mask != 0;
    // SAFETY (whole body): every element index is below `len`, every word below
    // `ceil(len / 32)`, and each ballot is reached by the whole warp.
    unsafe {
        let mut at = warp;
        let mut walk = extent.at((at * WARP_SIZE as u64 + lane as u64) * P as u64);
        let stride = extent.stride(warps * chunk);
        while at < chunks {
            let i = (at * WARP_SIZE as u64 + lane as u64) * P as u64;
            let bits = if A::READS_MASK && has_mask {
                (words.add((i / 32) as usize).read() >> (i % 32)) & ((1u64 << P) - 1) as u32
            } else {
                0
            };
            let set = pass.pack::<P>(i, extent.channels::<P>(walk), bits);
            if A::WRITES_MASK && has_mask {
                let slots: [u32; P] = unrolled_array(|j| ballot(ALL_LANES, set & (1 << j) != 0));
                if (lane as usize) < P {
                    words.add((at * P as u64 + lane as u64) as usize).write(chunk_word::<P>(&slots, lane));
                }
            }
            walk = extent.advance(walk, stride);
            at += warps;
        }
        // The partial chunk: the warp that would take it next.
        if at == chunks && chunks * chunk < len {
            unroll::<P>(|t| {
                let i = chunks * chunk + (t as u64) * WARP_SIZE as u64 + lane as u64;
                let inside = i < len;
                let word = (i / 32) as usize;
                let bits = if A::READS_MASK && has_mask && inside { (words.add(word).read() >> lane) & 1 } else { 0 };
                let set = if inside { pass.pack::<1>(i, [extent.at(i).c], bits) } else { 0 };
                if A::WRITES_MASK && has_mask {
                    let word_bits = ballot(ALL_LANES, set != 0);
                    if lane == 0 && (i - lane as u64) < len {
                        words.add(word).write(word_bits);
                    }
                }
            });
        }
    }
}

/// The apply kernel's launch: a grid-stride loop over chunks; every array aligned to `P`.
///
/// # Safety
/// `args` must describe live arrays of `outer * channels * inner` elements of `T` aligned to
/// `P`, per-channel coefficients where the pass reads them, and a grid of whole warps.
#[inline(always)]
pub unsafe fn forward_apply<T: Scalar, const ACT: Activation, const P: usize>(args: &BatchNormArgs) {
    // SAFETY: forwarded.
    unsafe {
        let pass = ForwardPass::<T, ACT> {
            x: Flat::new(args.x),
            addend: Flat::new(args.second),
            y: Flat::new(args.output),
            coefficients: coefficients(args),
        };
        apply::<_, P>(&pass, Extent::of(args), len(args), args.mask);
    }
}

/// # Safety
/// As [`forward_apply`].
#[inline(always)]
pub unsafe fn backward_apply<T: Scalar, const ACT: Activation, const P: usize>(args: &BatchNormArgs) {
    // SAFETY: forwarded.
    unsafe {
        let pass = BackwardPass::<T, ACT> {
            dy: Flat::new(args.second),
            x: Flat::new(args.x),
            dx: Flat::new(args.output),
            daddend: Flat::new(args.second_output),
            coefficients: coefficients(args),
            affine: args.coefficients != 0,
        };
        apply::<_, P>(&pass, Extent::of(args), len(args), args.mask);
    }
}

/// The ReLU backward from `y` (`args.x` holds y).
///
/// # Safety
/// As [`forward_apply`].
#[inline(always)]
pub unsafe fn relu_backward<T: Scalar, const P: usize>(args: &BatchNormArgs) {
    // SAFETY: forwarded.
    unsafe {
        let pass = ReluBackwardPass::<T> { dy: Flat::new(args.second), y: Flat::new(args.x), dx: Flat::new(args.output) };
        apply::<_, P>(&pass, Extent::of(args), len(args), 0);
    }
}

/// The per-channel coefficient vectors the finalize kernel wrote (none for the standalone
/// ReLU ops).
///
/// # Safety
/// A non-zero `args.coefficients` must hold `BATCH_NORM_COEFFICIENTS x channels` f32.
#[inline(always)]
unsafe fn coefficients(args: &BatchNormArgs) -> [PerChannel; BATCH_NORM_COEFFICIENTS] {
    let at = |k: usize| if args.coefficients == 0 { 0 } else { args.coefficients + 4 * k as u64 * args.channels };
    // SAFETY: forwarded.
    core::array::from_fn(|k| unsafe { PerChannel::new(at(k)) })
}

#[inline(always)]
fn len(args: &BatchNormArgs) -> u64 {
    args.outer * args.channels * args.inner
}

/// What each element adds to its channel's two sums.
trait ChannelTerms {
    /// What `P` consecutive elements are read as.
    type Fetched<const P: usize>: Copy;

    /// The value channel `c`'s terms are taken about (the statistics' shift, the backward's
    /// mean).
    ///
    /// # Safety
    /// `c` must be a channel.
    unsafe fn center(&self, c: u32) -> f32;

    /// # Safety
    /// Elements `i..i + P` must be inside the view, `i` aligned to `P` where `P > 1`.
    unsafe fn fetch<const P: usize>(&self, i: u64) -> Self::Fetched<P>;

    /// The two terms of each element, about its channel's center.
    fn terms<const P: usize>(&self, fetched: Self::Fetched<P>, centers: [f32; P]) -> ([f32; P], [f32; P]);
}

/// The forward's statistics: `x - k` and `(x - k)^2`, `k` the channel's first element.
struct StatsTerms<T> {
    x: Flat<T>,
    inner: u64,
}

impl<T: Scalar> ChannelTerms for StatsTerms<T> {
    type Fetched<const P: usize> = [f32; P];

    #[inline(always)]
    unsafe fn center(&self, c: u32) -> f32 {
        // SAFETY: element (0, c, 0) is inside the view.
        unsafe { self.x.load::<1>(c as u64 * self.inner)[0] }
    }

    #[inline(always)]
    unsafe fn fetch<const P: usize>(&self, i: u64) -> [f32; P] {
        // SAFETY: forwarded.
        unsafe { self.x.load::<P>(i) }
    }

    #[inline(always)]
    fn terms<const P: usize>(&self, x: [f32; P], k: [f32; P]) -> ([f32; P], [f32; P]) {
        let d: [f32; P] = unrolled_array(|j| x[j] - k[j]);
        (d, unrolled_array(|j| d[j] * d[j]))
    }
}

/// The backward's sums: `g` and `g (x - mean)`, `g = dy` where the mask (if any) lets the
/// element through, else 0.
struct GradTerms<T> {
    dy: Flat<T>,
    x: Flat<T>,
    mask: *const u32,
    mean: PerChannel,
}

impl<T: Scalar> ChannelTerms for GradTerms<T> {
    type Fetched<const P: usize> = ([f32; P], [f32; P], u32);

    #[inline(always)]
    unsafe fn center(&self, c: u32) -> f32 {
        // SAFETY: forwarded.
        unsafe { self.mean.get(c, 0.0) }
    }

    #[inline(always)]
    unsafe fn fetch<const P: usize>(&self, i: u64) -> Self::Fetched<P> {
        // SAFETY: forwarded; the mask holds a bit per element, and `P` divides 32.
        unsafe {
            let bits = if self.mask.is_null() { u32::MAX } else { self.mask.add((i / 32) as usize).read() >> (i % 32) };
            (self.dy.load::<P>(i), self.x.load::<P>(i), bits)
        }
    }

    #[inline(always)]
    fn terms<const P: usize>(&self, (dy, x, bits): Self::Fetched<P>, mean: [f32; P]) -> ([f32; P], [f32; P]) {
        let g: [f32; P] = unrolled_array(|j| if bits & (1 << j) == 0 { 0.0 } else { dy[j] });
        (g, unrolled_array(|j| g[j] * (x[j] - mean[j])))
    }
}

/// The rows sums (`inner > 1`): warp `w` sums part `w % row_parts` of row
/// `(n, c) = w / row_parts` into `partial[.., n * row_parts + part, c]`. A part's elements
/// before its first `P`-aligned one and after its last whole pack (fewer than `P` each) are
/// single loads, one a lane.
///
/// # Safety
/// `args` must describe the view, its arrays aligned to `P`, `partial` of
/// `2 x outer * row_parts x channels` f32, and a grid of at least one warp a part.
#[inline(always)]
unsafe fn row_sums<C: ChannelTerms, const P: usize>(terms: &C, args: &BatchNormArgs) {
    let lane = lane_id() as u64;
    let warp = (block_idx_x() * block_dim_x() + thread_idx_x()) as u64 / WARP_SIZE as u64;
    let row_parts = args.row_parts.max(1);
    let row = warp / row_parts;
    if row >= args.outer * args.channels {
        return;
    }
    let part = warp - row * row_parts;
    let channels = args.channels.max(1);
    let (n, c) = (row / channels, (row % channels) as u32);
    let start = row * args.inner + part * args.part_len;
    let end = (start + args.part_len).min((row + 1) * args.inner);
    let head_end = start.next_multiple_of(P as u64).min(end);
    let packs_end = head_end + (end - head_end) / P as u64 * P as u64;
    // SAFETY (whole body): every index is in `start..end`, inside the row.
    unsafe {
        let center = terms.center(c);
        let (mut first, mut second) = (0.0f32, 0.0f32);
        for (i, limit) in [(start + lane, head_end), (packs_end + lane, end)] {
            if i < limit {
                let (a, b) = terms.terms::<1>(terms.fetch::<1>(i), [center]);
                first += a[0];
                second += b[0];
            }
        }
        let mut i = head_end + lane * P as u64;
        while i < packs_end {
            let (a, b) = terms.terms::<P>(terms.fetch::<P>(i), [center; P]);
            unroll::<P>(|j| {
                first += a[j];
                second += b[j];
            });
            i += WARP_SIZE as u64 * P as u64;
        }
        let (first, second) = (warp_sum(first), warp_sum(second));
        if lane == 0 {
            let partial = args.partial as *mut f32;
            let at = ((n * row_parts + part) * args.channels + c as u64) as usize;
            partial.add(at).write(first);
            partial.add(at + (args.parts * args.channels) as usize).write(second);
        }
    }
}

/// The sum of `value` over the warp, in lane 0.
#[inline(always)]
fn warp_sum(mut value: f32) -> f32 {
    unroll::<5>(|k| {
        // SAFETY: the whole warp runs this.
        value += unsafe { shfl_down(ALL_LANES, value, WARP_SIZE >> (k + 1), WARP_SIZE) };
    });
    value
}

/// Channel terms as column sums of the `(outer, channels)` view (`inner == 1`): a lane's
/// columns are channels, their centers read once.
struct ColumnChannels<'a, C> {
    terms: &'a C,
    channels: u64,
}

impl<C: ChannelTerms, const P: usize> ColumnTerms<P> for ColumnChannels<'_, C> {
    type Loaded = C::Fetched<P>;
    type Lane = [f32; P];

    #[inline(always)]
    unsafe fn lane(&self, col: u64) -> [f32; P] {
        // SAFETY: forwarded.
        unrolled_array(|j| unsafe { self.terms.center((col + j as u64) as u32) })
    }

    #[inline(always)]
    unsafe fn load(&self, row: u64, col: u64) -> C::Fetched<P> {
        // SAFETY: forwarded.
        unsafe { self.terms.fetch::<P>(row * self.channels + col) }
    }

    #[inline(always)]
    unsafe fn add(&self, centers: &[f32; P], _row: u64, loaded: C::Fetched<P>, first: &mut [f32; P], second: &mut [f32; P]) {
        let (a, b) = self.terms.terms::<P>(loaded, *centers);
        unroll::<P>(|j| {
            first[j] += a[j];
            second[j] += b[j];
        });
    }

    #[inline(always)]
    fn second(&self) -> bool {
        true
    }
}

/// Each channel's two sums in parts: rows sums where `inner > 1`, column sums otherwise.
///
/// # Safety
/// As [`row_sums`] or [`columns::chunk_sums`] (`part_len` rows a chunk, `parts` chunks).
#[inline(always)]
unsafe fn channel_sums<C: ChannelTerms, const P: usize>(terms: &C, args: &BatchNormArgs) {
    // SAFETY: forwarded.
    unsafe {
        if args.inner > 1 {
            row_sums::<C, P>(terms, args);
        } else {
            let at = Columns {
                rows: args.outer,
                cols: args.channels,
                rows_per_chunk: args.part_len,
                chunks: args.parts,
                partial: args.partial,
            };
            columns::chunk_sums::<_, P>(&ColumnChannels { terms, channels: args.channels }, &at);
        }
    }
}

/// The forward statistics' sums.
///
/// # Safety
/// As [`channel_sums`].
#[inline(always)]
pub unsafe fn stats<T: Scalar, const P: usize>(args: &BatchNormArgs) {
    // SAFETY: forwarded.
    unsafe { channel_sums::<_, P>(&StatsTerms::<T> { x: Flat::new(args.x), inner: args.inner }, args) }
}

/// The backward's sums (the mask read where `args.mask` is not 0).
///
/// # Safety
/// As [`channel_sums`].
#[inline(always)]
pub unsafe fn grad_sums<T: Scalar, const P: usize>(args: &BatchNormArgs) {
    // SAFETY: forwarded.
    unsafe {
        let terms = GradTerms::<T> {
            dy: Flat::new(args.second),
            x: Flat::new(args.x),
            mask: args.mask as *const u32,
            mean: PerChannel::new(args.save_mean),
        };
        channel_sums::<_, P>(&terms, args);
    }
}

/// Finalize of the training forward: each channel's parts added in order, then the saved
/// mean and invstd, the running statistics (unbiased variance, as PyTorch) and the apply
/// pass's `y = scale (x - center) + shift`: `weight * invstd`, the mean, the bias. Eval (`parts == 0`) takes the
/// running statistics instead. `T` is x's dtype (the shifts are its elements); `ONE` the
/// table's pack, 1: a thread per channel.
///
/// # Safety
/// `args` must describe live per-channel arrays, `partial` as the sums wrote it, and
/// `coefficients` of `2 x channels` f32.
#[inline(always)]
pub unsafe fn finalize_forward<T: Scalar, const ONE: usize>(args: &BatchNormArgs) {
    let count = (args.outer * args.inner) as f32;
    let stride = (grid_dim_x() * block_dim_x()) as u64;
    let mut c = (block_idx_x() * block_dim_x() + thread_idx_x()) as u64;
    // SAFETY (whole body): `c < channels` indexes every per-channel array.
    unsafe {
        let shifts = StatsTerms::<T> { x: Flat::new(args.x), inner: args.inner };
        let weight = PerChannel::new(args.weight);
        let bias = PerChannel::new(args.bias);
        let coefficients = args.coefficients as *mut f32;
        let running_mean = args.running_mean as *mut f32;
        let running_var = args.running_var as *mut f32;
        while c < args.channels {
            let (mean, var) = if args.parts == 0 {
                (running_mean.add(c as usize).read(), running_var.add(c as usize).read())
            } else {
                let (first, second) = part_totals(args, c);
                let shift = shifts.center(c as u32);
                let m = first / count;
                (shift + m, (second / count - m * m).max(0.0))
            };
            let invstd = rsqrt(var + args.eps);
            if args.parts != 0 {
                if args.save_mean != 0 {
                    (args.save_mean as *mut f32).add(c as usize).write(mean);
                    (args.save_invstd as *mut f32).add(c as usize).write(invstd);
                }
                if !running_mean.is_null() {
                    let m = args.momentum;
                    let unbiased = if count > 1.0 { var * count / (count - 1.0) } else { var };
                    running_mean.add(c as usize).write((1.0 - m) * running_mean.add(c as usize).read() + m * mean);
                    running_var.add(c as usize).write((1.0 - m) * running_var.add(c as usize).read() + m * unbiased);
                }
            }
            let at = |k: u64| (k * args.channels + c) as usize;
            coefficients.add(at(0)).write(weight.get(c as u32, 1.0) * invstd);
            coefficients.add(at(1)).write(mean);
            coefficients.add(at(2)).write(bias.get(c as u32, 0.0));
            c += stride;
        }
    }
}

/// Channel `c`'s two sums over its parts, in part order.
///
/// # Safety
/// `partial` must hold `2 x parts x channels` f32 and `c` be a channel.
#[inline(always)]
unsafe fn part_totals(args: &BatchNormArgs, c: u64) -> (f32, f32) {
    let partial = args.partial as *const f32;
    let (mut first, mut second) = (0.0, 0.0);
    let mut part = 0;
    while part < args.parts {
        let at = (part * args.channels + c) as usize;
        // SAFETY: forwarded.
        unsafe {
            first += partial.add(at).read();
            second += partial.add(at + (args.parts * args.channels) as usize).read();
        }
        part += 1;
    }
    (first, second)
}

/// Finalize of the backward: `dbias = sum g`, `dweight = invstd sum g (x - mean)`, and the
/// apply pass's `dx = scale g + slope (x - center) + shift` with `scale = weight invstd`, the
/// mean, `shift = -scale sum g / count`, `slope = -scale invstd^2 sum g (x - mean) / count`
/// (centered, so no large terms cancel). `T` and `ONE`
/// as [`finalize_forward`]'s.
///
/// # Safety
/// As [`finalize_forward`], `coefficients` of `3 x channels` f32.
#[inline(always)]
pub unsafe fn finalize_backward<T: Scalar, const ONE: usize>(args: &BatchNormArgs) {
    let count = (args.outer * args.inner) as f32;
    let stride = (grid_dim_x() * block_dim_x()) as u64;
    let mut c = (block_idx_x() * block_dim_x() + thread_idx_x()) as u64;
    // SAFETY (whole body): `c < channels` indexes every per-channel array.
    unsafe {
        let weight = PerChannel::new(args.weight);
        let coefficients = args.coefficients as *mut f32;
        while c < args.channels {
            let (sum_g, sum_gx) = part_totals(args, c);
            let mean = (args.save_mean as *const f32).add(c as usize).read();
            let invstd = (args.save_invstd as *const f32).add(c as usize).read();
            if args.dbias != 0 {
                (args.dbias as *mut f32).add(c as usize).write(sum_g);
            }
            if args.dweight != 0 {
                (args.dweight as *mut f32).add(c as usize).write(sum_gx * invstd);
            }
            let scale = weight.get(c as u32, 1.0) * invstd;
            let at = |k: u64| (k * args.channels + c) as usize;
            coefficients.add(at(0)).write(scale);
            coefficients.add(at(1)).write(mean);
            coefficients.add(at(2)).write(-scale * sum_g / count);
            coefficients.add(at(3)).write(-scale * invstd * invstd * sum_gx / count);
            c += stride;
        }
    }
}
