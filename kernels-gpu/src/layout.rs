//! Where the kernels put things, which the host must compute the same way: a row's aligned
//! packs and edge elements, a cluster block's part of a row, a warp tier's rows per access,
//! and the shared-memory layouts of the gathered and summed columns that the host sizes.
//! Compiled by both sides, as the ABI is; the ABI holds the parameter structs and the
//! device facts these read.

use crate::abi::{COLUMN_SUM_WARPS, COLUMN_TOTALS_WARPS, PACK_BYTES, RowShape};

/// Rows a lane group handles per access on the warp path: two in the 8-element tier, so a lane
/// keeps two packs in flight where one pack a lane leaves too few loads to cover DRAM's latency,
/// else one (the wider tiers already hold two or more packs a row, and a second row would double
/// their registers; docs/DECISIONS.md, "Warp tiers and their widths").
pub const fn rows_per_access(elements: usize) -> u64 {
    if elements <= 8 { 2 } else { 1 }
}

impl RowShape {
    /// Columns of `row` before its first element aligned to a pack of `pack` (a power of two).
    pub const fn head(&self, row: u64, pack: u64) -> u64 {
        (self.phase as u64 + row * self.cols).wrapping_neg() & (pack - 1)
    }

    /// Whether every row starts at a pack of `pack` and holds whole packs.
    const fn aligned(&self, pack: u64) -> bool {
        pack == 1 || (self.phase == 0 && self.cols.is_multiple_of(pack))
    }

    /// Aligned packs the block paths take from every row, starting at its head: all of a
    /// row where every row is aligned, else as many as the row with the longest head holds,
    /// so every row has the same (and the cluster path the same slices).
    pub const fn aligned_packs(&self, pack: u64) -> u64 {
        // [`part_packs`] of the whole row, written out: through the call, LLVM chose a select
        // where it branched, and ptxas gave the phased cluster kernels up to 8 more registers.
        if self.aligned(pack) { self.cols / pack } else { (self.cols + 1).saturating_sub(pack) / pack }
    }

    /// Elements of each row outside its aligned packs: at most `2 * pack - 2`.
    pub const fn edges(&self, pack: u64) -> u64 {
        self.cols - self.aligned_packs(pack) * pack
    }

    /// The column of edge `edge` (below [`RowShape::edges`]) of `row`: the head's
    /// elements, then those after the last aligned pack.
    pub const fn edge_col(&self, row: u64, pack: u64, edge: u64) -> u64 {
        if edge < self.head(row, pack) { edge } else { self.aligned_packs(pack) * pack + edge }
    }

    /// Block `rank`'s part of each row on a cluster of `ranks` blocks where each block owns
    /// its columns in every row (gathering per-column sums of rows run from their heads):
    /// `(first column, columns, aligned packs)`. The parts are consecutive columns,
    /// [`cluster_part_cols`] each (the last shorter, or empty), so each starts at a
    /// multiple of `pack` and a row's head is the same in every part. A block takes its
    /// part's aligned packs from the row's head on (as many in every row, by
    /// [`RowShape::aligned_packs`]'s rule) and its other elements one at a time
    /// ([`part_edge_col`]). (The cluster's other kernels split a row's aligned packs
    /// instead, the first block taking the row's few other elements.)
    pub const fn cluster_part(&self, pack: u64, rank: u32, ranks: u32) -> (u64, u64, u64) {
        let each = cluster_part_cols(self.cols, pack, ranks);
        let first = if rank as u64 * each < self.cols { rank as u64 * each } else { self.cols };
        let cols = if each < self.cols - first { each } else { self.cols - first };
        (first, cols, part_packs(cols, pack, self.aligned(pack)))
    }
}

/// Columns of each block's part of a row of `cols` split over a cluster of `ranks` blocks
/// ([`RowShape::cluster_part`]): a multiple of `pack`, so the host sizes a block's shared
/// memory for the kernel's parts.
pub const fn cluster_part_cols(cols: u64, pack: u64, ranks: u32) -> u64 {
    let ranks = if ranks == 0 { 1 } else { ranks as u64 };
    cols.div_ceil(pack).div_ceil(ranks) * pack
}

/// Aligned packs of `pack` in `cols` columns of each row from a multiple of `pack` on: all
/// where the rows are `aligned`, else as many as follow the longest head (`pack - 1`).
pub const fn part_packs(cols: u64, pack: u64, aligned: bool) -> u64 {
    if aligned { cols / pack } else { (cols + 1).saturating_sub(pack) / pack }
}

