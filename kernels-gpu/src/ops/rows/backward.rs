//! The row engine's backward: each path's body written once, for every op whose gradient
//! reads two rows (`a`, `b`), sums per-element terms over each row, and then writes one
//! value per element from the row's sums. Softmax and log-softmax (`a = y`, `b = dy`) and
//! the norms (`a` the normalized input, `b = dy * gamma`) are [`RowGradient`]s. Beside the
//! rows' sums, a backward may gather per-column sums of its pairs ([`ColumnGather`]): the
//! norms' parameter gradients, from the same reads of the rows.

#[cfg(feature = "cluster")]
use super::ClusterSplit;
use super::{
    BlockRow, BlockSplit, HeldRowCache, RowSplit, Slice, WarpRows, block_packs_loaded, warp_load, warp_row_reduce,
    warp_store,
};
use crate::abi::{ROW_CACHE_STAGES, RowShape};
use crate::arch::{
    SharedAddr, block_dim_x, dynamic_shared_addr, load_shared, store_shared, sync_threads, thread_idx_x,
    wait_async_copies, wait_async_groups_but,
};
use crate::layout::{column_gather_bytes, column_gather_stride, slab_run_words};
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

/// Per-column sums a backward gathers from the pairs `(a, b)` of its rows, beside the rows'
/// own sums (the norms' parameter gradients: `sum(dy * xhat)` and `sum(dy)` over the rows),
/// so one read of the rows serves both. Each block adds its rows' terms up in shared memory
/// ([`ColumnSlab`]) and writes the total into its row of `partial` (f32 `[sums, rows, cols]`,
/// a row a block, or a cluster: [`RowSplit::partial_row`]); a second kernel adds those rows
/// in order: no atomics, the same bits every run.
pub(crate) trait ColumnGather {
    /// Whether anything is gathered (a plain backward gathers nothing: compiled out).
    const GATHERS: bool;

    /// Sums per column: 1 or 2 where [`ColumnGather::GATHERS`].
    fn sums(&self) -> u32;

    /// What the pair `(a, b)` of a column adds to its sum `k`.
    fn term(&self, k: usize, a: f32, b: f32) -> f32;

    /// `b` at columns `col..col + Q` as the row's sums and outputs take it, from `b` as loaded
    /// and gathered (the norms scale `dy` by gamma here, after gathering `dy` itself).
    ///
    /// # Safety
    /// The columns must be inside the row, `col` a multiple of `Q` unless the rows run from
    /// their heads.
    unsafe fn scale<const Q: usize>(&self, col: u64, b: [f32; Q]) -> [f32; Q];

    /// Generic address of the f32 `[sums, rows, cols]` partial rows.
    fn partial(&self) -> u64;
}

/// Nothing gathered: the loads give `b` as the row's sums take it.
pub(crate) struct NoGather;

impl ColumnGather for NoGather {
    const GATHERS: bool = false;

    #[inline(always)]
    fn sums(&self) -> u32 {
        0
    }

    #[inline(always)]
    fn term(&self, _k: usize, _a: f32, _b: f32) -> f32 {
        0.0
    }

    #[inline(always)]
    unsafe fn scale<const Q: usize>(&self, _col: u64, b: [f32; Q]) -> [f32; Q] {
        b
    }

    #[inline(always)]
    fn partial(&self) -> u64 {
        0
    }
}

/// A block's gathered column sums in shared memory, first in its dynamic shared memory
/// (the row caches follow): `groups` partial rows of `sums` f32 sums of the `cols` columns
/// from `first` ([`RowSplit::gathered_columns`], or on rows run from their heads the
/// block's [`RowSplit::owned_slice`]), one per set of threads that never share a column (a
/// lane group on the warp path, the block on the others), so each word has one writer and
/// no atomics are needed. Empty where nothing is gathered.
#[derive(Clone, Copy)]
struct ColumnSlab {
    base: SharedAddr,
    first: u64,
    cols: u32,
    /// F32s from one sum's columns to the next's: `cols`, or on rows run from their heads
    /// [`column_gather_stride`] of them.
    stride: u32,
    sums: u32,
    groups: u32,
    /// The row's columns: the stride of the partial array's rows.
    row_cols: u64,
    /// This block's partial row, and the grid's count of them ([`RowSplit::partial_row`]).
    partial_row: (u32, u32),
}

