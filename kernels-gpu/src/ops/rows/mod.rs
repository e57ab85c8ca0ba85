//! The row engine: the path bodies every row-wise op (softmax, the norms) runs on,
//! written once over the op's hooks ([`forward`], [`backward`]), and the machinery under
//! them: where a thread's rows and columns are on each of OneFlow's three paths, loading a
//! row into registers or a cache, and reductions over a row.
//! - warp: a group of `width` lanes (1 to 32) owns one row (two in the 8-element tier), the
//!   row held in registers, `E` elements per lane;
//! - shared: a block owns a row, cached in dynamic shared memory (filled by `cp.async`
//!   where the load has a source);
//! - cluster (sm_90): a cluster of blocks owns a row, each caching a slice of it;
//! - uncached: a block owns a row and re-reads it from global memory (any width).

#[cfg(feature = "cluster")]
use crate::abi::MAX_CLUSTER_BLOCKS;
use crate::abi::{PACK_BYTES, RowShape, part_edge_col, rows_per_access};
use crate::arch::{
    SharedAddr, WARP_SIZE, block_dim_x, block_idx_x, commit_async_copies, copy_async, grid_dim_x, load_global_nc,
    load_shared, pinned, request_row_l2, store_shared, thread_idx_x, wait_async_groups_but,
};
#[cfg(feature = "cluster")]
use crate::arch::{
    cluster_blocks, cluster_exchange, cluster_id, cluster_rank, cluster_sync, clusters, expect_bytes,
    fence_barrier_init, init_barrier, store_remote_async, wait_barrier,
};
use crate::pack::{Load, Pack, RowMajor, Store};
#[cfg(feature = "cluster")]
use crate::reduce::{MAX_WORDS, Words};
use crate::reduce::{Reduce, block_all_reduce, group_all_reduce};
use crate::scalar::Scalar;
use crate::unroll::unroll;
use core::cell::Cell;
use core::marker::PhantomData;
use core::mem::MaybeUninit;

/// `$body` with `$e`, a `const usize`, the elements a lane holds on `$path` where it is a
/// warp path (the row kernels' warp bodies take them as a const parameter); nothing on the
/// block paths, whose bodies the caller matches first.
macro_rules! on_warp_path {
    ($path:expr, $e:ident => $body:expr) => {
        match $path {
            crate::table::RowPath::Warp8 => {
                const $e: usize = crate::table::RowPath::Warp8.warp_elements();
                $body
            }
            crate::table::RowPath::Warp16 => {
                const $e: usize = crate::table::RowPath::Warp16.warp_elements();
                $body
            }
            crate::table::RowPath::Warp24 => {
                const $e: usize = crate::table::RowPath::Warp24.warp_elements();
                $body
            }
            crate::table::RowPath::Warp32 => {
                const $e: usize = crate::table::RowPath::Warp32.warp_elements();
                $body
            }
            _ => {}
        }
    };
}

pub(crate) mod backward;
pub(crate) mod forward;

/// Where a lane's rows are on the warp path. A warp steps through rows as a whole
/// (`warp_first`, `+ step`, ...), its groups at `group_offset` rows from the warp's first, so
/// every lane runs the same iterations and shuffles never see a lane that left the loop.
pub(crate) struct WarpRows {
    pub(crate) width: u32,
    pub(crate) lane: u32,
    warp_first: u64,
    group_offset: u64,
    step: u64,
}

impl WarpRows {
    #[inline(always)]
    pub(crate) fn new<const E: usize>(args: &RowShape) -> Self {
        // A power of two up to 32 (the host checks): shifts and masks, no division.
        let width = args.width.clamp(1, WARP_SIZE);
        let width_log2 = width.trailing_zeros();
        let rows_per_access = rows_per_access(E);
        let rows_per_warp = ((WARP_SIZE >> width_log2) as u64) * rows_per_access;
        let warp = ((block_idx_x() * block_dim_x() + thread_idx_x()) / WARP_SIZE) as u64;
        let warps = (grid_dim_x() * block_dim_x() / WARP_SIZE) as u64;
        let group_in_warp = ((thread_idx_x() % WARP_SIZE) >> width_log2) as u64;
        WarpRows {
            width,
            lane: thread_idx_x() & (width - 1),
            warp_first: warp * rows_per_warp,
            group_offset: group_in_warp * rows_per_access,
            step: warps * rows_per_warp,
        }
    }

    /// Column of the pack holding element `i` (of packs of `P`) of this lane.
    #[inline(always)]
    pub(crate) fn col<const P: usize>(&self, i: usize) -> u64 {
        (((i / P) as u64) * self.width as u64 + self.lane as u64) * P as u64
    }

    /// Whether row `r` (0 or 1) of the access starting at row `first` exists.
    #[inline(always)]
    pub(crate) fn holds<const E: usize>(&self, r: usize, first: u64, rows: u64) -> bool {
        row_possible::<E>(r) && first + (r as u64) < rows
    }

    /// Whether element `i` of this lane lies inside a row of `cols` (a multiple of `P`).
    #[inline(always)]
    pub(crate) fn in_row<const P: usize>(&self, i: usize, cols: u64) -> bool {
        self.col::<P>(i) < cols
    }

    /// Calls `f(at, first)` for each access of this lane's group (rows `first` and, with two
    /// rows per access, `first + 1`), the whole warp running the same iterations. `at` is
    /// this place with its lane and width [`pinned`] in the iteration: a lane's columns do
    /// not depend on the row, so LLVM would otherwise hoist every address and offset built
    /// from them out of the loop, 64 bits each, live through every row (the 16-bit
    /// 32-element norm forward: 94 registers against 64-72, 5 blocks of 128 an SM against
    /// 7-8; measured in docs/PERF.md).
    #[inline(always)]
    pub(crate) fn for_each_access(&self, rows: u64, mut f: impl FnMut(&WarpRows, u64)) {
        strided(self.warp_first, self.step, rows, |base| f(&self.pinned(), base + self.group_offset));
    }

    /// This place with its lane and width [`pinned`] where it is called. [`warp_load`] and
    /// [`warp_store`] each pin again, so the load pass's addresses are not held through the
    /// reductions for the store pass; within a pass they are shared by its arrays. (Pinning
    /// each column instead rebuilt it at every use, as pinned values are never merged: the
    /// pack-1 softmax backward lost 7 points of copy.)
    #[inline(always)]
    fn pinned(&self) -> WarpRows {
        WarpRows { width: pinned(self.width), lane: pinned(self.lane), ..*self }
    }

    /// Calls `f(r, i, row, col)` for every pack slot of this lane numbered in `packs`, in
    /// range or not, with the row and column clamped into the view (out-of-range slots read
    /// the row's last pack again, an L1 hit). Fetching every slot unconditionally keeps the
    /// loads apart from any fill value: a predicated load merged with a zero fill made ptxas
    /// copy each result, waiting for it, before issuing the next load. (Written apart from
    /// [`WarpRows::for_each_pack`]: expressing one through the other cost 20-40 registers.)
    #[inline(always)]
    fn for_each_slot<const P: usize, const E: usize>(
        &self,
        first: u64,
        args: &RowShape,
        packs: core::ops::Range<usize>,
        mut f: impl FnMut(usize, usize, u64, u64),
    ) {
        unroll::<2>(|r| {
            if row_possible::<E>(r) {
                let row = (first + r as u64).min(args.rows - 1);
                unroll::<E>(|i| {
                    if i % P == 0 && packs.contains(&(i / P)) {
                        f(r, i, row, self.col::<P>(i).min(args.cols - P as u64));
                    }
                });
            }
        });
    }

