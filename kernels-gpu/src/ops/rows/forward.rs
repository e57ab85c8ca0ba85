//! The row engine's forward: each path's body written once, for every op that reads a row,
//! reduces it to statistics, writes per-row values and (usually) one output per element.
//! Softmax, log-softmax and their fused kinds, cross entropy's loss, logsumexp, LayerNorm
//! and RMSNorm are [`RowForward`]s.
//!
//! The statistics are two reductions: a center (softmax's max, a norm's mean) and a
//! spread about it (the sum of `e^(x - max)`, of `(x - mean)^2`). Rows held in registers or
//! shared memory take two passes over them ([`two_pass`]); rows read once from global
//! memory, and cached rows where an op merges its reductions, use the op's own one-pass
//! form ([`RowForward::streamed_stats`], [`RowForward::cached_stats`]).

#[cfg(feature = "cluster")]
use super::ClusterSplit;
use super::{
    BlockRow, BlockSplit, RowCache, RowSplit, Slice, WarpRows, block_packs, block_packs_loaded, request_ahead,
    warp_load, warp_row_reduce, warp_store,
};
use crate::abi::RowShape;
use crate::arch::{dynamic_shared_addr, thread_idx_x, wait_async_copies};
use crate::pack::{Load, LoadOne, Store, StoreOne};
use crate::reduce::{Reduce, Sum};
use crate::scalar::Scalar;
use crate::table::{RowPath, requests_rows_ahead};
use crate::unroll::{unroll, unrolled_array};

/// What takes in a thread's values of a row, a pack (or a single edge element) at a time.
pub(crate) trait Accumulate {
    fn add<const Q: usize>(&mut self, values: [f32; Q]);
}

/// One pass over a thread's share of a row: its element outside the aligned packs, if any,
/// and its packs.
pub(crate) trait RowPass<const P: usize> {
    /// This thread's element outside the row's aligned packs (phased rows only).
    fn edge(&self) -> Option<f32>;

    /// Adds each of this thread's packs to `acc`.
    ///
    /// # Safety
    /// The pass's row and packs must be inside the view (the engine builds passes so).
    unsafe fn packs(&self, acc: &mut impl Accumulate);

    /// `R` over the edge element and the packs, starting from the edge.
    ///
    /// # Safety
    /// As [`RowPass::packs`].
    #[inline(always)]
    unsafe fn fold<R: Reduce<Value = f32>>(&self) -> f32 {
        let mut fold = Fold::<R>(self.edge().map_or(R::IDENTITY, |x| x), core::marker::PhantomData);
        // SAFETY: forwarded to the caller.
        unsafe { self.packs(&mut fold) };
        fold.0
    }

    /// The sum of `op`'s spread about `center` over the edge element and the packs.
    ///
    /// # Safety
    /// As [`RowPass::packs`].
    #[inline(always)]
    unsafe fn spread<O: RowForward>(&self, op: &O, center: f32) -> f32 {
        let mut spread = Spread { op, center, sum: self.edge().map_or(0.0, |x| op.spread(x, center)) };
        // SAFETY: forwarded to the caller.
        unsafe { self.packs(&mut spread) };
        spread.sum
    }
}

struct Fold<R: Reduce<Value = f32>>(f32, core::marker::PhantomData<R>);

impl<R: Reduce<Value = f32>> Accumulate for Fold<R> {
    #[inline(always)]
    fn add<const Q: usize>(&mut self, values: [f32; Q]) {
        unroll::<Q>(|j| self.0 = R::combine(self.0, values[j]));
    }
}

struct Spread<'a, O> {
    op: &'a O,
    center: f32,
    sum: f32,
}

impl<O: RowForward> Accumulate for Spread<'_, O> {
    #[inline(always)]
    fn add<const Q: usize>(&mut self, values: [f32; Q]) {
        unroll::<Q>(|j| self.sum += self.op.spread(values[j], self.center));
    }
}