impl ColumnSlab {
    #[inline(always)]
    fn new<C: ColumnGather, R: RowSplit, const P: usize, const PHASED: bool>(
        gather: &C,
        split: &R,
        shape: &RowShape,
        groups: u32,
    ) -> Self {
        let sums = if C::GATHERS { gather.sums() } else { 0 };
        let owns = owns_columns::<C, PHASED>();
        let (first, cols) =
            if owns { split.owned_slice::<P>(shape).columns::<P>() } else { split.gathered_columns::<P>(shape) };
        let (base, row_cols, partial_row) = (dynamic_shared_addr(), shape.cols, split.partial_row());
        let stride = if owns { column_gather_stride(cols as u64) as u32 } else { cols };
        ColumnSlab { base, first, cols, stride, sums, groups, row_cols, partial_row }
    }

    /// Where the shared memory after the slab starts.
    #[inline(always)]
    fn end(&self) -> SharedAddr {
        self.base.offset(column_gather_bytes(self.groups, self.sums, self.stride as u64) as u32)
    }

    #[inline(always)]
    fn at(&self, group: u32, k: usize, col: u64) -> SharedAddr {
        self.base.offset(((group * self.sums + k as u32) * self.stride + (col - self.first) as u32) * 4)
    }

    /// Zeroes the slab where `C` gathers; every thread of the block calls it (a barrier).
    ///
    /// # Safety
    /// The launch must size the block's shared memory for the slab.
    #[inline(always)]
    unsafe fn clear<C: ColumnGather>(&self) {
        if !C::GATHERS {
            return;
        }
        let words = self.groups * self.sums * self.stride;
        let mut word = thread_idx_x();
        // SAFETY: every word is inside the slab.
        unsafe {
            while word < words {
                store_shared(self.base.offset(word * 4), 4, [0; 4]);
                word += block_dim_x();
            }
            sync_threads();
        }
    }

    /// Adds `term(k, j)` to group `group`'s sum `k` of column `col + j`, for the columns
    /// `col..col + Q`: 16 bytes an access where `aligned` (`col` a multiple of `Q`, and the
    /// stride of 4 where `Q` is; a constant after inlining); else, for packs of 4 or 8
    /// (rows run from their heads, whose columns start `col - first` words past 16 bytes,
    /// the same for every pack of a row), in runs of 1, 2 and 4 words aligned to their
    /// widths ([`slab_run_words`]), one of four unrolled forms picked by that offset; else a
    /// word at a time. A warp's word-at-a-time adds of packs of 8 meet 8-way bank conflicts
    /// (its lanes' words 32 bytes apart); its runs meet those of a 16-byte access.
    ///
    /// # Safety
    /// The columns must be among the slab's, `group` below its groups, and no other thread
    /// of the block add to this group's columns meanwhile; where not `aligned`, the slab's
    /// sums must start 16 bytes apart ([`column_gather_stride`]).
    #[inline(always)]
    unsafe fn add<const Q: usize>(&self, (group, col, aligned): (u32, u64, bool), term: impl Fn(usize, usize) -> f32) {
        // SAFETY: forwarded to the caller.
        unsafe {
            if aligned && Q % 4 == 0 {
                self.add_runs::<Q, 0, 4>(group, col, term);
            } else if Q % 4 != 0 {
                self.add_runs::<Q, 0, 1>(group, col, term);
            } else {
                match (col - self.first) % 4 {
                    0 => self.add_runs::<Q, 0, 4>(group, col, term),
                    1 => self.add_runs::<Q, 1, 4>(group, col, term),
                    2 => self.add_runs::<Q, 2, 4>(group, col, term),
                    _ => self.add_runs::<Q, 3, 4>(group, col, term),
                }
            }
        }
    }

