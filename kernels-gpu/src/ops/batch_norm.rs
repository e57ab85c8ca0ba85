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
//! 2. **finalize** ([`finalize_forward`], [`finalize_backward`]): a block per channel adds
//!    its parts in a fixed order (no atomics: the same bits every run) and writes the saved
//!    statistics, the running statistics, the parameter gradients and the per-channel
//!    coefficients of pass 3.
//! 3. **apply** ([`apply`]): one pass of 16-byte packs over the tensor, last chunk first, a
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
    GlobalAddr, WARP_SIZE, ballot, block_dim_x, block_idx_x, dynamic_shared, grid_dim_x, lane_id, rsqrt, shfl_down,
    sync_threads, thread_idx_x,
};
use crate::channel_walk::{ChannelWalk, Extent, Stride};
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

/// The most chunks of 32 packs whose loads a warp of the apply pass keeps in flight
/// together (each pass says how many: [`ApplyPass::CHUNKS_IN_FLIGHT`]).
const MOST_CHUNKS_IN_FLIGHT: usize = 6;

/// The per-channel coefficients of `P` consecutive elements: `[coefficient][element]`.
type PackCoefficients<const P: usize> = [[f32; P]; BATCH_NORM_COEFFICIENTS];

/// An elementwise pass of the apply kernel: what it reads and writes for `P` consecutive
/// elements from element `i`.
trait ApplyPass {
    /// Whether the pass writes the mask (forward) or reads it (backward; then it is always
    /// there).
    const WRITES_MASK: bool;
    const READS_MASK: bool;
    /// Whether the pass reads the finalize's coefficients (the standalone ReLU ops do not).
    const AFFINE: bool;
    /// Chunks a warp keeps in flight, at most [`MOST_CHUNKS_IN_FLIGHT`]: chosen so that the
    /// registers they cost (ptxas, sm_90) leave about 48 KB of loads in flight an SM, what
    /// HBM's latency needs, e.g. 16 warps x 6 chunks x 512 B for the ReLU forward at 127
    /// registers.
    const CHUNKS_IN_FLIGHT: usize;

    /// What `P` elements are read as, so that several chunks' loads can be in flight together.
    type Fetched<const P: usize>: Copy;

    /// # Safety
    /// The elements `i..i + P` must be inside the view; `i` aligned to `P` where `P > 1`.
    unsafe fn fetch<const P: usize>(&self, i: u64) -> Self::Fetched<P>;

    /// Processes the fetched elements with their coefficients `k`; `bits` are their mask
    /// bits (bit `j` for element `j`) where the pass reads the mask. Returns the bits to set
    /// where it writes it.
    ///
    /// # Safety
    /// As [`ApplyPass::fetch`].
    unsafe fn finish<const P: usize>(
        &self,
        i: u64,
        fetched: Self::Fetched<P>,
        k: &PackCoefficients<P>,
        bits: u32,
    ) -> u32;

    /// # Safety
    /// As [`ApplyPass::fetch`].
    #[inline(always)]
    unsafe fn pack<const P: usize>(&self, i: u64, k: &PackCoefficients<P>, bits: u32) -> u32 {
        // SAFETY: forwarded.
        unsafe { self.finish::<P>(i, self.fetch::<P>(i), k, bits) }
    }
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

    /// Elements `i..i + P` as loaded: chunks in flight hold them so (half the registers of
    /// f32 for 16-bit types).
    ///
    /// # Safety
    /// Elements `i..i + P` must be inside the array, `i` aligned to `P` where `P > 1`.
    #[inline(always)]
    unsafe fn fetch<const P: usize>(&self, i: u64) -> Pack<T, P> {
        // SAFETY: forwarded.
        unsafe { Pack::<T, P>::load(self.base, i / P as u64) }
    }

    /// # Safety
    /// As [`Flat::fetch`].
    #[inline(always)]
    unsafe fn load<const P: usize>(&self, i: u64) -> [f32; P] {
        // SAFETY: forwarded.
        unsafe { self.fetch::<P>(i) }.to_f32()
    }