/// An op's forward math over the engine's paths.
pub(crate) trait RowForward: Sized {
    /// What a row's outputs and per-row values need.
    type Stats: Copy;
    /// The reduction giving the row's center (before [`RowForward::center`]).
    type Center: Reduce<Value = f32>;
    /// Per-column words an output pack needs beside the row (gamma and beta), fetched
    /// ahead of use.
    type Params<const P: usize>: Copy;
    /// Those words as the output's math takes them ([`RowForward::prepare`]).
    type Prepared<const P: usize>: Copy;

    /// Whether the warp path zeroes the spread of its registers past a row's end (which
    /// hold the center's identity, whose spread is not nothing).
    const MASKS_PADDING: bool;
    /// Whether the outputs are the row's elements; otherwise only per-row values.
    const ELEMENTS: bool;
    /// Whether an element that is `-inf` whatever the view holds (in a pack the load does
    /// not read, [`Load::reads`]) leaves the row's statistics as they are and has the same
    /// output wherever it is in the row (softmax: `e^-inf` is 0): the cached paths then
    /// neither read nor compute such packs, and store that output.
    const SKIPS_MASKED: bool = false;

    /// Whether the row has a center to reduce (RMSNorm's is 0).
    #[inline(always)]
    fn centers(&self) -> bool {
        true
    }

    /// The center from its reduction's total.
    fn center(&self, total: f32) -> f32;

    /// What `x` adds to the spread about `center`.
    fn spread(&self, x: f32, center: f32) -> f32;

    /// The row's statistics from its center and total spread.
    fn stats(&self, center: f32, spread: f32) -> Self::Stats;

    /// What the warp path keeps in `x`'s register once its spread is known (softmax keeps
    /// `e^(x - max)`, so the output needs no second exponential).
    #[inline(always)]
    fn keep(&self, x: f32, _spread: f32) -> f32 {
        x
    }

    /// Fetched parameters as the output takes them. The engine prepares a pack's
    /// parameters before reading the pack from a cache: the read issued before the
    /// parameters' conversion kept its registers live across it (the norms' shared forward,
    /// 8 registers more).
    fn prepare<const P: usize>(&self, params: Self::Params<P>) -> Self::Prepared<P>;

    /// The output pack for `values`: the row's elements, or (`kept`) what
    /// [`RowForward::keep`] left of them.
    fn output<const P: usize>(
        &self,
        stats: Self::Stats,
        values: [f32; P],
        kept: bool,
        params: Self::Prepared<P>,
    ) -> [f32; P];

    /// The parameters of the output pack at `col`.
    ///
    /// # Safety
    /// `col..col + P` must be columns of the row, `col` aligned to `P` where `P > 1`.
    unsafe fn fetch_params<const P: usize>(&self, col: u64) -> Self::Params<P>;

    /// Whether the shared path fetches the parameters in batches of packs, ahead of the
    /// output pass's reads (see the norms' forward).
    #[inline(always)]
    fn batches_params(&self) -> bool {
        false
    }

    /// Writes row `row`'s per-row values; one thread per row calls it.
    ///
    /// # Safety
    /// `row` must be a row of the view `load` reads.
    unsafe fn write_row<L: LoadOne>(&self, load: &L, row: u64, stats: Self::Stats);

    /// Starts reading what [`RowForward::write_row`] reads beside the row (cross entropy's
    /// target) into L1 as the row's loads are issued, so that the read after the reductions
    /// does not wait on DRAM. Every thread of the row calls it (a test for the one that
    /// writes would cost the ops that read nothing). Nothing to read by default.
    ///
    /// # Safety
    /// As [`RowForward::write_row`].
    #[inline(always)]
    unsafe fn prefetch_row(&self, _row: u64) {}

    /// The statistics of a row read once from global memory, over every thread of the
    /// blocks sharing the row.
    ///
    /// # Safety
    /// As [`RowSplit::all_reduce`] and [`RowPass::packs`].
    unsafe fn streamed_stats<R: RowSplit, const P: usize>(&self, split: &R, pass: &impl RowPass<P>) -> Self::Stats;

