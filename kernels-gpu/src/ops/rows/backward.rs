//! The row engine's backward: each path's body written once, for every op whose gradient
//! reads two rows (`a`, `b`), sums per-element terms over each row, and then writes one
//! value per element from the row's sums. Softmax and log-softmax (`a = y`, `b = dy`) and
//! the norms (`a` the normalized input, `b = dy * gamma`) are [`RowGradient`]s.

#[cfg(feature = "cluster")]
use super::ClusterSplit;
use super::{
    BlockRow, BlockSplit, HeldRowCache, RowSplit, Slice, WarpRows, block_packs_loaded, warp_load, warp_row_reduce,
    warp_store,
};
use crate::abi::RowShape;
use crate::arch::{dynamic_shared_addr, wait_async_copies};
use crate::pack::{Load, LoadOne, Store, StoreOne};
use crate::reduce::{Sum, SumPair};
use crate::table::RowPath;
use crate::unroll::{unroll, unrolled_array};

/// An op's backward math over the engine's paths: `N` sums (1 or 2) per row.
pub(crate) trait RowGradient<const N: usize> {
    /// What a row's outputs need once its sums are known.
    type Row: Copy + Default;

    /// What the elements `a` and `b` at one column add to the row's sum `k`. One sum at a
    /// time: from an array of both, LLVM merged the warp path's two reductions' products
    /// into the first, keeping them all live across its shuffles (the norms' warp24
    /// backward, 10 registers more).
    fn term(&self, k: usize, a: f32, b: f32) -> f32;

    /// Row `row`'s gradient from its sums; `None` for a warp path's slot past the last row
    /// (whose outputs are never stored). The sums come by reference, as the engine's
    /// accumulators stay: an array read whole made LLVM carry two f32 sums packed in one
    /// 64-bit register (six instructions more a row on the norms' cluster path).
    ///
    /// # Safety
    /// A `Some` row must be a row of the view.
    unsafe fn row(&self, row: Option<u64>, sums: &[f32; N]) -> Self::Row;

    /// The output for the elements `a` and `b` of a row.
    fn apply(row: Self::Row, a: f32, b: f32) -> f32;
}

/// Adds the terms of a pack's elements to `sums`.
#[inline(always)]
fn add_terms<G: RowGradient<N>, const N: usize, const P: usize>(op: &G, sums: &mut [f32; N], a: [f32; P], b: [f32; P]) {
    unroll::<P>(|j| {
        unroll::<N>(|k| sums[k] += op.term(k, a[j], b[j]));
    });
}

/// Starts a thread's sums of a row from its edge element (`PHASED` rows), or at 0.
/// Written in place: sums returned as an array came back packed in one integer word.
#[inline(always)]
fn start_sums<G: RowGradient<N>, const N: usize>(op: &G, sums: &mut [f32; N], edge: Option<(u64, f32, f32)>) {
    if let Some((_, a, b)) = edge {
        unroll::<N>(|k| sums[k] = op.term(k, a, b));
    }
}

/// Sums `sums` over every thread of the blocks sharing a row, in place: two sums at once
/// where the split merges reductions ([`RowSplit::MERGES_REDUCTIONS`]), else one after the
/// other.
///
/// # Safety
/// As [`RowSplit::all_reduce`].
#[inline(always)]
unsafe fn reduce_sums<R: RowSplit, const N: usize>(split: &R, sums: &mut [f32; N]) {
    // SAFETY: forwarded to the caller.
    unsafe {
        if N == 2 && R::MERGES_REDUCTIONS {
            // The pair's two ends: the first and last of two sums.
            [sums[0], sums[N - 1]] = split.all_reduce::<SumPair>([sums[0], sums[N - 1]]);
        } else {
            unroll::<N>(|k| sums[k] = split.all_reduce::<Sum>(sums[k]));
        }
    }
}

/// The element outside row `at`'s aligned packs this thread takes (`PHASED` rows only), if
/// any: its column and the two inputs there.
///
/// # Safety
/// `at` must be a row of `shape`.
#[inline(always)]
unsafe fn edge<LA: LoadOne, LB: LoadOne, const P: usize, const PHASED: bool>(
    load_a: &LA,
    load_b: &LB,
    shape: &RowShape,
    split: &impl RowSplit,
    at: BlockRow,
) -> Option<(u64, f32, f32)> {
    // SAFETY: an edge is an element of the row.
    split
        .edge::<P, PHASED>(shape, at)
        .map(|col| unsafe { (col, load_a.load_one(at.row, col), load_b.load_one(at.row, col)) })
}

/// One backward call: the op, the loads of its two input rows, the output's store and the
/// view; its methods are the path bodies.
pub(crate) struct BackwardRows<'a, G, LA, LB, S, const N: usize, const P: usize> {
    pub(crate) op: &'a G,
    pub(crate) load_a: &'a LA,
    pub(crate) load_b: &'a LB,
    pub(crate) store: &'a S,
    pub(crate) shape: &'a RowShape,
}