/// The column of edge `edge` (below the part's columns outside its packs) of a row's part
/// from column `first` holding `packs` aligned packs from the row's `head` on: the
/// elements before its first pack, then those after its last. In 32 bits, as the cluster
/// kernels compute it: a row's columns fit them (the host's widest row, `MAX_COLS`, is
/// under 2^31), and in 64 ptxas gave those kernels up to 16 more registers.
pub const fn part_edge_col(first: u32, packs: u32, head: u32, pack: u32, edge: u32) -> u32 {
    first + if edge < head { edge } else { packs * pack + edge }
}

/// Elements from one shifted copy of a norm's per-column vector to the next, for `cols`
/// columns: a whole number of 16-byte accesses of any pack (8 elements), so each copy
/// starts aligned. The phased paths read a weight and bias through these copies, copy `h`
/// holding the vector from element `h` (the device's `ColumnLoad::shifted`).
pub const fn column_copy_stride(cols: u64) -> u64 {
    cols.next_multiple_of(8)
}

/// Whether the phased paths at packs of `pack` elements read a norm's weight and bias from
/// shifted copies ([`column_copy_stride`]) rather than an element at a time: rows of 16-bit
/// elements (packs of 8, so eight loads a pack otherwise) read a pack's weight in one aligned
/// access; f32 rows (packs of 4) keep their element reads, which hit L1 after a pack's first, where
/// copies would be four vectors' worth of L2 reads (docs/DECISIONS.md, "The weight's shifted
/// copies").
pub const fn phased_columns_copied(pack: usize) -> bool {
    pack >= 8
}

/// Dynamic shared memory of a column-sum stage-2 block: each warp's two sums per column of
/// its tile, added in a fixed order.
pub const fn column_totals_shared_bytes() -> u32 {
    2 * COLUMN_TOTALS_WARPS * 32 * size_of::<f32>() as u32
}

/// Bytes of dynamic shared memory a backward that gathers column sums from its rows (the
/// norms' parameter gradients) holds them in, before its row caches: `groups` partial rows
/// of `sums x stride` f32, one for each set of threads that never share a column (a lane
/// group on the warp path, `block / width` of them; the block on the others), each sum's
/// columns `stride` f32s apart (the columns, or [`column_gather_stride`] of them on rows
/// run from their heads).
pub const fn column_gather_bytes(groups: u32, sums: u32, stride: u64) -> u64 {
    groups as u64 * sums as u64 * stride * size_of::<f32>() as u64
}

/// The f32s from one gathered sum's `cols` columns to the next's on rows run from their
/// heads: `cols` rounded up to 16 bytes, so each sum's first column and the row caches
/// after the sums (filled and read 16 bytes at a time) stay aligned where the columns are
/// not a multiple of four.
pub const fn column_gather_stride(cols: u64) -> u64 {
    cols.next_multiple_of((PACK_BYTES / size_of::<f32>()) as u64)
}

/// Words of the run of a gathered sum's columns (shared memory, [`column_gather_bytes`])
/// that starts at word `start` of `q` words whose first lies `shift` words past 16 bytes,
/// where runs are the widest of 4, 2 and 1 words (at most `widest`) aligned to their bytes,
/// taken in order; 0 where `start` is inside an earlier run. The kernels add a pack's terms
/// to the sums of rows run from their heads so; a constant after inlining.
pub const fn slab_run_words(shift: usize, start: usize, q: usize, widest: usize) -> usize {
    let mut word = 0;
    while word <= start {
        let mut words = widest;
        while words > 1 && (!(shift + word).is_multiple_of(words) || word + words > q) {
            words /= 2;
        }
        if word == start {
            return words;
        }
        word += words;
    }
    0
}

/// Runs of 32 packs in a column-sum stage-1 tile at pack `pack`, a pack of each per lane: a
/// warp's access at pack 1 is 32 elements (64 bytes in 16 bits), so there it reads four
/// runs of each row, 256 contiguous bytes; one run at the wider packs.
pub const fn column_sum_segments(pack: usize) -> usize {
    if pack == 1 { 4 } else { 1 }
}

/// Columns of a column-sum stage-1 tile at pack `pack`: [`column_sum_segments`] runs of a
/// pack per lane of a warp.
pub const fn column_sum_tile_cols(pack: usize) -> usize {
    32 * pack * column_sum_segments(pack)
}

/// The first column of lane `lane`'s pack in run `run` of stage-1 tile `tile` at pack `pack`
/// (a column past the row's end where the tile is the last and partial).
pub const fn column_sum_col(tile: u64, run: usize, lane: u32, pack: usize) -> u64 {
    tile * column_sum_tile_cols(pack) as u64 + ((run * 32 + lane as usize) * pack) as u64
}

/// Dynamic shared memory of a column-sum stage-1 block at pack `pack`: each warp's two f32
/// sums per column of its tile, added in a fixed order.
pub const fn column_sum_shared_bytes(pack: usize) -> u32 {
    (2 * column_sum_tile_cols(pack) * COLUMN_SUM_WARPS as usize * size_of::<f32>()) as u32
}