    /// The statistics of a row cached in shared memory: by default two passes, after the
    /// cache's copies have landed.
    ///
    /// # Safety
    /// As [`RowForward::streamed_stats`].
    #[inline(always)]
    unsafe fn cached_stats<L: Load<P>, R: RowSplit, const P: usize>(
        &self,
        split: &R,
        pass: &CachedPass<'_, L, P>,
    ) -> Self::Stats {
        wait_async_copies();
        // SAFETY: forwarded to the caller.
        unsafe { two_pass(self, split, pass) }
    }
}

/// The statistics of a row by two passes over `pass`: the center, reduced over the blocks
/// sharing the row, then the spread about it.
///
/// # Safety
/// As [`RowForward::streamed_stats`].
#[inline(always)]
pub(crate) unsafe fn two_pass<O: RowForward, R: RowSplit, const P: usize>(
    op: &O,
    split: &R,
    pass: &impl RowPass<P>,
) -> O::Stats {
    // SAFETY: forwarded to the caller.
    unsafe {
        // Skipped where there is no center: shared reads are ordered accesses the compiler
        // keeps even where their result goes unused.
        let center =
            if op.centers() { op.center(split.all_reduce::<O::Center>(pass.fold::<O::Center>())) } else { 0.0 };
        op.stats(center, split.all_reduce::<Sum>(pass.spread(op, center)))
    }
}

/// A pass over this thread's packs of a row cached in shared memory.
pub(crate) struct CachedPass<'a, L: Load<P>, const P: usize> {
    cache: &'a RowCache<L::Exact, P>,
    load: &'a L,
    at: BlockRow,
    slice: Slice,
    edge: Option<f32>,
    /// Whether packs the load does not read are left out ([`RowForward::SKIPS_MASKED`]).
    skips_masked: bool,
}

impl<L: Load<P>, const P: usize> CachedPass<'_, L, P> {
    /// Whether pack `local` counts: every pack, but those the load does not read where the
    /// op skips them.
    #[inline(always)]
    fn counts(&self, local: u64) -> bool {
        !self.skips_masked || self.load.reads(self.at.row, self.slice.col::<P>(local))
    }

    /// Whether the cache copies the row (`cp.async`), so its packs land one by one.
    #[cfg(feature = "softmax")]
    #[inline(always)]
    pub(crate) fn copies(&self) -> bool {
        self.cache.copies(self.load)
    }

    /// Adds each pack to `acc` as it lands ([`RowCache::landed_packs`]).
    ///
    /// # Safety
    /// As [`RowPass::packs`].
    #[cfg(feature = "softmax")]
    #[inline(always)]
    pub(crate) unsafe fn landed(&self, acc: &mut impl Accumulate) {
        self.cache.landed_packs(1, |local| {
            if self.counts(local) {
                // SAFETY: this thread filled the pack, and waited for it.
                acc.add(unsafe { self.cache.read(self.load, self.at, local) })
            }
        });
    }
}

impl<L: Load<P>, const P: usize> RowPass<P> for CachedPass<'_, L, P> {
    #[inline(always)]
    fn edge(&self) -> Option<f32> {
        self.edge
    }

    #[inline(always)]
    unsafe fn packs(&self, acc: &mut impl Accumulate) {
        block_packs::<P>(self.slice, |local, _| {
            if self.counts(local) {
                // SAFETY: this thread filled the pack (the caller waited for its copies).
                acc.add(unsafe { self.cache.read(self.load, self.at, local) })
            }
        });
    }
}

/// A pass over this thread's packs of a row read from global memory.
struct StreamedPass<'a, L> {
    load: &'a L,
    row: u64,
    slice: Slice,
    edge: Option<f32>,
}