    /// Calls `f(r, i, row, col)` for each of this lane's packs of `P` numbered in `packs`
    /// and inside the rows of the access at `first`: `r` the row of the access, `i` the
    /// pack's first element in the lane.
    #[inline(always)]
    fn for_each_pack<const P: usize, const E: usize>(
        &self,
        first: u64,
        args: &RowShape,
        packs: core::ops::Range<usize>,
        mut f: impl FnMut(usize, usize, u64, u64),
    ) {
        unroll::<2>(|r| {
            if self.holds::<E>(r, first, args.rows) {
                unroll::<E>(|i| {
                    let col = self.col::<P>(i);
                    if i % P == 0 && packs.contains(&(i / P)) && col < args.cols {
                        f(r, i, first + r as u64, col);
                    }
                });
            }
        });
    }
}

/// A row-major `(rows, cols)` view of `T` at `address` as the kernel on `path` indexes it:
/// starting `shape.phase` elements past a 16-byte boundary on the phased paths (the host
/// passes a phase only to those), aligned on the others.
///
/// # Safety
/// `address` must be a generic address of global memory holding `shape.rows x shape.cols`
/// elements of `T`, aligned as the host's plan for `path` assumed.
#[inline(always)]
pub(crate) unsafe fn row_view<T: Scalar>(address: u64, shape: &RowShape, path: crate::table::RowPath) -> RowMajor<T> {
    let first = if path.phased() { shape.phase as u64 } else { 0 };
    // SAFETY: forwarded to the caller.
    unsafe { RowMajor::<T>::past_boundary(address, shape.cols, first) }
}

/// Calls `f(row)` for rows `first, first + step, ...` below `rows` (uniform across the
/// threads that share them, so barriers and shuffles inside stay converged).
#[inline(always)]
fn strided(first: u64, step: u64, rows: u64, mut f: impl FnMut(u64)) {
    let mut row = first;
    while row < rows {
        f(row);
        row += step;
    }
}

/// A row a block path works on, where its aligned packs of `P` start, and the row its
/// blocks take next where the split prefetches ([`RowSplit::PREFETCHES`]).
#[derive(Clone, Copy)]
pub(crate) struct BlockRow {
    pub(crate) row: u64,
    /// Columns before the row's first aligned pack ([`RowShape::head`]).
    head: u64,
    /// The next row and its head.
    next: Option<(u64, u64)>,
    /// Whether the previous row's last pass already requested this row's packs.
    prefetched: bool,
}

/// [`strided`] for the block paths: `f` learns each row's successor when `prefetch` says,
/// and, where `PHASED`, each row's head (else every row is aligned: head 0).
#[inline(always)]
fn block_rows<const P: usize, const PHASED: bool>(
    shape: &RowShape,
    first: u64,
    step: u64,
    prefetch: bool,
    mut f: impl FnMut(BlockRow),
) {
    let mut prefetched = false;
    let head = |row| if PHASED { shape.head(row, P as u64) } else { 0 };
    strided(first, step, shape.rows, |row| {
        let next = if prefetch && row + step < shape.rows { Some((row + step, head(row + step))) } else { None };
        f(BlockRow { row, head: head(row), next, prefetched });
        prefetched = next.is_some();
    });
}

/// Requests into L2 this thread's share (thread `thread` of the `threads` sharing `row`) of
/// the row of `load`'s source [`RowShape::ahead`] rows past `row`, where the plan asks for
/// it and that row exists: the warp that takes it later then waits on L2, not DRAM.
///
/// # Safety
/// `load`'s source must hold `shape`'s rows.
#[inline(always)]
pub(crate) unsafe fn request_ahead<L: Load<P>, const P: usize>(
    load: &L,
    shape: &RowShape,
    row: u64,
    thread: u32,
    threads: u32,
) {
    let ahead = row + shape.ahead;
    if shape.ahead > 0 && ahead < shape.rows {
        if let Some(view) = load.source() {
            // SAFETY: the row is one of the view's (forwarded to the caller).
            unsafe { request_row_l2(view.at(ahead, 0), shape.cols * L::Exact::BYTES as u64, thread, threads) }
        }
    }
}

/// Whether row `r` (0 or 1) of an access can exist for `E` elements per lane: known at
/// compile time, so the second row's registers and shuffles vanish from the wide tiers.
#[inline(always)]
pub(crate) const fn row_possible<const E: usize>(r: usize) -> bool {
    r < rows_per_access(E) as usize
}

/// Raw bytes a thread fetches before converting any (32 registers): enough loads in flight
/// to cover memory latency, few enough that wide fetches (several arrays a pack) do not
/// cost occupancy.
const FETCH_BUDGET_BYTES: usize = 128;

/// Packs of `V` fetched together under [`FETCH_BUDGET_BYTES`], at least one and at most
/// `most`.
const fn fetch_group<V>(most: usize) -> usize {
    let size = core::mem::size_of::<V>();
    let fit = if size == 0 { most } else { FETCH_BUDGET_BYTES / size };
    if fit < 1 {
        1
    } else if fit > most {
        most
    } else {
        fit
    }
}

/// Loads `E` elements per row of up to two rows into registers (`fill` where out of range),
/// a group of packs at a time: the group's fetches first, then its conversions, so its
/// loads are in flight together.
#[inline(always)]
pub(crate) unsafe fn warp_load<L: Load<P>, const P: usize, const E: usize>(
    load: &L,
    at: &WarpRows,
    first: u64,
    args: &RowShape,
    fill: f32,
) -> [[f32; E]; 2] {
    let at = &at.pinned();
    let group = const { fetch_group::<L::Fetched>(E) };
    let mut buf = [[fill; E]; 2];
    unroll::<E>(|start| {
        if start % group == 0 && start * P < E {
            let packs = start..start + group;
            let mut fetched = [[MaybeUninit::<L::Fetched>::uninit(); E]; 2];
            // SAFETY: the slot's row and column are clamped into the view.
            at.for_each_slot::<P, E>(first, args, packs.clone(), |r, i, row, col| {
                fetched[r][i].write(unsafe { load.fetch(row, col) });
            });
            at.for_each_pack::<P, E>(first, args, packs, |r, i, row, col| {
                // SAFETY: every slot was fetched just above, a pack in range at this row
                // and column (the clamp moves only slots out of range).
                let v = unsafe { load.convert(fetched[r][i].assume_init(), row, col) };
                unroll::<P>(|j| buf[r][i + j] = v[j]);
            });
        }
    });
    buf
}

