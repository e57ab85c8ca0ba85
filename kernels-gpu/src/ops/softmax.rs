//! Softmax and log-softmax over the rows of a `(rows, cols)` view, forward and backward:
//! their math as hooks of the row engine ([`crate::ops::rows`]), which runs them on every
//! path.
//!
//! Every kernel reads through a [`Load`] and writes through a [`Store`], so the fused
//! variants (scale and mask, causal mask, cross entropy's gradient) are functors over the
//! same hooks. Cross entropy's loss and logsumexp need only each row's statistics
//! ([`RowValue`]): the engine reads each row once and writes a value per row.

use super::rows::RowSplit;
use super::rows::backward::{BackwardRows, NoGather, RowGradient};
use super::rows::forward::{Accumulate, CachedPass, ForwardRows, NoElements, RowForward, RowOutput, RowPass, two_pass};
use crate::abi::{CROSS_ENTROPY_IGNORE_INDEX, Divisor, RowShape, SOFTMAX_BACKWARD_HELD_PACKS, SoftmaxArgs};
use crate::arch::wait_async_copies;
use crate::arch::{ex2, fma, lg2, rcp};
use crate::math::{LN_2, LOG2_E, exp};
#[cfg(feature = "fuse")]
use crate::pack::StoreOne;
use crate::pack::{DirectLoad, DirectStore, Load, LoadOne, Pack, RowMajor, Store};
use crate::reduce::{MAX_WORDS, Max, Reduce, Sum, Words};
use crate::scalar::Scalar;
use crate::table::RowPath;
use crate::unroll::{unroll, unrolled_array};
use core::num::NonZeroU32;

/// Turns a row's max and sum of exponentials into outputs.
#[derive(Clone, Copy)]
struct Normalize {
    max: f32,
    inv_sum: f32,
    log2_sum: f32,
    log_sum: f32,
    log: bool,
}

impl Normalize {
    #[inline(always)]
    fn new(max: f32, sum: f32, log: bool) -> Self {
        let log2_sum = lg2(sum);
        Normalize { max, inv_sum: rcp(sum), log2_sum, log_sum: log2_sum * LN_2, log }
    }

    /// The output for an element that holds `e^(x - max)` (softmax) or `x` (log-softmax).
    #[inline(always)]
    fn apply(self, held: f32) -> f32 {
        if self.log { held - self.max - self.log_sum } else { held * self.inv_sum }
    }

    /// Softmax's output for `x`: `e^(x - max) / sum` as one exponential,
    /// `2^((x - max) log2(e) - log2(sum))`, a multiply an element fewer than the quotient
    /// (the fused kernels' output passes are issue-bound). Exact where the quotient is: a
    /// one-element row gives `2^0`, a `-inf` gives 0.
    #[inline(always)]
    fn softmax(self, x: f32) -> f32 {
        ex2(fma(x - self.max, LOG2_E, -self.log2_sum))
    }
}

/// Running max and sum of exponentials relative to it (online softmax), so one read of
/// the row gives both; the cluster path reduces the threads' at once ([`MergeOnline`]).
#[derive(Clone, Copy)]
struct Online {
    max: f32,
    sum: f32,
}

impl Words for Online {
    const COUNT: usize = 2;
    #[inline(always)]
    fn to_words(self) -> [u32; MAX_WORDS] {
        [self.max.to_bits(), self.sum.to_bits()]
    }
    #[inline(always)]
    fn from_words(w: [u32; MAX_WORDS]) -> Self {
        Online { max: f32::from_bits(w[0]), sum: f32::from_bits(w[1]) }
    }
}

/// Merges [`Online`] sums by rescaling the one at the smaller max to the larger: one
/// exponential a merge (none at equal maxes, which also keeps `e^(-inf - -inf)` out). A NaN
/// max on either side makes the merged max NaN, and its sum (no comparison orders a NaN, so
/// the scale is `e^NaN`).
struct MergeOnline;

