//! Softmax and log-softmax over the rows of a `(rows, cols)` view, forward and backward,
//! on the three paths of [`crate::ops::rows`] (warp, shared, uncached).
//!
//! Every kernel reads through a [`Load`] and writes through a [`Store`], so the fused
//! variants (scale and mask, causal mask, cross entropy's gradient) are functors over the
//! same bodies. Cross entropy's loss needs only each row's statistics: its bodies read each
//! row once and write a value per row.

#[cfg(feature = "cluster")]
use super::rows::ClusterSplit;
use super::rows::{
    BlockRow, BlockSplit, HeldRowCache, RowCache, RowSplit, Slice, WarpRows, block_packs, block_packs_loaded,
    warp_load, warp_row_reduce, warp_store,
};
#[cfg(feature = "cluster")]
use crate::abi::SOFTMAX_BACKWARD_HELD_PACKS;
use crate::abi::{CROSS_ENTROPY_IGNORE_INDEX, RowShape, SoftmaxArgs};
use crate::arch::{dynamic_shared_addr, thread_idx_x, wait_async_copies};
use crate::math::exp;
use crate::pack::{DirectLoad, DirectStore, Load, LoadOne, Pack, RowMajor, Store, StoreOne};
use crate::reduce::{MAX_WORDS, Max, Reduce, Sum, Words, block_all_reduce};
use crate::scalar::Scalar;
use crate::table::RowPath;
use crate::unroll::{unroll, unrolled_array};
use core::num::NonZeroU64;

/// Turns a row's max and sum of exponentials into outputs.
#[derive(Clone, Copy)]
struct Normalize {
    max: f32,
    inv_sum: f32,
    log_sum: f32,
    log: bool,
}

impl Normalize {
    #[inline(always)]
    fn new(max: f32, sum: f32, log: bool) -> Self {
        Normalize { max, inv_sum: crate::arch::rcp(sum), log_sum: crate::math::log(sum), log }
    }

    /// The output for an element that holds `e^(x - max)` (softmax) or `x` (log-softmax).
    #[inline(always)]
    fn apply(self, held: f32) -> f32 {
        if self.log { held - self.max - self.log_sum } else { held * self.inv_sum }
    }
}

/// Where a forward's outputs go, a row at a time: what a row's stores need beyond its
/// elements (cross entropy's target and loss gradient) is read once, as the row starts,
/// rather than with every pack (measured on the H100: the per-pack reads cost the cross
/// entropy backward 4-13 points on the shared and cluster paths).
trait RowOutput<const P: usize> {
    type Row: Store<P> + StoreOne;

    /// # Safety
    /// `row` must be a row of the view.
    unsafe fn row(&self, row: u64) -> Self::Row;
}

impl<T: Scalar, const P: usize> RowOutput<P> for DirectStore<T> {
    type Row = DirectStore<T>;

    #[inline(always)]
    unsafe fn row(&self, _row: u64) -> DirectStore<T> {
        *self
    }
}

/// A forward's outputs looked up a pack at a time, as the warp and uncached paths store
/// them. Measured on the H100 (cross entropy backward): a row's state held per warp access
/// cost the 16-bit tiers of 16 and 24 elements a lane 5-8 points (12 registers more) and
/// the two-row tier 3-7, for 3-5 elsewhere; held per row on the uncached path, it cost
/// ptxas 8-24 registers there.
struct EachPack<'a, O>(&'a O);

impl<O: RowOutput<P>, const P: usize> Store<P> for EachPack<'_, O> {
    #[inline(always)]
    unsafe fn store(&self, values: [f32; P], row: u64, col: u64) {
        // SAFETY: forwarded.
        unsafe { self.0.row(row).store(values, row, col) }
    }
}