/// Stores up to two rows through `store`: `values(r, i, col)` gives the pack starting at
/// element `i` (column `col`) of row `r` of the access.
#[inline(always)]
pub(crate) unsafe fn warp_store<S: Store<P>, const P: usize, const E: usize>(
    store: &S,
    at: &WarpRows,
    first: u64,
    args: &RowShape,
    values: impl Fn(usize, usize, u64) -> [f32; P],
) {
    let at = &at.pinned();
    // SAFETY: each pack is inside the view (for_each_pack keeps to the rows and columns).
    at.for_each_pack::<P, E>(first, args, 0..E / P, |r, i, row, col| unsafe {
        store.store(values(r, i, col), row, col)
    });
}

/// `R` over each of the two rows' registers, then across the lane group.
#[inline(always)]
pub(crate) unsafe fn warp_row_reduce<R: Reduce<Value = f32>, const E: usize>(
    mut values: impl FnMut(usize, usize) -> f32,
    width: u32,
) -> [f32; 2] {
    let mut out = [R::IDENTITY; 2];
    unroll::<2>(|r| {
        if row_possible::<E>(r) {
            let mut acc = R::IDENTITY;
            unroll::<E>(|i| acc = R::combine(acc, values(r, i)));
            // SAFETY: every lane of the warp runs the same number of steps (WarpRows).
            out[r] = unsafe { group_all_reduce::<R>(acc, width) };
        }
    });
    out
}

/// The aligned packs of a row one block handles: all of them, or, on the cluster path, its
/// share.
#[derive(Clone, Copy)]
pub(crate) struct Slice {
    /// The first pack, counted in packs from column 0.
    first: u64,
    packs: u64,
    /// The columns from the first pack's that the block owns in every row where it owns
    /// them ([`Slice::whole`], [`Slice::part`]), its packs' and the elements outside them
    /// ([`Slice::edge`]); its packs' alone on a share ([`Slice::share`]).
    cols: u32,
    /// Column of the row's first aligned pack (0 until [`Slice::in_row`]).
    head: u64,
}

impl Slice {
    /// Every aligned pack of a row of `shape`.
    #[inline(always)]
    pub(crate) fn whole<const P: usize>(shape: &RowShape) -> Slice {
        Slice { first: 0, packs: shape.aligned_packs(P as u64), cols: shape.cols as u32, head: 0 }
    }

    /// This slice of row `at`, whose aligned packs start at its head.
    #[inline(always)]
    pub(crate) fn in_row(self, at: BlockRow) -> Slice {
        Slice { head: at.head, ..self }
    }

    /// How many of the slice's packs this thread handles in [`block_packs`].
    #[inline(always)]
    fn thread_packs(&self) -> u32 {
        let (thread, block) = (thread_idx_x(), block_dim_x());
        let packs = self.packs as u32;
        if thread < packs { (packs - 1 - thread) / block + 1 } else { 0 }
    }

    /// First column of pack `local` of the slice.
    #[inline(always)]
    fn col<const P: usize>(&self, local: u64) -> u64 {
        self.head + (self.first + local) * P as u64
    }

    /// Pack `local` of the slice and its first column, for this thread's `n`-th pack in
    /// [`block_packs`] order, if it has that many.
    #[inline(always)]
    fn thread_pack<const P: usize>(&self, n: usize) -> Option<(u64, u64)> {
        let local = thread_idx_x() as u64 + n as u64 * block_dim_x() as u64;
        (local < self.packs).then(|| (local, self.col::<P>(local)))
    }

    /// Share `rank` of `ranks` of a row of `shape`: consecutive packs, the last share shorter
    /// (or empty).
    #[cfg(feature = "cluster")]
    #[inline(always)]
    fn share<const P: usize>(shape: &RowShape, rank: u32, ranks: u32) -> Slice {
        let packs = shape.aligned_packs(P as u64);
        let each = packs.div_ceil(ranks.max(1) as u64);
        let first = (rank as u64 * each).min(packs);
        let packs = each.min(packs - first);
        Slice { first, packs, cols: (packs * P as u64) as u32, head: 0 }
    }

    /// Part `rank` of `ranks` of a row of `shape` ([`RowShape::cluster_part`]): its columns
    /// are the block's in every row.
    #[cfg(feature = "cluster")]
    #[inline(always)]
    fn part<const P: usize>(shape: &RowShape, rank: u32, ranks: u32) -> Slice {
        let (first, cols, packs) = shape.cluster_part(P as u64, rank, ranks);
        Slice { first: first / P as u64, packs, cols: cols as u32, head: 0 }
    }

    /// The columns of every row this block owns: `(first, count)`.
    #[inline(always)]
    fn columns<const P: usize>(&self) -> (u64, u32) {
        (self.first * P as u64, self.cols)
    }

    /// The column of the one element of this owned slice ([`Slice::whole`],
    /// [`Slice::part`]) of a `PHASED` row (after [`Slice::in_row`]) outside its aligned
    /// packs that this thread takes, if any: at most `2 * P - 2` a slice, so one thread each.
    #[inline(always)]
    pub(crate) fn edge<const P: usize, const PHASED: bool>(&self) -> Option<u64> {
        // In 32 bits (a row's columns fit them): in 64, ptxas gave the phased cluster
        // kernels up to 16 more registers.
        let (edge, packs) = (thread_idx_x(), self.packs as u32);
        (PHASED && edge < self.cols - packs * P as u32).then(|| {
            let (first, head) = ((self.first * P as u64) as u32, self.head as u32);
            part_edge_col(first, packs, head, P as u32, edge) as u64
        })
    }
}

/// How the block paths split rows over blocks: [`BlockSplit`], a block per row, or (sm_90)
/// `ClusterSplit`, a cluster of blocks per row, each holding a slice of it.
pub(crate) trait RowSplit {
    /// Whether two statistics of a row are better reduced at once, merged (one barrier,
    /// more arithmetic on the reduction's critical path). Measured on the H100: yes for a
    /// cluster, whose barrier is long (softmax forward at 131072 columns, 71% -> 84% of
    /// copy); no for a block, whose barriers are short (cross entropy at 2048 columns,
    /// 62% -> 53%, the merges' exponentials on the critical path).
    const MERGES_REDUCTIONS: bool;

    /// Whether each row's last pass starts copying the next row into the cache, slot by
    /// slot as its last read of the slot is done (see [`RowCache::prefetch`]), and the
    /// backward's first pass takes each pack as its copies land
    /// ([`HeldRowCache::landed_pairs`]). Yes for a cluster, which holds one block per SM, so
    /// its loads otherwise stopped for each row's reductions and output pass (measured on
    /// the H100: the softmax backward at 131072 f16 columns went from 81% to 89% of copy;
    /// the landed first pass took the f32 RMSNorm backward with its parameter gradients at
    /// 49152x32768 from 79% to 86%). A block keeps its code as it was: several resident
    /// blocks per SM already overlap one another's passes.
    const PREFETCHES: bool;