impl Reduce for MergeOnline {
    type Value = Online;
    const IDENTITY: Online = Online { max: f32::NEG_INFINITY, sum: 0.0 };

    #[inline(always)]
    fn combine(a: Online, b: Online) -> Online {
        let (big, small) = if a.max >= b.max { (a, b) } else { (b, a) };
        let scale = if small.max == big.max { 1.0 } else { exp(small.max - big.max) };
        Online { max: a.max.maximum(b.max), sum: big.sum + small.sum * scale }
    }
}

impl Accumulate for Online {
    /// A NaN in the pack makes the max NaN (`maximum`, as [`Max`]), and the max's change is
    /// found by `!=` (not `>`, which a NaN fails), so the sum turns NaN too: a thread whose
    /// first values are NaN (or NaN and `-inf`) keeps the NaN instead of skipping it.
    #[inline(always)]
    fn add<const P: usize>(&mut self, v: [f32; P]) {
        let mut pack_max = f32::NEG_INFINITY;
        unroll::<P>(|j| pack_max = pack_max.maximum(v[j]));
        let max = self.max.maximum(pack_max);
        if max != self.max {
            self.sum *= exp(self.max - max);
            self.max = max;
        }
        if self.max > f32::NEG_INFINITY {
            unroll::<P>(|j| self.sum += exp(v[j] - self.max));
        }
    }
}

/// The max and sum of `e^(x - max)` of `online` (a thread's share of a row) over the blocks
/// sharing the row: at once where the split merges reductions, else the max first.
#[inline(always)]
unsafe fn reduce_online<R: RowSplit>(split: &R, online: Online) -> (f32, f32) {
    // SAFETY: forwarded to the caller (every thread of the row's blocks calls this).
    unsafe {
        if R::MERGES_REDUCTIONS {
            let total = split.all_reduce::<MergeOnline>(online);
            (total.max, total.sum)
        } else {
            let max = split.all_reduce::<Max>(online.max);
            // A thread that saw only -inf contributes 0 (its max is -inf, its sum 0); one that saw
            // a NaN made the row's max NaN.
            let rescaled = if online.max > f32::NEG_INFINITY { online.sum * exp(online.max - max) } else { 0.0 };
            (max, split.all_reduce::<Sum>(rescaled))
        }
    }
}

/// A softmax kind's forward: the row's max is its center, the sum of `e^(x - max)` its
/// spread; `V` is what the kind writes per row.
struct Softmax<V> {
    log: bool,
    value: V,
}

impl<V: RowValue> RowForward for Softmax<V> {
    type Stats = Normalize;
    type Center = Max;
    type Params<const P: usize> = ();
    type Prepared<const P: usize> = ();

    /// `e^(-inf - max)` is 0 already.
    const MASKS_PADDING: bool = false;
    const ELEMENTS: bool = V::ELEMENTS;
    /// A `-inf` adds nothing to the max and the sum.
    const SKIPS_MASKED: bool = true;

    #[inline(always)]
    fn center(&self, max: f32) -> f32 {
        max
    }

    #[inline(always)]
    fn spread(&self, x: f32, max: f32) -> f32 {
        exp(x - max)
    }

    #[inline(always)]
    fn stats(&self, max: f32, sum: f32) -> Normalize {
        Normalize::new(max, sum, self.log)
    }

    /// Softmax keeps `e^(x - max)`; log-softmax keeps `x` and only sums.
    #[inline(always)]
    fn keep(&self, x: f32, e: f32) -> f32 {
        if self.log { x } else { e }
    }

    /// Where not kept, `e^(x - max)` is computed again rather than cached: a cache holds the
    /// row's own dtype, which would round it.
    #[inline(always)]
    fn output<const P: usize>(&self, norm: Normalize, v: [f32; P], kept: bool, (): ()) -> [f32; P] {
        unrolled_array(|j| if kept || norm.log { norm.apply(v[j]) } else { norm.softmax(v[j]) })
    }

