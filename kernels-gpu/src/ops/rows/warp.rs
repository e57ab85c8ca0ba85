//! The warp path's rows: where a lane's rows and columns are, and loading, storing and
//! reducing a row held in registers.

use super::strided;
use crate::abi::RowShape;
use crate::arch::{WARP_SIZE, block_dim_x, block_idx_x, grid_dim_x, pinned, request_row_l2, thread_idx_x};
use crate::layout::rows_per_access;
use crate::pack::{Load, Store};
use crate::reduce::{Reduce, group_all_reduce};
use crate::scalar::Scalar;
use crate::unroll::unroll;
use core::mem::MaybeUninit;

/// Where a lane's rows are on the warp path. A warp steps through rows as a whole
/// (`warp_first`, `+ step`, ...), its groups at `group_offset` rows from the warp's first, so
/// every lane runs the same iterations and shuffles never see a lane that left the loop.
pub(crate) struct WarpRows {
    pub(crate) width: u32,
    pub(crate) lane: u32,
    pub(super) warp_first: u64,
    pub(super) group_offset: u64,
    pub(super) step: u64,
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
    /// from them out of the loop, 64 bits each, live through every row, at the cost of resident
    /// blocks (docs/DECISIONS.md, "The warp path's columns pinned per pass").
    #[inline(always)]
    pub(crate) fn for_each_access(&self, rows: u64, mut f: impl FnMut(&WarpRows, u64)) {
        strided(self.warp_first, self.step, rows, |base| f(&self.pinned(), base + self.group_offset));
    }

    /// This place with its lane and width [`pinned`] where it is called. [`warp_load`] and
    /// [`warp_store`] each pin again, so the load pass's addresses are not held through the
    /// reductions for the store pass; within a pass they are shared by its arrays. (Pinning
    /// each column instead rebuilt it at every use, as pinned values are never merged;
    /// docs/DECISIONS.md, "The warp path's columns pinned per pass".)
    #[inline(always)]
    pub(super) fn pinned(&self) -> WarpRows {
        WarpRows { width: pinned(self.width), lane: pinned(self.lane), ..*self }
    }

    /// Calls `f(r, i, row, col)` for every pack slot of this lane numbered in `packs`, in
    /// range or not, with the row and column clamped into the view (out-of-range slots read
    /// the row's last pack again, an L1 hit). Fetching every slot unconditionally keeps the
    /// loads apart from any fill value: a predicated load merged with a zero fill made ptxas
    /// copy each result, waiting for it, before issuing the next load. (Written apart from
    /// [`WarpRows::for_each_pack`]: expressing one through the other cost 20-40 registers.)
    #[inline(always)]
    pub(super) fn for_each_slot<const P: usize, const E: usize>(
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
    pub(super) fn for_each_pack<const P: usize, const E: usize>(
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
pub(super) const FETCH_BUDGET_BYTES: usize = 128;

/// Packs of `V` fetched together under [`FETCH_BUDGET_BYTES`], at least one and at most
/// `most`.
pub(super) const fn fetch_group<V>(most: usize) -> usize {
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