    /// Calls `f` for each row this block works on; every block sharing a row runs the same
    /// rows. `PHASED` rows may start anywhere past a 16-byte boundary (`shape.phase`): each
    /// row's aligned packs of `P` start at its head. Otherwise (the norms, whose per-column
    /// gamma and beta need every row aligned) all start at column 0, known at compile time:
    /// measured, a head computed for aligned rows cost the norm kernels 7-16 registers.
    /// Where `ahead`, each row learns its successor (and is marked as requested by the row
    /// before): the split prefetches ([`RowSplit::PREFETCHES`]) or the caller stages rows.
    fn rows<const P: usize, const PHASED: bool>(&self, shape: &RowShape, ahead: bool, f: impl FnMut(BlockRow));

    /// The aligned packs of a row this block handles.
    fn slice<const P: usize>(&self, shape: &RowShape) -> Slice;

    /// The part of a row whose columns this block owns in every row, whatever its head
    /// (the whole row, or a cluster block's [`RowShape::cluster_part`]), and takes its
    /// elements outside the aligned packs ([`Slice::edge`]): for gathering per-column sums
    /// of rows run from their heads. Elsewhere [`RowSplit::slice`] and [`RowSplit::edge`].
    fn owned_slice<const P: usize>(&self, shape: &RowShape) -> Slice;

    /// Whether this is the row's first block: it writes the per-row outputs and takes the
    /// row's single elements outside its aligned packs.
    fn leads(&self) -> bool;

    /// The columns of every aligned row whose per-column sums this block gathers (a
    /// backward's column slab): `(first, count)`. All of them for a block, its slice's on a
    /// cluster. (Rows run from their heads gather their [`RowSplit::owned_slice`]'s.)
    fn gathered_columns<const P: usize>(&self, shape: &RowShape) -> (u64, u32);

    /// This block's partial row of gathered column sums and how many partial rows the grid
    /// writes: one a block, or one a cluster, each block writing its slice's columns.
    fn partial_row(&self) -> (u32, u32);

    /// The column of the one element outside `PHASED` row `at`'s aligned packs of `P` that
    /// this thread takes, if any ([`RowShape::edges`]: at most 14, so one thread each of
    /// the first block).
    #[inline(always)]
    fn edge<const P: usize, const PHASED: bool>(&self, shape: &RowShape, at: BlockRow) -> Option<u64> {
        let edge = thread_idx_x() as u64;
        let taken = PHASED && self.leads() && edge < shape.edges(P as u64);
        taken.then(|| shape.edge_col(at.row, P as u64, edge))
    }

    /// `R` over every thread of the blocks sharing a row; each gets the result.
    ///
    /// # Safety
    /// Every thread of those blocks must call it (it has barriers), the same number of times.
    unsafe fn all_reduce<R: Reduce>(&self, value: R::Value) -> R::Value;
}

/// A block per row: rows `blockIdx.x, blockIdx.x + gridDim.x, ...`.
pub(crate) struct BlockSplit;

impl RowSplit for BlockSplit {
    const MERGES_REDUCTIONS: bool = false;
    const PREFETCHES: bool = false;

    #[inline(always)]
    fn rows<const P: usize, const PHASED: bool>(&self, shape: &RowShape, ahead: bool, f: impl FnMut(BlockRow)) {
        block_rows::<P, PHASED>(shape, block_idx_x() as u64, grid_dim_x() as u64, ahead, f);
    }

    #[inline(always)]
    fn slice<const P: usize>(&self, shape: &RowShape) -> Slice {
        Slice::whole::<P>(shape)
    }

    #[inline(always)]
    fn owned_slice<const P: usize>(&self, shape: &RowShape) -> Slice {
        Slice::whole::<P>(shape)
    }

    #[inline(always)]
    fn leads(&self) -> bool {
        true
    }

    #[inline(always)]
    fn gathered_columns<const P: usize>(&self, shape: &RowShape) -> (u64, u32) {
        (0, shape.cols as u32)
    }

    #[inline(always)]
    fn partial_row(&self) -> (u32, u32) {
        (block_idx_x(), grid_dim_x())
    }

    #[inline(always)]
    unsafe fn all_reduce<R: Reduce>(&self, value: R::Value) -> R::Value {
        // SAFETY: forwarded to the caller.
        unsafe { block_all_reduce::<R>(value) }
    }
}

/// A cluster of blocks per row (rows `clusterid, clusterid + clusters, ...`), block `rank`
/// caching share `rank` of it. A reduction sends each block's partial to every block of the
/// cluster (`st.async` into distributed shared memory, counted on the receiver's
/// mbarrier), and each warp combines them by a butterfly over its lanes, one partial a lane
/// (deterministic, the same in every block). No cluster barrier per row: its release fence
/// (`MEMBAR.ALL.GPU`, waiting on the row's output stores) and the remote loads of the
/// partials made each reduction long (the f32 softmax backward at 262144 columns, 16
/// blocks a row, went from 71% to 83% of copy without them).
#[cfg(feature = "cluster")]
pub(crate) struct ClusterSplit {
    /// Reductions done so far. Consecutive reductions alternate between two sets of slots
    /// and mbarriers (bit 0), so a block's partial for one never lands in a slot still being
    /// read for the one before: a block sends its next partial only after reading those
    /// slots, and its peers need that partial before they can send theirs. Bit 1 is the
    /// parity of the set's mbarrier phase.
    reductions: Cell<u32>,
}

#[cfg(feature = "cluster")]
impl ClusterSplit {
    /// Runs `body` split over the launch's clusters, then waits for every block of the
    /// cluster, so none exits while another may still write to its shared memory.
    ///
    /// # Safety
    /// The launch must have clusters along x of at most [`MAX_CLUSTER_BLOCKS`] blocks, and
    /// every thread must run this.
    #[inline(always)]
    pub(crate) unsafe fn run(body: impl FnOnce(&ClusterSplit)) {
        // SAFETY: one thread initializes this block's two mbarriers, fenced; the cluster
        // barrier after it keeps every block from sending partials before its receivers'
        // mbarriers exist. Every thread of every block of the cluster gets to both barriers.
        unsafe {
            if thread_idx_x() == 0 {
                init_barrier(Self::barrier(0));
                init_barrier(Self::barrier(1));
                fence_barrier_init();
            }
            cluster_sync();
            body(&ClusterSplit { reductions: Cell::new(0) });
            cluster_sync();
        }
    }

    /// Set `set`'s slot for the partial of block `rank`.
    #[inline(always)]
    fn slot(set: u32, rank: u32) -> SharedAddr {
        cluster_exchange().offset(8 * (set * MAX_CLUSTER_BLOCKS + rank))
    }

    /// Set `set`'s mbarrier, after both sets' slots.
    #[inline(always)]
    fn barrier(set: u32) -> SharedAddr {
        cluster_exchange().offset(8 * (2 * MAX_CLUSTER_BLOCKS + set))
    }
}

#[cfg(feature = "cluster")]
impl RowSplit for ClusterSplit {
    const MERGES_REDUCTIONS: bool = true;
    const PREFETCHES: bool = true;

    #[inline(always)]
    fn rows<const P: usize, const PHASED: bool>(&self, shape: &RowShape, ahead: bool, f: impl FnMut(BlockRow)) {
        block_rows::<P, PHASED>(shape, cluster_id() as u64, clusters() as u64, ahead, f);
    }

