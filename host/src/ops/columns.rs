//! The host side of the deterministic two-stage column sums (chunk sums, then chunk totals
//! in order): how stage 1 chunks the rows, its stream-ordered workspace, and the two
//! launches. The norms' parameter gradients use it; any kernel pair of that shape can.

use crate::error::Result;
use crate::launch::{LaunchConfig, launch};
use crate::module::Kernel;
use crate::workspace::Workspace;
use crate::{DeviceInfo, Stream};
use rill_kernels_gpu::abi::{COLUMN_SUM_WARPS, COLUMN_TOTALS_WARPS};
use rill_kernels_gpu::layout::{column_sum_shared_bytes, column_sum_tile_cols, column_totals_shared_bytes};

/// Parameters of a column-sum kernel pair, which take the chunking and the workspace.
pub(crate) trait ColumnSumArgs: Copy {
    fn set_chunking(&mut self, rows_per_chunk: u64, chunks: u64, partial: u64);
}

/// How stage 1 splits `rows`: enough blocks for two waves, chunks of at least 32 rows (the
/// partial sums stay small beside the input). Returns rows per chunk and chunks.
pub fn chunking(rows: usize, cols: usize, pack: usize, device: &DeviceInfo) -> (u64, u64) {
    let tiles = cols.div_ceil(column_sum_tile_cols(pack)) as u64;
    let threads_per_block = COLUMN_SUM_WARPS * 32;
    let resident = device.multiprocessors as u64 * (device.max_threads_per_multiprocessor / threads_per_block) as u64;
    chunks_filling(rows, tiles, 2 * resident)
}

/// Rows per chunk and chunks for about `blocks` blocks of stage 1 over `tiles` column tiles,
/// in chunks of at least 32 rows.
pub fn chunks_filling(rows: usize, tiles: u64, blocks: u64) -> (u64, u64) {
    let max_chunks = (rows as u64 / 32).max(1);
    let chunks = (blocks / tiles.max(1)).clamp(1, max_chunks);
    let rows_per_chunk = (rows as u64).div_ceil(chunks);
    (rows_per_chunk, (rows as u64).div_ceil(rows_per_chunk))
}

/// Stage 1 (`chunk_sums`) then stage 2 (`chunk_totals`) over `rows x cols` at `pack`, with
/// a workspace of two f32 per chunk and column, freed in stream order.
///
/// # Safety
/// Both kernels must take `A`, and every array `args` names must be valid for `rows x cols`
/// at `pack` (per-row arrays `rows`, outputs `cols`), as the kernels read and write them.
pub(crate) unsafe fn sum_columns<A: ColumnSumArgs>(
    stream: &Stream,
    (chunks_kernel, totals_kernel): (Kernel, Kernel),
    mut args: A,
    (rows, cols, pack): (usize, usize, usize),
) -> Result<()> {
    let device = stream.gpu().info();
    let (rows_per_chunk, chunks) = chunking(rows, cols, pack, device);
    let tiles = cols.div_ceil(column_sum_tile_cols(pack)) as u32;
    let chunks_config = LaunchConfig {
        grid: tiles * chunks as u32,
        block: COLUMN_SUM_WARPS * 32,
        shared_bytes: column_sum_shared_bytes(pack),
        cluster: 1,
    };
    // SAFETY: stage 1 writes every partial sum stage 2 reads, before it on the same stream.
    Workspace::scoped(stream, 2 * chunks as usize * cols, |partial| {
        args.set_chunking(rows_per_chunk, chunks, partial);
        // SAFETY: the caller's promise for the arrays; the workspace holds 2 x chunks x cols;
        // the grid is tiles x chunks blocks of the warps stage 1 expects, with its shared
        // memory.
        unsafe {
            launch(stream, chunks_kernel, chunks_config, &args)
                .and_then(|()| sum_chunks(stream, totals_kernel, args, cols))
        }
    })
}

/// Stage 2 (`chunk_totals`) alone: each of `cols` columns' chunk sums added in a fixed
/// order, a block per 32 columns.
///
/// # Safety
/// `totals_kernel` must take `A`, whose partial sums (as many chunks as it says) are
/// written before this launch on `stream`, and whose outputs hold `cols` elements.
pub(crate) unsafe fn sum_chunks<A: Copy>(stream: &Stream, totals_kernel: Kernel, args: A, cols: usize) -> Result<()> {
    let config = LaunchConfig {
        grid: cols.div_ceil(32) as u32,
        block: COLUMN_TOTALS_WARPS * 32,
        shared_bytes: column_totals_shared_bytes(),
        cluster: 1,
    };
    // SAFETY: forwarded to the caller; the geometry `chunk_totals` asks for.
    unsafe { launch(stream, totals_kernel, config, &args) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_kernels_gpu::layout::{column_sum_col, column_sum_segments};

    #[test]
    fn chunks_cover_the_rows_in_chunks_of_at_least_32() {
        let device = crate::launch::tests::h100();
        for (rows, cols, pack) in [(49152, 4096, 8), (49152, 128, 8), (1, 1, 1), (33, 5, 1), (4096, 65536, 4)] {
            let (per_chunk, chunks) = chunking(rows, cols, pack, &device);
            assert!(per_chunk * chunks >= rows as u64 && per_chunk * (chunks - 1) < rows as u64);
            assert!(per_chunk >= 32 || chunks == 1, "{rows} {cols}: {per_chunk} x {chunks}");
        }
    }

    #[test]
    fn stage_one_tiles_cover_every_column_once() {
        for pack in [1, 4, 8] {
            for cols in [1usize, 31, 32, 33, 127, 128, 129, 1000, 4096, 32001] {
                let cols = cols.next_multiple_of(pack);
                let mut seen = vec![0u32; cols];
                for tile in 0..cols.div_ceil(column_sum_tile_cols(pack)) as u64 {
                    for run in 0..column_sum_segments(pack) {
                        for lane in 0..32 {
                            let col = column_sum_col(tile, run, lane, pack) as usize;
                            (col..col + pack).filter(|&c| c < cols).for_each(|c| seen[c] += 1);
                        }
                    }
                }
                assert!(seen.iter().all(|&n| n == 1), "pack {pack}, {cols} columns");
            }
        }
    }
}