impl<L: Load<P>, const P: usize> RowPass<P> for StreamedPass<'_, L> {
    #[inline(always)]
    fn edge(&self) -> Option<f32> {
        self.edge
    }

    #[inline(always)]
    unsafe fn packs(&self, acc: &mut impl Accumulate) {
        let (load, row) = (self.load, self.row);
        // SAFETY: the slice's packs are inside the row (the caller's promise).
        block_packs_loaded::<P, _>(
            self.slice,
            |col| unsafe { load.fetch(row, col) },
            |_, col, fetched| acc.add(unsafe { load.convert(fetched, row, col) }),
        );
    }
}

/// Where a forward's outputs go, a row at a time: what a row's stores need beyond its
/// elements (cross entropy's target and loss gradient) is read once, as the row starts,
/// rather than with every pack, whose reads would add to every pack's latency on the shared and
/// cluster paths (docs/DECISIONS.md, "Per-row values read once a row").
pub(crate) trait RowOutput<const P: usize> {
    type Row: Store<P> + StoreOne;

    /// # Safety
    /// `row` must be a row of the view.
    unsafe fn row(&self, row: u64) -> Self::Row;

    /// Starts reading what [`RowOutput::row`] reads for `row`, as the row's loads are issued,
    /// on the paths that call `row` only after the row's reductions (warp, uncached): the
    /// reads then hit L1 instead of putting DRAM latency after the reductions, and no
    /// register is held across the row. Nothing to read by default.
    ///
    /// # Safety
    /// As [`RowOutput::row`].
    #[inline(always)]
    unsafe fn prefetch(&self, _row: u64) {}
}

impl<S: Store<P> + StoreOne + Copy, const P: usize> RowOutput<P> for S {
    type Row = S;

    #[inline(always)]
    unsafe fn row(&self, _row: u64) -> S {
        *self
    }
}

/// The outputs of an op without element outputs ([`RowForward::ELEMENTS`]): never stored
/// to.
#[cfg(feature = "softmax")]
#[derive(Clone, Copy)]
pub(crate) struct NoElements;

#[cfg(feature = "softmax")]
impl<const P: usize> Store<P> for NoElements {
    #[inline(always)]
    unsafe fn store(&self, _values: [f32; P], _row: u64, _col: u64) {}
}

/// A forward's outputs looked up a pack at a time, as the warp and uncached paths store
/// them: a row's state held per warp access, or per row on the uncached path, stays live across the
/// row's loads and costs registers, and on the warp tiers resident warps (docs/DECISIONS.md,
/// "Per-row values read once a row").
struct EachPack<'a, Out>(&'a Out);

impl<Out: RowOutput<P>, const P: usize> Store<P> for EachPack<'_, Out> {
    #[inline(always)]
    unsafe fn store(&self, values: [f32; P], row: u64, col: u64) {
        // SAFETY: forwarded.
        unsafe { self.0.row(row).store(values, row, col) }
    }

    #[inline(always)]
    unsafe fn store_streaming(&self, values: [f32; P], row: u64, col: u64) {
        // SAFETY: forwarded.
        unsafe { self.0.row(row).store_streaming(values, row, col) }
    }
}

/// The output of the single element `x` at `col`.
///
/// # Safety
/// `col` must be a column of the row.
#[inline(always)]
unsafe fn output_one<O: RowForward>(op: &O, stats: O::Stats, x: f32, col: u64) -> f32 {
    // SAFETY: forwarded to the caller.
    op.output::<1>(stats, [x], false, op.prepare(unsafe { op.fetch_params::<1>(col) }))[0]
}

/// One forward call: the op, the load of its rows, its outputs and the view; its methods
/// are the path bodies.
pub(crate) struct ForwardRows<'a, O, L, Out, const P: usize> {
    pub(crate) op: &'a O,
    pub(crate) load: &'a L,
    pub(crate) outputs: &'a Out,
    pub(crate) shape: &'a RowShape,
}