    #[inline(always)]
    unsafe fn fetch_params<const P: usize>(&self, _col: u64) {}

    #[inline(always)]
    fn prepare<const P: usize>(&self, (): ()) {}

    #[inline(always)]
    unsafe fn write_row<L: LoadOne>(&self, load: &L, row: u64, norm: Normalize) {
        // SAFETY: forwarded.
        unsafe { self.value.write(load, row, norm) }
    }

    #[inline(always)]
    unsafe fn prefetch_row(&self, row: u64) {
        // SAFETY: forwarded.
        unsafe { self.value.prefetch(row) }
    }

    /// One read: max and sum at once, online.
    #[inline(always)]
    unsafe fn streamed_stats<R: RowSplit, const P: usize>(&self, split: &R, pass: &impl RowPass<P>) -> Normalize {
        let mut online = Online { max: f32::NEG_INFINITY, sum: 0.0 };
        if let Some(x) = pass.edge() {
            online.add([x]);
        }
        // SAFETY: forwarded.
        let (max, sum) = unsafe {
            pass.packs(&mut online);
            reduce_online(split, online)
        };
        self.stats(max, sum)
    }

    /// Where the split merges reductions: max and sum at once, online over the packs as
    /// they land where the cache copies (the exponentials overlap the row's loads rather
    /// than following them; a cache filled through registers is complete here, so one
    /// exponential more a pack would buy nothing), else each thread's two passes merged.
    /// A block whose load transforms every cached read ([`Load::TRANSFORMS`]) takes the
    /// online pass too, once its copies have landed: one pass of transforms less, and no
    /// wait per pack (the blocks an SM holds overlap one another's loads).
    #[inline(always)]
    unsafe fn cached_stats<L: Load<P>, R: RowSplit, const P: usize>(
        &self,
        split: &R,
        pass: &CachedPass<'_, L, P>,
    ) -> Normalize {
        // SAFETY (whole body): forwarded.
        let (max, sum) = unsafe {
            if (R::MERGES_REDUCTIONS && pass.copies()) || L::TRANSFORMS {
                let mut online = Online { max: f32::NEG_INFINITY, sum: 0.0 };
                if let Some(x) = pass.edge() {
                    online.add([x]);
                }
                if R::MERGES_REDUCTIONS && pass.copies() {
                    pass.landed(&mut online);
                } else {
                    wait_async_copies();
                    pass.packs(&mut online);
                }
                reduce_online(split, online)
            } else if R::MERGES_REDUCTIONS {
                wait_async_copies();
                let max = pass.fold::<Max>();
                // A thread that saw only -inf contributes (-inf, 0): no e^(-inf - -inf). One that
                // saw a NaN contributes a NaN max, which the merge keeps.
                let sum = if max > f32::NEG_INFINITY { pass.spread(self, max) } else { 0.0 };
                reduce_online(split, Online { max, sum })
            } else {
                wait_async_copies();
                return two_pass(self, split, pass);
            }
        };
        self.stats(max, sum)
    }
}

/// Backward from `y` and `dy`: softmax `dx = (dy - sum(dy * y)) * y`; log-softmax
/// `dx = dy - exp(y) * sum(dy)`.
#[derive(Clone, Copy, Default)]
struct Gradient {
    log: bool,
    sum: f32,
}

impl RowGradient<1> for Gradient {
    type Row = Gradient;

    #[inline(always)]
    fn term(&self, _k: usize, y: f32, dy: f32) -> f32 {
        if self.log { dy } else { dy * y }
    }

    #[inline(always)]
    unsafe fn row(&self, _row: Option<u64>, &[sum]: &[f32; 1]) -> Gradient {
        Gradient { sum, ..*self }
    }

    #[inline(always)]
    fn apply(g: Gradient, y: f32, dy: f32) -> f32 {
        if g.log { dy - exp(y) * g.sum } else { (dy - g.sum) * y }
    }
}