    /// [`ColumnSlab::add`] for columns that start `SHIFT` words past 16 bytes, in runs of
    /// at most `WIDEST` words ([`slab_run_words`]).
    ///
    /// # Safety
    /// As [`ColumnSlab::add`]; `col - first` must be `SHIFT` past a multiple of 4 where
    /// `WIDEST` is over 1.
    #[inline(always)]
    unsafe fn add_runs<const Q: usize, const SHIFT: usize, const WIDEST: usize>(
        &self,
        group: u32,
        col: u64,
        term: impl Fn(usize, usize) -> f32,
    ) {
        unroll::<2>(|k| {
            if (k as u32) < self.sums {
                unroll::<Q>(|start| {
                    let words = slab_run_words(SHIFT, start, Q, WIDEST);
                    if words > 0 {
                        let at = self.at(group, k, col + start as u64);
                        // SAFETY: the caller's columns, the run aligned to its bytes.
                        let mut run = unsafe { load_shared(at, 4 * words) };
                        unroll::<4>(|q| {
                            if q < words {
                                run[q] = (f32::from_bits(run[q]) + term(k, start + q)).to_bits();
                            }
                        });
                        // SAFETY: as the load.
                        unsafe { store_shared(at, 4 * words, run) };
                    }
                });
            }
        });
    }

    /// Writes the block's total of each of its columns, its groups added in order, into
    /// its partial row of `gather`'s partial array, where it gathers; every thread of the
    /// block calls it (a barrier).
    ///
    /// # Safety
    /// The partial array must hold `sums x rows x cols` f32 for the rows of
    /// [`RowSplit::partial_row`].
    #[inline(always)]
    unsafe fn finish<C: ColumnGather>(&self, gather: &C) {
        if !C::GATHERS {
            return;
        }
        let (row, rows) = (self.partial_row.0 as u64, self.partial_row.1 as u64);
        let partial = gather.partial() as *mut f32;
        // SAFETY: the slab's words and this block's row of `partial`.
        unsafe {
            sync_threads();
            let mut local = thread_idx_x();
            while local < self.cols {
                let col = self.first + local as u64;
                unroll::<2>(|k| {
                    if (k as u32) < self.sums {
                        let mut total = 0.0;
                        for group in 0..self.groups {
                            total += f32::from_bits(load_shared(self.at(group, k, col), 4)[0]);
                        }
                        partial.add(((k as u64 * rows + row) * self.row_cols + col) as usize).write(total);
                    }
                });
                local += block_dim_x();
            }
        }
    }
}

/// Whether a cached backward may stage its rows in two caches ([`RowShape::stages`]): where
/// it gathers column sums from aligned rows on a block split that does not prefetch (the
/// shared path, whose gathering grid is one wave of blocks, each working through many rows),
/// holding no packs in registers.
const fn stages_rows<C: ColumnGather, R: RowSplit, const PHASED: bool, const HELD: usize>() -> bool {
    C::GATHERS && !PHASED && !R::PREFETCHES && HELD == 0
}