    /// # Safety
    /// As [`Flat::load`], for a writable array.
    #[inline(always)]
    unsafe fn store<const P: usize>(&self, i: u64, values: [f32; P]) {
        // SAFETY: forwarded.
        unsafe { Pack::<T, P>::from_f32(values).store(self.base, i / P as u64) }
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
    if passes_relu(y) { y } else { 0.0 }
}

/// Whether the ReLU backward at output `y` lets `dy` through: PyTorch's
/// `threshold_backward` zeroes it where `y <= 0`, so a NaN `y` passes it (`y > 0` would not).
/// The negated compare is one unordered `setp.gtu`, where `y > 0.0 || y.is_nan()` took two.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
#[inline(always)]
fn passes_relu(y: f32) -> bool {
    !(y <= 0.0)
}

/// The forward apply: `y = act(scale (x - center) + shift [+ addend])`, its mask bits where
/// [`passes_relu`]. Without coefficients (`AFFINE == false`) it is `act(x)`: the standalone
/// ReLU with a mask.
struct ForwardPass<T, const ACT: Activation, const AFFINE: bool> {
    x: Flat<T>,
    addend: Flat<T>,
    y: Flat<T>,
}

impl<T: Scalar, const ACT: Activation, const AFFINE: bool> ApplyPass for ForwardPass<T, ACT, AFFINE> {
    const WRITES_MASK: bool = !matches!(ACT, Activation::None);
    const READS_MASK: bool = false;
    const AFFINE: bool = AFFINE;
    const CHUNKS_IN_FLIGHT: usize = match (AFFINE, ACT) {
        (false, _) => 2,
        (true, Activation::AddRelu) => 3,
        (true, _) => 6,
    };

    type Fetched<const P: usize> = (Pack<T, P>, Pack<T, P>);

    #[inline(always)]
    unsafe fn fetch<const P: usize>(&self, i: u64) -> Self::Fetched<P> {
        // SAFETY: forwarded; the addend has x's shape.
        unsafe {
            let addend = if ACT == Activation::AddRelu { self.addend.fetch::<P>(i) } else { Pack::new() };
            (self.x.fetch::<P>(i), addend)
        }
    }

    #[inline(always)]
    unsafe fn finish<const P: usize>(
        &self,
        i: u64,
        (x, addend): Self::Fetched<P>,
        k: &PackCoefficients<P>,
        _: u32,
    ) -> u32 {
        let (x, addend) = (x.to_f32(), addend.to_f32());
        // SAFETY: forwarded.
        unsafe {
            let mut bits = 0;
            let y = unrolled_array(|j| {
                let [scale, center, shift, _] = k;
                let mut y = if AFFINE { scale[j] * (x[j] - center[j]) + shift[j] } else { x[j] };
                if ACT == Activation::AddRelu {
                    y += addend[j];
                }
                if ACT != Activation::None {
                    y = relu(y);
                    // The bit says what the stored y says: a tiny positive y is 0 in f16.
                    bits |= (passes_relu(T::from_f32(y).to_f32()) as u32) << j;
                }
                y
            });
            self.y.store::<P>(i, y);
            bits
        }
    }
}

/// The backward apply: `g = dy` where the mask lets the element through (else 0), then
/// `dx = scale g + slope (x - center) + shift` and, with Add + ReLU, `d(addend) = g`.
/// Without coefficients it is the ReLU backward from the mask, `dx = g`.
struct BackwardPass<T, const ACT: Activation, const AFFINE: bool> {
    dy: Flat<T>,
    x: Flat<T>,
    dx: Flat<T>,
    daddend: Flat<T>,
}

impl<T: Scalar, const ACT: Activation, const AFFINE: bool> ApplyPass for BackwardPass<T, ACT, AFFINE> {
    const WRITES_MASK: bool = false;
    const READS_MASK: bool = !matches!(ACT, Activation::None);
    const AFFINE: bool = AFFINE;
    const CHUNKS_IN_FLIGHT: usize = if AFFINE && !matches!(ACT, Activation::AddRelu) { 3 } else { 2 };

    type Fetched<const P: usize> = (Pack<T, P>, Pack<T, P>);