    #[inline(always)]
    fn slice<const P: usize>(&self, shape: &RowShape) -> Slice {
        Slice::share::<P>(shape, cluster_rank(), cluster_blocks())
    }

    #[inline(always)]
    fn owned_slice<const P: usize>(&self, shape: &RowShape) -> Slice {
        Slice::part::<P>(shape, cluster_rank(), cluster_blocks())
    }

    #[inline(always)]
    fn leads(&self) -> bool {
        cluster_rank() == 0
    }

    #[inline(always)]
    fn gathered_columns<const P: usize>(&self, shape: &RowShape) -> (u64, u32) {
        let slice = self.slice::<P>(shape);
        (slice.first * P as u64, (slice.packs * P as u64) as u32)
    }

    #[inline(always)]
    fn partial_row(&self) -> (u32, u32) {
        (cluster_id(), clusters())
    }

    #[inline(always)]
    unsafe fn all_reduce<R: Reduce>(&self, value: R::Value) -> R::Value {
        let done = self.reductions.get();
        self.reductions.set(done + 1);
        let (set, parity) = (done & 1, (done >> 1) & 1);
        let barrier = Self::barrier(set);
        let ranks = cluster_blocks();
        // SAFETY: every thread of the cluster's blocks calls this (the caller's promise).
        // Warp 0 announces the bytes this block awaits and sends its partial to this rank's
        // slot in each block (a lane per block: ranks <= 32); every thread waits for all
        // partials before reading them. Slots and phases are not reused too early (see
        // `reductions`).
        unsafe {
            let partial = block_all_reduce::<R>(value);
            let thread = thread_idx_x();
            if thread < WARP_SIZE {
                if thread == 0 {
                    expect_bytes(barrier, 8 * ranks);
                }
                if thread < ranks {
                    store_remote_async(Self::slot(set, cluster_rank()), barrier, thread, partial.to_words());
                }
            }
            wait_barrier(barrier, parity);
            let lane = thread % WARP_SIZE;
            let mine = if lane < ranks {
                let [a, b, _, _] = load_shared(Self::slot(set, lane), 4 * MAX_WORDS);
                R::Value::from_words([a, b])
            } else {
                R::IDENTITY
            };
            group_all_reduce::<R>(mine, WARP_SIZE)
        }
    }
}

/// Calls `f(local, col)` for this thread's packs of `slice`, in a block-strided loop:
/// `local` counts packs from the slice's first, `col` is the pack's first column.
///
/// The loop is counted in 32 bits (an add and a compare a pack, where 64 bits take two
/// each) beside the 64-bit index the addresses come from: one index in 32 bits alone made
/// LLVM rebuild every address from it, reloading the arrays' bases a pack (see
/// docs/PERF.md, "The loops' own instructions"). The host's widest row (`MAX_COLS`, under
/// 2^31) keeps the count from wrapping.
#[inline(always)]
pub(crate) fn block_packs<const P: usize>(slice: Slice, f: impl FnMut(u64, u64)) {
    block_packs_from::<P>(slice, 0, f);
}

/// As [`block_packs`], from this thread's pack `skip` of the slice (its first `skip` taken
/// elsewhere).
#[inline(always)]
fn block_packs_from<const P: usize>(slice: Slice, skip: u32, mut f: impl FnMut(u64, u64)) {
    let (packs, block) = (slice.packs as u32, block_dim_x());
    let first = thread_idx_x() + skip * block;
    let (mut count, mut local) = (first, first as u64);
    while count < packs {
        f(local, slice.col::<P>(local));
        count += block;
        local += block as u64;
    }
}

/// Most packs a thread fetches before using any on the block paths' global-memory passes.
const MAX_BATCH: usize = 4;

/// Like [`block_packs`], but for global reads: `fetch(col)` for a batch of packs (up to
/// [`MAX_BATCH`], within [`FETCH_BUDGET_BYTES`]), then `consume(local, col, fetched)` for each, so
/// every thread keeps several loads in flight. Fetches are raw words (four registers a
/// pack whatever the dtype), so a batch costs 16-bit rows no more registers than f32 rows.
#[inline(always)]
pub(crate) fn block_packs_loaded<const P: usize, V: Copy>(
    slice: Slice,
    mut fetch: impl FnMut(u64) -> V,
    mut consume: impl FnMut(u64, u64, V),
) {
    let batch = const { fetch_group::<V>(MAX_BATCH) } as u64;
    let block = block_dim_x() as u64;
    let col = |local: u64| slice.col::<P>(local);
    let mut local = thread_idx_x() as u64;
    while local + (batch - 1) * block < slice.packs {
        let first = fetch(col(local));
        let mut fetched = [first; MAX_BATCH];
        unroll::<MAX_BATCH>(|u| {
            if u > 0 && (u as u64) < batch {
                fetched[u] = fetch(col(local + u as u64 * block));
            }
        });
        unroll::<MAX_BATCH>(|u| {
            if (u as u64) < batch {
                let at = local + u as u64 * block;
                consume(at, col(at), fetched[u])
            }
        });
        local += batch * block;
    }
    while local < slice.packs {
        consume(local, col(local), fetch(col(local)));
        local += block;
    }
}

/// A block's row cached in shared memory as `C` (the dtype holding the row's values
/// exactly, so a 16-bit row takes half the bytes of f32), in packs of `P` elements. A pack's
/// bytes are split into accesses of at most 16 bytes, access `q` of every pack stored
/// together, so a warp's vector accesses are consecutive and conflict-free. A thread reads
/// back only the packs it wrote (after `wait_async_copies` for copied ones): no barrier
/// guards the cache.
#[derive(Clone, Copy)]
pub(crate) struct RowCache<C, const P: usize> {
    base: SharedAddr,
    slice: Slice,
    _element: PhantomData<C>,
}

impl<C: Scalar, const P: usize> RowCache<C, P> {
    /// Bytes of one access.
    const ACCESS: usize = if P * C::BYTES < PACK_BYTES { P * C::BYTES } else { PACK_BYTES };
    /// Accesses per pack (1, or 2 for packs of 8 f32s).
    const ACCESSES: usize = P * C::BYTES / Self::ACCESS;
    /// Elements per access.
    const PER_ACCESS: usize = Self::ACCESS / C::BYTES;

    /// The cache of `slice` of a row, at `base`.
    #[inline(always)]
    pub(crate) fn new(base: SharedAddr, slice: Slice) -> Self {
        RowCache { base, slice, _element: PhantomData }
    }

    /// Where the shared memory after this cache starts (for a second cached array).
    #[inline(always)]
    pub(crate) fn end(&self) -> SharedAddr {
        self.base.offset(self.slice.packs as u32 * (P * C::BYTES) as u32)
    }

    #[inline(always)]
    fn at(&self, local: u64, access: usize) -> SharedAddr {
        self.base.offset((access as u32 * self.slice.packs as u32 + local as u32) * Self::ACCESS as u32)
    }