/// `x * scale + mask[row % period]`: attention scores with an additive mask broadcast over
/// the rows (batch and heads).
pub struct ScaleMaskLoad<T> {
    x: DirectLoad<T>,
    mask: DirectLoad<T>,
    /// The mask's rows; with the rows below 2^32 ([`crate::abi::MASKED_MAX_ROWS`]).
    period: NonZeroU32,
    scale: f32,
}

impl<T: Scalar> ScaleMaskLoad<T> {
    /// The mask's pack at `col` for `row`.
    ///
    /// # Safety
    /// As [`Load::fetch`]; the mask has `period` rows of the input's width, and `row` fits
    /// in 32 bits (the host checks the rows).
    #[inline(always)]
    unsafe fn mask_at<const N: usize>(&self, row: u64, col: u64) -> Pack<T, N> {
        // SAFETY: forwarded to the caller.
        unsafe { self.mask.fetch(u64::from(row as u32 % self.period), col) }
    }
}

/// The block paths cache x as it is and add the mask on every read of the cache, as the
/// causal kind masks it: the cache takes x's bytes (half an f32 cache's in 16 bits) and is
/// copied with `cp.async`, so a block copies its next row while it writes the last. Each
/// read of the cache then reads the mask too, so the statistics take one pass
/// ([`Load::TRANSFORMS`]). Against the sum cached in f32 this halves a 16-bit row's cache and
/// copies it without registers, which is worth the mask's re-read on each read of the cache
/// (docs/DECISIONS.md, "`cp.async` row caches").
impl<T: Scalar, const N: usize> Load<N> for ScaleMaskLoad<T> {
    const TRANSFORMS: bool = true;

    type Fetched = (Pack<T, N>, Pack<T, N>);
    type Exact = T;

    #[inline(always)]
    unsafe fn fetch(&self, row: u64, col: u64) -> Self::Fetched {
        // SAFETY: forwarded.
        unsafe { (self.x.fetch(row, col), self.mask_at(row, col)) }
    }

    #[inline(always)]
    unsafe fn convert(&self, (x, mask): Self::Fetched, _row: u64, _col: u64) -> [f32; N] {
        let (x, m) = (x.to_f32(), mask.to_f32());
        unrolled_array(|j| x[j] * self.scale + m[j])
    }

    #[inline(always)]
    fn source(&self) -> Option<RowMajor<T>> {
        Some(self.x.0)
    }

    #[inline(always)]
    unsafe fn transform(&self, x: [f32; N], row: u64, col: u64) -> [f32; N] {
        // SAFETY: forwarded.
        let m = unsafe { self.mask_at::<N>(row, col) }.to_f32();
        unrolled_array(|j| x[j] * self.scale + m[j])
    }
}

/// A load whose values a cache holds as computed, in f32, staged through registers: no
/// source, so no transform on the cache's reads. The masked kind's f32 clusters take it:
/// its cache takes x's bytes either way, and with one block an SM nothing overlaps the mask re-read
/// on each pass (docs/DECISIONS.md, "The masked kind's f32 clusters cache the sum").
struct Staged<'a, L>(&'a L);

impl<L: Load<N>, const N: usize> Load<N> for Staged<'_, L> {
    type Fetched = L::Fetched;
    type Exact = f32;

    #[inline(always)]
    unsafe fn fetch(&self, row: u64, col: u64) -> Self::Fetched {
        // SAFETY: forwarded.
        unsafe { self.0.fetch(row, col) }
    }

    #[inline(always)]
    unsafe fn convert(&self, fetched: Self::Fetched, row: u64, col: u64) -> [f32; N] {
        // SAFETY: forwarded.
        unsafe { self.0.convert(fetched, row, col) }
    }
}

/// `x * scale` where `col <= row % period` (a query sees keys up to its own position,
/// PyTorch's `is_causal`), `-inf` elsewhere.
pub struct CausalLoad<T> {
    x: DirectLoad<T>,
    period: Divisor,
    scale: f32,
}