    #[inline(always)]
    unsafe fn fetch<const P: usize>(&self, i: u64) -> Self::Fetched<P> {
        // SAFETY: forwarded; every array has x's shape.
        unsafe { (self.dy.fetch::<P>(i), if AFFINE { self.x.fetch::<P>(i) } else { Pack::new() }) }
    }

    #[inline(always)]
    unsafe fn finish<const P: usize>(
        &self,
        i: u64,
        (dy, x): Self::Fetched<P>,
        k: &PackCoefficients<P>,
        bits: u32,
    ) -> u32 {
        let (dy, x) = (dy.to_f32(), x.to_f32());
        // SAFETY: forwarded.
        unsafe {
            let g: [f32; P] = unrolled_array(|j| if Self::READS_MASK && bits & (1 << j) == 0 { 0.0 } else { dy[j] });
            if ACT == Activation::AddRelu {
                self.daddend.store::<P>(i, g);
            }
            let [scale, center, shift, slope] = k;
            let dx =
                unrolled_array(
                    |j| if AFFINE { scale[j] * g[j] + slope[j] * (x[j] - center[j]) + shift[j] } else { g[j] },
                );
            self.dx.store::<P>(i, dx);
            0
        }
    }
}

/// The ReLU backward from `y`: `dx = dy` where [`passes_relu`], else 0 (what the mask
/// replaces).
struct ReluBackwardPass<T> {
    dy: Flat<T>,
    y: Flat<T>,
    dx: Flat<T>,
}

impl<T: Scalar> ApplyPass for ReluBackwardPass<T> {
    const WRITES_MASK: bool = false;
    const READS_MASK: bool = false;
    const AFFINE: bool = false;
    const CHUNKS_IN_FLIGHT: usize = 2;

    type Fetched<const P: usize> = (Pack<T, P>, Pack<T, P>);

    #[inline(always)]
    unsafe fn fetch<const P: usize>(&self, i: u64) -> Self::Fetched<P> {
        // SAFETY: forwarded.
        unsafe { (self.dy.fetch::<P>(i), self.y.fetch::<P>(i)) }
    }

    #[inline(always)]
    unsafe fn finish<const P: usize>(&self, i: u64, (dy, y): Self::Fetched<P>, _: &PackCoefficients<P>, _: u32) -> u32 {
        let (dy, y) = (dy.to_f32(), y.to_f32());
        // SAFETY: forwarded.
        unsafe { self.dx.store::<P>(i, unrolled_array(|j| if passes_relu(y[j]) { dy[j] } else { 0.0 })) };
        0
    }
}

/// The coefficient vectors the finalize kernel wrote: f32 `[BATCH_NORM_COEFFICIENTS,
/// channels]`, read through the read-only path (every warp re-reads them).
#[derive(Clone, Copy)]
struct Coefficients {
    vectors: ColumnLoad<f32>,
    channels: u64,
}

impl Coefficients {
    /// # Safety
    /// `args.coefficients` must hold the vectors where a pass reads them.
    #[inline(always)]
    unsafe fn of(args: &BatchNormArgs) -> Self {
        // SAFETY: forwarded (a pass without coefficients never reads them).
        Coefficients { vectors: unsafe { ColumnLoad::new(args.coefficients) }, channels: args.channels }
    }

    /// Coefficient `k` of channel `c`.
    ///
    /// # Safety
    /// `c` must be a channel.
    #[inline(always)]
    unsafe fn get(&self, k: usize, c: u32) -> f32 {
        // SAFETY: forwarded.
        unsafe { self.vectors.load::<1>(k as u64 * self.channels + c as u64)[0] }
    }

    /// The coefficients of elements in `channels`.
    ///
    /// # Safety
    /// Every entry must be a channel.
    #[inline(always)]
    unsafe fn each<const P: usize>(&self, channels: [u32; P]) -> PackCoefficients<P> {
        // SAFETY: forwarded.
        core::array::from_fn(|k| unrolled_array(|j| unsafe { self.get(k, channels[j]) }))
    }

