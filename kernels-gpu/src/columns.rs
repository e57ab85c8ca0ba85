//! Column sums over the rows of a `(rows, cols)` view, deterministic: the two-stage
//! reduction behind the norms' parameter gradients, and behind any per-column (per-channel)
//! statistic of a row-major tensor.
//!
//! Stage 1 ([`chunk_sums`]): block `b` sums the rows of chunk `b / tiles` over the column
//! tile `b % tiles` (32 lanes x `P` columns), two terms per column; each warp takes every
//! [`COLUMN_SUM_WARPS`]-th row of the chunk, and the warps' sums add up in a fixed order
//! through shared memory. Stage 2 ([`chunk_totals`]) adds the chunks in order. No atomics:
//! the same bits every run, whatever the scheduling.

use crate::abi::{COLUMN_SUM_WARPS, column_sum_tile_cols};
use crate::arch::{WARP_SIZE, block_dim_x, block_idx_x, dynamic_shared, grid_dim_x, sync_threads, thread_idx_x};
use crate::pack::{DirectStore, Store};
use crate::scalar::Scalar;
use crate::unroll::unroll;
use core::num::NonZeroU64;

/// What each row adds to its columns: two terms per column of a pack (the norms' `dy * x̂`
/// and `dy`). The loads come first, so a lane keeps four rows' loads in flight.
pub trait ColumnTerms<const P: usize> {
    type Loaded: Copy;

    /// # Safety
    /// `row` must be a row of the view and `col` the first column of a pack inside it.
    unsafe fn load(&self, row: u64, col: u64) -> Self::Loaded;

    /// The two terms row `row` adds to each column of the pack `loaded` came from.
    ///
    /// # Safety
    /// As [`ColumnTerms::load`], for the same `row`.
    unsafe fn terms(&self, row: u64, loaded: Self::Loaded) -> ([f32; P], [f32; P]);
}

/// The rows and columns summed, how the rows are chunked, and where the partial sums go:
/// f32 `[2, chunks, cols]`, the first term's chunk sums, then the second's.
#[derive(Clone, Copy)]
pub struct Chunking {
    pub rows: u64,
    pub cols: u64,
    /// Rows each chunk sums (the last may have fewer).
    pub rows_per_chunk: u64,
    pub chunks: u64,
    pub partial: u64,
}

/// Stage 1: this block's chunk sums of both terms (of the first only, where `second` is
/// false) for its column tile.
///
/// # Safety
/// `terms` must read a live `rows x cols` view with `cols` a multiple of `P`; `partial` must
/// hold `2 x chunks x cols` f32; the grid must be `tiles x chunks` blocks of
/// [`COLUMN_SUM_WARPS`] warps with `column_sum_shared_bytes(P)` of dynamic shared memory.
#[inline(always)]
pub unsafe fn chunk_sums<C: ColumnTerms<P>, const P: usize>(terms: &C, at: Chunking, second: bool) {
    let tile_cols = column_sum_tile_cols(P) as u64;
    // At least one tile (cols > 0): a divisor with no zero check.
    let tiles = NonZeroU64::new(at.cols.div_ceil(tile_cols)).unwrap_or(NonZeroU64::MIN);
    let (chunk, tile) = (block_idx_x() as u64 / tiles, block_idx_x() as u64 % tiles);
    let (warp, lane) = (thread_idx_x() / WARP_SIZE, thread_idx_x() % WARP_SIZE);
    let col = tile * tile_cols + lane as u64 * P as u64;
    let first = chunk * at.rows_per_chunk;
    let end = (first + at.rows_per_chunk).min(at.rows);
    let (mut sum_a, mut sum_b) = ([0.0f32; P], [0.0f32; P]);
    // SAFETY (block): every access is a pack of a row < rows at a column < cols.
    unsafe {
        let mut add = |row: u64, loaded: C::Loaded| {
            let (a, b) = terms.terms(row, loaded);
            unroll::<P>(|j| {
                sum_a[j] += a[j];
                sum_b[j] += b[j];
            });
        };
        if col < at.cols {
            // Four rows' loads in flight per lane, then the rest one by one.
            let step = COLUMN_SUM_WARPS as u64;
            let mut row = first + warp as u64;
            while row + 3 * step < end {
                let mut loaded = [terms.load(row, col); 4];
                unroll::<4>(|u| {
                    if u > 0 {
                        loaded[u] = terms.load(row + u as u64 * step, col);
                    }
                });
                unroll::<4>(|u| add(row + u as u64 * step, loaded[u]));
                row += 4 * step;
            }
            while row < end {
                add(row, terms.load(row, col));
                row += step;
            }
        }
        // Warp w's sums at scratch[(w * 2 + which) * 32 * P + j * 32 + lane].
        let scratch = dynamic_shared::<f32>();
        let slot =
            |w: u32, which: usize, j: usize| ((w as usize * 2 + which) * P + j) * WARP_SIZE as usize + lane as usize;
        unroll::<P>(|j| {
            scratch.add(slot(warp, 0, j)).write(sum_a[j]);
            scratch.add(slot(warp, 1, j)).write(sum_b[j]);
        });
        sync_threads();
        if warp == 0 && col < at.cols {
            let partial = at.partial as *mut f32;
            let chunk_at = (chunk * at.cols + col) as usize;
            let second_at = (at.chunks * at.cols) as usize;
            unroll::<P>(|j| {
                let (mut a, mut b) = (0.0, 0.0);
                for w in 0..COLUMN_SUM_WARPS {
                    a += scratch.add(slot(w, 0, j)).read();
                    b += scratch.add(slot(w, 1, j)).read();
                }
                partial.add(chunk_at + j).write(a);
                if second {
                    partial.add(second_at + chunk_at + j).write(b);
                }
            });
        }
    }
}

/// Stage 2: each column's total of each term over the chunks, in chunk order, into `first`
/// and `second` (either absent); a thread per column, grid-strided.
///
/// # Safety
/// As [`chunk_sums`], after it on the same stream; `first` and `second` hold `cols` `G`s.
#[inline(always)]
pub unsafe fn chunk_totals<G: Scalar>(at: Chunking, first: Option<DirectStore<G>>, second: Option<DirectStore<G>>) {
    let partial = at.partial as *const f32;
    let stride = (grid_dim_x() * block_dim_x()) as u64;
    let mut col = (block_idx_x() * block_dim_x() + thread_idx_x()) as u64;
    let second_at = at.chunks * at.cols;
    // SAFETY: reads `chunks x cols` partial sums per term and writes column `col`.
    unsafe {
        while col < at.cols {
            let (mut a, mut b) = (0.0, 0.0);
            let mut chunk = 0;
            while chunk < at.chunks {
                a += partial.add((chunk * at.cols + col) as usize).read();
                if second.is_some() {
                    b += partial.add((second_at + chunk * at.cols + col) as usize).read();
                }
                chunk += 1;
            }
            if let Some(first) = &first {
                first.store([a], 0, col);
            }
            if let Some(second) = &second {
                second.store([b], 0, col);
            }
            col += stride;
        }
    }
}