impl<T: Scalar> CausalLoad<T> {
    /// How many of the pack at `col` the query of `row` sees (0 to `N`).
    #[inline(always)]
    fn visible<const N: usize>(&self, row: u64, col: u64) -> u32 {
        let last = self.period.remainder(row);
        // SAFETY: the host builds the divisor with `Divisor::new`, whose remainders are below
        // it. Told so, the compiler compares the column with `last` alone where only whether
        // the pack is seen matters (the fetch), as it did with the `%` operator.
        unsafe { core::hint::assert_unchecked(last < self.period.divisor) };
        if col > last { 0 } else { (last - col + 1).min(N as u64) as u32 }
    }

    /// The first `visible` of `x` scaled, the rest `-inf`: compared with the lane's constant
    /// index, in 32 bits (64-bit column compares a lane cost the warp tiers 30 registers).
    #[inline(always)]
    fn mask<const N: usize>(&self, x: [f32; N], visible: u32) -> [f32; N] {
        unrolled_array(|j| if (j as u32) < visible { x[j] * self.scale } else { f32::NEG_INFINITY })
    }
}

impl<T: Scalar, const N: usize> Load<N> for CausalLoad<T> {
    /// The pack and how many of it the query sees, found once as it is fetched.
    type Fetched = (Pack<T, N>, u32);
    type Exact = T;

    /// A pack wholly past the query's last key is masked whole, so the row's first aligned
    /// pack (column `col % N`: 0, or the head of a phased row) is read in its place: an L1 hit,
    /// and DRAM reads only the keys the query sees. The load stays unconditional (a
    /// predicated one merged with a fill made ptxas wait on each).
    #[inline(always)]
    unsafe fn fetch(&self, row: u64, col: u64) -> (Pack<T, N>, u32) {
        let visible = self.visible::<N>(row, col);
        // SAFETY: forwarded; column `col % N` starts an aligned pack of the same row.
        (unsafe { self.x.fetch(row, if visible > 0 { col } else { col % N as u64 }) }, visible)
    }

    #[inline(always)]
    unsafe fn convert(&self, (x, visible): (Pack<T, N>, u32), _row: u64, _col: u64) -> [f32; N] {
        self.mask(x.to_f32(), visible)
    }

    #[inline(always)]
    fn source(&self) -> Option<RowMajor<T>> {
        Some(self.x.0)
    }

    /// The keys the query sees; the transform masks the others whatever the cache holds.
    #[inline(always)]
    fn reads(&self, row: u64, col: u64) -> bool {
        self.visible::<N>(row, col) > 0
    }

    #[inline(always)]
    unsafe fn transform(&self, x: [f32; N], row: u64, col: u64) -> [f32; N] {
        self.mask(x, self.visible::<N>(row, col))
    }
}

/// The class of `row`: `Some(class)` inside the row, `None` for the ignore index, and
/// `Some(u64::MAX)` (matches no column) for anything else.
#[inline(always)]
unsafe fn target_of(target: *const i64, row: u64, cols: u64) -> Option<u64> {
    // SAFETY: the caller passes the row's target array.
    let t = unsafe { target.add(row as usize).read() };
    if t == CROSS_ENTROPY_IGNORE_INDEX {
        None
    } else if t >= 0 && (t as u64) < cols {
        Some(t as u64)
    } else {
        Some(u64::MAX)
    }
}

/// What a softmax kind writes per row: nothing for the kinds whose outputs are the row's
/// elements (`()`), or a value from the row's statistics alone (cross entropy's loss,
/// logsumexp's value), where each row is read once and no element is written.
trait RowValue {
    /// Whether the kind's outputs are the row's elements.
    const ELEMENTS: bool;

    /// Writes row `row`'s value from its statistics.
    ///
    /// # Safety
    /// `row` must be a row of the view `load` reads, whose per-row arrays this holds.
    unsafe fn write<L: LoadOne>(&self, load: &L, row: u64, norm: Normalize);