    /// The coefficients of the `P` consecutive channels from `c`: a vector load each.
    ///
    /// # Safety
    /// `c..c + P` must be channels, `c` and `channels` multiples of `P` (the vectors are then
    /// aligned to the loads: the workspace before them holds a multiple of `P` f32s).
    #[inline(always)]
    unsafe fn run<const P: usize>(&self, c: u32) -> PackCoefficients<P> {
        // SAFETY: forwarded.
        core::array::from_fn(|k| unsafe { self.vectors.load::<P>(k as u64 * self.channels + c as u64) })
    }

    /// The coefficients of `P` elements of channel `c`: one load each.
    ///
    /// # Safety
    /// `c` must be a channel.
    #[inline(always)]
    unsafe fn one<const P: usize>(&self, c: u32) -> PackCoefficients<P> {
        // SAFETY: forwarded.
        core::array::from_fn(|k| [unsafe { self.get(k, c) }; P])
    }
}

/// The chunk a turn of the grid-stride loop takes: the last first for the normalizing
/// passes (the sums before them read the tensor forwards, so its end is what L2 still
/// holds), in memory order for the standalone ReLU passes.
#[inline(always)]
fn chunk_of<A: ApplyPass>(turn: u64, chunks: u64) -> u64 {
    if A::AFFINE { chunks - 1 - turn } else { turn }
}

/// The whole chunks of the apply pass: the warp's turns `at`, `at + warps`, ... take chunks
/// [`chunk_of`] them, from the walk of the thread's first element and the grid's stride
/// (which [`apply`] has already found), `coefficients` giving each pack's from its walk
/// (walking backwards: only the normalizing passes read it). The pass's chunks in flight
/// are loaded before the first is finished; past the last chunk the slots are skipped
/// (the test is the warp's, so every ballot has the whole warp).
///
/// # Safety
/// As [`apply`].
#[inline(always)]
unsafe fn whole_chunks<A: ApplyPass, const P: usize>(
    pass: &A,
    extent: Extent,
    (mut at, warps, chunks): (u64, u64, u64),
    (mut walk, stride): (ChannelWalk, Stride),
    words: *mut u32,
    coefficients: impl Fn(ChannelWalk) -> PackCoefficients<P>,
) {
    let lane = lane_id();
    // SAFETY (whole body): every element index is below `len`, every word below
    // `ceil(len / 32)`, and each ballot is reached by the whole warp.
    unsafe {
        let index = |turn: u64| (chunk_of::<A>(turn, chunks) * WARP_SIZE as u64 + lane as u64) * P as u64;
        let bits = |i: u64| {
            if A::READS_MASK { (words.add((i / 32) as usize).read() >> (i % 32)) & ((1u64 << P) - 1) as u32 } else { 0 }
        };
        let finish = |turn: u64, fetched, bits, walk| {
            let set = pass.finish::<P>(index(turn), fetched, &coefficients(walk), bits);
            if A::WRITES_MASK && !words.is_null() {
                let slots: [u32; P] = unrolled_array(|j| ballot(ALL_LANES, set & (1 << j) != 0));
                if (lane as usize) < P {
                    let word = chunk_of::<A>(turn, chunks) * P as u64 + lane as u64;
                    words.add(word as usize).write(chunk_word::<P>(&slots, lane));
                }
            }
        };
        while at < chunks {
            let first = index(at);
            let mut masks = [bits(first); MOST_CHUNKS_IN_FLIGHT];
            let mut fetched = [pass.fetch::<P>(first); MOST_CHUNKS_IN_FLIGHT];
            let mut walks = [walk; MOST_CHUNKS_IN_FLIGHT];
            unroll::<MOST_CHUNKS_IN_FLIGHT>(|d| {
                let slot = at + d as u64 * warps;
                if d > 0 && d < A::CHUNKS_IN_FLIGHT {
                    walks[d] = extent.retreat(walks[d - 1], stride);
                    if slot < chunks {
                        let i = index(slot);
                        masks[d] = bits(i);
                        fetched[d] = pass.fetch::<P>(i);
                    }
                }
            });
            unroll::<MOST_CHUNKS_IN_FLIGHT>(|d| {
                let slot = at + d as u64 * warps;
                if d < A::CHUNKS_IN_FLIGHT && slot < chunks {
                    finish(slot, fetched[d], masks[d], walks[d]);
                }
            });
            walk = extent.retreat(walks[A::CHUNKS_IN_FLIGHT - 1], stride);
            at += A::CHUNKS_IN_FLIGHT as u64 * warps;
        }
    }
}

/// Runs `pass` over the `len` elements of the view: full chunks of 32 packs a warp,
/// grid-strided ([`chunk_of`] says in which order), then the last partial chunk element by
/// element (lane `l` of slot `t` takes element `32 t + l` of it, so each slot's ballot is a
/// mask word as it stands). A pack's
/// coefficients are read once a thread where its channels never change (channels-last,
/// the grid's stride a whole number of rows), once a pack where the pack is one channel,
/// else per element.
///
/// # Safety
/// The pass's arrays must hold `len` elements aligned to `P`; the mask `ceil(len / 32)`
/// words (always, where the pass reads it); the coefficients as [`Coefficients::of`]; the
/// grid a whole number of warps.
#[inline(always)]
unsafe fn apply<A: ApplyPass, const P: usize>(pass: &A, extent: Extent, len: u64, mask: u64, k: Coefficients) {
    let chunk = (WARP_SIZE as usize * P) as u64;
    let lane = lane_id();
    let warp = (block_idx_x() * block_dim_x() + thread_idx_x()) as u64 / WARP_SIZE as u64;
    let warps = (grid_dim_x() * block_dim_x()) as u64 / WARP_SIZE as u64;
    let chunks = len / chunk;
    let words = mask as *mut u32;
    // The thread's first turn's element (any element where the warp has no turn).
    let first = chunk_of::<A>(warp.min(chunks.max(1) - 1), chunks.max(1));
    let walk = extent.at((first * WARP_SIZE as u64 + lane as u64) * P as u64);
    let stride = extent.stride(warps * chunk);
    let (span, walks) = ((warp, warps, chunks), (walk, stride));
    // SAFETY (whole body): as the caller promised; every channel a walk gives is one.
    unsafe {
        if !A::AFFINE {
            whole_chunks(pass, extent, span, walks, words, |_| [[0.0; P]; BATCH_NORM_COEFFICIENTS]);
        } else if extent.inner == 1 && stride.c == 0 {
            let fixed = if extent.channels % P as u32 == 0 {
                k.run::<P>(walk.c)
            } else {
                k.each::<P>(extent.channels::<P>(walk))
            };
            whole_chunks(pass, extent, span, walks, words, |_| fixed);
        } else if extent.inner % P as u32 == 0 {
            whole_chunks(pass, extent, span, walks, words, |walk| k.one::<P>(walk.c));
        } else {
            whole_chunks(pass, extent, span, walks, words, |walk| k.each::<P>(extent.channels::<P>(walk)));
        }
        // The partial chunk: the warp whose turn comes after the whole ones.
        if chunks * chunk < len && warp == chunks % warps {
            unroll::<P>(|t| {
                let i = chunks * chunk + (t as u64) * WARP_SIZE as u64 + lane as u64;
                let inside = i < len;
                let word = (i / 32) as usize;
                let bits = if A::READS_MASK && inside { (words.add(word).read() >> lane) & 1 } else { 0 };
                let coefficients =
                    if A::AFFINE && inside { k.each::<1>([extent.at(i).c]) } else { [[0.0]; BATCH_NORM_COEFFICIENTS] };
                let set = if inside { pass.pack::<1>(i, &coefficients, bits) } else { 0 };
                if A::WRITES_MASK && !words.is_null() {
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
/// `P`, the finalize's coefficients, and a grid of whole warps.
#[inline(always)]
pub unsafe fn forward_apply<T: Scalar, const ACT: Activation, const P: usize>(args: &BatchNormArgs) {
    // SAFETY: forwarded.
    unsafe { forward::<T, ACT, true, P>(args) }
}

/// The standalone `y = relu(x)` with its mask.
///
/// # Safety
/// As [`forward_apply`], without coefficients; the mask may be absent (0).
#[inline(always)]
pub unsafe fn relu_with_mask<T: Scalar, const P: usize>(args: &BatchNormArgs) {
    // SAFETY: forwarded.
    unsafe { forward::<T, { Activation::Relu }, false, P>(args) }
}

/// # Safety
/// As [`forward_apply`].
#[inline(always)]
unsafe fn forward<T: Scalar, const ACT: Activation, const AFFINE: bool, const P: usize>(args: &BatchNormArgs) {
    // SAFETY: forwarded.
    unsafe {
        let pass = ForwardPass::<T, ACT, AFFINE> {
            x: Flat::new(args.x),
            addend: Flat::new(args.second),
            y: Flat::new(args.output),
        };
        apply::<_, P>(&pass, Extent::of(args), len(args), args.mask, Coefficients::of(args));
    }
}

/// # Safety
/// As [`forward_apply`], the mask present where `ACT` has a ReLU.
#[inline(always)]
pub unsafe fn backward_apply<T: Scalar, const ACT: Activation, const P: usize>(args: &BatchNormArgs) {
    // SAFETY: forwarded.
    unsafe { backward::<T, ACT, true, P>(args) }
}

/// The standalone ReLU backward from the mask.
///
/// # Safety
/// As [`forward_apply`], without coefficients, with the mask.
#[inline(always)]
pub unsafe fn relu_backward_from_mask<T: Scalar, const P: usize>(args: &BatchNormArgs) {
    // SAFETY: forwarded.
    unsafe { backward::<T, { Activation::Relu }, false, P>(args) }
}

/// # Safety
/// As [`backward_apply`].
#[inline(always)]
unsafe fn backward<T: Scalar, const ACT: Activation, const AFFINE: bool, const P: usize>(args: &BatchNormArgs) {
    // SAFETY: forwarded.
    unsafe {
        let pass = BackwardPass::<T, ACT, AFFINE> {
            dy: Flat::new(args.second),
            x: Flat::new(args.x),
            dx: Flat::new(args.output),
            daddend: Flat::new(args.second_output),
        };
        apply::<_, P>(&pass, Extent::of(args), len(args), args.mask, Coefficients::of(args));
    }
}

/// The ReLU backward from `y` (`args.x` holds y).
///
/// # Safety
/// As [`forward_apply`], without coefficients.
#[inline(always)]
pub unsafe fn relu_backward<T: Scalar, const P: usize>(args: &BatchNormArgs) {
    // SAFETY: forwarded.
    unsafe {
        let pass =
            ReluBackwardPass::<T> { dy: Flat::new(args.second), y: Flat::new(args.x), dx: Flat::new(args.output) };
        apply::<_, P>(&pass, Extent::of(args), len(args), 0, Coefficients::of(args));
    }
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
        let step = WARP_SIZE as u64 * P as u64;
        let mut add = |fetched| {
            let (a, b) = terms.terms::<P>(fetched, [center; P]);
            unroll::<P>(|j| {
                first += a[j];
                second += b[j];
            });
        };
        // Four packs' loads in flight per lane, then the rest one by one.
        let mut i = head_end + lane * P as u64;
        while i + 3 * step < packs_end {
            let fetch = |u: u64| terms.fetch::<P>(i + u * step);
            let fetched = (fetch(0), fetch(1), fetch(2), fetch(3));
            add(fetched.0);
            add(fetched.1);
            add(fetched.2);
            add(fetched.3);
            i += 4 * step;
        }
        while i < packs_end {
            add(terms.fetch::<P>(i));
            i += step;
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

/// Channel terms as column sums (`inner == 1`) over a view `groups` rows of channels wide,
/// so that at few channels every lane of a tile still has a column: column `col` is channel
/// `col % channels`, and a pack past the last element adds nothing. A lane's centers are
/// read once.
struct ColumnChannels<'a, C> {
    terms: &'a C,
    channels: u64,
    width: u64,
    len: u64,
}

impl<C: ChannelTerms, const P: usize> ColumnTerms<P> for ColumnChannels<'_, C> {
    type Loaded = C::Fetched<P>;
    /// The centers of the lane's channels, and its column.
    type Lane = ([f32; P], u64);

    #[inline(always)]
    unsafe fn lane(&self, col: u64) -> Self::Lane {
        // SAFETY: forwarded; `% channels` keeps every index a channel.
        (unrolled_array(|j| unsafe { self.terms.center(((col + j as u64) % self.channels) as u32) }), col)
    }

    #[inline(always)]
    unsafe fn load(&self, row: u64, col: u64) -> C::Fetched<P> {
        let i = row * self.width + col;
        // SAFETY: forwarded; a pack past the end reads the first one instead, and `add`
        // drops it.
        unsafe { self.terms.fetch::<P>(if i < self.len { i } else { 0 }) }
    }

    #[inline(always)]
    unsafe fn add(
        &self,
        (centers, col): &Self::Lane,
        row: u64,
        loaded: C::Fetched<P>,
        first: &mut [f32; P],
        second: &mut [f32; P],
    ) {
        if row * self.width + col < self.len {
            let (a, b) = self.terms.terms::<P>(loaded, *centers);
            unroll::<P>(|j| {
                first[j] += a[j];
                second[j] += b[j];
            });
        }
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
            let width = args.channels * args.groups;
            let at = Columns {
                rows: args.outer.div_ceil(args.groups),
                cols: width,
                rows_per_chunk: args.part_len,
                chunks: args.parts,
                interleaved: true,
                partial: args.partial,
            };
            let view = ColumnChannels { terms, channels: args.channels, width, len: args.outer * args.channels };
            columns::chunk_sums::<_, P>(&view, &at);
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
/// table's pack, 1: a block per channel.
///
/// # Safety
/// `args` must describe live per-channel arrays, `partial` as the sums wrote it, and
/// `coefficients` of `2 x channels` f32.
#[inline(always)]
pub unsafe fn finalize_forward<T: Scalar, const ONE: usize>(args: &BatchNormArgs) {
    let count = (args.outer * args.inner) as f32;
    let (mut c, blocks) = channel_blocks();
    let writer = thread_idx_x() == 0;
    // SAFETY (whole body): `c < channels` indexes every per-channel array; thread 0 writes.
    unsafe {
        let shifts = StatsTerms::<T> { x: Flat::new(args.x), inner: args.inner };
        let weight = PerChannel::new(args.weight);
        let bias = PerChannel::new(args.bias);
        let running_mean = PerChannel::new(args.running_mean);
        let running_var = PerChannel::new(args.running_var);
        let coefficients = args.coefficients as *mut f32;
        while c < args.channels {
            // Every per-channel value is loaded before the parts, so that its latency
            // overlaps theirs instead of following them.
            let ch = c as u32;
            let shift = if args.parts == 0 { 0.0 } else { shifts.center(ch) };
            let running = (running_mean.get(ch, 0.0), running_var.get(ch, 0.0));
            let (scale, offset) = (weight.get(ch, 1.0), bias.get(ch, 0.0));
            let (mean, var) = if args.parts == 0 {
                running
            } else {
                let (first, second) = part_totals(args, c);
                let m = first / count;
                // Clamped at 0 (rounding can take it below) by a max that keeps NaN: a NaN or
                // infinite value makes the channel's variance NaN, as PyTorch's.
                (shift + m, (second / count - m * m).maximum(0.0))
            };
            let invstd = rsqrt(var + args.eps);
            if writer {
                if args.parts != 0 {
                    if args.save_mean != 0 {
                        (args.save_mean as *mut f32).add(c as usize).write(mean);
                        (args.save_invstd as *mut f32).add(c as usize).write(invstd);
                    }
                    if args.running_mean != 0 {
                        let m = args.momentum;
                        let unbiased = if count > 1.0 { var * count / (count - 1.0) } else { var };
                        (args.running_mean as *mut f32).add(c as usize).write((1.0 - m) * running.0 + m * mean);
                        (args.running_var as *mut f32).add(c as usize).write((1.0 - m) * running.1 + m * unbiased);
                    }
                }
                let at = |k: u64| (k * args.channels + c) as usize;
                coefficients.add(at(0)).write(scale * invstd);
                coefficients.add(at(1)).write(mean);
                coefficients.add(at(2)).write(offset);
            }
            c += blocks;
        }
    }
}

/// `(block, blocks)`: the finalize kernels take a channel a block.
#[inline(always)]
fn channel_blocks() -> (u64, u64) {
    (block_idx_x() as u64, grid_dim_x() as u64)
}

/// Channel `c`'s two sums over its parts (and groups), in thread 0: thread `t` adds parts
/// `t, t + threads, ...` in order, four loads in flight; each warp's sums add up in a fixed
/// tree, then warp 0 adds the warps' in order, so every run gives the same bits.
///
/// # Safety
/// `partial` must hold `2 x parts x groups x channels` f32 and `c` be a channel; the whole
/// block must call it, with `2 x warps` f32 of dynamic shared memory.
#[inline(always)]
unsafe fn part_totals(args: &BatchNormArgs, c: u64) -> (f32, f32) {
    let partial = args.partial as *const f32;
    let parts = args.parts * args.groups;
    let second_at = (parts * args.channels) as usize;
    let (mut first, mut second) = (0.0, 0.0);
    let step = block_dim_x() as u64;
    let mut part = thread_idx_x() as u64;
    // SAFETY (loads): a part past the last adds nothing and reads nothing.
    let load = |part: u64| unsafe {
        let at = (part * args.channels + c) as usize;
        if part < parts { (partial.add(at).read(), partial.add(second_at + at).read()) } else { (0.0, 0.0) }
    };
    // Four loads in flight, predicated rather than a tail loop, so that a thread with
    // fewer than four parts still issues them together.
    while part < parts {
        let loaded = (load(part), load(part + step), load(part + 2 * step), load(part + 3 * step));
        first += loaded.0.0 + loaded.1.0 + loaded.2.0 + loaded.3.0;
        second += loaded.0.1 + loaded.1.1 + loaded.2.1 + loaded.3.1;
        part += 4 * step;
    }
    let (first, second) = (warp_sum(first), warp_sum(second));
    let (warp, warps) = (thread_idx_x() / WARP_SIZE, block_dim_x() / WARP_SIZE);
    let scratch = dynamic_shared::<f32>();
    // SAFETY: the scratch holds two f32 a warp; the barriers order its writes and reads,
    // and the last one keeps the next channel's writes after these reads.
    unsafe {
        if lane_id() == 0 {
            scratch.add(2 * warp as usize).write(first);
            scratch.add(2 * warp as usize + 1).write(second);
        }
        sync_threads();
        let (mut first, mut second) = (0.0, 0.0);
        if thread_idx_x() == 0 {
            for w in 0..warps as usize {
                first += scratch.add(2 * w).read();
                second += scratch.add(2 * w + 1).read();
            }
        }
        sync_threads();
        (first, second)
    }
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
    let (mut c, blocks) = channel_blocks();
    // SAFETY (whole body): `c < channels` indexes every per-channel array; thread 0 writes.
    unsafe {
        let weight = PerChannel::new(args.weight);
        let coefficients = args.coefficients as *mut f32;
        while c < args.channels {
            // Loaded before the parts, as in the forward's finalize.
            let mean = (args.save_mean as *const f32).add(c as usize).read();
            let invstd = (args.save_invstd as *const f32).add(c as usize).read();
            let scale = weight.get(c as u32, 1.0) * invstd;
            let (sum_g, sum_gx) = part_totals(args, c);
            if thread_idx_x() != 0 {
                c += blocks;
                continue;
            }
            if args.dbias != 0 {
                (args.dbias as *mut f32).add(c as usize).write(sum_g);
            }
            if args.dweight != 0 {
                (args.dweight as *mut f32).add(c as usize).write(sum_gx * invstd);
            }
            let at = |k: u64| (k * args.channels + c) as usize;
            coefficients.add(at(0)).write(scale);
            coefficients.add(at(1)).write(mean);
            coefficients.add(at(2)).write(-scale * sum_g / count);
            coefficients.add(at(3)).write(-scale * invstd * invstd * sum_gx / count);
            c += blocks;
        }
    }
}