#[inline(always)]
unsafe fn warp_forward<L: Load<P>, O: RowOutput<P>, const P: usize, const E: usize>(
    load: &L,
    outputs: &O,
    args: &SoftmaxArgs,
) {
    let at = WarpRows::new::<E>(&args.shape);
    let log = args.log != 0;
    // SAFETY (block): loads and stores stay in range (warp_load, warp_store), and the whole
    // warp runs the same iterations.
    at.for_each_access(args.shape.rows, |first| unsafe {
        let mut buf = warp_load::<L, P, E>(load, &at, first, &args.shape, f32::NEG_INFINITY);
        let max = warp_row_reduce::<Max, E>(|r, i| buf[r][i], at.width);
        // Softmax keeps e^(x - max) in place; log-softmax keeps x and only sums.
        let sum = warp_row_reduce::<Sum, E>(
            |r, i| {
                let e = exp(buf[r][i] - max[r]);
                if !log {
                    buf[r][i] = e;
                }
                e
            },
            at.width,
        );
        let norm = [Normalize::new(max[0], sum[0], log), Normalize::new(max[1], sum[1], log)];
        warp_store::<_, _, P, E>(
            &EachPack(outputs),
            &at,
            first,
            &args.shape,
            |_| (),
            |r, i, ()| unrolled_array(|j| norm[r].apply(buf[r][i + j])),
        );
    });
}