    /// As [`RowForward::prefetch_row`]: nothing by default.
    ///
    /// # Safety
    /// As [`RowValue::write`].
    #[inline(always)]
    unsafe fn prefetch(&self, _row: u64) {}
}

impl RowValue for () {
    const ELEMENTS: bool = true;

    #[inline(always)]
    unsafe fn write<L: LoadOne>(&self, _load: &L, _row: u64, _norm: Normalize) {}
}

/// Cross entropy's output: a loss per row, `max + ln(sum) - x[target]` from the row's
/// statistics; 0 where the target is ignored, NaN where it is outside the row.
struct Loss {
    target: *const i64,
    loss: *mut f32,
    cols: u64,
}

impl RowValue for Loss {
    const ELEMENTS: bool = false;

    #[inline(always)]
    unsafe fn prefetch(&self, row: u64) {
        // SAFETY: the target holds one element per row.
        unsafe { crate::arch::prefetch_l1_element(self.target, row) }
    }

    #[inline(always)]
    unsafe fn write<L: LoadOne>(&self, load: &L, row: u64, norm: Normalize) {
        // SAFETY: forwarded; a target inside the row is an element of it.
        unsafe {
            let value = match target_of(self.target, row, self.cols) {
                None => 0.0,
                Some(u64::MAX) => f32::NAN,
                // `x - max` first: exact near the max, where a small loss would cancel.
                Some(t) => norm.log_sum - (load.load_one(row, t) - norm.max),
            };
            self.loss.add(row as usize).write(value);
        }
    }
}

/// `ln(sum(e^x))` of each row, as f32: `max + ln(sum)`, or the max where it is infinite, as
/// PyTorch (which shifts by 0 there): `+inf` for a row holding `+inf` and `-inf` for a row of
/// `-inf` only, where `max + ln(sum)` is NaN (the sum holds `e^(inf - inf)`, or on the warp
/// path `e^(-inf - -inf)`). A NaN anywhere in the row is the max, so the value is NaN.
struct LogSumExp {
    out: *mut f32,
}

impl RowValue for LogSumExp {
    const ELEMENTS: bool = false;

    #[inline(always)]
    unsafe fn write<L: LoadOne>(&self, _load: &L, row: u64, norm: Normalize) {
        // SAFETY: forwarded; `out` holds a value per row.
        unsafe {
            let value = if norm.max.is_infinite() { norm.max } else { norm.max + norm.log_sum };
            self.out.add(row as usize).write(value);
        }
    }
}

/// Cross-entropy backward: given a row's probabilities, stores
/// `(p - onehot(target)) * dloss[row]` (0 for ignored rows).
pub struct CrossEntropyGrad<T> {
    out: DirectStore<T>,
    target: *const i64,
    dloss: *const f32,
    cols: u64,
}

impl<T: Scalar, const P: usize> RowOutput<P> for CrossEntropyGrad<T> {
    type Row = CrossEntropyGradRow<T>;

    #[inline(always)]
    unsafe fn row(&self, row: u64) -> CrossEntropyGradRow<T> {
        // SAFETY: target and dloss hold one element per row.
        unsafe {
            let target = target_of(self.target, row, self.cols);
            let scale = if target.is_some() { self.dloss.add(row as usize).read() } else { 0.0 };
            CrossEntropyGradRow { out: self.out, target: target.unwrap_or(u64::MAX), scale }
        }
    }

    #[inline(always)]
    unsafe fn prefetch(&self, row: u64) {
        // SAFETY: target and dloss hold one element per row.
        unsafe {
            crate::arch::prefetch_l1_element(self.target, row);
            crate::arch::prefetch_l1_element(self.dloss, row);
        }
    }
}

/// [`CrossEntropyGrad`] for one row: its target column (`u64::MAX` for none) and scale.
pub struct CrossEntropyGradRow<T> {
    out: DirectStore<T>,
    target: u64,
    scale: f32,
}

