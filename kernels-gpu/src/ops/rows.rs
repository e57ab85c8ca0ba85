//! The machinery every row-wise op (softmax, the norms) shares: where a thread's rows and
//! columns are on each of OneFlow's three paths, loading a row into registers, and
//! reductions over a row.
//! - warp: a group of `width` lanes (1 to 32) owns one row (two when narrower than a
//!   warp), the row held in registers, `E` elements per lane;
//! - shared: a block owns a row, cached in dynamic shared memory;
//! - uncached: a block owns a row and re-reads it from global memory (any width).

use crate::abi::{RowShape, rows_per_access};
use crate::arch::{WARP_SIZE, block_dim_x, block_idx_x, grid_dim_x, thread_idx_x};
use crate::pack::{Load, Store};
use crate::reduce::{Reduce, group_all_reduce};
use crate::unroll::{unroll, unrolled_array};

/// Where a lane's rows are on the warp path. A warp steps through rows as a whole
/// (`warp_first`, `+ step`, ...), its groups at `group_offset` rows from the warp's first, so
/// every lane runs the same iterations and shuffles never see a lane that left the loop.
pub(crate) struct WarpRows {
    pub(crate) width: u32,
    pub(crate) lane: u32,
    rows_per_access: u64,
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
        let rows_per_access = rows_per_access(E, width);
        let rows_per_warp = ((WARP_SIZE >> width_log2) as u64) * rows_per_access;
        let warp = ((block_idx_x() * block_dim_x() + thread_idx_x()) / WARP_SIZE) as u64;
        let warps = (grid_dim_x() * block_dim_x() / WARP_SIZE) as u64;
        let group_in_warp = ((thread_idx_x() % WARP_SIZE) >> width_log2) as u64;
        WarpRows {
            width,
            lane: thread_idx_x() & (width - 1),
            rows_per_access,
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
        row_possible::<E>(r) && (r as u64) < self.rows_per_access && first + (r as u64) < rows
    }

    /// Whether element `i` of this lane lies inside a row of `cols` (a multiple of `P`).
    #[cfg(feature = "norm")]
    #[inline(always)]
    pub(crate) fn in_row<const P: usize>(&self, i: usize, cols: u64) -> bool {
        self.col::<P>(i) < cols
    }

    /// Calls `f(first)` for each access of this lane's group (rows `first` and, with two
    /// rows per access, `first + 1`), the whole warp running the same iterations.
    #[inline(always)]
    pub(crate) fn for_each_access(&self, rows: u64, mut f: impl FnMut(u64)) {
        let mut base = self.warp_first;
        while base < rows {
            f(base + self.group_offset);
            base += self.step;
        }
    }
}

/// Whether row `r` (0 or 1) of an access can exist for `E` elements per lane: known at
/// compile time, so the second row's registers and shuffles vanish from the wide tiers.
#[inline(always)]
pub(crate) const fn row_possible<const E: usize>(r: usize) -> bool {
    r < rows_per_access(E, 1) as usize
}

/// Loads `E` elements per row of up to two rows into registers (`fill` where out of range).
#[inline(always)]
pub(crate) unsafe fn warp_load<L: Load<P>, const P: usize, const E: usize>(
    load: &L,
    at: &WarpRows,
    first: u64,
    args: &RowShape,
    fill: f32,
) -> [[f32; E]; 2] {
    let mut buf = [[fill; E]; 2];
    unroll::<2>(|r| {
        let row = first + r as u64;
        if at.holds::<E>(r, first, args.rows) {
            unroll::<E>(|i| {
                let col = at.col::<P>(i);
                if i % P == 0 && col < args.cols {
                    // SAFETY: row < rows and col + P <= cols (cols is a multiple of P).
                    let v = unsafe { load.load(row, col) };
                    unroll::<P>(|j| buf[r][i + j] = v[j]);
                }
            });
        }
    });
    buf
}

/// Stores the registers of up to two rows through `store`, mapping each element by `f`.
#[inline(always)]
pub(crate) unsafe fn warp_store<S: Store<P>, const P: usize, const E: usize>(
    store: &S,
    at: &WarpRows,
    first: u64,
    args: &RowShape,
    f: impl Fn(usize, usize) -> f32,
) {
    unroll::<2>(|r| {
        let row = first + r as u64;
        if at.holds::<E>(r, first, args.rows) {
            unroll::<E>(|i| {
                let col = at.col::<P>(i);
                if i % P == 0 && col < args.cols {
                    // SAFETY: as in warp_load.
                    unsafe { store.store(unrolled_array(|j| f(r, i + j)), row, col) };
                }
            });
        }
    });
}

/// `R` over each of the two rows' registers, then across the lane group.
#[inline(always)]
pub(crate) unsafe fn warp_row_reduce<R: Reduce, const E: usize>(
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

/// A block per row: rows `blockIdx.x, blockIdx.x + gridDim.x, ...` (uniform per block).
#[inline(always)]
pub(crate) fn block_rows(args: &RowShape, mut per_row: impl FnMut(u64)) {
    let mut row = block_idx_x() as u64;
    while row < args.rows {
        per_row(row);
        row += grid_dim_x() as u64;
    }
}

/// Calls `f(pack, col)` for this thread's packs of a row, in a block-strided loop.
#[inline(always)]
pub(crate) fn block_packs<const P: usize>(args: &RowShape, mut f: impl FnMut(u64, u64)) {
    let packs = args.cols / P as u64;
    let mut pack = thread_idx_x() as u64;
    while pack < packs {
        f(pack, pack * P as u64);
        pack += block_dim_x() as u64;
    }
}

/// Most packs a thread loads before using any on the block paths' global-memory passes.
pub(crate) const MAX_BATCH: usize = 4;

/// Like [`block_packs`], but for global reads: `load(col)` for `batch` packs (at most
/// [`MAX_BATCH`]), then `consume(pack, loaded)` for each, so every thread keeps several
/// loads in flight. Measured on the H100: 4 pays on the uncached passes; on the shared
/// path it pays for f32 but costs f16 its occupancy, which is why it is a parameter.
#[inline(always)]
pub(crate) fn block_packs_loaded<const P: usize, V: Copy>(
    args: &RowShape,
    batch: usize,
    mut load: impl FnMut(u64) -> V,
    mut consume: impl FnMut(u64, V),
) {
    let batch = batch.clamp(1, MAX_BATCH) as u64;
    let packs = args.cols / P as u64;
    let block = block_dim_x() as u64;
    let mut pack = thread_idx_x() as u64;
    while pack + (batch - 1) * block < packs {
        let first = load(pack * P as u64);
        let mut loaded = [first; MAX_BATCH];
        unroll::<MAX_BATCH>(|u| {
            if u > 0 && (u as u64) < batch {
                loaded[u] = load((pack + u as u64 * block) * P as u64);
            }
        });
        unroll::<MAX_BATCH>(|u| {
            if (u as u64) < batch {
                consume(pack + u as u64 * block, loaded[u])
            }
        });
        pack += batch * block;
    }
    while pack < packs {
        consume(pack, load(pack * P as u64));
        pack += block;
    }
}

/// Packs batched while filling the shared-memory cache: 4 for f32 packs, 1 for 16-bit
/// packs, whose f32 registers would halve the blocks resident per SM.
pub(crate) const fn shared_batch(pack: usize) -> usize {
    if pack >= 8 { 1 } else { MAX_BATCH }
}
