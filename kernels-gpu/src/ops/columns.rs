//! Deterministic column sums of a `(rows, cols)` view in two stages, for any op whose
//! per-column outputs are two sums over the rows (the norms' dgamma and dbeta; a
//! channels-last BatchNorm's statistics and gradients are the same shape). The op's
//! [`ColumnTerms`] say what a row adds to each sum; the stages are written once here.
//!
//! Stage 1 ([`chunk_sums`]): block `b` sums rows `chunk * rows_per_chunk ..` (chunk
//! `b / tiles`), or rows `chunk, chunk + chunks, ...` where [`Columns::interleaved`], of
//! column tile `b % tiles` (32 lanes x `P` columns, in [`column_sum_segments`] runs). Each
//! warp takes every [`COLUMN_SUM_WARPS`]-th row of the chunk; the warps' sums then add up
//! in a fixed order through shared memory, so the result does not depend on scheduling.
//! Stage 2 ([`chunk_totals`]): each column's chunk sums added in a fixed order, a warp's
//! lanes over 32 columns, the block's warps over the chunks.

use crate::abi::{COLUMN_SUM_WARPS, COLUMN_TOTALS_WARPS};
use crate::arch::{WARP_SIZE, block_idx_x, dynamic_shared, sync_threads, thread_idx_x};
use crate::layout::{column_sum_col, column_sum_segments, column_sum_tile_cols};
use crate::pack::{DirectStore, Store};
use crate::scalar::Scalar;
use crate::unroll::{unroll, unrolled_array};
use core::num::NonZeroU64;

/// What one row adds to a column pack's two sums.
pub(crate) trait ColumnTerms<const P: usize> {
    /// What a row's pack of columns is read as (loads kept in flight together).
    type Loaded: Copy;
    /// What a lane needs of its columns beside the rows, read once before them.
    type Lane: Copy;

    /// # Safety
    /// `col..col + P` must be columns of the view, `col` aligned to `P`.
    unsafe fn lane(&self, col: u64) -> Self::Lane;

    /// # Safety
    /// `(row, col..col + P)` must be inside the view, `col` aligned to `P`.
    unsafe fn load(&self, row: u64, col: u64) -> Self::Loaded;

    /// Adds row `row`'s terms to `first` and `second`.
    ///
    /// # Safety
    /// `row` must be a row of the view.
    unsafe fn add(
        &self,
        lane: &Self::Lane,
        row: u64,
        loaded: Self::Loaded,
        first: &mut [f32; P],
        second: &mut [f32; P],
    );

    /// Whether the second sum is wanted (RMSNorm has no dbeta).
    fn second(&self) -> bool;
}

/// The view and workspace of a two-stage column sum.
#[derive(Clone, Copy)]
pub(crate) struct Columns {
    pub(crate) rows: u64,
    pub(crate) cols: u64,
    pub(crate) rows_per_chunk: u64,
    pub(crate) chunks: u64,
    /// Whether chunk `b` takes rows `b, b + chunks, ...` instead of a block of
    /// `rows_per_chunk`: the resident grid's reads then sweep the view in order, so the rows
    /// left in L2 at the end are the last ones (a pass that re-reads the view backwards
    /// finds them there).
    pub(crate) interleaved: bool,
    /// f32 `[2, chunks, cols]`: the first sum's chunk sums, then the second's.
    pub(crate) partial: u64,
}