    /// Caches this thread's packs of `row` as `load` reads them. A load with a source has
    /// its packs copied to shared memory as the source holds them (`cp.async`: all in
    /// flight at once, no registers; read them after `wait_async_copies`). Other loads'
    /// packs are fetched in batches, converted and written. Measured reason for the copies:
    /// ptxas issued each register-staged pack's shared store right after its load, and the
    /// next load only after that store.
    ///
    /// A row the previous row's last pass prefetched ([`RowCache::prefetch`]) is not
    /// requested again.
    ///
    /// # Safety
    /// `at.row` must be a row of `shape`, whose packs the launch sized the cache for.
    #[inline(always)]
    pub(crate) unsafe fn fill<L: Load<P, Exact = C>>(&self, load: &L, at: BlockRow) {
        if self.requested(load, at) {
            return;
        }
        let row = at.row;
        let slice = self.slice.in_row(at);
        match load.source() {
            // cp.async moves 4, 8 or 16 bytes; a source's pack is one access.
            // SAFETY: the pack is inside the row and the cache.
            Some(view) if Self::ACCESS >= 4 => {
                block_packs::<P>(slice, |local, col| unsafe { self.copy_pack(load, view, row, col, local) })
            }
            // Single 8- or 16-bit elements: copied through registers, still untransformed.
            Some(view) => block_packs_loaded::<P, _>(
                slice,
                // SAFETY: the element is inside the row.
                |col| unsafe { load_global_nc(view.at(row, col), Self::ACCESS) },
                // SAFETY: the element is inside the cache.
                |local, _, words| unsafe { store_shared(self.at(local, 0), Self::ACCESS, words) },
            ),
            None => block_packs_loaded::<P, _>(
                slice,
                // SAFETY: the pack is inside the row.
                |col| unsafe { load.fetch(row, col) },
                // SAFETY: what `fetch` returned for this pack; the pack is inside the cache.
                |local, col, fetched| unsafe { self.write(local, load.convert(fetched, row, col)) },
            ),
        }
    }

    /// Caches this thread's packs of `at.row` as `load` reads them, and its packs of the same
    /// slice into `other` as `other_load` reads them: where both caches copy, pack by pack,
    /// each array's copies of a pack a group of their own (`self`'s first), as the last
    /// pass's prefetches order them, so [`HeldRowCache::landed_pairs`] can take each pack as
    /// it lands; else as [`RowCache::fill`] for each.
    ///
    /// # Safety
    /// As [`RowCache::fill`], for both caches (`other` of the same slice).
    #[inline(always)]
    unsafe fn fill_pair<L: Load<P, Exact = C>, D: Scalar, M: Load<P, Exact = D>>(
        &self,
        load: &L,
        other: &RowCache<D, P>,
        other_load: &M,
        at: BlockRow,
    ) {
        // SAFETY: forwarded to the caller.
        unsafe { self.copy_pair(load, other, other_load, at, true) };
    }

    /// [`RowCache::fill_pair`]'s copies: each pack's of each array a group of its own where
    /// `group_per_pack` (a constant after inlining), else left in the open group.
    ///
    /// # Safety
    /// As [`RowCache::fill`], for both caches.
    #[inline(always)]
    unsafe fn copy_pair<L: Load<P, Exact = C>, D: Scalar, M: Load<P, Exact = D>>(
        &self,
        load: &L,
        other: &RowCache<D, P>,
        other_load: &M,
        at: BlockRow,
        group_per_pack: bool,
    ) {
        match (load.source(), other_load.source()) {
            (Some(view), Some(other_view)) if self.copies(load) && other.copies(other_load) => {
                if self.requested(load, at) {
                    return;
                }
                let row = at.row;
                // SAFETY: the pack is inside the row and both caches.
                block_packs::<P>(self.slice.in_row(at), |local, col| unsafe {
                    self.start_copy(load, view, row, col, local);
                    if group_per_pack {
                        commit_async_copies();
                    }
                    other.start_copy(other_load, other_view, row, col, local);
                    if group_per_pack {
                        commit_async_copies();
                    }
                });
            }
            // SAFETY: forwarded to the caller.
            _ => unsafe {
                self.fill(load, at);
                other.fill(other_load, at);
            },
        }
    }

    /// Starts copying pack `local` of the cache from `view` at `col` of `row` where `load`
    /// reads it, and closes the pack's group (empty where the load does not read it), so each
    /// pack's copies stay a group of their own.
    ///
    /// # Safety
    /// The pack must be inside the row and the cache.
    #[inline(always)]
    unsafe fn copy_pack<L: Load<P, Exact = C>>(&self, load: &L, view: RowMajor<C>, row: u64, col: u64, local: u64) {
        // SAFETY: forwarded to the caller.
        unsafe { self.start_copy(load, view, row, col, local) };
        commit_async_copies();
    }

    /// Starts copying pack `local` of the cache from `view` at `col` of `row` where `load`
    /// reads it, in the group of copies still open.
    ///
    /// # Safety
    /// As [`RowCache::copy_pack`].
    #[inline(always)]
    unsafe fn start_copy<L: Load<P, Exact = C>>(&self, load: &L, view: RowMajor<C>, row: u64, col: u64, local: u64) {
        if load.reads(row, col) {
            // SAFETY: forwarded to the caller; a source's pack is one access, aligned to its size.
            unsafe { copy_async(self.at(local, 0), view.at(row, col), Self::ACCESS) };
        }
    }

    /// Caches this thread's packs of `at.row` into this cache and `other` (of the same
    /// slice) as [`RowCache::fill_pair`] does, but as one group of copies committed after
    /// the last, so that [`wait_async_groups_but`]`(1)` waits for an earlier row's group
    /// while this one is still in flight (a staged row: see `BackwardRows::cached`). Caches
    /// that do not copy are filled before this returns; their group is empty.
    ///
    /// # Safety
    /// As [`RowCache::fill`], for both caches.
    #[inline(always)]
    unsafe fn stage_pair<L: Load<P, Exact = C>, D: Scalar, M: Load<P, Exact = D>>(
        &self,
        load: &L,
        other: &RowCache<D, P>,
        other_load: &M,
        at: BlockRow,
    ) {
        // SAFETY: forwarded to the caller; the row is copied even where the one before
        // requested it (a staged row's successor is marked so by the row walk).
        unsafe { self.copy_pair(load, other, other_load, BlockRow { prefetched: false, ..at }, false) };
        commit_async_copies();
    }

    /// Whether the cache copies `load`'s packs (`cp.async`) rather than staging them.
    #[inline(always)]
    pub(crate) fn copies<L: Load<P, Exact = C>>(&self, load: &L) -> bool {
        load.source().is_some() && Self::ACCESS >= 4
    }

    /// Whether the previous row's last pass already requested row `at`'s packs
    /// ([`RowCache::prefetch`]): only caches that copy prefetch.
    #[inline(always)]
    fn requested<L: Load<P, Exact = C>>(&self, load: &L, at: BlockRow) -> bool {
        at.prefetched && self.copies(load)
    }

    /// The row after `at` (and its head) that this cache prefetches for `load`, if any.
    #[inline(always)]
    fn prefetched_row<L: Load<P, Exact = C>>(&self, load: &L, at: BlockRow) -> Option<(u64, u64)> {
        at.next.filter(|_| self.copies(load))
    }