impl<T: Scalar, const N: usize> Store<N> for CrossEntropyGradRow<T> {
    #[inline(always)]
    unsafe fn store(&self, values: [f32; N], row: u64, col: u64) {
        // The target's lane in this pack, if any, compared with each lane's constant index in 32
        // bits (64-bit column compares cost the warp tiers up to 30 registers).
        let lane = self.target.wrapping_sub(col);
        let lane = if lane < N as u64 { lane as u32 } else { u32::MAX };
        let grad: [f32; N] = unrolled_array(|j| (values[j] - if j as u32 == lane { 1.0 } else { 0.0 }) * self.scale);
        // SAFETY: forwarded.
        unsafe { self.out.store(grad, row, col) }
    }
}

/// # Safety (every kernel body below)
/// `args` must describe live arrays of `rows x cols` elements of `T` (row stride `cols`),
/// each starting `args.shape.phase` elements past a 16-byte boundary, with either every row
/// aligned to `P` elements or `PATH` a block path (which runs each row from its head), and
/// a launch with the geometry the host's dispatch planned for `PATH`.
#[inline(always)]
unsafe fn direct<T: Scalar, const PATH: RowPath>(address: u64, shape: &RowShape) -> (DirectLoad<T>, DirectStore<T>) {
    // SAFETY: forwarded (the host passes a phase only to kernels that run phased rows).
    let view = unsafe { super::rows::row_view::<T>(address, shape, PATH) };
    (DirectLoad(view), DirectStore(view))
}

#[inline(always)]
pub unsafe fn forward<T: Scalar, const P: usize, const PATH: RowPath>(args: &SoftmaxArgs) {
    // SAFETY: see `direct`.
    unsafe {
        let (load, _) = direct::<T, PATH>(args.input, &args.shape);
        let (_, store) = direct::<T, PATH>(args.output, &args.shape);
        ForwardRows::<_, _, _, P> { op: &elements(args), load: &load, outputs: &store, shape: &args.shape }
            .run::<PATH>();
    }
}

#[inline(always)]
pub unsafe fn backward<T: Scalar, const P: usize, const PATH: RowPath>(args: &SoftmaxArgs) {
    // SAFETY: see `direct`.
    unsafe {
        let (load_y, _) = direct::<T, PATH>(args.input, &args.shape);
        let (load_dy, _) = direct::<T, PATH>(args.second, &args.shape);
        let (_, store) = direct::<T, PATH>(args.output, &args.shape);
        let op = Gradient { log: args.log != 0, sum: 0.0 };
        let rows = BackwardRows::<_, _, _, _, _, 1, P> {
            op: &op,
            load_a: &load_y,
            load_b: &load_dy,
            store: &store,
            gather: &NoGather,
            shape: &args.shape,
        };
        rows.run::<PATH, SOFTMAX_BACKWARD_HELD_PACKS, 0>();
    }
}

/// The forward of a kind whose outputs are the row's elements.
#[inline(always)]
fn elements(args: &SoftmaxArgs) -> Softmax<()> {
    Softmax { log: args.log != 0, value: () }
}

/// The mask's rows as a 32-bit divisor (the host never passes 0; 1 stands in if it did):
/// the masked kind keeps its rows within [`crate::abi::MASKED_MAX_ROWS`]. A `%`, not the
/// causal kind's [`Divisor`]: the compiler computes it before each loop over the row's
/// packs, where the divisor's quotient, computed once a row, held registers across the row
/// (the uncached kernels 7-15 more, one block of 512 threads an SM where two fitted).
#[inline(always)]
fn mask_period(args: &SoftmaxArgs) -> NonZeroU32 {
    NonZeroU32::new(args.period.divisor as u32).unwrap_or(NonZeroU32::MIN)
}