impl<G, LA, LB, S, const N: usize, const P: usize> BackwardRows<'_, G, LA, LB, S, N, P>
where
    G: RowGradient<N>,
    LA: Load<P> + LoadOne,
    LB: Load<P> + LoadOne,
    S: Store<P> + StoreOne,
{
    /// Both rows cached in shared memory, split over blocks as `split` says, `HELD` packs of
    /// each per thread in registers ([`HeldRowCache`]).
    #[inline(always)]
    unsafe fn cached<R: RowSplit, const PHASED: bool, const HELD: usize>(&self, split: &R) {
        let &BackwardRows { op, load_a, load_b, store, shape } = self;
        let slice = split.slice::<P>(shape);
        // a's cache, then b's.
        let cache_a = HeldRowCache::<LA::Exact, P, HELD>::new(dynamic_shared_addr(), slice);
        let cache_b = HeldRowCache::<LB::Exact, P, HELD>::new(cache_a.end(), slice);
        // SAFETY (block): the launch sizes shared memory for both caches; each thread touches
        // only its own packs' slots, so no barrier is needed beyond those in the reductions.
        split.rows::<P, PHASED>(shape, |at| unsafe {
            let row = at.row;
            let edge = edge::<LA, LB, P, PHASED>(load_a, load_b, shape, split, at);
            cache_a.fill(load_a, at);
            cache_b.fill(load_b, at);
            wait_async_copies();
            let read = |pack, col| (cache_a.read(load_a, at, pack, col), cache_b.read(load_b, at, pack, col));
            let mut sums = [0.0; N];
            start_sums(op, &mut sums, edge);
            cache_a.packs(at, |pack, col| {
                let (a, b) = read(pack, col);
                add_terms(op, &mut sums, a, b);
            });
            reduce_sums(split, &mut sums);
            let grad = op.row(Some(row), &sums);
            if let Some((col, a, b)) = edge {
                store.store_one(G::apply(grad, a, b), row, col);
            }
            cache_a.packs(at, |pack, col| {
                let (a, b) = read(pack, col);
                store.store(unrolled_array(|j| G::apply(grad, a[j], b[j])), row, col);
                cache_a.prefetch(load_a, at, pack);
                cache_b.prefetch(load_b, at, pack);
            });
        });
    }

    /// Both rows re-read from global memory, a block per row.
    #[inline(always)]
    unsafe fn uncached<const PHASED: bool>(&self) {
        let &BackwardRows { op, load_a, load_b, store, shape } = self;
        let slice = Slice::whole::<P>(shape);
        // SAFETY (block): every column visited is a pack or an edge element inside the row.
        BlockSplit.rows::<P, PHASED>(shape, |at| unsafe {
            let (row, slice) = (at.row, slice.in_row(at));
            let edge = edge::<LA, LB, P, PHASED>(load_a, load_b, shape, &BlockSplit, at);
            let fetch = |col| (load_a.fetch(row, col), load_b.fetch(row, col));
            let convert = |(a, b), col| (load_a.convert(a, row, col), load_b.convert(b, row, col));
            let mut sums = [0.0; N];
            start_sums(op, &mut sums, edge);
            block_packs_loaded::<P, _>(slice, fetch, |_, col, fetched| {
                let (a, b) = convert(fetched, col);
                add_terms(op, &mut sums, a, b);
            });
            reduce_sums(&BlockSplit, &mut sums);
            let grad = op.row(Some(row), &sums);
            if let Some((col, a, b)) = edge {
                store.store_one(G::apply(grad, a, b), row, col);
            }
            block_packs_loaded::<P, _>(slice, fetch, |_, col, fetched| {
                let (a, b) = convert(fetched, col);
                store.store(unrolled_array(|j| G::apply(grad, a[j], b[j])), row, col)
            });
        });
    }

    /// Both rows in registers, `E` elements per lane (two rows per access in the narrowest
    /// tier); padding loads as 0 in both, so it must add nothing to the sums.
    #[inline(always)]
    unsafe fn warp<const E: usize>(&self) {
        let &BackwardRows { op, load_a, load_b, store, shape } = self;
        let at = WarpRows::new::<E>(shape);
        // SAFETY (block): loads and stores stay in range (warp_load, warp_store), and the whole
        // warp runs the same iterations.
        at.for_each_access(shape.rows, |first| unsafe {
            let a = warp_load::<LA, P, E>(load_a, &at, first, shape, 0.0);
            let b = warp_load::<LB, P, E>(load_b, &at, first, shape, 0.0);
            let sums: [[f32; 2]; N] =
                unrolled_array(|k| warp_row_reduce::<Sum, E>(|r, i| op.term(k, a[r][i], b[r][i]), at.width));
            let grad: [G::Row; 2] = unrolled_array(|r| {
                let row = at.holds::<E>(r, first, shape.rows).then_some(first + r as u64);
                op.row(row, &unrolled_array(|k| sums[k][r]))
            });
            warp_store::<S, _, P, E>(
                store,
                &at,
                first,
                shape,
                |_| (),
                |r, i, ()| unrolled_array(|j| G::apply(grad[r], a[r][i + j], b[r][i + j])),
            );
        });
    }

    /// The backward body of path `PATH`, `HELD` packs of each row per thread in registers on
    /// the cluster path (see [`HeldRowCache`]).
    ///
    /// # Safety
    /// The loads and the store must cover `shape`'s rows, the launch have `PATH`'s geometry, and
    /// rows not aligned to `P` come only with a phased or warp path.
    #[inline(always)]
    pub(crate) unsafe fn run<const PATH: RowPath, const HELD: usize>(&self) {
        // SAFETY: forwarded to the caller.
        unsafe {
            match PATH {
                RowPath::Uncached => self.uncached::<false>(),
                RowPath::UncachedPhased => self.uncached::<true>(),
                RowPath::Shared => self.cached::<_, false, 0>(&BlockSplit),
                RowPath::SharedPhased => self.cached::<_, true, 0>(&BlockSplit),
                #[cfg(feature = "cluster")]
                RowPath::Cluster => ClusterSplit::run(|split| self.cached::<_, false, HELD>(split)),
                #[cfg(feature = "cluster")]
                RowPath::ClusterPhased => ClusterSplit::run(|split| self.cached::<_, true, HELD>(split)),
                _ => on_warp_path!(PATH, E => self.warp::<E>()),
            }
        }
    }
}