/// Stage 1: this block's chunk of rows summed over its column tile, into `partial`.
///
/// # Safety
/// `terms` must read a live `rows x cols` view aligned to `P` with `cols` a multiple of `P`;
/// `partial` must hold `2 x chunks x cols` f32; the grid must be `tiles x chunks` blocks of
/// [`COLUMN_SUM_WARPS`] warps with `column_sum_shared_bytes(P)` of dynamic shared memory.
#[inline(always)]
pub(crate) unsafe fn chunk_sums<C: ColumnTerms<P>, const P: usize>(terms: &C, at: &Columns) {
    const { assert!(column_sum_segments(P) <= MAX_SEGMENTS) };
    let segments = column_sum_segments(P);
    let tile_cols = column_sum_tile_cols(P) as u64;
    // At least one tile (cols > 0): a divisor with no zero check.
    let tiles = NonZeroU64::new(at.cols.div_ceil(tile_cols)).unwrap_or(NonZeroU64::MIN);
    let (chunk, tile) = (block_idx_x() as u64 / tiles, block_idx_x() as u64 % tiles);
    let (warp, lane) = (thread_idx_x() / WARP_SIZE, thread_idx_x() % WARP_SIZE);
    // The lane's pack in each run of the tile; a run past the row's end reads the first
    // run's pack instead and adds nothing.
    let cols: [u64; MAX_SEGMENTS] = unrolled_array(|k| column_sum_col(tile, k, lane, P));
    let runs: [bool; MAX_SEGMENTS] = unrolled_array(|k| k < segments && cols[k] < at.cols);
    let read_at = |k: usize| if runs[k] { cols[k] } else { cols[0] };
    let (first, step, end) = if at.interleaved {
        (chunk, at.chunks, at.rows)
    } else {
        let first = chunk * at.rows_per_chunk;
        (first, 1, (first + at.rows_per_chunk).min(at.rows))
    };
    let (mut sum_a, mut sum_b) = ([[0.0f32; P]; MAX_SEGMENTS], [[0.0f32; P]; MAX_SEGMENTS]);
    // SAFETY (block): every access is a pack of a row < rows at a column < cols.
    unsafe {
        if runs[0] {
            let mut own = [terms.lane(cols[0]); MAX_SEGMENTS];
            unroll::<MAX_SEGMENTS>(|k| {
                if k > 0 && runs[k] {
                    own[k] = terms.lane(cols[k]);
                }
            });
            let load = |row: u64| {
                let mut loaded = [terms.load(row, cols[0]); MAX_SEGMENTS];
                unroll::<MAX_SEGMENTS>(|k| {
                    if k > 0 && k < segments {
                        loaded[k] = terms.load(row, read_at(k));
                    }
                });
                loaded
            };
            let add = |row: u64, loaded: [C::Loaded; MAX_SEGMENTS]| {
                unroll::<MAX_SEGMENTS>(|k| {
                    if runs[k] {
                        terms.add(&own[k], row, loaded[k], &mut sum_a[k], &mut sum_b[k]);
                    }
                })
            };
            let (row, step) = (first + warp as u64 * step, COLUMN_SUM_WARPS as u64 * step);
            rows_in_flight((row, step, end), load, add);
        }
        // Warp w's sums at scratch[((w * 2 + which) * segments * P + k * P + j) * 32 + lane].
        let scratch = dynamic_shared::<f32>();
        let slot = |w: u32, which: usize, k: usize, j: usize| {
            (((w as usize * 2 + which) * segments + k) * P + j) * WARP_SIZE as usize + lane as usize
        };
        unroll::<MAX_SEGMENTS>(|k| {
            if k < segments {
                unroll::<P>(|j| {
                    scratch.add(slot(warp, 0, k, j)).write(sum_a[k][j]);
                    scratch.add(slot(warp, 1, k, j)).write(sum_b[k][j]);
                });
            }
        });
        sync_threads();
        if warp == 0 {
            let partial = at.partial as *mut f32;
            let second_at = (at.chunks * at.cols) as usize;
            unroll::<MAX_SEGMENTS>(|k| {
                if runs[k] {
                    let chunk_at = (chunk * at.cols + cols[k]) as usize;
                    unroll::<P>(|j| {
                        let (mut a, mut b) = (0.0, 0.0);
                        for w in 0..COLUMN_SUM_WARPS {
                            a += scratch.add(slot(w, 0, k, j)).read();
                            b += scratch.add(slot(w, 1, k, j)).read();
                        }
                        partial.add(chunk_at + j).write(a);
                        if terms.second() {
                            partial.add(second_at + chunk_at + j).write(b);
                        }
                    });
                }
            });
        }
    }
}

/// The most runs of packs a stage-1 tile has: pack 1's ([`column_sum_segments`]).
const MAX_SEGMENTS: usize = column_sum_segments(1);

/// Rows whose loads of every run a stage-1 lane keeps in flight together.
const ROWS_IN_FLIGHT: usize = 4;