impl<O, L, Out, const P: usize> ForwardRows<'_, O, L, Out, P>
where
    O: RowForward,
    L: Load<P> + LoadOne,
    Out: RowOutput<P>,
{
    /// Each row in registers, `E` elements per lane (two rows per access in the narrowest
    /// tier).
    #[inline(always)]
    unsafe fn warp<const E: usize>(&self) {
        let &ForwardRows { op, load, outputs, shape } = self;
        let at = WarpRows::new::<E>(shape);
        // SAFETY (block): loads and stores stay in range (warp_load, warp_store), and the whole
        // warp runs the same iterations.
        at.for_each_access(shape.rows, |at, first| unsafe {
            unroll::<2>(|r| {
                if at.holds::<E>(r, first, shape.rows) {
                    op.prefetch_row(first + r as u64);
                    if O::ELEMENTS {
                        outputs.prefetch(first + r as u64);
                    }
                }
            });
            let mut buf = warp_load::<L, P, E>(load, at, first, shape, O::Center::IDENTITY);
            // After the row's own loads, so they leave first. Only where the planner may request
            // rows: elsewhere the code alone costs registers, and with them resident blocks
            // (docs/DECISIONS.md, "Rows requested ahead into L2").
            if O::ELEMENTS && requests_rows_ahead(E, <L::Exact as Scalar>::BYTES) {
                request_ahead(load, shape, first, at.lane, at.width);
            }
            let center = if op.centers() {
                warp_row_reduce::<O::Center, E>(|r, i| buf[r][i], at.width).map(|total| op.center(total))
            } else {
                [0.0; 2]
            };
            let spread = warp_row_reduce::<Sum, E>(
                // A branch, not a select of a spread computed anyway: LLVM then merges a pack's
                // branches into one, a select a pack rather than an element (the norms' warp
                // kernels, 6-18 instructions).
                |r, i| {
                    if !O::MASKS_PADDING || at.in_row::<P>(i, shape.cols) {
                        let spread = op.spread(buf[r][i], center[r]);
                        buf[r][i] = op.keep(buf[r][i], spread);
                        spread
                    } else {
                        0.0
                    }
                },
                at.width,
            );
            let stats = [op.stats(center[0], spread[0]), op.stats(center[1], spread[1])];
            if at.lane == 0 {
                unroll::<2>(|r| {
                    if at.holds::<E>(r, first, shape.rows) {
                        op.write_row(load, first + r as u64, stats[r]);
                    }
                });
            }
            if O::ELEMENTS {
                warp_store::<_, P, E>(&EachPack(outputs), at, first, shape, |r, i, col| {
                    let params = op.prepare(op.fetch_params::<P>(col));
                    op.output(stats[r], unrolled_array(|j| buf[r][i + j]), true, params)
                });
            }
        });
    }

    /// The row cached in shared memory, split over blocks as `split` says (a block, or a
    /// cluster of blocks each holding a slice). A thread's element outside the row's aligned
    /// packs ([`RowSplit::edge`]) stays in a register.
    #[inline(always)]
    unsafe fn cached<R: RowSplit, const PHASED: bool>(&self, split: &R) {
        let &ForwardRows { op, load, outputs, shape } = self;
        let slice = split.slice::<P>(shape);
        let cache = RowCache::<L::Exact, P>::new(dynamic_shared_addr(), slice);
        // SAFETY (block): the launch sizes shared memory for the cache; each thread touches only
        // its own packs' slots, so no barrier is needed beyond those in the reductions. Edges
        // are elements of the row.
        split.rows::<P, PHASED>(shape, R::PREFETCHES, |at| unsafe {
            let (row, slice) = (at.row, slice.in_row(at));
            let edge = split.edge::<P, PHASED>(shape, at).map(|col| (col, load.load_one(row, col)));
            let store = outputs.row(row);
            cache.fill(load, at);
            let pass =
                CachedPass { cache: &cache, load, at, slice, edge: edge.map(|e| e.1), skips_masked: O::SKIPS_MASKED };
            let stats = op.cached_stats(split, &pass);
            if thread_idx_x() == 0 && split.leads() {
                op.write_row(load, row, stats);
            }
            if let Some((col, x)) = edge {
                store.store_one(output_one(op, stats, x, col), row, col);
            }
            // Column 0 stands for any: such an op's output does not depend on the column.
            let masked = O::SKIPS_MASKED.then(|| output_one(op, stats, f32::NEG_INFINITY, 0));
            let output = |local, col, params| {
                let params = op.prepare(params);
                let values = match masked {
                    Some(masked) if !load.reads(row, col) => [masked; P],
                    _ => op.output(stats, cache.read(load, at, local), false, params),
                };
                store.store(values, row, col);
                cache.prefetch(load, at, local);
            };
            let fetch = |col| op.fetch_params::<P>(col);
            if op.batches_params() {
                block_packs_loaded::<P, _>(slice, fetch, output);
            } else {
                block_packs::<P>(slice, |local, col| output(local, col, fetch(col)));
            }
        });
    }

    /// The row read from global memory, once for the statistics and (where the op has
    /// element outputs) again for the outputs, split over blocks as `split` says.
    #[inline(always)]
    unsafe fn streamed<R: RowSplit, const PHASED: bool>(&self, split: &R) {
        let &ForwardRows { op, load, outputs, shape } = self;
        let slice = split.slice::<P>(shape);
        // SAFETY (block): every column visited is a pack or an edge element inside the row.
        split.rows::<P, PHASED>(shape, R::PREFETCHES, |at| unsafe {
            let (row, slice) = (at.row, slice.in_row(at));
            let edge = split.edge::<P, PHASED>(shape, at).map(|col| (col, load.load_one(row, col)));
            op.prefetch_row(row);
            if O::ELEMENTS {
                outputs.prefetch(row);
            }
            let stats = op.streamed_stats(split, &StreamedPass { load, row, slice, edge: edge.map(|e| e.1) });
            if thread_idx_x() == 0 && split.leads() {
                op.write_row(load, row, stats);
            }
            if O::ELEMENTS {
                if let Some((col, x)) = edge {
                    outputs.row(row).store_one(output_one(op, stats, x, col), row, col);
                }
                let store = EachPack(outputs);
                block_packs_loaded::<P, _>(
                    slice,
                    |col| (load.fetch(row, col), op.fetch_params::<P>(col)),
                    |_, col, (fetched, params)| {
                        let x = load.convert(fetched, row, col);
                        store.store_streaming(op.output(stats, x, false, op.prepare(params)), row, col)
                    },
                );
            }
        });
    }

    /// The forward body of path `PATH`. An op without element outputs streams its rows on the
    /// block paths (the statistics read each row once; a cache would buy nothing).
    ///
    /// # Safety
    /// The load and the outputs must cover `shape`'s rows, the launch have `PATH`'s geometry,
    /// and rows not aligned to `P` come only with a phased or warp path.
    #[inline(always)]
    pub(crate) unsafe fn run<const PATH: RowPath>(&self) {
        // SAFETY: forwarded to the caller.
        unsafe {
            match PATH {
                RowPath::Uncached => self.streamed::<_, false>(&BlockSplit),
                RowPath::UncachedPhased => self.streamed::<_, true>(&BlockSplit),
                RowPath::Shared if !O::ELEMENTS => self.streamed::<_, false>(&BlockSplit),
                RowPath::SharedPhased if !O::ELEMENTS => self.streamed::<_, true>(&BlockSplit),
                RowPath::Shared => self.cached::<_, false>(&BlockSplit),
                RowPath::SharedPhased => self.cached::<_, true>(&BlockSplit),
                #[cfg(feature = "cluster")]
                RowPath::Cluster => ClusterSplit::run(|split| {
                    if O::ELEMENTS { self.cached::<_, false>(split) } else { self.streamed::<_, false>(split) }
                }),
                #[cfg(feature = "cluster")]
                RowPath::ClusterPhased => ClusterSplit::run(|split| {
                    if O::ELEMENTS { self.cached::<_, true>(split) } else { self.streamed::<_, true>(split) }
                }),
                _ => on_warp_path!(PATH, E => self.warp::<E>()),
            }
        }
    }
}