/// The row cached in shared memory, split over blocks as `split` says (a block, or a
/// cluster of blocks each holding a slice). A thread's element outside the row's aligned
/// packs ([`RowSplit::edge`]) stays in a register.
#[inline(always)]
unsafe fn shared_forward<L: Load<P> + LoadOne, O: RowOutput<P>, R: RowSplit, const P: usize, const PHASED: bool>(
    load: &L,
    outputs: &O,
    args: &SoftmaxArgs,
    split: &R,
) {
    let log = args.log != 0;
    let slice = split.slice::<P>(&args.shape);
    let cache = RowCache::<L::Exact, P>::new(dynamic_shared_addr(), slice);
    // SAFETY (block): the launch sizes shared memory for the cache; each thread touches only
    // its own packs' slots, so no barrier is needed beyond those in the reductions. Edges
    // are elements of the row.
    split.rows::<P, PHASED>(&args.shape, |at| unsafe {
        let (row, slice) = (at.row, slice.in_row(at));
        let edge = split.edge::<P, PHASED>(&args.shape, at).map(|col| (col, load.load_one(row, col)));
        let store = outputs.row(row);
        cache.fill(load, at);
        let (max, sum) = if R::MERGES_REDUCTIONS && cache.copies(load) {
            // Max and sum at once, online, over the packs as they land: the exponentials
            // overlap the row's loads rather than following them. (A cache filled through
            // registers is complete here: one exponential more a pack would buy nothing.)
            let mut online = Online { max: f32::NEG_INFINITY, sum: 0.0 };
            if let Some((_, x)) = edge {
                online.add([x]);
            }
            cache.landed_packs(|local| online.add(cache.read(load, at, local)));
            reduce_online(split, online)
        } else {
            wait_async_copies();
            let mut thread_max = edge.map_or(f32::NEG_INFINITY, |(_, x)| x);
            block_packs::<P>(slice, |local, _| {
                let v = cache.read(load, at, local);
                unroll::<P>(|j| thread_max = thread_max.max(v[j]));
            });
            // e^(x - max) is computed again for the output rather than cached: the cache
            // holds the row's own dtype, which would round it.
            let thread_sum = |max: f32| {
                let mut sum = edge.map_or(0.0, |(_, x)| exp(x - max));
                block_packs::<P>(slice, |local, _| {
                    let v = cache.read(load, at, local);
                    unroll::<P>(|j| sum += exp(v[j] - max));
                });
                sum
            };
            if R::MERGES_REDUCTIONS {
                // A thread that saw only -inf contributes (-inf, 0): no e^(-inf - -inf).
                let sum = if thread_max > f32::NEG_INFINITY { thread_sum(thread_max) } else { 0.0 };
                reduce_online(split, Online { max: thread_max, sum })
            } else {
                let max = split.all_reduce::<Max>(thread_max);
                (max, split.all_reduce::<Sum>(thread_sum(max)))
            }
        };
        let norm = Normalize::new(max, sum, log);
        let output = |x: f32| norm.apply(if log { x } else { exp(x - max) });
        if let Some((col, x)) = edge {
            store.store_one(output(x), row, col);
        }
        block_packs::<P>(slice, |local, col| {
            let v = cache.read(load, at, local);
            store.store(unrolled_array(|j| output(v[j])), row, col);
            cache.prefetch(load, at, local);
        });
    });
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
/// exponential a merge (none at equal maxes, which also keeps `e^(-inf - -inf)` out).
struct MergeOnline;

impl Reduce for MergeOnline {
    type Value = Online;
    const IDENTITY: Online = Online { max: f32::NEG_INFINITY, sum: 0.0 };

    #[inline(always)]
    fn combine(a: Online, b: Online) -> Online {
        let (big, small) = if a.max >= b.max { (a, b) } else { (b, a) };
        let scale = if small.max == big.max { 1.0 } else { exp(small.max - big.max) };
        Online { max: big.max, sum: big.sum + small.sum * scale }
    }
}

impl Online {
    #[inline(always)]
    fn add<const P: usize>(&mut self, v: [f32; P]) {
        let mut pack_max = f32::NEG_INFINITY;
        unroll::<P>(|j| pack_max = pack_max.max(v[j]));
        if pack_max > self.max {
            self.sum *= exp(self.max - pack_max);
            self.max = pack_max;
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
            // A thread that saw only -inf contributes 0 (its max is -inf, its sum 0).
            let rescaled = if online.max > f32::NEG_INFINITY { online.sum * exp(online.max - max) } else { 0.0 };
            (max, split.all_reduce::<Sum>(rescaled))
        }
    }
}

/// The max and sum of `e^(x - max)` of row `at`, this block reading its `slice` of the row
/// (and `edge`, its element outside the aligned packs) once from global memory.
#[inline(always)]
unsafe fn streamed_statistics<L: Load<P>, R: RowSplit, const P: usize>(
    load: &L,
    split: &R,
    at: BlockRow,
    slice: Slice,
    edge: Option<(u64, f32)>,
) -> (f32, f32) {
    let row = at.row;
    let mut online = Online { max: f32::NEG_INFINITY, sum: 0.0 };
    if let Some((_, x)) = edge {
        online.add([x]);
    }
    // SAFETY: the slice's packs are inside the row; every thread of the row's blocks
    // reduces (the caller's promise).
    unsafe {
        block_packs_loaded::<P, _>(
            slice,
            |col| load.fetch(row, col),
            |_, col, fetched| online.add(load.convert(fetched, row, col)),
        );
        reduce_online(split, online)
    }
}

#[inline(always)]
unsafe fn uncached_forward<L: Load<P> + LoadOne, O: RowOutput<P>, const P: usize, const PHASED: bool>(
    load: &L,
    outputs: &O,
    args: &SoftmaxArgs,
) {
    let log = args.log != 0;
    let slice = Slice::whole::<P>(&args.shape);
    // SAFETY (block): every column visited is a pack or an edge element inside the row.
    BlockSplit.rows::<P, PHASED>(&args.shape, |at| unsafe {
        let (row, slice) = (at.row, slice.in_row(at));
        let edge = BlockSplit.edge::<P, PHASED>(&args.shape, at).map(|col| (col, load.load_one(row, col)));
        let (max, sum) = streamed_statistics(load, &BlockSplit, at, slice, edge);
        let store = EachPack(outputs);
        let norm = Normalize::new(max, sum, log);
        let output = |x: f32| norm.apply(if log { x } else { exp(x - max) });
        if let Some((col, x)) = edge {
            outputs.row(row).store_one(output(x), row, col);
        }
        block_packs_loaded::<P, _>(
            slice,
            |col| load.fetch(row, col),
            |_, col, fetched| {
                let v = load.convert(fetched, row, col);
                store.store(unrolled_array(|j| output(v[j])), row, col);
            },
        );
    });
}

/// The forward body for path `PATH`.
#[inline(always)]
unsafe fn forward_path<L: Load<P> + LoadOne, O: RowOutput<P>, const P: usize, const PATH: RowPath>(
    load: &L,
    outputs: &O,
    args: &SoftmaxArgs,
) {
    // SAFETY: forwarded; the host launched this kernel with this path's geometry.
    unsafe {
        match PATH {
            RowPath::Uncached => uncached_forward::<L, O, P, false>(load, outputs, args),
            RowPath::UncachedPhased => uncached_forward::<L, O, P, true>(load, outputs, args),
            RowPath::Shared => shared_forward::<L, O, _, P, false>(load, outputs, args, &BlockSplit),
            RowPath::SharedPhased => shared_forward::<L, O, _, P, true>(load, outputs, args, &BlockSplit),
            #[cfg(feature = "cluster")]
            RowPath::Cluster => {
                ClusterSplit::run(|split| shared_forward::<L, O, _, P, false>(load, outputs, args, split))
            }
            #[cfg(feature = "cluster")]
            RowPath::ClusterPhased => {
                ClusterSplit::run(|split| shared_forward::<L, O, _, P, true>(load, outputs, args, split))
            }
            _ => on_warp_path!(PATH, E => warp_forward::<L, O, P, E>(load, outputs, args)),
        }
    }
}

/// Backward from `y` and `dy`: softmax `dx = (dy - sum(dy * y)) * y`; log-softmax
/// `dx = dy - exp(y) * sum(dy)`.
#[derive(Clone, Copy)]
struct Gradient {
    log: bool,
    sum: f32,
}

impl Gradient {
    /// What the row sum adds up for one element.
    #[inline(always)]
    fn term(log: bool, y: f32, dy: f32) -> f32 {
        if log { dy } else { dy * y }
    }

    #[inline(always)]
    fn apply(self, y: f32, dy: f32) -> f32 {
        if self.log { dy - exp(y) * self.sum } else { (dy - self.sum) * y }
    }
}

/// The element outside a row's aligned packs that this thread takes on the backward, if
/// any: its column, y and dy.
#[inline(always)]
unsafe fn backward_edge<LY: LoadOne, LD: LoadOne, const P: usize, const PHASED: bool>(
    load_y: &LY,
    load_dy: &LD,
    args: &SoftmaxArgs,
    split: &impl RowSplit,
    at: BlockRow,
) -> Option<(u64, f32, f32)> {
    // SAFETY: an edge is an element of the row.
    split
        .edge::<P, PHASED>(&args.shape, at)
        .map(|col| unsafe { (col, load_y.load_one(at.row, col), load_dy.load_one(at.row, col)) })
}

/// The backward with the rows cached in shared memory, split over blocks as `split` says,
/// `HELD` packs of y and of dy per thread in registers ([`HeldRowCache`]).
#[inline(always)]
unsafe fn shared_backward<
    LY: Load<P> + LoadOne,
    LD: Load<P> + LoadOne,
    S: Store<P> + StoreOne,
    const P: usize,
    const PHASED: bool,
    const HELD: usize,
>(
    load_y: &LY,
    load_dy: &LD,
    store: &S,
    args: &SoftmaxArgs,
    split: &impl RowSplit,
) {
    let log = args.log != 0;
    let slice = split.slice::<P>(&args.shape);
    // y's cache, then dy's.
    let cache_y = HeldRowCache::<LY::Exact, P, HELD>::new(dynamic_shared_addr(), slice);
    let cache_dy = HeldRowCache::<LD::Exact, P, HELD>::new(cache_y.end(), slice);
    // SAFETY (block): as shared_forward.
    split.rows::<P, PHASED>(&args.shape, |at| unsafe {
        let row = at.row;
        let edge = backward_edge::<LY, LD, P, PHASED>(load_y, load_dy, args, split, at);
        cache_y.fill(load_y, at);
        cache_dy.fill(load_dy, at);
        wait_async_copies();
        let read = |pack, col| (cache_y.read(load_y, at, pack, col), cache_dy.read(load_dy, at, pack, col));
        let mut thread_sum = edge.map_or(0.0, |(_, y, dy)| Gradient::term(log, y, dy));
        cache_y.packs(at, |pack, col| {
            let (y, dy) = read(pack, col);
            unroll::<P>(|j| thread_sum += Gradient::term(log, y[j], dy[j]));
        });
        let g = Gradient { log, sum: split.all_reduce::<Sum>(thread_sum) };
        if let Some((col, y, dy)) = edge {
            store.store_one(g.apply(y, dy), row, col);
        }
        cache_y.packs(at, |pack, col| {
            let (y, dy) = read(pack, col);
            store.store(unrolled_array(|j| g.apply(y[j], dy[j])), row, col);
            cache_y.prefetch(load_y, at, pack);
            cache_dy.prefetch(load_dy, at, pack);
        });
    });
}

/// The backward re-reading the rows from global memory.
#[inline(always)]
unsafe fn uncached_backward<
    LY: Load<P> + LoadOne,
    LD: Load<P> + LoadOne,
    S: Store<P> + StoreOne,
    const P: usize,
    const PHASED: bool,
>(
    load_y: &LY,
    load_dy: &LD,
    store: &S,
    args: &SoftmaxArgs,
) {
    let log = args.log != 0;
    let slice = Slice::whole::<P>(&args.shape);
    // SAFETY (block): every column visited is a pack or an edge element inside the row.
    BlockSplit.rows::<P, PHASED>(&args.shape, |at| unsafe {
        let (row, slice) = (at.row, slice.in_row(at));
        let edge = backward_edge::<LY, LD, P, PHASED>(load_y, load_dy, args, &BlockSplit, at);
        let fetch = |col| (load_y.fetch(row, col), load_dy.fetch(row, col));
        let convert = |(y, dy), col| (load_y.convert(y, row, col), load_dy.convert(dy, row, col));
        let mut thread_sum = edge.map_or(0.0, |(_, y, dy)| Gradient::term(log, y, dy));
        block_packs_loaded::<P, _>(slice, fetch, |_, col, fetched| {
            let (y, dy) = convert(fetched, col);
            unroll::<P>(|j| thread_sum += Gradient::term(log, y[j], dy[j]))
        });
        let g = Gradient { log, sum: block_all_reduce::<Sum>(thread_sum) };
        if let Some((col, y, dy)) = edge {
            store.store_one(g.apply(y, dy), row, col);
        }
        block_packs_loaded::<P, _>(slice, fetch, |_, col, fetched| {
            let (y, dy) = convert(fetched, col);
            store.store(unrolled_array(|j| g.apply(y[j], dy[j])), row, col)
        });
    })
}

#[inline(always)]
unsafe fn backward_path<
    LY: Load<P> + LoadOne,
    LD: Load<P> + LoadOne,
    S: Store<P> + StoreOne,
    const P: usize,
    const PATH: RowPath,
>(
    load_y: &LY,
    load_dy: &LD,
    store: &S,
    args: &SoftmaxArgs,
) {
    let log = args.log != 0;
    // SAFETY (whole body): as the forward paths.
    unsafe {
        match PATH {
            RowPath::Uncached => uncached_backward::<LY, LD, S, P, false>(load_y, load_dy, store, args),
            RowPath::UncachedPhased => uncached_backward::<LY, LD, S, P, true>(load_y, load_dy, store, args),
            RowPath::Shared => shared_backward::<LY, LD, S, P, false, 0>(load_y, load_dy, store, args, &BlockSplit),
            RowPath::SharedPhased => {
                shared_backward::<LY, LD, S, P, true, 0>(load_y, load_dy, store, args, &BlockSplit)
            }
            #[cfg(feature = "cluster")]
            RowPath::Cluster => ClusterSplit::run(|split| {
                shared_backward::<LY, LD, S, P, false, SOFTMAX_BACKWARD_HELD_PACKS>(load_y, load_dy, store, args, split)
            }),
            #[cfg(feature = "cluster")]
            RowPath::ClusterPhased => ClusterSplit::run(|split| {
                shared_backward::<LY, LD, S, P, true, SOFTMAX_BACKWARD_HELD_PACKS>(load_y, load_dy, store, args, split)
            }),
            _ => on_warp_path!(PATH, E => {
                let at = WarpRows::new::<E>(&args.shape);
                at.for_each_access(args.shape.rows, |first| {
                    let y = warp_load::<LY, P, E>(load_y, &at, first, &args.shape, 0.0);
                    let dy = warp_load::<LD, P, E>(load_dy, &at, first, &args.shape, 0.0);
                    let sum = warp_row_reduce::<Sum, E>(|r, i| Gradient::term(log, y[r][i], dy[r][i]), at.width);
                    let g = [Gradient { log, sum: sum[0] }, Gradient { log, sum: sum[1] }];
                    warp_store::<S, _, P, E>(
                        store,
                        &at,
                        first,
                        &args.shape,
                        |_| (),
                        |r, i, ()| unrolled_array(|j| g[r].apply(y[r][i + j], dy[r][i + j])),
                    );
                });
            }),
        }
    }
}

/// `x * scale + mask[row % period]`: attention scores with an additive mask broadcast over
/// the rows (batch and heads).
pub struct ScaleMaskLoad<T> {
    x: DirectLoad<T>,
    mask: DirectLoad<T>,
    period: NonZeroU64,
    scale: f32,
}

impl<T: Scalar, const N: usize> Load<N> for ScaleMaskLoad<T> {
    type Fetched = (Pack<T, N>, Pack<T, N>);
    type Exact = f32;

    #[inline(always)]
    unsafe fn fetch(&self, row: u64, col: u64) -> Self::Fetched {
        // SAFETY: forwarded; the mask has `period` rows of the same width.
        unsafe { (self.x.fetch(row, col), self.mask.fetch(row % self.period, col)) }
    }

    #[inline(always)]
    unsafe fn convert(&self, (x, mask): Self::Fetched, _row: u64, _col: u64) -> [f32; N] {
        let (x, m) = (x.to_f32(), mask.to_f32());
        unrolled_array(|j| x[j] * self.scale + m[j])
    }
}

/// `x * scale` where `col <= row % period` (a query sees keys up to its own position,
/// PyTorch's `is_causal`), `-inf` elsewhere.
pub struct CausalLoad<T> {
    x: DirectLoad<T>,
    period: NonZeroU64,
    scale: f32,
}

impl<T: Scalar, const N: usize> Load<N> for CausalLoad<T> {
    type Fetched = Pack<T, N>;
    type Exact = T;

    #[inline(always)]
    unsafe fn fetch(&self, row: u64, col: u64) -> Pack<T, N> {
        // SAFETY: forwarded.
        unsafe { self.x.fetch(row, col) }
    }

    #[inline(always)]
    unsafe fn convert(&self, x: Pack<T, N>, row: u64, col: u64) -> [f32; N] {
        // SAFETY: forwarded.
        unsafe { self.transform(x.to_f32(), row, col) }
    }

    #[inline(always)]
    fn source(&self) -> Option<RowMajor<T>> {
        Some(self.x.0)
    }

    #[inline(always)]
    unsafe fn transform(&self, x: [f32; N], row: u64, col: u64) -> [f32; N] {
        let last = row % self.period;
        unrolled_array(|j| if col + j as u64 <= last { x[j] * self.scale } else { f32::NEG_INFINITY })
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

/// What a kind that needs only each row's statistics writes for a row: cross entropy's
/// loss, logsumexp's value.
trait RowValue {
    /// Writes row `row`'s value from its max and sum of `e^(x - max)`.
    ///
    /// # Safety
    /// `row` must be a row of the view `load` reads, whose per-row arrays this holds.
    unsafe fn write<L: LoadOne>(&self, load: &L, row: u64, max: f32, sum: f32);
}

/// Cross entropy's output: a loss per row, `max + ln(sum) - x[target]` from the row's
/// statistics; 0 where the target is ignored, NaN where it is outside the row.
struct Loss {
    target: *const i64,
    loss: *mut f32,
    cols: u64,
}

impl RowValue for Loss {
    #[inline(always)]
    unsafe fn write<L: LoadOne>(&self, load: &L, row: u64, max: f32, sum: f32) {
        // SAFETY: forwarded; a target inside the row is an element of it.
        unsafe {
            let value = match target_of(self.target, row, self.cols) {
                None => 0.0,
                Some(u64::MAX) => f32::NAN,
                // `x - max` first: exact near the max, where a small loss would cancel.
                Some(t) => crate::math::log(sum) - (load.load_one(row, t) - max),
            };
            self.loss.add(row as usize).write(value);
        }
    }
}

/// `ln(sum(e^x))` of each row, as f32: `max + ln(sum)`.
struct LogSumExp {
    out: *mut f32,
}

impl RowValue for LogSumExp {
    #[inline(always)]
    unsafe fn write<L: LoadOne>(&self, _load: &L, row: u64, max: f32, sum: f32) {
        // SAFETY: forwarded; `out` holds a value per row.
        unsafe { self.out.add(row as usize).write(max + crate::math::log(sum)) }
    }
}

/// A statistics-only kind on path `PATH`: a row's max and sum are all its value needs, so
/// every path reads each row once and writes only the value (the block paths stream their
/// rows, with no cache; the shared path's kernel is the uncached one's).
#[inline(always)]
unsafe fn row_value_path<L: Load<P> + LoadOne, V: RowValue, const P: usize, const PATH: RowPath>(
    load: &L,
    value: &V,
    args: &SoftmaxArgs,
) {
    // SAFETY (whole body): as the forward paths.
    unsafe {
        match PATH {
            RowPath::Uncached | RowPath::Shared => streamed_value::<L, V, _, P, false>(load, value, args, &BlockSplit),
            RowPath::UncachedPhased | RowPath::SharedPhased => {
                streamed_value::<L, V, _, P, true>(load, value, args, &BlockSplit)
            }
            #[cfg(feature = "cluster")]
            RowPath::Cluster => {
                ClusterSplit::run(|split| streamed_value::<L, V, _, P, false>(load, value, args, split))
            }
            #[cfg(feature = "cluster")]
            RowPath::ClusterPhased => {
                ClusterSplit::run(|split| streamed_value::<L, V, _, P, true>(load, value, args, split))
            }
            _ => on_warp_path!(PATH, E => {
                let at = WarpRows::new::<E>(&args.shape);
                at.for_each_access(args.shape.rows, |first| {
                    let x = warp_load::<L, P, E>(load, &at, first, &args.shape, f32::NEG_INFINITY);
                    let max = warp_row_reduce::<Max, E>(|r, i| x[r][i], at.width);
                    let sum = warp_row_reduce::<Sum, E>(|r, i| exp(x[r][i] - max[r]), at.width);
                    unroll::<2>(|r| {
                        if at.lane == 0 && at.holds::<E>(r, first, args.shape.rows) {
                            value.write(load, first + r as u64, max[r], sum[r]);
                        }
                    });
                });
            }),
        }
    }
}

/// [`row_value_path`] on the block paths, split over blocks as `split` says.
#[inline(always)]
unsafe fn streamed_value<L: Load<P> + LoadOne, V: RowValue, R: RowSplit, const P: usize, const PHASED: bool>(
    load: &L,
    value: &V,
    args: &SoftmaxArgs,
    split: &R,
) {
    let slice = split.slice::<P>(&args.shape);
    // SAFETY (block): every column visited is a pack or an edge element inside the row.
    split.rows::<P, PHASED>(&args.shape, |at| unsafe {
        let edge = split.edge::<P, PHASED>(&args.shape, at).map(|col| (col, load.load_one(at.row, col)));
        let (max, sum) = streamed_statistics(load, split, at, slice.in_row(at), edge);
        if thread_idx_x() == 0 && split.leads() {
            value.write(load, at.row, max, sum);
        }
    });
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
        let (t, scale) = (self.target, self.scale);
        let grad: [f32; N] = unrolled_array(|j| (values[j] - if col + j as u64 == t { 1.0 } else { 0.0 }) * scale);
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
    let first = if PATH.phased() { shape.phase as u64 } else { 0 };
    // SAFETY: forwarded (the host passes a phase only to kernels that run phased rows).
    let view = unsafe { RowMajor::<T>::past_boundary(address, shape.cols, first) };
    (DirectLoad(view), DirectStore(view))
}

#[inline(always)]
pub unsafe fn forward<T: Scalar, const P: usize, const PATH: RowPath>(args: &SoftmaxArgs) {
    // SAFETY: see `direct`.
    unsafe {
        let (load, _) = direct::<T, PATH>(args.input, &args.shape);
        let (_, store) = direct::<T, PATH>(args.output, &args.shape);
        forward_path::<_, _, P, PATH>(&load, &store, args);
    }
}

#[inline(always)]
pub unsafe fn backward<T: Scalar, const P: usize, const PATH: RowPath>(args: &SoftmaxArgs) {
    // SAFETY: see `direct`.
    unsafe {
        let (load_y, _) = direct::<T, PATH>(args.input, &args.shape);
        let (load_dy, _) = direct::<T, PATH>(args.second, &args.shape);
        let (_, store) = direct::<T, PATH>(args.output, &args.shape);
        backward_path::<_, _, _, P, PATH>(&load_y, &load_dy, &store, args);
    }
}

/// `args.period` as a divisor (the host never passes 0; 1 stands in if it did).
#[inline(always)]
fn period(args: &SoftmaxArgs) -> NonZeroU64 {
    NonZeroU64::new(args.period).unwrap_or(NonZeroU64::MIN)
}

#[inline(always)]
pub unsafe fn scale_mask<T: Scalar, const P: usize, const PATH: RowPath>(args: &SoftmaxArgs) {
    // SAFETY: see `direct`; the mask has `period` rows.
    unsafe {
        let load = ScaleMaskLoad {
            x: direct::<T, PATH>(args.input, &args.shape).0,
            mask: direct::<T, PATH>(args.second, &args.shape).0,
            period: period(args),
            scale: args.scale,
        };
        let (_, store) = direct::<T, PATH>(args.output, &args.shape);
        forward_path::<_, _, P, PATH>(&load, &store, args);
    }
}

#[inline(always)]
pub unsafe fn causal<T: Scalar, const P: usize, const PATH: RowPath>(args: &SoftmaxArgs) {
    // SAFETY: see `direct`.
    unsafe {
        let load =
            CausalLoad { x: direct::<T, PATH>(args.input, &args.shape).0, period: period(args), scale: args.scale };
        let (_, store) = direct::<T, PATH>(args.output, &args.shape);
        forward_path::<_, _, P, PATH>(&load, &store, args);
    }
}

#[inline(always)]
pub unsafe fn cross_entropy<T: Scalar, const P: usize, const PATH: RowPath>(args: &SoftmaxArgs) {
    // SAFETY: see `direct`; target and loss have `rows` elements.
    unsafe {
        let (load, _) = direct::<T, PATH>(args.input, &args.shape);
        let loss = Loss { target: args.target as *const i64, loss: args.row_values as *mut f32, cols: args.shape.cols };
        row_value_path::<_, _, P, PATH>(&load, &loss, args);
    }
}

#[inline(always)]
pub unsafe fn logsumexp<T: Scalar, const P: usize, const PATH: RowPath>(args: &SoftmaxArgs) {
    // SAFETY: see `direct`; `row_values` has `rows` elements.
    unsafe {
        let (load, _) = direct::<T, PATH>(args.input, &args.shape);
        row_value_path::<_, _, P, PATH>(&load, &LogSumExp { out: args.row_values as *mut f32 }, args);
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
        forward_path::<_, _, P, PATH>(&load, &grad, args);
    }
}