/// `add(row, load(row))` for rows `row, row + step, ..` below `end`, [`ROWS_IN_FLIGHT`]
/// rows' loads in flight before their adds, then the rest one by one.
#[inline(always)]
fn rows_in_flight<L: Copy>(
    (mut row, step, end): (u64, u64, u64),
    load: impl Fn(u64) -> L,
    mut add: impl FnMut(u64, L),
) {
    const R: usize = ROWS_IN_FLIGHT;
    while row + (R as u64 - 1) * step < end {
        let mut loaded = [load(row); R];
        unroll::<R>(|u| {
            if u > 0 {
                loaded[u] = load(row + u as u64 * step);
            }
        });
        unroll::<R>(|u| add(row + u as u64 * step, loaded[u]));
        row += R as u64 * step;
    }
    while row < end {
        add(row, load(row));
        row += step;
    }
}

/// Stage 2: each column's sums as the sum of its chunk sums, stored through `first` and
/// `second` (where wanted). Block `b` takes the 32 columns from `32 * b`, a lane each; its
/// warps split the chunks (warp `w` takes chunks `w, w + warps, ...`, four loads in flight
/// into four sums), and warp 0 adds the warps' sums in order: a fixed order whatever the
/// scheduling, so the same bits every run. A thread per column adding its chunks one load at a time
/// would leave too few loads in flight and take a large share of the backward's time
/// (docs/DECISIONS.md, "Deterministic two-stage column sums").
///
/// # Safety
/// As [`chunk_sums`], after it; `first` and `second` must hold `cols` elements; the grid
/// must be `cols.div_ceil(32)` blocks of [`COLUMN_TOTALS_WARPS`] warps with
/// `column_totals_shared_bytes()` of dynamic shared memory.
#[inline(always)]
pub(crate) unsafe fn chunk_totals<G: Scalar>(
    at: &Columns,
    first: Option<DirectStore<G>>,
    second: Option<DirectStore<G>>,
) {
    const IN_FLIGHT: usize = 4;
    let partial = at.partial as *const f32;
    let (warp, lane) = (thread_idx_x() / WARP_SIZE, thread_idx_x() % WARP_SIZE);
    let col = block_idx_x() as u64 * WARP_SIZE as u64 + lane as u64;
    let sums_at = [0, at.chunks * at.cols];
    let wanted = [true, second.is_some()];
    let mut sums = [[0.0f32; 2]; IN_FLIGHT];
    // SAFETY (block): reads `chunks x cols` partial sums per sum wanted, writes column `col`.
    unsafe {
        if col < at.cols {
            let step = COLUMN_TOTALS_WARPS as u64;
            let read = |k: usize, chunk: u64| partial.add((sums_at[k] + chunk * at.cols + col) as usize).read();
            let mut chunk = warp as u64;
            while chunk + (IN_FLIGHT as u64 - 1) * step < at.chunks {
                unroll::<IN_FLIGHT>(|u| {
                    unroll::<2>(|k| {
                        if wanted[k] {
                            sums[u][k] += read(k, chunk + u as u64 * step);
                        }
                    })
                });
                chunk += IN_FLIGHT as u64 * step;
            }
            while chunk < at.chunks {
                unroll::<2>(|k| {
                    if wanted[k] {
                        sums[0][k] += read(k, chunk);
                    }
                });
                chunk += step;
            }
        }
        // Warp w's sums at scratch[(k * warps + w) * 32 + lane].
        let scratch = dynamic_shared::<f32>();
        let slot =
            |k: usize, w: u32| ((k * COLUMN_TOTALS_WARPS as usize + w as usize) * WARP_SIZE as usize) + lane as usize;
        unroll::<2>(|k| {
            let mut total = 0.0;
            unroll::<IN_FLIGHT>(|u| total += sums[u][k]);
            scratch.add(slot(k, warp)).write(total);
        });
        sync_threads();
        if warp == 0 && col < at.cols {
            let mut totals = [0.0f32; 2];
            unroll::<2>(|k| {
                for w in 0..COLUMN_TOTALS_WARPS {
                    totals[k] += scratch.add(slot(k, w)).read();
                }
            });
            if let Some(first) = &first {
                first.store([totals[0]], 0, col);
            }
            if let Some(second) = &second {
                second.store([totals[1]], 0, col);
            }
        }
    }
}