    /// `cached`, the values of the pack at `col` of `row` as the cache holds them, as `load`
    /// gives them: transformed where the cache holds the load's source.
    ///
    /// # Safety
    /// As [`Load::transform`].
    #[inline(always)]
    unsafe fn loaded<L: Load<P, Exact = C>>(load: &L, cached: [f32; P], row: u64, col: u64) -> [f32; P] {
        // SAFETY: forwarded to the caller.
        if load.source().is_some() { unsafe { load.transform(cached, row, col) } } else { cached }
    }

    /// Starts copying pack `local` of the row after `at` into its slot, where there is one
    /// and the cache copies `load`: the next row's loads then overlap the rest of this row.
    ///
    /// # Safety
    /// As [`RowCache::fill`]; this thread must be done reading pack `local` of `at.row`
    /// (the copy lands in the same slot: call this after the values read are used).
    #[inline(always)]
    pub(crate) unsafe fn prefetch<L: Load<P, Exact = C>>(&self, load: &L, at: BlockRow, local: u64) {
        if let (Some(view), Some((next, head))) = (load.source(), self.prefetched_row(load, at)) {
            let col = Slice { head, ..self.slice }.col::<P>(local);
            // SAFETY: the pack is inside the row and the cache.
            unsafe { self.copy_pack(load, view, next, col, local) };
        }
    }

    /// Calls `f(local)` for this thread's packs of the row it filled or prefetched, each
    /// pack waited for on its own: the first packs are used while later ones are still in
    /// flight. Each pack's copies are `groups` groups of their own, committed pack by pack
    /// (1 for this cache alone, 2 for [`HeldRowCache::landed_pairs`]); packs not copied
    /// are there already.
    #[inline(always)]
    pub(crate) fn landed_packs(&self, groups: u32, mut f: impl FnMut(u64)) {
        let mut after = self.slice.thread_packs();
        block_packs::<P>(self.slice, |local, _| {
            after -= 1;
            wait_async_groups_but(after * groups);
            f(local);
        });
    }

    /// The values of pack `local` of the slice of row `at` as `load` gives them: the cached
    /// ones, transformed where the cache holds the load's source.
    ///
    /// # Safety
    /// This thread must have filled the pack through `load` (and waited for its copies).
    #[inline(always)]
    pub(crate) unsafe fn read<L: Load<P, Exact = C>>(&self, load: &L, at: BlockRow, local: u64) -> [f32; P] {
        // SAFETY: forwarded to the caller.
        unsafe {
            let cached = self.read_cached(local);
            Self::loaded(load, cached, at.row, self.slice.in_row(at).col::<P>(local))
        }
    }

    /// # Safety
    /// `pack` must be a pack of the row, inside the shared memory the launch sized.
    #[inline(always)]
    unsafe fn write(&self, pack: u64, values: [f32; P]) {
        let words = Self::to_words(values);
        unroll::<2>(|access| {
            if access < Self::ACCESSES {
                // SAFETY: forwarded to the caller; the access is aligned to its size.
                unsafe { store_shared(self.at(pack, access), Self::ACCESS, words[access]) };
            }
        });
    }

    /// # Safety
    /// As [`RowCache::write`], after this thread wrote `pack`.
    #[inline(always)]
    unsafe fn read_cached(&self, pack: u64) -> [f32; P] {
        let mut words = [[0; 4]; 2];
        unroll::<2>(|access| {
            if access < Self::ACCESSES {
                // SAFETY: forwarded to the caller.
                words[access] = unsafe { load_shared(self.at(pack, access), Self::ACCESS) };
            }
        });
        Self::from_words(words)
    }

    /// A pack's values as the cache holds them: `C`s, in the words of each access.
    #[inline(always)]
    fn to_words(values: [f32; P]) -> PackWords {
        let mut words = [[0; 4]; 2];
        unroll::<2>(|access| {
            if access < Self::ACCESSES {
                let mut pack = Pack::<C, 8>::new();
                unroll::<8>(|k| {
                    if k < Self::PER_ACCESS {
                        pack.set(k, C::from_f32(values[access * Self::PER_ACCESS + k]));
                    }
                });
                words[access] = pack.words();
            }
        });
        words
    }

    /// The values of a pack the cache holds as `words` ([`RowCache::to_words`]).
    #[inline(always)]
    fn from_words(words: PackWords) -> [f32; P] {
        let mut values = [0.0; P];
        unroll::<2>(|access| {
            if access < Self::ACCESSES {
                let pack = Pack::<C, 8>::from_words(words[access]);
                unroll::<8>(|k| {
                    if k < Self::PER_ACCESS {
                        values[access * Self::PER_ACCESS + k] = pack.get_f32(k);
                    }
                });
            }
        });
        values
    }
}

/// The words a cache holds of one pack, one array of up to 16 bytes per access.
type PackWords = [[u32; 4]; 2];

/// Where [`HeldRowCache`] keeps one of this thread's packs.
#[derive(Clone, Copy)]
pub(crate) enum CachedPack {
    /// In registers: the thread's `k`-th pack of the slice.
    Held(usize),
    /// In shared memory: pack `local` of the part of the slice there.
    Shared(u64),
}

/// A [`RowCache`] that keeps each thread's first `HELD` packs of the block's slice in
/// registers and only the rest in shared memory, so a slice up to `HELD * block` packs
/// larger than a block's shared memory still fits: the cluster path then splits a row over
/// fewer blocks, keeping more SMs busy (clusters of 16 leave 20 of the H100's 132 idle,
/// clusters of 8 leave 12). Held packs are loaded into their registers, whose loads stay in
/// flight until the values are used, and prefetched for the next row the same way.
pub(crate) struct HeldRowCache<C, const P: usize, const HELD: usize> {
    slice: Slice,
    held: Cell<[PackWords; HELD]>,
    /// The rest of the slice, past the held packs.
    shared: RowCache<C, P>,
}

impl<C: Scalar, const P: usize, const HELD: usize> HeldRowCache<C, P, HELD> {
    /// The cache of `slice` of a row, its shared part at `base`.
    #[inline(always)]
    pub(crate) fn new(base: SharedAddr, slice: Slice) -> Self {
        let held = (HELD as u64 * block_dim_x() as u64).min(slice.packs);
        let rest = Slice { first: slice.first + held, packs: slice.packs - held, ..slice };
        HeldRowCache { slice, held: Cell::new([[[0; 4]; 2]; HELD]), shared: RowCache::new(base, rest) }
    }

    /// Where the shared memory after this cache starts (for a second cached array).
    #[inline(always)]
    pub(crate) fn end(&self) -> SharedAddr {
        self.shared.end()
    }

    /// Calls `f(pack, col)` for this thread's packs of the slice of row `at`, the held ones
    /// first (as [`block_packs`] orders them).
    #[inline(always)]
    pub(crate) fn packs(&self, at: BlockRow, mut f: impl FnMut(CachedPack, u64)) {
        self.numbered_packs::<0>(at, |pack, col, _| f(pack, col));
    }