#[inline(always)]
pub unsafe fn scale_mask<T: Scalar, const P: usize, const PATH: RowPath>(args: &SoftmaxArgs) {
    // SAFETY: see `direct`; the mask has `period` rows, and the rows are at most
    // `MASKED_MAX_ROWS` (the host checks).
    unsafe {
        let load = ScaleMaskLoad {
            x: direct::<T, PATH>(args.input, &args.shape).0,
            mask: direct::<T, PATH>(args.second, &args.shape).0,
            period: mask_period(args),
            scale: args.scale,
        };
        let (_, store) = direct::<T, PATH>(args.output, &args.shape);
        let op = &elements(args);
        if PATH.clustered() && T::BYTES == 4 {
            ForwardRows::<_, _, _, P> { op, load: &Staged(&load), outputs: &store, shape: &args.shape }.run::<PATH>();
        } else {
            ForwardRows::<_, _, _, P> { op, load: &load, outputs: &store, shape: &args.shape }.run::<PATH>();
        }
    }
}

#[inline(always)]
pub unsafe fn causal<T: Scalar, const P: usize, const PATH: RowPath>(args: &SoftmaxArgs) {
    // SAFETY: see `direct`.
    unsafe {
        let load =
            CausalLoad { x: direct::<T, PATH>(args.input, &args.shape).0, period: args.period, scale: args.scale };
        let (_, store) = direct::<T, PATH>(args.output, &args.shape);
        ForwardRows::<_, _, _, P> { op: &elements(args), load: &load, outputs: &store, shape: &args.shape }
            .run::<PATH>();
    }
}

#[inline(always)]
pub unsafe fn cross_entropy<T: Scalar, const P: usize, const PATH: RowPath>(args: &SoftmaxArgs) {
    // SAFETY: see `direct`; target and loss have `rows` elements.
    unsafe {
        let (load, _) = direct::<T, PATH>(args.input, &args.shape);
        let loss = Loss { target: args.target as *const i64, loss: args.row_values as *mut f32, cols: args.shape.cols };
        let op = Softmax { log: false, value: loss };
        ForwardRows::<_, _, _, P> { op: &op, load: &load, outputs: &NoElements, shape: &args.shape }.run::<PATH>();
    }
}

#[inline(always)]
pub unsafe fn logsumexp<T: Scalar, const P: usize, const PATH: RowPath>(args: &SoftmaxArgs) {
    // SAFETY: see `direct`; `row_values` has `rows` elements.
    unsafe {
        let (load, _) = direct::<T, PATH>(args.input, &args.shape);
        let value = LogSumExp { out: args.row_values as *mut f32 };
        let op = Softmax { log: false, value };
        ForwardRows::<_, _, _, P> { op: &op, load: &load, outputs: &NoElements, shape: &args.shape }.run::<PATH>();
    }
}

#[inline(always)]
pub unsafe fn cross_entropy_backward<T: Scalar, const P: usize, const PATH: RowPath>(args: &SoftmaxArgs) {
    // SAFETY: see `direct`; target and dloss have `rows` elements. `args.log` is 0.
    unsafe {
        let (load, _) = direct::<T, PATH>(args.input, &args.shape);
        let grad = CrossEntropyGrad {
            out: direct::<T, PATH>(args.output, &args.shape).1,
            target: args.target as *const i64,
            dloss: args.row_values as *const f32,
            cols: args.shape.cols,
        };
        ForwardRows::<_, _, _, P> { op: &elements(args), load: &load, outputs: &grad, shape: &args.shape }
            .run::<PATH>();
    }
}

/// Softmax through a user's functors (`crate::fuse`).
///
/// # Safety
/// As [`crate::fuse::softmax`].
#[cfg(feature = "fuse")]
#[inline(always)]
pub unsafe fn fused<L, S, const P: usize, const PATH: RowPath>(shape: &RowShape, load: &L, store: &S)
where
    L: Load<P> + LoadOne,
    S: Store<P> + StoreOne + Copy,
{
    let op = Softmax { log: false, value: () };
    // SAFETY: forwarded to the caller.
    unsafe { ForwardRows::<_, _, _, P> { op: &op, load, outputs: store, shape }.run::<PATH>() }
}
