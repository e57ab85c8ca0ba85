//! The block paths' rows: which rows a block (or a cluster) works on, and which of a row's
//! packs each of its threads takes, on one block or split over a cluster's.

use super::strided;
use super::warp::fetch_group;
#[cfg(feature = "cluster")]
use crate::abi::MAX_CLUSTER_BLOCKS;
use crate::abi::RowShape;
#[cfg(feature = "cluster")]
use crate::arch::{
    SharedAddr, WARP_SIZE, cluster_blocks, cluster_exchange, cluster_id, cluster_rank, cluster_sync, clusters,
    expect_bytes, fence_barrier_init, init_barrier, load_shared, store_remote_async, wait_barrier,
};
use crate::arch::{block_dim_x, block_idx_x, grid_dim_x, thread_idx_x};
use crate::layout::part_edge_col;
#[cfg(feature = "cluster")]
use crate::reduce::group_all_reduce;
#[cfg(feature = "cluster")]
use crate::reduce::{MAX_WORDS, Words};
use crate::reduce::{Reduce, block_all_reduce};
use crate::unroll::unroll;
#[cfg(feature = "cluster")]
use core::cell::Cell;

/// A row a block path works on, where its aligned packs of `P` start, and the row its
/// blocks take next where the split prefetches ([`RowSplit::PREFETCHES`]).
#[derive(Clone, Copy)]
pub(crate) struct BlockRow {
    pub(crate) row: u64,
    /// Columns before the row's first aligned pack ([`RowShape::head`]).
    pub(super) head: u64,
    /// The next row and its head.
    pub(super) next: Option<(u64, u64)>,
    /// Whether the previous row's last pass already requested this row's packs.
    pub(super) prefetched: bool,
}

/// [`strided`] for the block paths: `f` learns each row's successor when `prefetch` says,
/// and, where `PHASED`, each row's head (else every row is aligned: head 0).
#[inline(always)]
pub(super) fn block_rows<const P: usize, const PHASED: bool>(
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

/// The aligned packs of a row one block handles: all of them, or, on the cluster path, its
/// share.
#[derive(Clone, Copy)]
pub(crate) struct Slice {
    /// The first pack, counted in packs from column 0.
    pub(super) first: u64,
    pub(super) packs: u64,
    /// The columns from the first pack's that the block owns in every row where it owns
    /// them ([`Slice::whole`], [`Slice::part`]), its packs' and the elements outside them
    /// ([`Slice::edge`]); its packs' alone on a share ([`Slice::share`]).
    pub(super) cols: u32,
    /// Column of the row's first aligned pack (0 until [`Slice::in_row`]).
    pub(super) head: u64,
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
    pub(super) fn thread_packs(&self) -> u32 {
        let (thread, block) = (thread_idx_x(), block_dim_x());
        let packs = self.packs as u32;
        if thread < packs { (packs - 1 - thread) / block + 1 } else { 0 }
    }

    /// First column of pack `local` of the slice.
    #[inline(always)]
    pub(super) fn col<const P: usize>(&self, local: u64) -> u64 {
        self.head + (self.first + local) * P as u64
    }

    /// Pack `local` of the slice and its first column, for this thread's `n`-th pack in
    /// [`block_packs`] order, if it has that many.
    #[inline(always)]
    pub(super) fn thread_pack<const P: usize>(&self, n: usize) -> Option<(u64, u64)> {
        let local = thread_idx_x() as u64 + n as u64 * block_dim_x() as u64;
        (local < self.packs).then(|| (local, self.col::<P>(local)))
    }

    /// Share `rank` of `ranks` of a row of `shape`: consecutive packs, the last share shorter
    /// (or empty).
    #[cfg(feature = "cluster")]
    #[inline(always)]
    pub(super) fn share<const P: usize>(shape: &RowShape, rank: u32, ranks: u32) -> Slice {
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
    pub(super) fn part<const P: usize>(shape: &RowShape, rank: u32, ranks: u32) -> Slice {
        let (first, cols, packs) = shape.cluster_part(P as u64, rank, ranks);
        Slice { first: first / P as u64, packs, cols: cols as u32, head: 0 }
    }

    /// The columns of every row this block owns: `(first, count)`.
    #[inline(always)]
    pub(super) fn columns<const P: usize>(&self) -> (u64, u32) {
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
    /// more arithmetic on the reduction's critical path): yes for a cluster, whose barrier is long;
    /// no for a block, whose barriers are short, so the merges' exponentials would lengthen its
    /// critical path (docs/DECISIONS.md, "Reductions").
    const MERGES_REDUCTIONS: bool;

    /// Whether each row's last pass starts copying the next row into the cache, slot by
    /// slot as its last read of the slot is done (see [`RowCache::prefetch`]), and the
    /// backward's first pass takes each pack as its copies land
    /// ([`HeldRowCache::landed_pairs`]). Yes for a cluster, which holds one block per SM, so
    /// its loads otherwise stop for each row's reductions and output pass (docs/DECISIONS.md,
    /// "`cp.async` row caches"). A block keeps its code as it was: several resident
    /// blocks per SM already overlap one another's passes.
    const PREFETCHES: bool;

    /// Calls `f` for each row this block works on; every block sharing a row runs the same
    /// rows. `PHASED` rows may start anywhere past a 16-byte boundary (`shape.phase`): each
    /// row's aligned packs of `P` start at its head. Otherwise (the norms, whose per-column
    /// gamma and beta need every row aligned) all start at column 0, known at compile time:
    /// a head computed for aligned rows costs the norm kernels registers (docs/DECISIONS.md, "Rows
    /// run from their heads").
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
/// partials make each reduction long (docs/DECISIONS.md, "Clusters: distributed shared memory and
/// mbarriers").
#[cfg(feature = "cluster")]
pub(crate) struct ClusterSplit {
    /// Reductions done so far. Consecutive reductions alternate between two sets of slots
    /// and mbarriers (bit 0), so a block's partial for one never lands in a slot still being
    /// read for the one before: a block sends its next partial only after reading those
    /// slots, and its peers need that partial before they can send theirs. Bit 1 is the
    /// parity of the set's mbarrier phase.
    pub(super) reductions: Cell<u32>,
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
    pub(super) fn slot(set: u32, rank: u32) -> SharedAddr {
        cluster_exchange().offset(8 * (set * MAX_CLUSTER_BLOCKS + rank))
    }

    /// Set `set`'s mbarrier, after both sets' slots.
    #[inline(always)]
    pub(super) fn barrier(set: u32) -> SharedAddr {
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
/// docs/DECISIONS.md, "32-bit pack counts"). The host's widest row (`MAX_COLS`, under
/// 2^31) keeps the count from wrapping.
#[inline(always)]
pub(crate) fn block_packs<const P: usize>(slice: Slice, f: impl FnMut(u64, u64)) {
    block_packs_from::<P>(slice, 0, f);
}

/// As [`block_packs`], from this thread's pack `skip` of the slice (its first `skip` taken
/// elsewhere).
#[inline(always)]
pub(super) fn block_packs_from<const P: usize>(slice: Slice, skip: u32, mut f: impl FnMut(u64, u64)) {
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
pub(super) const MAX_BATCH: usize = 4;

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