    /// As [`HeldRowCache::packs`], with `Some(n)` for this thread's `n`-th pack where `n`
    /// is below `K`: those calls are unrolled, so `n` is a constant that may index registers.
    #[inline(always)]
    pub(crate) fn numbered_packs<const K: usize>(
        &self,
        at: BlockRow,
        mut f: impl FnMut(CachedPack, u64, Option<usize>),
    ) {
        self.held_packs(at, |k, col| f(CachedPack::Held(k), col, (k < K).then_some(k)));
        let shared = self.shared.slice.in_row(at);
        unroll::<K>(|n| {
            if n >= HELD
                && let Some((local, col)) = shared.thread_pack::<P>(n - HELD)
            {
                f(CachedPack::Shared(local), col, Some(n));
            }
        });
        let skip = K.saturating_sub(HELD) as u32;
        block_packs_from::<P>(shared, skip, |local, col| f(CachedPack::Shared(local), col, None));
    }

    /// Calls `f(k, col)` for this thread's held packs of the slice of row `at`.
    #[inline(always)]
    fn held_packs(&self, at: BlockRow, mut f: impl FnMut(usize, u64)) {
        let slice = self.slice.in_row(at);
        unroll::<HELD>(|k| {
            if let Some((_, col)) = slice.thread_pack::<P>(k) {
                f(k, col);
            }
        });
    }

    /// Caches this thread's packs of `at.row` as [`RowCache::fill`] does, the held ones
    /// loaded into registers.
    ///
    /// # Safety
    /// As [`RowCache::fill`].
    #[inline(always)]
    pub(crate) unsafe fn fill<L: Load<P, Exact = C>>(&self, load: &L, at: BlockRow) {
        self.hold_row(load, at);
        // SAFETY: forwarded to the caller.
        unsafe { self.shared.fill(load, at) };
    }

    /// Loads this thread's held packs of `at.row` into their registers, unless the last
    /// row's pass prefetched them.
    #[inline(always)]
    fn hold_row<L: Load<P, Exact = C>>(&self, load: &L, at: BlockRow) {
        if !self.shared.requested(load, at) {
            // SAFETY: the pack is inside the row.
            self.held_packs(at, |k, col| unsafe { self.hold(k, load, at.row, col) });
        }
    }

    /// Caches this thread's packs of `at.row` into this cache and `other` as
    /// [`RowCache::fill_pair`] does, the held ones loaded into registers.
    ///
    /// # Safety
    /// As [`RowCache::fill`], for both caches (`other` of the same slice).
    #[inline(always)]
    pub(crate) unsafe fn fill_pair<L: Load<P, Exact = C>, D: Scalar, M: Load<P, Exact = D>>(
        &self,
        load: &L,
        other: &HeldRowCache<D, P, HELD>,
        other_load: &M,
        at: BlockRow,
    ) {
        self.hold_row(load, at);
        other.hold_row(other_load, at);
        // SAFETY: forwarded to the caller.
        unsafe { self.shared.fill_pair(load, &other.shared, other_load, at) };
    }

    /// Caches this thread's packs of `at.row` into this cache and `other` as one group of
    /// copies ([`RowCache::stage_pair`]), its shared part alone.
    ///
    /// # Safety
    /// As [`RowCache::fill`], for both caches (`other` of the same slice); the caches must
    /// hold no packs in registers (`HELD` 0), whose registers would take the staged row
    /// over the one in use.
    #[inline(always)]
    pub(crate) unsafe fn stage_pair<L: Load<P, Exact = C>, D: Scalar, M: Load<P, Exact = D>>(
        &self,
        load: &L,
        other: &HeldRowCache<D, P, HELD>,
        other_load: &M,
        at: BlockRow,
    ) {
        // SAFETY: forwarded to the caller.
        unsafe { self.shared.stage_pair(load, &other.shared, other_load, at) };
    }

    /// As [`HeldRowCache::packs`] over a row filled or prefetched through this cache and
    /// `other` (of the same slice) pack by pack ([`HeldRowCache::fill_pair`], or prefetches
    /// of this cache's pack then `other`'s): each shared pack is waited for on its own, the
    /// first used while later ones are still in flight (the held ones are loaded into
    /// registers, waited for where used).
    #[inline(always)]
    pub(crate) fn landed_pairs<L: Load<P, Exact = C>, D: Scalar, M: Load<P, Exact = D>>(
        &self,
        load: &L,
        other: &HeldRowCache<D, P, HELD>,
        other_load: &M,
        at: BlockRow,
        mut f: impl FnMut(CachedPack, u64),
    ) {
        let groups = self.shared.copies(load) as u32 + other.shared.copies(other_load) as u32;
        self.held_packs(at, |k, col| f(CachedPack::Held(k), col));
        let shared = self.shared.slice.in_row(at);
        self.shared.landed_packs(groups, |local| f(CachedPack::Shared(local), shared.col::<P>(local)));
    }

    /// Loads held pack `k` of `row`, at `col`, into its registers.
    ///
    /// # Safety
    /// The pack must be inside the row, aligned to its size.
    #[inline(always)]
    unsafe fn hold<L: Load<P, Exact = C>>(&self, k: usize, load: &L, row: u64, col: u64) {
        let mut held = self.held.get();
        // SAFETY: forwarded to the caller. A source's pack is one access, held as the
        // source stores it, as `RowCache::fill` copies it.
        held[k] = unsafe {
            match load.source() {
                Some(view) => [load_global_nc(view.at(row, col), RowCache::<C, P>::ACCESS), [0; 4]],
                None => RowCache::<C, P>::to_words(load.load(row, col)),
            }
        };
        self.held.set(held);
    }

    /// As [`RowCache::prefetch`], for any of this thread's packs.
    ///
    /// # Safety
    /// As [`RowCache::prefetch`].
    #[inline(always)]
    pub(crate) unsafe fn prefetch<L: Load<P, Exact = C>>(&self, load: &L, at: BlockRow, pack: CachedPack) {
        // SAFETY: forwarded to the caller; the held pack is inside the next row.
        unsafe {
            match pack {
                CachedPack::Held(k) => {
                    if let Some((next, head)) = self.shared.prefetched_row(load, at) {
                        let local = thread_idx_x() as u64 + k as u64 * block_dim_x() as u64;
                        self.hold(k, load, next, Slice { head, ..self.slice }.col::<P>(local));
                    }
                }
                CachedPack::Shared(local) => self.shared.prefetch(load, at, local),
            }
        }
    }

    /// As [`RowCache::read`], for any of this thread's packs.
    ///
    /// # Safety
    /// As [`RowCache::read`].
    #[inline(always)]
    pub(crate) unsafe fn read<L: Load<P, Exact = C>>(
        &self,
        load: &L,
        at: BlockRow,
        pack: CachedPack,
        col: u64,
    ) -> [f32; P] {
        // SAFETY: forwarded to the caller.
        unsafe {
            match pack {
                CachedPack::Held(k) => {
                    RowCache::<C, P>::loaded(load, RowCache::<C, P>::from_words(self.held.get()[k]), at.row, col)
                }
                CachedPack::Shared(local) => self.shared.read(load, at, local),
            }
        }
    }
}