/// Whether each block owns its columns in every row ([`RowSplit::owned_slice`]): where `C`
/// gathers column sums from `PHASED` rows, whose packs' columns move with each row's head.
const fn owns_columns<C: ColumnGather, const PHASED: bool>() -> bool {
    C::GATHERS && PHASED
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
fn start_sums<G: RowGradient<N>, const N: usize>(op: &G, sums: &mut [f32; N], edge: Option<(f32, f32)>) {
    if let Some((a, b)) = edge {
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

/// The element of row `row` at `col`, outside its aligned packs, that this thread takes
/// (`PHASED` rows only), if any: its column, `a` there, and `b` as loaded and as `gather`
/// scales it.
///
/// # Safety
/// `col` must be a column of row `row` of the loads' views.
#[inline(always)]
unsafe fn edge<LA: LoadOne, LB: LoadOne, C: ColumnGather>(
    (load_a, load_b, gather): (&LA, &LB, &C),
    row: u64,
    col: Option<u64>,
) -> Option<Edge> {
    // SAFETY: forwarded to the caller.
    col.map(|col| unsafe {
        let (a, b) = (load_a.load_one(row, col), load_b.load_one(row, col));
        Edge { col, a, b, scaled: gather.scale(col, [b])[0] }
    })
}

/// A row's element outside its aligned packs: its column, `a`, `b` as loaded, and `b` as
/// the row's sums take it ([`ColumnGather::scale`]).
#[derive(Clone, Copy)]
struct Edge {
    col: u64,
    a: f32,
    b: f32,
    scaled: f32,
}

/// One backward call: the op, the loads of its two input rows, the output's store, the
/// column sums it gathers and the view; its methods are the path bodies.
pub(crate) struct BackwardRows<'a, G, LA, LB, S, C, const N: usize, const P: usize> {
    pub(crate) op: &'a G,
    pub(crate) load_a: &'a LA,
    pub(crate) load_b: &'a LB,
    pub(crate) store: &'a S,
    pub(crate) gather: &'a C,
    pub(crate) shape: &'a RowShape,
}

impl<G, LA, LB, S, C, const N: usize, const P: usize> BackwardRows<'_, G, LA, LB, S, C, N, P>
where
    G: RowGradient<N>,
    LA: Load<P> + LoadOne,
    LB: Load<P> + LoadOne,
    S: Store<P> + StoreOne,
    C: ColumnGather,
{
    /// Gathers a pack's pairs into `slab` at `(group, col, aligned)` (where the call
    /// gathers; see [`ColumnSlab::add`]) and returns `b` scaled.
    ///
    /// # Safety
    /// As [`ColumnSlab::add`] and [`ColumnGather::scale`].
    #[inline(always)]
    unsafe fn gather_pack(&self, slab: &ColumnSlab, at: (u32, u64, bool), a: [f32; P], b: [f32; P]) -> [f32; P] {
        let col = at.1;
        // SAFETY: forwarded to the caller.
        unsafe {
            if C::GATHERS {
                slab.add::<P>(at, |k, j| self.gather.term(k, a[j], b[j]));
            }
            self.gather.scale(col, b)
        }
    }

    /// The edge's output, gathering its pair first; the block's only group.
    ///
    /// # Safety
    /// As [`BackwardRows::gather_pack`]; `edge` must be of row `row`.
    #[inline(always)]
    unsafe fn store_edge(&self, slab: &ColumnSlab, row: u64, grad: G::Row, edge: Option<Edge>) {
        if let Some(Edge { col, a, b, scaled }) = edge {
            // SAFETY: forwarded to the caller.
            unsafe {
                if C::GATHERS {
                    slab.add::<1>((0, col, false), |k, _| self.gather.term(k, a, b));
                }
                self.store.store_one(G::apply(grad, a, scaled), row, col);
            }
        }
    }

    /// Both rows cached in shared memory, split over blocks as `split` says, `HELD` packs of
    /// each per thread in registers ([`HeldRowCache`]); the column sums of each thread's
    /// first `SUMS_HELD` packs in registers across rows where the rows are aligned (each
    /// thread takes the same packs of every row, so none shares them), the rest in the slab.
    /// Rows run from their heads whose column sums are gathered take each block's owned
    /// part ([`RowSplit::owned_slice`]), so its slab holds its own columns alone.
    ///
    /// A block that gathers over aligned rows works through many (its grid is one wave of
    /// resident blocks), so where the launch gives it two caches ([`RowShape::stages`]) it
    /// stages its rows ([`stages_rows`]): as it starts a row it copies the next into the
    /// other cache, whose copies then overlap the row's passes and reductions, and waits
    /// for the row's own alone.
    #[inline(always)]
    unsafe fn cached<R: RowSplit, const PHASED: bool, const HELD: usize, const SUMS_HELD: usize>(&self, split: &R) {
        let &BackwardRows { op, load_a, load_b, store, gather, shape } = self;
        let owns = owns_columns::<C, PHASED>();
        let slice = if owns { split.owned_slice::<P>(shape) } else { split.slice::<P>(shape) };
        // The gathered sums, then a's cache, then b's; where staged, a second pair of caches.
        let slab = ColumnSlab::new::<C, R, P, PHASED>(gather, split, shape, 1);
        let staged = stages_rows::<C, R, PHASED, HELD>() && shape.stages >= ROW_CACHE_STAGES;
        let stage_bytes = HeldRowCache::<LB::Exact, P, HELD>::new(
            HeldRowCache::<LA::Exact, P, HELD>::new(slab.end(), slice).end(),
            slice,
        )
        .end()
        .bytes_past(slab.end());
        let caches = |stage: u32| {
            let cache_a = HeldRowCache::<LA::Exact, P, HELD>::new(slab.end().offset(stage * stage_bytes), slice);
            let cache_b = HeldRowCache::<LB::Exact, P, HELD>::new(cache_a.end(), slice);
            (cache_a, cache_b)
        };
        // Made once: a cache's held packs live in its registers across rows.
        let stage_caches = (caches(0), caches(1));
        let mut stage = 0;
        let mut held_sums = [[[0.0; P]; SUMS_HELD]; 2];
        // SAFETY (block): the launch sizes shared memory for the slab and the caches; each
        // thread touches only its own packs' slots and columns, so no barrier is needed
        // beyond those in the reductions (which also order one row's gathering before the
        // next's, whose columns may be another thread's where rows run from their heads). A
        // staged row lands in the cache whose slots this thread last read for the row
        // before, whose values it has used.
        unsafe {
            slab.clear::<C>();
            split.rows::<P, PHASED>(shape, R::PREFETCHES || staged, |at| {
                let row = at.row;
                let (current, upcoming) = &stage_caches;
                let ((cache_a, cache_b), (next_a, next_b)) =
                    if staged && stage == 1 { (upcoming, current) } else { (current, upcoming) };
                let col = if owns { slice.in_row(at).edge::<P, PHASED>() } else { split.edge::<P, PHASED>(shape, at) };
                let edge = edge((load_a, load_b, gather), row, col);
                if staged {
                    if !at.prefetched {
                        cache_a.stage_pair(load_a, cache_b, load_b, at);
                    }
                    match at.next {
                        Some((next, head)) => {
                            let next = BlockRow { row: next, head, next: None, prefetched: false };
                            next_a.stage_pair(load_a, next_b, load_b, next);
                            wait_async_groups_but(1);
                        }
                        None => wait_async_copies(),
                    }
                    stage ^= 1;
                } else if R::PREFETCHES {
                    // A split that prefetches holds one block an SM, so nothing else overlaps
                    // the wait for a row's copies: its first pass takes each pack as it lands.
                    cache_a.fill_pair(load_a, cache_b, load_b, at);
                } else {
                    cache_a.fill(load_a, at);
                    cache_b.fill(load_b, at);
                    wait_async_copies();
                }
                let read = |pack, col| (cache_a.read(load_a, at, pack, col), cache_b.read(load_b, at, pack, col));
                let mut sums = [0.0; N];
                start_sums(op, &mut sums, edge.map(|e| (e.a, e.scaled)));
                let mut first_pass = |pack, col| {
                    let (a, b) = read(pack, col);
                    add_terms(op, &mut sums, a, gather.scale(col, b));
                };
                if R::PREFETCHES {
                    cache_a.landed_pairs(load_a, cache_b, load_b, at, &mut first_pass);
                } else {
                    cache_a.packs(at, &mut first_pass);
                }
                reduce_sums(split, &mut sums);
                let grad = op.row(Some(row), &sums);
                self.store_edge(&slab, row, grad, edge);
                cache_a.numbered_packs::<SUMS_HELD>(at, |pack, col, number| {
                    let (a, b) = read(pack, col);
                    let b = match number {
                        Some(n) if C::GATHERS && !PHASED => {
                            unroll::<2>(|k| unroll::<P>(|j| held_sums[k][n][j] += gather.term(k, a[j], b[j])));
                            gather.scale(col, b)
                        }
                        _ => self.gather_pack(&slab, (0, col, !PHASED), a, b),
                    };
                    store.store(unrolled_array(|j| G::apply(grad, a[j], b[j])), row, col);
                    if R::PREFETCHES {
                        cache_a.prefetch(load_a, at, pack);
                        cache_b.prefetch(load_b, at, pack);
                    }
                });
            });
            if C::GATHERS && !PHASED {
                // This thread's columns: no other thread of the block adds to them.
                unroll::<SUMS_HELD>(|n| {
                    if let Some((_, col)) = slice.thread_pack::<P>(n) {
                        slab.add::<P>((0, col, true), |k, j| held_sums[k][n][j]);
                    }
                });
            }
            slab.finish(gather);
        }
    }

    /// Both rows re-read from global memory, a block per row.
    #[inline(always)]
    unsafe fn uncached<const PHASED: bool>(&self) {
        let &BackwardRows { op, load_a, load_b, store, gather, shape } = self;
        let slice = Slice::whole::<P>(shape);
        let slab = ColumnSlab::new::<C, _, P, PHASED>(gather, &BlockSplit, shape, 1);
        // SAFETY (block): every column visited is a pack or an edge element inside the row;
        // the launch sizes shared memory for the slab, whose columns are each one thread's
        // within a row (the reductions' barriers order rows).
        unsafe {
            slab.clear::<C>();
            BlockSplit.rows::<P, PHASED>(shape, false, |at| {
                let (row, slice) = (at.row, slice.in_row(at));
                let edge = edge((load_a, load_b, gather), row, BlockSplit.edge::<P, PHASED>(shape, at));
                let fetch = |col| (load_a.fetch(row, col), load_b.fetch(row, col));
                let convert = |(a, b), col| (load_a.convert(a, row, col), load_b.convert(b, row, col));
                let mut sums = [0.0; N];
                start_sums(op, &mut sums, edge.map(|e| (e.a, e.scaled)));
                block_packs_loaded::<P, _>(slice, fetch, |_, col, fetched| {
                    let (a, b) = convert(fetched, col);
                    add_terms(op, &mut sums, a, gather.scale(col, b));
                });
                reduce_sums(&BlockSplit, &mut sums);
                let grad = op.row(Some(row), &sums);
                self.store_edge(&slab, row, grad, edge);
                block_packs_loaded::<P, _>(slice, fetch, |_, col, fetched| {
                    let (a, b) = convert(fetched, col);
                    let b = self.gather_pack(&slab, (0, col, !PHASED), a, b);
                    store.store_streaming(unrolled_array(|j| G::apply(grad, a[j], b[j])), row, col)
                });
            });
            slab.finish(gather);
        }
    }

    /// Both rows in registers, `E` elements per lane (two rows per access in the narrowest
    /// tier); padding loads as 0 in both, so it must add nothing to the sums. Each lane
    /// group gathers into its own partial row: groups share columns.
    #[inline(always)]
    unsafe fn warp<const E: usize>(&self) {
        let &BackwardRows { op, load_a, load_b, store, gather, shape } = self;
        let at = WarpRows::new::<E>(shape);
        // The block's lane groups (a power of two of lanes each: shifts, no division).
        let width_log2 = at.width.trailing_zeros();
        let slab = ColumnSlab::new::<C, _, P, false>(gather, &BlockSplit, shape, block_dim_x() >> width_log2);
        let group = thread_idx_x() >> width_log2;
        // SAFETY (block): loads and stores stay in range (warp_load, warp_store), and the whole
        // warp runs the same iterations; a group's columns are its own in the slab, which the
        // launch sizes.
        unsafe {
            slab.clear::<C>();
            at.for_each_access(shape.rows, |at, first| {
                let a = warp_load::<LA, P, E>(load_a, at, first, shape, 0.0);
                let mut b = warp_load::<LB, P, E>(load_b, at, first, shape, 0.0);
                if C::GATHERS {
                    // The access's rows share their columns: one read-modify-write of the
                    // sums a pack adds both rows' terms (docs/DECISIONS.md, "Parameter gradients gathered in the dx pass").
                    let held: [bool; 2] = unrolled_array(|r| at.holds::<E>(r, first, shape.rows));
                    unroll::<E>(|i| {
                        if i % P == 0 && at.in_row::<P>(i, shape.cols) {
                            slab.add::<P>((group, at.col::<P>(i), true), |k, j| {
                                let mut term = 0.0;
                                unroll::<2>(|r| {
                                    if held[r] {
                                        term += gather.term(k, a[r][i + j], b[r][i + j]);
                                    }
                                });
                                term
                            });
                        }
                    });
                }
                at.for_each_pack::<P, E>(first, shape, 0..E / P, |r, i, _, col| {
                    let scaled = gather.scale::<P>(col, unrolled_array(|j| b[r][i + j]));
                    unroll::<P>(|j| b[r][i + j] = scaled[j]);
                });
                let sums: [[f32; 2]; N] =
                    unrolled_array(|k| warp_row_reduce::<Sum, E>(|r, i| op.term(k, a[r][i], b[r][i]), at.width));
                let grad: [G::Row; 2] = unrolled_array(|r| {
                    let row = at.holds::<E>(r, first, shape.rows).then_some(first + r as u64);
                    op.row(row, &unrolled_array(|k| sums[k][r]))
                });
                warp_store::<S, P, E>(store, at, first, shape, |r, i, _| {
                    unrolled_array(|j| G::apply(grad[r], a[r][i + j], b[r][i + j]))
                });
            });
            slab.finish(gather);
        }
    }

    /// The backward body of path `PATH`, `HELD` packs of each row per thread in registers on
    /// the cluster path (see [`HeldRowCache`]), and the gathered column sums of `SUMS_HELD`
    /// packs a thread on the aligned cached paths (see [`BackwardRows::cached`]).
    ///
    /// # Safety
    /// The loads and the store must cover `shape`'s rows, the launch have `PATH`'s geometry
    /// (and, where the call gathers, shared memory for its [`ColumnSlab`] first and the
    /// partial rows of [`RowSplit::partial_row`] in `partial`), and rows not aligned to `P`
    /// come only with a phased or warp path.
    #[inline(always)]
    pub(crate) unsafe fn run<const PATH: RowPath, const HELD: usize, const SUMS_HELD: usize>(&self) {
        // SAFETY: forwarded to the caller.
        unsafe {
            match PATH {
                RowPath::Uncached => self.uncached::<false>(),
                RowPath::UncachedPhased => self.uncached::<true>(),
                RowPath::Shared => self.cached::<_, false, 0, SUMS_HELD>(&BlockSplit),
                RowPath::SharedPhased => self.cached::<_, true, 0, 0>(&BlockSplit),
                #[cfg(feature = "cluster")]
                RowPath::Cluster => ClusterSplit::run(|split| self.cached::<_, false, HELD, SUMS_HELD>(split)),
                #[cfg(feature = "cluster")]
                RowPath::ClusterPhased => ClusterSplit::run(|split| self.cached::<_, true, HELD, 0>(split)),
                _ => on_warp_path!(PATH, E => self.warp::<E>()),
            }
        }
    }
}
