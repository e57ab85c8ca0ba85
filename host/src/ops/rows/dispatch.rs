//! Which implementation of a row-wise op (softmax, the norms) runs for a shape where no
//! tuning table's entry plans it (`super::choose`): a pure function of the shape, dtype,
//! alignment and device limits, so every decision is unit-tested on the CPU. The measured
//! rules below ([`plan`]) plan such calls until the checked-in tables cover the GPUs they were
//! measured on; [`ladder_plan`] is the ladder alone.
//!
//! The ladder, as OneFlow's: up to 1024 columns the warp path (the row in registers);
//! otherwise one block per row with the row cached in shared memory, when the kernel can
//! launch with that much; otherwise, on GPUs with thread-block clusters (sm_90), a cluster
//! of blocks per row, each caching a slice; otherwise one block per row re-reading global
//! memory.

use crate::DeviceInfo;
use crate::Error::Unsupported;
use crate::launch::grid_stride_blocks;
use rill_kernels_gpu::abi::{
    CLUSTER_STATIC_SHARED_BYTES, MAX_CLUSTER_BLOCKS, PACK_BYTES, ROW_CACHE_STAGES, ROW_CLUSTER_SIZES,
    ROW_STATIC_SHARED_BYTES, ROW_WARP_BLOCK_SIZE, WARP_SIZE,
};
use rill_kernels_gpu::layout::{
    cluster_part_cols, column_gather_bytes, column_gather_stride, part_packs, rows_per_access,
};
use rill_kernels_gpu::table::{RowPath, requests_rows_ahead};

use super::spec::{OpClass, RowSpec};

/// Widest row of any path: the block paths count a thread's packs in 32 bits (one
/// instruction a step instead of a pair), and a count below 2^31 cannot wrap as it steps.
pub const MAX_COLS: usize = i32::MAX as usize;

/// Widest row the warp path takes: 32 lanes of the largest register tier.
pub const WARP_MAX_COLS: usize = 32 * RowPath::Warp32.warp_elements();

/// Widest row the planner gives the warp path for ops of `spec`: [`WARP_MAX_COLS`], but for
/// the norms' backward, whose widest tier holds x and dy in registers, and f32 norm
/// forwards without a residual, where the shared path leads from
/// [`F32_NORM_WARP_MAX_COLS`] on.
pub fn warp_max_cols(spec: &RowSpec) -> usize {
    match spec.class {
        OpClass::NormBackward | OpClass::NormBackwardParams => NORM_BACKWARD_WARP_MAX_COLS,
        OpClass::Norm if spec.element_bytes == size_of::<f32>() as u32 => F32_NORM_WARP_MAX_COLS,
        _ => WARP_MAX_COLS,
    }
}

/// Widest row the norms' backward gives the warp path. Its 32-element tier holds x and dy (64
/// registers of row), which costs it the rows in flight the shared path keeps at 1024 columns
/// (docs/DECISIONS.md, "The norms' warp-path widths").
const NORM_BACKWARD_WARP_MAX_COLS: usize = 512;

/// Widest f32 row the norm forwards without a residual give the warp path: past it the shared
/// path's block of threads a row keeps more bytes in flight than the warp tiers, and rows run from
/// their heads need it at odd widths; below it the warp path's lighter reduction wins. The
/// residual-add forwards run level on either path, and 16-bit rows keep the warp path to 1024
/// columns (docs/DECISIONS.md, "The norms' warp-path widths").
const F32_NORM_WARP_MAX_COLS: usize = 640;

/// Block sizes the block paths choose among. 384 lets a kernel of 41-56 registers keep three 64 KB
/// blocks an SM at 12 warps each, where blocks of 512 would keep two (see [`shared_plan`]); 768 is
/// left out, as it lost where it would have been chosen (docs/DECISIONS.md, "Block sizes").
pub const BLOCK_SIZES: [u32; 5] = [128, 256, 384, 512, 1024];

/// Shared memory the driver reserves for itself in every block (sm_80 and later).
pub const RESERVED_SHARED_BYTES: u32 = 1024;

/// An implementation, with its shape parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// `width` lanes per row, `elements` per lane in registers, rows per access as
    /// `rows_per_access` says.
    Warp { width: u32, elements: u32 },
    /// One block per row, the row cached in `shared_bytes` of dynamic shared memory.
    Shared { block: u32, shared_bytes: u32 },
    /// One block per row, re-reading the row from global memory.
    Uncached { block: u32 },
    /// `cluster` blocks per row, each caching a slice of it in `shared_bytes`.
    Cluster { cluster: u32, block: u32, shared_bytes: u32 },
}

/// The implementations, to force one in tests and benchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PathKind {
    Warp,
    Shared,
    Uncached,
    Cluster,
}

impl PathKind {
    /// Every implementation, to try each in turn (tests ask the planner which take a call).
    pub const ALL: [PathKind; 4] = [PathKind::Warp, PathKind::Shared, PathKind::Uncached, PathKind::Cluster];
}

/// What a launch will do: path, pack (elements per vectorized access) and grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub path: Path,
    pub pack: usize,
    /// Whether a block path runs each row from its head: rows that start past a 16-byte
    /// boundary, all arrays by the same amount.
    pub phased: bool,
    pub grid: u32,
    /// Rows past each row whose lines a warp requests into L2 (the planner's `rows_ahead`; 0
    /// for none).
    pub ahead: u64,
    /// Row caches each block keeps and uses in turn (`RowShape::stages`): 1, or
    /// [`ROW_CACHE_STAGES`] for a shared-path backward that gathers column sums from aligned
    /// rows, where they keep its blocks an SM (the planner's `stages_rows`).
    pub stages: u32,
}

impl Plan {
    pub fn kind(&self) -> PathKind {
        match self.path {
            Path::Warp { .. } => PathKind::Warp,
            Path::Shared { .. } => PathKind::Shared,
            Path::Uncached { .. } => PathKind::Uncached,
            Path::Cluster { .. } => PathKind::Cluster,
        }
    }

    pub fn block(&self) -> u32 {
        match self.path {
            Path::Warp { .. } => ROW_WARP_BLOCK_SIZE,
            Path::Shared { block, .. } | Path::Uncached { block } | Path::Cluster { block, .. } => block,
        }
    }

    pub fn shared_bytes(&self) -> u32 {
        match self.path {
            Path::Shared { shared_bytes, .. } | Path::Cluster { shared_bytes, .. } => shared_bytes,
            _ => 0,
        }
    }

    /// Blocks per cluster (1 but on the cluster path).
    pub fn cluster(&self) -> u32 {
        match self.path {
            Path::Cluster { cluster, .. } => cluster,
            _ => 1,
        }
    }

    /// Rows of the partial array a gathering backward writes: one a block, or a cluster.
    pub fn partial_rows(&self) -> u32 {
        self.grid / self.cluster()
    }

    /// The kernels' path: the warp tier, or the block path, phased or not.
    pub fn row_path(&self) -> RowPath {
        match (self.path, self.phased) {
            (Path::Warp { elements, .. }, _) => {
                RowPath::WARP.into_iter().find(|p| p.warp_elements() == elements as usize).unwrap_or(RowPath::Warp32)
            }
            (Path::Shared { .. }, false) => RowPath::Shared,
            (Path::Shared { .. }, true) => RowPath::SharedPhased,
            (Path::Uncached { .. }, false) => RowPath::Uncached,
            (Path::Uncached { .. }, true) => RowPath::UncachedPhased,
            (Path::Cluster { .. }, false) => RowPath::Cluster,
            (Path::Cluster { .. }, true) => RowPath::ClusterPhased,
        }
    }

    /// One line for logs and test messages.
    pub fn describe(&self) -> String {
        let path = match self.path {
            Path::Warp { width, elements } => format!("warp path: {width} lanes/row, {elements} elements/lane"),
            Path::Shared { block, shared_bytes } => format!("shared path: block {block}, {shared_bytes} B shared"),
            Path::Uncached { block } => format!("uncached path: block {block}"),
            Path::Cluster { cluster, block, shared_bytes } => {
                format!("cluster path: {cluster} blocks of {block} a row, {shared_bytes} B shared each")
            }
        };
        let phased = if self.phased { " from each row's head" } else { "" };
        let ahead = if self.ahead > 0 { format!(", rows {} ahead into L2", self.ahead) } else { String::new() };
        let stages = if self.stages > 1 { format!(", rows staged in {} caches", self.stages) } else { String::new() };
        format!("{path}, pack {}{phased}, grid {}{ahead}{stages}", self.pack, self.grid)
    }
}

/// What the planner needs to know about one call: the op's spec, the shape, the packs its
/// arrays allow, and the block-path kernels' thread limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Problem {
    pub rows: usize,
    pub cols: usize,
    /// The widest pack every address and the row length allow (1 or the dtype's widest).
    pub pack: usize,
    /// The block paths' pack: `pack`, or the dtype's widest where the row's arrays share
    /// one offset from a 16-byte boundary (the kernels then run each row in aligned packs
    /// from its head, its few other elements one at a time; see `RowShape::phase`).
    pub block_pack: usize,
    /// The most threads per block the block-path kernels launch with (their register use
    /// decides it; the driver reports it).
    pub block_limit: u32,
    pub spec: RowSpec,
    pub force: Option<PathKind>,
}

impl Problem {
    /// A block path's plan: in the block paths' pack, rows run from their heads where that
    /// is wider than every row allows.
    pub(super) fn block_plan(&self, path: Path, grid: u32) -> Plan {
        Plan { path, pack: self.block_pack, phased: self.block_phased(), grid, ahead: 0, stages: 1 }
    }

    /// Whether a cluster's blocks each own a part of every row's columns (the kernels'
    /// `RowShape::cluster_part`): where they gather column sums from rows run from their
    /// heads. Elsewhere they split a row's aligned packs.
    pub(super) fn owns_parts(&self) -> bool {
        self.spec.gathered_bytes_per_col() > 0 && self.block_phased()
    }

    /// The aligned packs of the block paths' pack in one block's slice of a row split over
    /// `cluster` blocks (the last slice may hold fewer). Where a block owns its part of
    /// rows run from their heads, the most any row of this width gives: every pack of the
    /// part where the width is a multiple of the pack (the rows' arrays may start on 16
    /// bytes, run from their heads because a column array does not), else those after the
    /// longest head. Not every pack at other widths: one pack more of shared memory can move two
    /// cluster blocks from the 196 KB shared-memory configuration the driver picks for cluster
    /// kernels (no carveout set), which leaves L1 60 KB of the SM's 256 for the weight, to the 228
    /// KB one, which leaves it 28 (docs/DECISIONS.md, "The L1 carveout for column data").
    pub(super) fn slice_packs(&self, cluster: u32) -> u64 {
        let (cols, pack) = (self.cols as u64, self.block_pack.max(1) as u64);
        if self.owns_parts() {
            part_packs(cluster_part_cols(cols, pack, cluster), pack, cols.is_multiple_of(pack))
        } else {
            (cols / pack).div_ceil(cluster as u64)
        }
    }

    /// The columns of one block's slice of a row split over `cluster` blocks: its part's
    /// where it owns one, else its packs'.
    pub(super) fn slice_cols(&self, cluster: u32) -> u64 {
        let pack = self.block_pack.max(1) as u64;
        if self.owns_parts() {
            cluster_part_cols(self.cols as u64, pack, cluster)
        } else {
            self.slice_packs(cluster) * pack
        }
    }

    /// Shared memory of one block of a row split over `cluster` blocks of `block` threads:
    /// its slice's packs of each cached array but those its threads hold in registers, and
    /// its slice's gathered sums.
    pub(super) fn slice_bytes(&self, cluster: u32, block: u32) -> u64 {
        let held = self.spec.cluster_held_packs as u64 * block as u64;
        let pack_bytes = self.block_pack.max(1) as u64 * self.spec.cache_bytes_per_col as u64;
        self.slice_packs(cluster).saturating_sub(held) * pack_bytes + self.gathered_bytes(self.slice_cols(cluster))
    }

    /// Shared memory of a block holding `cols` columns of each cached array and of the
    /// gathered sums.
    pub(super) fn block_bytes(&self, cols: u64) -> u64 {
        self.staged_block_bytes(cols, 1)
    }

    /// [`Problem::block_bytes`] with `stages` caches of the rows.
    pub(super) fn staged_block_bytes(&self, cols: u64, stages: u32) -> u64 {
        stages as u64 * cols * self.spec.cache_bytes_per_col as u64 + self.gathered_bytes(cols)
    }

    /// Whether the shared-path kernel may stage rows in [`ROW_CACHE_STAGES`] caches: a
    /// backward that gathers column sums from aligned rows (its grid one wave of blocks).
    pub(super) fn stages_rows(&self) -> bool {
        self.spec.gathered_bytes_per_col() > 0 && !self.block_phased()
    }

    /// Shared memory of the gathered sums of `cols` columns (the kernels' `ColumnSlab`:
    /// each sum's columns 16-byte aligned).
    pub(super) fn gathered_bytes(&self, cols: u64) -> u64 {
        let sums = self.spec.gathered_bytes_per_col() / size_of::<f32>() as u32;
        column_gather_bytes(1, sums, column_gather_stride(cols))
    }

    /// Whether the block paths run rows from their heads: their pack is wider than every
    /// row allows.
    pub(super) fn block_phased(&self) -> bool {
        self.block_pack > self.pack
    }

    /// Whether the gathered column sums take no more shared memory than the cached rows
    /// (all but 16-bit LayerNorm's), which decides where the sums gather and on which
    /// clusters ([`gathers_columns`], [`cluster_plan`]).
    pub(super) fn sums_fit_caches(&self) -> bool {
        self.spec.gathered_bytes_per_col() <= self.spec.cache_bytes_per_col
    }
}

/// Blocks per SM the kernel reaches with `block` threads and `shared` bytes (the
/// occupancy API), or an error from the driver.
pub type Occupancy<'a> = &'a dyn Fn(u32, u32) -> crate::Result<u32>;

/// Clusters of `cluster` blocks of `block` threads and `shared` bytes each that the cluster
/// kernel keeps resident at once (0 where it cannot launch so), or an error from the driver.
pub type ClusterOccupancy<'a> = &'a dyn Fn(u32, u32, u32) -> crate::Result<u32>;

/// The occupancy questions the planner may ask.
#[derive(Clone, Copy)]
pub struct Occupancies<'a> {
    /// For the shared-path kernel.
    pub shared: Occupancy<'a>,
    /// For the cluster-path kernel (never asked on GPUs without clusters).
    pub cluster: ClusterOccupancy<'a>,
}

/// The plan for `problem`.
pub fn plan(problem: &Problem, device: &DeviceInfo, occupancy: Occupancies<'_>) -> crate::Result<Plan> {
    if problem.cols > MAX_COLS {
        return Err(Unsupported(format!(
            "rows of at most {MAX_COLS} columns are supported, not {}: split the row, or view it as several",
            problem.cols
        )));
    }
    match problem.force {
        Some(PathKind::Warp) if problem.cols > WARP_MAX_COLS => Err(Unsupported(format!(
            "the warp path takes rows of at most {WARP_MAX_COLS} columns, not {}",
            problem.cols
        ))),
        Some(PathKind::Warp) => Ok(warp_plan(problem, device)),
        Some(PathKind::Uncached) => Ok(uncached_plan(problem, device)),
        Some(PathKind::Shared) => {
            shared_plan(problem, device, occupancy.shared)?.map(|(plan, _)| plan).ok_or_else(|| {
                Unsupported(format!("a row of {} columns does not fit in this device's shared memory", problem.cols))
            })
        }
        Some(PathKind::Cluster) => cluster_plan(problem, device, occupancy.cluster)?.ok_or_else(|| {
            Unsupported(format!(
                "no cluster of up to {} blocks holds a row of {} columns on this device (clusters need sm_90)",
                ROW_CLUSTER_SIZES[ROW_CLUSTER_SIZES.len() - 1],
                problem.cols
            ))
        }),
        None if problem.cols <= warp_max_cols(&problem.spec) => Ok(warp_plan(problem, device)),
        None if problem.spec.reads_once => Ok(streaming_plan(problem, device)),
        None => Ok(match shared_plan(problem, device, occupancy.shared)? {
            Some((plan, resident)) if prefers_streaming(problem, &plan, resident) => uncached_plan(problem, device),
            Some((plan, resident)) if prefers_cluster(problem, &plan, resident, device) => {
                cluster_plan(problem, device, occupancy.cluster)?.unwrap_or(plan)
            }
            Some((plan, resident)) if prefers_fewer_blocks(problem, &plan, resident, device) => {
                with_fewer_blocks(plan, device, occupancy.shared)?
            }
            Some((plan, _)) if prefers_small_blocks(problem, &plan, device) => {
                let grid = block_grid(problem.rows, SMALL_BLOCK, device);
                Plan { path: Path::Shared { block: SMALL_BLOCK, shared_bytes: plan.shared_bytes() }, grid, ..plan }
            }
            Some((plan, _)) => plan,
            None => cluster_plan(problem, device, occupancy.cluster)?.unwrap_or_else(|| uncached_plan(problem, device)),
        }),
    }
}

/// Whether a shared-path `plan` whose cached reads read memory beside the cache
/// ([`Problem::cache_reads_memory`]), `resident` blocks an SM, loses to the uncached path:
/// one block an SM, in packs wider than an element, of a cache narrower than f32 or of rows
/// run from their heads. Each cached read also reads the mask, and a lone block has no other
/// block's loads to overlap those reads with; a 16-bit cache holds two elements in the bytes of one
/// f32, each converted and added to its mask on every read, so a lone block of 16-bit rows runs out
/// of issue slots where an aligned f32 one does not, and the uncached path's loads keep more in
/// flight (docs/DECISIONS.md, "The masked kind streams rather than caches where one block holds an
/// SM").
fn prefers_streaming(problem: &Problem, plan: &Plan, resident: u32) -> bool {
    problem.spec.cache_reads_memory
        && plan.pack > 1
        && resident == 1
        && (problem.spec.cache_bytes_per_col < size_of::<f32>() as u32 || plan.phased)
}

/// Whether a shared-path `plan` whose passes read per-column data
/// ([`Problem::passes_column_bytes`]), `resident` blocks an SM, loses to a cluster: one
/// block an SM, on rows run from their heads, or on any rows where each SM's share of the
/// DRAM's bandwidth passes [`FAST_DRAM_BYTES_PER_SM`] (a cluster's blocks share SMs, so
/// one block's passes and weight reads overlap another's loads). Aligned rows that gather
/// column sums keep their own plans ([`gathers_columns`], [`cluster_plan`]). On aligned rows of a
/// device whose DRAM is slower a lone block keeps up and the shared path keeps its one pass over a
/// cached row (docs/DECISIONS.md, "Clusters where the passes read column data, and the DRAM-per-SM
/// line").
fn prefers_cluster(problem: &Problem, plan: &Plan, resident: u32, device: &DeviceInfo) -> bool {
    let aligned_rows_move = fast_dram(device) && problem.spec.gathered_bytes_per_col() == 0;
    problem.spec.passes_column_bytes > 0 && resident == 1 && (plan.phased || aligned_rows_move)
}

/// Whether each SM's share of the DRAM's bandwidth passes [`FAST_DRAM_BYTES_PER_SM`].
fn fast_dram(device: &DeviceInfo) -> bool {
    device.dram_bytes_per_second > FAST_DRAM_BYTES_PER_SM * device.multiprocessors as u64
}

/// Whether a shared-path `plan` is the aligned backward of a 16-bit norm with a weight (no
/// gathered sums) on a device whose DRAM is fast ([`fast_dram`]): the rows whose blocks
/// [`prefers_fewer_blocks`] and [`prefers_small_blocks`] reshape.
fn sixteen_bit_norm_backward(problem: &Problem, plan: &Plan, device: &DeviceInfo) -> bool {
    let spec = &problem.spec;
    fast_dram(device)
        && spec.class == OpClass::NormBackward
        && spec.element_bytes == size_of::<u16>() as u32
        && spec.passes_column_bytes > 0
        && !plan.phased
}

/// Whether [`sixteen_bit_norm_backward`]'s `plan`, `resident` blocks an SM, runs faster
/// with at most [`FEWER_BLOCKS_RESIDENT`] of them, at [`FEWER_BLOCKS_COLS`]: bf16 rows gain, f16
/// ones (the same kernel but for the conversions) run level or slightly behind, for a reason not
/// known; the softmax backward (no weight, no saved statistics) does not move and the gathering
/// plans lose, so they keep theirs (docs/DECISIONS.md, "Fewer blocks an SM and blocks of 64 for the
/// 16-bit norm backward on fast DRAM").
fn prefers_fewer_blocks(problem: &Problem, plan: &Plan, resident: u32, device: &DeviceInfo) -> bool {
    sixteen_bit_norm_backward(problem, plan, device)
        && FEWER_BLOCKS_COLS.contains(&problem.cols)
        && resident > FEWER_BLOCKS_RESIDENT
}

/// Whether [`sixteen_bit_norm_backward`]'s `plan` runs faster on blocks of [`SMALL_BLOCK`]
/// (two packs a thread at 1024 columns, 32 rows an SM in flight instead of 16), at up to
/// [`SMALL_BLOCK_MAX_COLS`]. The gathering plans, which lose at 768 columns, and f32, whose
/// backward already runs at copy speed, keep blocks of 128 (docs/DECISIONS.md, "Fewer blocks an SM
/// and blocks of 64 for the 16-bit norm backward on fast DRAM").
fn prefers_small_blocks(problem: &Problem, plan: &Plan, device: &DeviceInfo) -> bool {
    sixteen_bit_norm_backward(problem, plan, device) && problem.cols <= SMALL_BLOCK_MAX_COLS
}

/// The block of [`prefers_small_blocks`]: two warps.
pub(super) const SMALL_BLOCK: u32 = 64;

/// Widest row [`prefers_small_blocks`] takes: the widest its records cover.
const SMALL_BLOCK_MAX_COLS: usize = 1024;

/// Most blocks an SM [`prefers_fewer_blocks`] keeps.
const FEWER_BLOCKS_RESIDENT: u32 = 10;

/// Row widths where [`prefers_fewer_blocks`] caps the blocks: those its records show gaining.
const FEWER_BLOCKS_COLS: core::ops::RangeInclusive<usize> = 2048..=4096;

/// Rows ahead ([`RowShape::ahead`](rill_kernels_gpu::abi::RowShape::ahead)) whose lines
/// the warp path's widest tier requests into L2 as it starts each row, for `plan` with
/// `resident_blocks` blocks an SM: a wave of the resident warps' rows, for 16-bit rows
/// with element outputs (the kernels compile the request for those alone), where the
/// DRAM is fast ([`fast_dram`]), the kernel's registers keep at most [`AHEAD_MAX_WARPS`]
/// warps an SM and a wave's rows take at most 1/[`AHEAD_L2_SHARE`] of L2; else 0. Each grid
/// gives a warp one row, so without the request a row's loads wait on DRAM with only the
/// resident rows in flight. Where more warps fit they hide the DRAM themselves and the request only
/// adds traffic, and where a wave's rows take more of L2 they are evicted before their warps read
/// them (docs/DECISIONS.md, "Rows requested ahead into L2").
/// The occupancy (`resident_blocks`) is asked only for such a plan on such a device.
pub fn rows_ahead(
    problem: &Problem,
    plan: &Plan,
    device: &DeviceInfo,
    resident_blocks: impl FnOnce() -> crate::Result<u32>,
) -> crate::Result<u64> {
    if !fast_dram(device) {
        return Ok(0);
    }
    let mut warps = 0;
    let wave = wave_ahead(problem, plan, device, || {
        let blocks_an_sm = resident_blocks()?;
        warps = blocks_an_sm * (plan.block() / WARP_SIZE);
        Ok(blocks_an_sm)
    })?;
    let wave_bytes = wave * (problem.cols * problem.spec.cache_bytes_per_col as usize) as u64;
    let fits = warps <= AHEAD_MAX_WARPS && wave_bytes <= device.l2_bytes as u64 / AHEAD_L2_SHARE;
    Ok(if fits { wave } else { 0 })
}

/// Most warps an SM for which [`rows_ahead`] requests rows.
const AHEAD_MAX_WARPS: u32 = 20;

/// The share of L2 (its inverse) a wave of rows [`rows_ahead`] requests may take, so they
/// are still there when their warps read them.
const AHEAD_L2_SHARE: u64 = 8;

/// Granularity in which the driver allots a block's shared memory (sm_80 and later).
pub(super) const SHARED_ALLOCATION_BYTES: u32 = 128;

/// Shared-path `plan` with its dynamic shared memory padded until at most
/// [`FEWER_BLOCKS_RESIDENT`] blocks fit an SM ([`padded_shared_bytes`]), or `plan` unchanged
/// where no padding gets there.
fn with_fewer_blocks(plan: Plan, device: &DeviceInfo, occupancy: Occupancy<'_>) -> crate::Result<Plan> {
    let Path::Shared { block, shared_bytes } = plan.path else {
        return Ok(plan);
    };
    Ok(match padded_shared_bytes(shared_bytes, block, Some(FEWER_BLOCKS_RESIDENT), device, occupancy)? {
        Some(padded) => Plan { path: Path::Shared { block, shared_bytes: padded }, ..plan },
        None => plan,
    })
}

/// The shared memory a shared-path block of `block` threads caching `cached` bytes launches
/// with: `cached`, padded (the kernel uses only its cache's bytes) until at most
/// `most_blocks_an_sm` blocks share an SM where that is given and fewer than the cache alone
/// allows; `None` where the block does not reside or no padding that launches gets there.
pub(super) fn padded_shared_bytes(
    cached: u32,
    block: u32,
    most_blocks_an_sm: Option<u32>,
    device: &DeviceInfo,
    occupancy: Occupancy<'_>,
) -> crate::Result<Option<u32>> {
    let resident = occupancy(block, cached)?;
    let Some(most) = most_blocks_an_sm.filter(|&most| most < resident) else {
        return Ok((resident > 0).then_some(cached));
    };
    if most == 0 {
        return Ok(None);
    }
    // The least allotment of which `most` + 1 blocks overfill the SM's shared memory.
    let per_block = device.max_shared_bytes_per_multiprocessor / (most + 1) + 1;
    let mut bytes = per_block
        .saturating_sub(ROW_STATIC_SHARED_BYTES + RESERVED_SHARED_BYTES)
        .next_multiple_of(SHARED_ALLOCATION_BYTES)
        .max(cached);
    while occupancy(block, bytes)? > most {
        bytes += SHARED_ALLOCATION_BYTES;
        if !fits_a_block(bytes as u64, device) {
            return Ok(None);
        }
    }
    Ok((occupancy(block, bytes)? > 0).then_some(bytes))
}

/// DRAM bandwidth an SM (bytes per second) past which a lone block on the shared path
/// cannot keep enough of its row's bytes in flight while its passes read per-column data
/// ([`prefers_cluster`]): between the H100's 25 GB/s an SM (3.35 TB/s over 132 SMs), where the
/// block keeps up, and the H200's 37 (4.8 TB/s), where it does not; the only two GPUs measured, so
/// the line may move with a third. The 16-bit norm backward's block shapes
/// ([`sixteen_bit_norm_backward`]) rest on the H200 alone, so they take the same line
/// (docs/DECISIONS.md, "Clusters where the passes read column data, and the DRAM-per-SM line").
const FAST_DRAM_BYTES_PER_SM: u64 = 30_000_000_000;

/// Fewest columns of a row read in packs (more than one element) that the warp path gives
/// the 16-element tier rather than the 8-element one: from there a row spans at least 4
/// lanes of 16. A lane then holds two packs of one row, not one pack of each of two rows,
/// so a warp's shuffles reduce its two lane groups' rows at once (4 levels at 256 columns
/// against 5 levels for each row), and each lane reads one row's per-row values (saved
/// statistics, a target) instead of two. Below 64 columns (1-3 lanes) and at packs of 1 (a lane's
/// 16 elements loaded one by one) the 8-element tier stays ahead (docs/DECISIONS.md, "Warp tiers
/// and their widths").
pub const WARP16_MIN_PACKED_COLS: usize = 64;

/// Widths of 16-bit rows, read in packs of 8, that an op reading each row once
/// ([`Problem::reads_once`]: cross entropy's loss, logsumexp) runs on the 32-element tier in
/// lane groups (8 lanes a row at 256 columns, 16 at 512) rather than the 16-element tier:
/// each lane keeps four packs in flight, not two, where nothing is written to overlap the
/// reads with. Narrower rows have too few packs to fill the wider lanes, and f32 rows (packs of 4)
/// already keep their loads in flight, so they keep the 16-element tier (docs/DECISIONS.md, "Warp
/// tiers and their widths").
pub const READ_ONCE_WARP32_COLS: core::ops::RangeInclusive<usize> = 256..=512;

fn warp_plan(problem: &Problem, device: &DeviceInfo) -> Plan {
    let narrowest = narrowest_tier(problem.cols);
    let elements = if problem.spec.reads_once && problem.pack == 8 && READ_ONCE_WARP32_COLS.contains(&problem.cols) {
        RowPath::Warp32.warp_elements() as u32
    } else if narrowest == RowPath::Warp8.warp_elements() as u32
        && problem.pack > 1
        && problem.cols >= WARP16_MIN_PACKED_COLS
    {
        RowPath::Warp16.warp_elements() as u32
    } else {
        narrowest
    };
    warp_tier_plan(problem, elements, device)
}

/// Elements a lane of the narrowest warp tier that holds a row of `cols` in 32 lanes (the
/// widest tier past them).
fn narrowest_tier(cols: usize) -> u32 {
    let cols = cols.max(1) as u32;
    let tiers = RowPath::WARP.into_iter().map(|path| path.warp_elements() as u32);
    tiers.clone().find(|&e| cols <= WARP_SIZE * e).unwrap_or(RowPath::Warp32.warp_elements() as u32)
}

/// The warp path's plan on the tier of `elements` a lane: as few lanes a row as a power of
/// two covering it, the grid striding over the rows' lane groups.
pub(super) fn warp_tier_plan(problem: &Problem, elements: u32, device: &DeviceInfo) -> Plan {
    let width = (problem.cols.max(1) as u32).div_ceil(elements).next_power_of_two().min(WARP_SIZE);
    let threads = (problem.rows as u64).div_ceil(rows_per_access(elements as usize)) * width as u64;
    Plan {
        path: Path::Warp { width, elements },
        pack: problem.pack,
        phased: false,
        grid: grid_stride_blocks(threads, ROW_WARP_BLOCK_SIZE, device),
        ahead: 0,
        stages: 1,
    }
}

/// The rows one wave of a warp-path plan's resident warps holds, at `blocks_an_sm` blocks
/// an SM of lane groups `width` lanes wide on the tier of `elements`: what a request for
/// the rows ahead ([`RowShape::ahead`](rill_kernels_gpu::abi::RowShape::ahead)) reaches.
pub(super) fn wave_rows(width: u32, elements: u32, blocks_an_sm: u32, device: &DeviceInfo) -> u64 {
    let warps = blocks_an_sm as u64 * (ROW_WARP_BLOCK_SIZE / WARP_SIZE) as u64;
    warps * device.multiprocessors as u64 * (WARP_SIZE / width) as u64 * rows_per_access(elements as usize)
}

/// A block per row, grid-strided ([`grid_stride_blocks`] over the rows' threads).
pub(super) fn block_grid(rows: usize, block: u32, device: &DeviceInfo) -> u32 {
    grid_stride_blocks(rows as u64 * block as u64, block, device)
}

/// The shared path, if the row fits, and the blocks it keeps resident per SM: the largest
/// block size that keeps as many as 128 threads do (more threads per row at no cost in
/// occupancy). Where every cached read is transformed ([`Problem::cache_transformed`]),
/// the size that keeps the most threads resident, the smallest on ties: such a load is bound by the
/// SMs' issue, not by memory, so threads resident count more than rows in flight
/// (docs/DECISIONS.md, "Block sizes"). A backward
/// in [`ROW_CACHE_STAGES`] caches ([`Plan::stages`]) where that keeps the block as many
/// blocks an SM as one cache does ([`stages_rows`]).
fn shared_plan(problem: &Problem, device: &DeviceInfo, occupancy: Occupancy<'_>) -> crate::Result<Option<(Plan, u32)>> {
    let bytes = problem.block_bytes(problem.cols as u64);
    if !fits_a_block(bytes, device) {
        return Ok(None);
    }
    let shared_bytes = bytes as u32;
    let baseline = occupancy(BLOCK_SIZES[0], shared_bytes)?;
    if baseline == 0 {
        return Ok(None);
    }
    let (mut block, mut resident) = (BLOCK_SIZES[0], baseline);
    for &candidate in BLOCK_SIZES[1..].iter().filter(|&&b| b <= problem.block_limit) {
        let blocks = occupancy(candidate, shared_bytes)?;
        let better =
            if problem.spec.cache_transformed { blocks * candidate > resident * block } else { blocks == baseline };
        if better {
            (block, resident) = (candidate, blocks);
        }
    }
    let (shared_bytes, stages) = match stages_rows(problem, device, occupancy, block, resident)? {
        Some(staged) => (staged, ROW_CACHE_STAGES),
        None => (shared_bytes, 1),
    };
    let plan = problem.block_plan(Path::Shared { block, shared_bytes }, block_grid(problem.rows, block, device));
    Ok(Some((Plan { stages, ..plan }, resident)))
}

/// The shared memory of [`ROW_CACHE_STAGES`] caches for a shared-path backward that gathers
/// column sums from aligned rows ([`Problem::stages_rows`]), in blocks of `block`, where
/// they fit and keep the `resident` blocks an SM of one cache: each block then copies its
/// next row while it works on one, at no cost in occupancy. Where a second cache would cost blocks
/// an SM it is not taken: another block's row in flight is worth more than a block's second row
/// (docs/DECISIONS.md, "Rows staged in two caches").
fn stages_rows(
    problem: &Problem,
    device: &DeviceInfo,
    occupancy: Occupancy<'_>,
    block: u32,
    resident: u32,
) -> crate::Result<Option<u32>> {
    let staged = problem.staged_block_bytes(problem.cols as u64, ROW_CACHE_STAGES);
    if !problem.stages_rows() || !fits_a_block(staged, device) {
        return Ok(None);
    }
    Ok((occupancy(block, staged as u32)? == resident).then_some(staged as u32))
}

/// Whether `bytes` of a row's cache fit one block's dynamic shared memory beside the row
/// kernels' static shared memory.
pub(super) fn fits_a_block(bytes: u64, device: &DeviceInfo) -> bool {
    bytes <= device.max_shared_bytes_per_block_optin.saturating_sub(ROW_STATIC_SHARED_BYTES) as u64
}

/// Whether a backward's rows can gather the column sums of `spec` (its gathering kernels'
/// paths):
/// rows on the warp path, or whose caches and sums fit one block's shared memory, or (sm_90)
/// a cluster's, each block holding its slice's, where the sums take no more of it than the
/// cached rows or, on aligned rows, where the largest cluster's slices fit
/// [`GATHERING_BLOCKS_AN_SM`] blocks an SM; rows run from their heads (`phased`, wider than
/// the warp path) only where the sums take no more of it than the cached rows, on either
/// path. Elsewhere a second kernel reads the rows again for them. 16-bit LayerNorm's two f32 sums
/// take twice the shared memory of its cached rows, so where they cost it blocks an SM the
/// gathering kernel falls behind the second kernel's extra read, and it gathers on clusters only
/// where it keeps two blocks an SM (docs/DECISIONS.md, "Which backwards gather their column sums").
pub fn gathers_columns(spec: &RowSpec, cols: usize, phased: bool, device: &DeviceInfo) -> bool {
    let gathering = Problem { rows: 0, cols, pack: 1, block_pack: 1, block_limit: 0, spec: *spec, force: None };
    let sums_fit_caches = gathering.sums_fit_caches();
    let per_col = spec.cache_bytes_per_col + spec.gathered_bytes_per_col();
    let cols = cols as u64;
    cols <= warp_max_cols(spec) as u64
        || ((!phased || sums_fit_caches) && fits_a_block(gathering.block_bytes(cols), device))
        || (sums_fit_caches && fits_a_cluster(cols, per_col, device))
        || (!phased && fits_a_cluster(cols, GATHERING_BLOCKS_AN_SM * per_col, device))
}

/// Blocks an SM whose slices' caches and sums the largest cluster must hold for aligned
/// rows whose sums take more shared memory than their caches (16-bit LayerNorm) to gather:
/// there the cluster takes more than one block an SM ([`cluster_plan`]).
const GATHERING_BLOCKS_AN_SM: u32 = 2;

/// Whether the largest cluster holds a row of `cols` columns of `per_col` bytes on a GPU
/// with clusters: each block's slice (rounded up to 16 columns, past any pack) in its
/// shared memory.
pub(super) fn fits_a_cluster(cols: u64, per_col: u32, device: &DeviceInfo) -> bool {
    let slice_cols = cols.div_ceil(MAX_CLUSTER_BLOCKS as u64).next_multiple_of(PACK_BYTES as u64);
    has_clusters(device) && slice_cols * per_col as u64 <= cluster_block_bytes(device)
}

/// Whether the GPU runs thread-block clusters (sm_90 on).
pub(super) fn has_clusters(device: &DeviceInfo) -> bool {
    device.compute_capability.0 >= 9
}

/// The dynamic shared memory a cluster block's slice may take beside the cluster kernels'
/// static shared memory.
pub(super) fn cluster_block_bytes(device: &DeviceInfo) -> u64 {
    device.max_shared_bytes_per_block_optin.saturating_sub(CLUSTER_STATIC_SHARED_BYTES) as u64
}

/// Waves of resident clusters the cluster path's grid holds. A cluster works through its
/// rows copying the next one into shared memory as it writes the last
/// (`RowSplit::PREFETCHES` in the kernels), which pays only over several rows; more waves make
/// more, shorter-lived clusters, fewer leave the prefetch too few rows (docs/DECISIONS.md, "Cluster
/// size and waves").
pub const CLUSTER_WAVES: u32 = 8;

/// The cluster path, on GPUs with clusters: the fewest blocks per row whose slices fit in
/// shared memory (less what the kernel's threads hold in registers) and that the device can
/// keep resident, each block as large as the kernel allows (more loads in flight) but where
/// the passes read column data ([`column_reading_blocks`]) or a wide cluster gathers column
/// sums ([`gathering_cluster_halves`]). The fewest blocks, not slices small enough for two blocks
/// an SM: with the next-row prefetch a block already overlaps its loads with its passes, and
/// smaller slices cost the wide backwards more than they bought (docs/DECISIONS.md, "Two blocks an
/// SM on every cluster").
///
/// Clusters that gather column sums ([`Problem::gathered_bytes_per_col`]) take instead the
/// fewest blocks, each the largest, that keep more than one block an SM and give each
/// thread at least [`GATHERING_PACKS_PER_THREAD`] packs of its slice, so that one block's
/// read-modify-writes of its sums in shared memory overlap another's loads. They keep the
/// fewest blocks where none does, and where those are a cluster of two over aligned rows
/// and the sums take no more shared memory than the cached rows
/// ([`gathers_two_blocks_an_sm`]): those keep up without the overlap (docs/DECISIONS.md, "Gathering
/// clusters on two blocks an SM").
fn cluster_plan(
    problem: &Problem,
    device: &DeviceInfo,
    occupancy: ClusterOccupancy<'_>,
) -> crate::Result<Option<Plan>> {
    if !has_clusters(device) {
        return Ok(None);
    }
    let limit = cluster_block_bytes(device);
    let blocks =
        |cluster| BLOCK_SIZES.into_iter().rev().filter(move |&b| b <= problem.block_limit).map(move |b| (cluster, b));
    let plan = |cluster, block, bytes: u64, resident| {
        let path = Path::Cluster { cluster, block, shared_bytes: bytes as u32 };
        problem.block_plan(path, cluster_grid(problem, cluster, resident))
    };
    let mut fewest = None;
    for (cluster, block) in ROW_CLUSTER_SIZES.into_iter().flat_map(blocks) {
        let bytes = problem.slice_bytes(cluster, block);
        if bytes > limit {
            continue;
        }
        let resident = occupancy(cluster, block, bytes as u32)?;
        if resident > 0 {
            let largest = ClusterBlocks { cluster, block, bytes, resident };
            let half_bytes = problem.slice_bytes(cluster, block / 2);
            let ClusterBlocks { block, bytes, resident, .. } = if half_bytes > limit {
                largest
            } else if gathering_cluster_halves(problem, largest) {
                halved_blocks(occupancy, largest, half_bytes)?.filter(|h| h.resident > 0).unwrap_or(largest)
            } else {
                column_reading_blocks(problem, device, occupancy, largest, half_bytes)?
            };
            fewest = Some(plan(cluster, block, bytes, resident));
            break;
        }
    }
    if fewest.is_some_and(|fewest| gathers_two_blocks_an_sm(problem, &fewest)) {
        for (cluster, block) in ROW_CLUSTER_SIZES.into_iter().flat_map(blocks) {
            let bytes = problem.slice_bytes(cluster, block);
            if bytes > limit || problem.slice_packs(cluster) < GATHERING_PACKS_PER_THREAD * block as u64 {
                continue;
            }
            let resident = occupancy(cluster, block, bytes as u32)?;
            if resident as u64 * cluster as u64 > device.multiprocessors as u64 {
                return Ok(Some(plan(cluster, block, bytes, resident)));
            }
        }
    }
    Ok(fewest)
}

/// Whether a cluster plan whose fewest blocks give `fewest` gathers its column sums on
/// more than one block an SM instead ([`cluster_plan`]): rows run from their heads that
/// gather, and aligned ones but for clusters of two whose sums take no more shared memory
/// than the cached rows. Rows run from their heads, whose packs' terms then reached the sums
/// a word at a time, gained even on clusters of two, whose blocks (72-114 registers a
/// thread, before [`rill_kernels_gpu::table::KernelKey::register_cap`]) were of 512 at
/// most (docs/DECISIONS.md, "Gathering clusters on two blocks an SM").
fn gathers_two_blocks_an_sm(problem: &Problem, fewest: &Plan) -> bool {
    problem.spec.gathered_bytes_per_col() > 0
        && (problem.owns_parts() || fewest.cluster() > ROW_CLUSTER_SIZES[0] || !problem.sums_fit_caches())
}

/// The cluster path's grid: [`CLUSTER_WAVES`] waves of `resident` clusters of `cluster`
/// blocks, or a cluster a row where there are fewer rows.
pub(super) fn cluster_grid(problem: &Problem, cluster: u32, resident: u32) -> u32 {
    let clusters = (problem.rows as u64).min(resident as u64 * CLUSTER_WAVES as u64).max(1);
    (clusters * cluster as u64) as u32
}

/// A cluster plan's blocks: `cluster` of `block` threads, `bytes` of shared memory each,
/// `resident` clusters at once.
#[derive(Clone, Copy)]
struct ClusterBlocks {
    cluster: u32,
    block: u32,
    bytes: u64,
    resident: u32,
}

/// The cluster's blocks where the passes read per-column data
/// ([`Problem::passes_column_bytes`]): blocks of half the threads (`half_bytes` each) where
/// they keep as many threads resident, so twice the blocks share an SM and one block's
/// passes over the column data overlap another's loads, while L1 still holds the column
/// data those blocks read beside their caches; else `largest`. Where their caches leave L1 too
/// little for the column data, the halved blocks re-read it from L2 and lose; the softmax backward,
/// whose passes read no column data, has nothing to overlap and is not halved (docs/DECISIONS.md,
/// "Halved cluster blocks where the passes read column data").
fn column_reading_blocks(
    problem: &Problem,
    device: &DeviceInfo,
    occupancy: ClusterOccupancy<'_>,
    largest: ClusterBlocks,
    half_bytes: u64,
) -> crate::Result<ClusterBlocks> {
    if problem.spec.passes_column_bytes == 0 {
        return Ok(largest);
    }
    let Some(halved) = halved_blocks(occupancy, largest, half_bytes)? else {
        return Ok(largest);
    };
    let threads = |b: ClusterBlocks| b.resident as u64 * b.cluster as u64 * b.block as u64;
    let per_sm = (halved.resident as u64 * largest.cluster as u64).div_ceil(device.multiprocessors.max(1) as u64);
    let caches = per_sm * (half_bytes + (CLUSTER_STATIC_SHARED_BYTES + RESERVED_SHARED_BYTES) as u64);
    let columns = per_sm * problem.slice_cols(largest.cluster) * problem.spec.passes_column_bytes as u64;
    let l1 = (device.max_shared_bytes_per_multiprocessor as u64).saturating_sub(caches);
    Ok(if threads(halved) >= threads(largest) && columns <= l1 { halved } else { largest })
}

/// `largest`'s cluster in blocks of half the threads, `half_bytes` of shared memory each,
/// and how many such clusters stay resident; `None` where half is not a block size.
fn halved_blocks(
    occupancy: ClusterOccupancy<'_>,
    largest: ClusterBlocks,
    half_bytes: u64,
) -> crate::Result<Option<ClusterBlocks>> {
    let half = largest.block / 2;
    if !BLOCK_SIZES.contains(&half) {
        return Ok(None);
    }
    let resident = occupancy(largest.cluster, half, half_bytes as u32)?;
    Ok(Some(ClusterBlocks { block: half, bytes: half_bytes, resident, ..largest }))
}

/// Packs of its slice each thread of a gathering cluster's block takes at least, where the
/// planner splits the rows for two blocks an SM ([`cluster_plan`]).
const GATHERING_PACKS_PER_THREAD: u64 = 2;

/// Clusters of at least this many blocks that gather column sums
/// ([`Problem::gathered_bytes_per_col`]) may run blocks of [`GATHERING_CLUSTER_BLOCK`].
const GATHERING_CLUSTER_HALVES_FROM: u32 = 4;

/// The block a wide gathering cluster halves its blocks of 1024 to.
const GATHERING_CLUSTER_BLOCK: u32 = 512;

/// The most packs of its slice a thread of a halved gathering cluster takes.
const GATHERING_HALVED_PACKS: u64 = 5;

/// Whether a cluster that gathers column sums with one block an SM (where [`cluster_plan`]
/// finds none of two) takes blocks of half the largest: where it
/// has [`GATHERING_CLUSTER_HALVES_FROM`] blocks or more, the largest are of 1024 threads,
/// and a thread of the halved blocks takes at most [`GATHERING_HALVED_PACKS`] packs of its
/// slice. One block an SM either way (the slices' caches and sums fill its shared memory).
/// With more packs a thread the halved blocks' threads run out of registers for them and lose.
/// Clusters of two keep the largest: halving them gains only where it evens the threads' shares
/// (docs/DECISIONS.md, "Gathering clusters of four blocks or more: blocks of 512"; "Halving
/// gathering clusters of two where it evens the threads' shares").
fn gathering_cluster_halves(problem: &Problem, largest: ClusterBlocks) -> bool {
    problem.spec.gathered_bytes_per_col() > 0
        && largest.cluster >= GATHERING_CLUSTER_HALVES_FROM
        && largest.block == 2 * GATHERING_CLUSTER_BLOCK
        && problem.slice_packs(largest.cluster) <= GATHERING_HALVED_PACKS * GATHERING_CLUSTER_BLOCK as u64
}

/// Block sizes a row read once streams in, largest first: whole warps, down to one.
pub(super) const STREAMING_BLOCK_SIZES: [u32; 3] = [128, 64, 32];

/// Packs a thread of a streaming block takes at least, where one of
/// [`STREAMING_BLOCK_SIZES`] allows.
const STREAMING_PACKS_PER_THREAD: u64 = 4;

/// A row read once: the largest of [`STREAMING_BLOCK_SIZES`] whose threads take at least
/// [`STREAMING_PACKS_PER_THREAD`] packs each, else one warp. Each thread then has its batch
/// of loads in flight, and an SM holds as many rows as it holds blocks (16 of 128, 32 of 64
/// or 32 on the H100), one row's reductions overlapping the others' loads. Larger blocks give a
/// thread a pack or so and an SM fewer rows; smaller ones, where 128 threads already take four
/// packs each, add reductions for nothing (docs/DECISIONS.md, "Rows read once stream").
fn streaming_plan(problem: &Problem, device: &DeviceInfo) -> Plan {
    let packs = (problem.cols / problem.block_pack.max(1)) as u64;
    let block = STREAMING_BLOCK_SIZES
        .into_iter()
        .find(|&block| packs >= STREAMING_PACKS_PER_THREAD * block as u64)
        .unwrap_or(STREAMING_BLOCK_SIZES[STREAMING_BLOCK_SIZES.len() - 1]);
    problem.block_plan(Path::Uncached { block }, block_grid(problem.rows, block, device))
}

/// The largest block the uncached path takes for 16-bit rows run from their heads (packs of
/// 8 elements): their threads' packs are twice as wide, so a block of 512 already keeps the row's
/// bytes in flight and two such blocks an SM overlap their passes; f32 rows (packs of 4) need the
/// threads and keep the largest (docs/DECISIONS.md, "The uncached block for 16-bit rows run from
/// their heads").
const UNCACHED_PHASED_16_BIT_MAX_BLOCK: u32 = 512;

/// The largest block the kernel allows (more threads per row, more loads in flight), up to
/// [`UNCACHED_PHASED_16_BIT_MAX_BLOCK`] for 16-bit rows run from their heads.
fn uncached_plan(problem: &Problem, device: &DeviceInfo) -> Plan {
    let phased_16_bit = problem.block_phased() && problem.block_pack == 8;
    let most =
        if phased_16_bit { problem.block_limit.min(UNCACHED_PHASED_16_BIT_MAX_BLOCK) } else { problem.block_limit };
    uncached_plan_within(problem, most, device)
}

/// The uncached path in the largest of [`BLOCK_SIZES`] up to `most` threads (the smallest
/// where none is).
fn uncached_plan_within(problem: &Problem, most: u32, device: &DeviceInfo) -> Plan {
    let block = BLOCK_SIZES.into_iter().rev().find(|&b| b <= most).unwrap_or(BLOCK_SIZES[0]);
    problem.block_plan(Path::Uncached { block }, block_grid(problem.rows, block, device))
}

/// The ladder, as OneFlow's, from the device's limits alone: what plans a call where the
/// GPU's tuning table has no entry for it and the table says `ladder` instead of the
/// measured rules ([`plan`]). Rows of up to [`WARP_MAX_COLS`] on the warp path's narrowest
/// tier that holds them; rows read once (no cache would pay) uncached; else the shared path
/// where the row fits a block, in the largest block that keeps as many blocks an SM as 128
/// threads do; a cluster of the fewest blocks, each the largest, where it fits one;
/// uncached in the largest block where neither does.
pub(super) fn ladder_plan(problem: &Problem, device: &DeviceInfo, occupancy: Occupancies<'_>) -> crate::Result<Plan> {
    let largest_uncached = || uncached_plan_within(problem, problem.block_limit, device);
    if problem.cols <= WARP_MAX_COLS {
        return Ok(warp_tier_plan(problem, narrowest_tier(problem.cols), device));
    }
    if problem.spec.reads_once {
        return Ok(largest_uncached());
    }
    let bytes = problem.block_bytes(problem.cols as u64);
    let baseline = if fits_a_block(bytes, device) { (occupancy.shared)(BLOCK_SIZES[0], bytes as u32)? } else { 0 };
    if baseline > 0 {
        let mut block = BLOCK_SIZES[0];
        for &candidate in BLOCK_SIZES[1..].iter().filter(|&&b| b <= problem.block_limit) {
            if (occupancy.shared)(candidate, bytes as u32)? == baseline {
                block = candidate;
            }
        }
        let path = Path::Shared { block, shared_bytes: bytes as u32 };
        return Ok(problem.block_plan(path, block_grid(problem.rows, block, device)));
    }
    let blocks = BLOCK_SIZES.into_iter().rev().filter(|&b| b <= problem.block_limit);
    for (cluster, block) in ROW_CLUSTER_SIZES.into_iter().flat_map(|cluster| blocks.clone().map(move |b| (cluster, b)))
    {
        if let Some(plan) = cluster_shape_plan(problem, device, occupancy.cluster, cluster, block)? {
            return Ok(plan);
        }
    }
    Ok(largest_uncached())
}

/// The cluster path in clusters of `cluster` blocks of `block` threads, where the GPU has
/// clusters, a block's slice fits its shared memory and such clusters reside.
pub(super) fn cluster_shape_plan(
    problem: &Problem,
    device: &DeviceInfo,
    occupancy: ClusterOccupancy<'_>,
    cluster: u32,
    block: u32,
) -> crate::Result<Option<Plan>> {
    let bytes = problem.slice_bytes(cluster, block);
    if !has_clusters(device) || bytes > cluster_block_bytes(device) {
        return Ok(None);
    }
    let resident = occupancy(cluster, block, bytes as u32)?;
    if resident == 0 {
        return Ok(None);
    }
    let path = Path::Cluster { cluster, block, shared_bytes: bytes as u32 };
    Ok(Some(problem.block_plan(path, cluster_grid(problem, cluster, resident))))
}

/// Rows ahead a warp-path `plan` requests into L2 where a tuning table's entry asks for
/// them: a wave of its resident warps' rows (`resident_blocks` blocks an SM, asked only
/// here), where its kernel holds the request (a forward writing an element for each it
/// reads, on a tier and element size the kernels compile it for); else 0.
pub fn wave_ahead(
    problem: &Problem,
    plan: &Plan,
    device: &DeviceInfo,
    resident_blocks: impl FnOnce() -> crate::Result<u32>,
) -> crate::Result<u64> {
    let Path::Warp { width, elements } = plan.path else {
        return Ok(0);
    };
    let spec = &problem.spec;
    if !spec.class.writes_elements_forward()
        || !requests_rows_ahead(elements as usize, spec.cache_bytes_per_col as usize)
    {
        return Ok(0);
    }
    Ok(wave_rows(width, elements, resident_blocks()?, device))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::launch::tests::h100;

    pub(in crate::ops::rows) fn problem(rows: usize, cols: usize, pack: usize) -> Problem {
        Problem {
            rows,
            cols,
            pack,
            block_pack: pack,
            block_limit: 1024,
            spec: RowSpec::rows_of(OpClass::Softmax, 4),
            force: None,
        }
    }

    /// `problem` with its spec changed by `change`.
    pub(in crate::ops::rows) fn with(mut problem: Problem, change: impl FnOnce(&mut RowSpec)) -> Problem {
        change(&mut problem.spec);
        problem
    }

    /// Occupancy of a kernel limited by shared memory alone (228 KB per SM, 64 warps).
    fn by_shared(block: u32, bytes: u32) -> crate::Result<u32> {
        let by_threads = h100().max_threads_per_multiprocessor / block;
        let by_shared = (228 * 1024) / (bytes + 1024).max(1);
        Ok(by_threads.min(by_shared))
    }

    /// Resident clusters when every SM holds `by_shared` blocks (GPC boundaries ignored).
    fn by_cluster(cluster: u32, block: u32, bytes: u32) -> crate::Result<u32> {
        Ok(132 * by_shared(block, bytes)? / cluster)
    }

    pub(in crate::ops::rows) const OCCUPANCY: Occupancies<'static> =
        Occupancies { shared: &by_shared, cluster: &by_cluster };

    fn ampere() -> DeviceInfo {
        DeviceInfo {
            compute_capability: (8, 0),
            multiprocessors: 108,
            max_shared_bytes_per_block_optin: 163 * 1024,
            ..h100()
        }
    }

    #[test]
    fn rows_past_the_widest_get_a_typed_error_on_every_path() {
        let device = h100();
        assert_eq!(plan(&problem(1, MAX_COLS, 1), &device, OCCUPANCY).unwrap().kind(), PathKind::Uncached);
        for force in [None, Some(PathKind::Uncached), Some(PathKind::Shared), Some(PathKind::Cluster)] {
            let wide = Problem { force, ..problem(1, MAX_COLS + 1, 1) };
            let err = plan(&wide, &device, OCCUPANCY).unwrap_err().to_string();
            assert!(err.contains("at most 2147483647 columns"), "{force:?}: {err}");
        }
    }

    #[test]
    fn narrow_rows_take_the_warp_path_with_a_matching_width() {
        let device = h100();
        let p = plan(&problem(49152, 32, 8), &device, OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Warp { width: 4, elements: 8 });
        let p = plan(&problem(49152, 1, 1), &device, OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Warp { width: 1, elements: 8 });
        let p = plan(&problem(49152, 1000, 1), &device, OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Warp { width: 32, elements: 32 });
        let p = plan(&problem(49152, 300, 4), &device, OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Warp { width: 32, elements: 16 });
    }

    #[test]
    fn warp_covers_the_row_in_lane_groups_of_the_tier_it_takes() {
        let device = h100();
        for cols in [1, 2, 3, 31, 32, 33, 127, 1000, 1024] {
            let p = plan(&problem(10, cols, 1), &device, OCCUPANCY).unwrap();
            let Path::Warp { width, elements } = p.path else { panic!("{cols}: {p:?}") };
            assert!((width * elements) as usize >= cols, "{cols}: {p:?}");
            assert!(width.is_power_of_two() && width <= 32);
        }
        // 32 columns in packs: 4 lanes of 8 elements, two rows an access. 64-256 columns in
        // packs: lane groups of 16 elements (256: 16 lanes, two rows a warp); in single
        // elements, the 8-element tier. 512: one row of 16 a lane.
        let p = plan(&problem(49152, 32, 8), &device, OCCUPANCY).unwrap();
        assert_eq!((p.path, p.grid), (Path::Warp { width: 4, elements: 8 }, 49152 / 2 * 4 / 128));
        for cols in [64, 128, 200, 256] {
            let p = plan(&problem(49152, cols, 8), &device, OCCUPANCY).unwrap();
            let width = (cols as u32).div_ceil(16).next_power_of_two();
            assert_eq!((p.path, p.grid), (Path::Warp { width, elements: 16 }, 49152 * width / 128), "{cols}");
        }
        let p = plan(&problem(49152, 100, 1), &device, OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Warp { width: 16, elements: 8 });
        let p = plan(&problem(49152, 256, 4), &device, OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Warp { width: 16, elements: 16 });
        let p = plan(&problem(49152, 512, 8), &device, OCCUPANCY).unwrap();
        assert_eq!((p.path, p.grid), (Path::Warp { width: 32, elements: 16 }, 49152 * 32 / 128));
        // 768: the 24-element tier, no empty fourth pack a lane.
        let p = plan(&problem(49152, 768, 8), &device, OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Warp { width: 32, elements: 24 });
    }

    #[test]
    fn rows_read_once_in_16_bits_take_the_widest_tier_at_256_to_512_columns() {
        let device = h100();
        let once = |cols, pack| {
            with(problem(49152, cols, pack), |s| {
                s.reads_once = true;
            })
        };
        for (cols, width) in [(256, 8), (300, 16), (512, 16)] {
            let p = plan(&once(cols, 8), &device, OCCUPANCY).unwrap();
            assert_eq!((p.path, p.grid), (Path::Warp { width, elements: 32 }, 49152 * width / 128), "{cols}");
        }
        // Narrower rows, f32 packs and ops that write the row keep the narrower tiers.
        let p = plan(&once(128, 8), &device, OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Warp { width: 8, elements: 16 });
        let p = plan(&once(256, 4), &device, OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Warp { width: 16, elements: 16 });
        let p = plan(&problem(49152, 256, 8), &device, OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Warp { width: 16, elements: 16 });
    }

    #[test]
    fn a_cache_read_with_memory_streams_where_one_lone_block_would_run_16_bit_or_phased_rows() {
        let device = h100();
        let masked = |rows, cols, pack, bytes| {
            with(problem(rows, cols, pack), |s| {
                s.cache_reads_memory = true;
                s.cache_bytes_per_col = bytes;
            })
        };
        // 65536 bf16 columns: 128 KB, one block an SM.
        assert_eq!(plan(&masked(4096, 65536, 8, 2), &device, OCCUPANCY).unwrap().path, Path::Uncached { block: 1024 });
        // f32 rows of 32001 from their heads: the same.
        let phased = Problem { block_pack: 4, ..masked(4096, 32001, 1, 4) };
        let p = plan(&phased, &device, OCCUPANCY).unwrap();
        assert_eq!((p.kind(), p.phased), (PathKind::Uncached, true));
        // Aligned f32 rows of 32768, two blocks an SM or more (32768 16-bit columns), an
        // element a pack, or a cache read alone: shared.
        assert_eq!(plan(&masked(49152, 32768, 4, 4), &device, OCCUPANCY).unwrap().kind(), PathKind::Shared);
        assert_eq!(plan(&masked(49152, 32768, 8, 2), &device, OCCUPANCY).unwrap().kind(), PathKind::Shared);
        assert_eq!(plan(&masked(4096, 65536, 1, 2), &device, OCCUPANCY).unwrap().kind(), PathKind::Shared);
        let alone = with(masked(4096, 65536, 8, 2), |s| {
            s.cache_reads_memory = false;
        });
        assert_eq!(plan(&alone, &device, OCCUPANCY).unwrap().kind(), PathKind::Shared);
        // Forcing the shared path still gets it.
        let forced = Problem { force: Some(PathKind::Shared), ..masked(4096, 65536, 8, 2) };
        assert_eq!(plan(&forced, &device, OCCUPANCY).unwrap().kind(), PathKind::Shared);
    }

    #[test]
    fn phased_passes_reading_columns_split_rows_where_one_block_would_hold_an_sm() {
        let device = h100();
        // A 16-bit norm backward with a weight: x and dy cached, 4 bytes a column.
        let backward = |cols, pack, block_pack| {
            with(Problem { block_pack, ..problem(4096, cols, pack) }, |s| {
                s.cache_bytes_per_col = 4;
                s.passes_column_bytes = 2;
            })
        };
        // 32001 columns from each row's head: 128 KB, one block an SM; a cluster of two.
        let p = plan(&backward(32001, 1, 8), &device, OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Cluster { cluster: 2, block: 1024, shared_bytes: 64000 });
        assert!(p.phased);
        // Aligned rows, no per-column reads, or several blocks an SM: the shared path.
        assert_eq!(plan(&backward(32000, 8, 8), &device, OCCUPANCY).unwrap().kind(), PathKind::Shared);
        let weightless = with(backward(32001, 1, 8), |s| {
            s.passes_column_bytes = 0;
        });
        assert_eq!(plan(&weightless, &device, OCCUPANCY).unwrap().kind(), PathKind::Shared);
        assert_eq!(plan(&backward(8001, 1, 8), &device, OCCUPANCY).unwrap().kind(), PathKind::Shared);
    }

    #[test]
    fn aligned_passes_reading_columns_split_rows_where_each_sm_moves_more_bytes() {
        let h200 = DeviceInfo { dram_bytes_per_second: 4_800_000_000_000, ..h100() };
        let backward = |cols| {
            with(problem(4096, cols, 8), |s| {
                s.cache_bytes_per_col = 4;
                s.passes_column_bytes = 2;
            })
        };
        // Aligned 16-bit rows of 32768: 128 KB, one block an SM. A cluster on the H200, the
        // shared path on the H100 and where the driver reports no DRAM bandwidth.
        assert_eq!(plan(&backward(32768), &h200, OCCUPANCY).unwrap().kind(), PathKind::Cluster);
        assert_eq!(plan(&backward(32768), &h100(), OCCUPANCY).unwrap().kind(), PathKind::Shared);
        let unreported = DeviceInfo { dram_bytes_per_second: 0, ..h100() };
        assert_eq!(plan(&backward(32768), &unreported, OCCUPANCY).unwrap().kind(), PathKind::Shared);
        // Two blocks an SM, no per-column reads, or gathered column sums: as on the H100.
        assert_eq!(plan(&backward(24576), &h200, OCCUPANCY).unwrap().kind(), PathKind::Shared);
        let weightless = with(backward(32768), |s| {
            s.passes_column_bytes = 0;
        });
        assert_eq!(plan(&weightless, &h200, OCCUPANCY).unwrap().kind(), PathKind::Shared);
        // 16384 columns and their sums: 128 KB, one block an SM.
        let gathering = with(backward(16384), |s| {
            s.column_sums = 1;
        });
        assert_eq!(plan(&gathering, &h200, OCCUPANCY).unwrap().kind(), PathKind::Shared);
    }

    #[test]
    fn sixteen_bit_norm_backward_rows_reshape_their_blocks_where_each_sm_moves_more_bytes() {
        let h200 = DeviceInfo { dram_bytes_per_second: 4_800_000_000_000, ..h100() };
        // bf16 x and dy cached, a bf16 weight read in the passes.
        let backward = |cols| {
            with(problem(49152, cols, 8), |s| {
                *s = RowSpec {
                    cache_bytes_per_col: 4,
                    passes_column_bytes: 2,
                    ..RowSpec::rows_of(OpClass::NormBackward, 2)
                };
            })
        };
        let f32_rows = |s: &mut RowSpec| (s.element_bytes, s.cache_bytes_per_col) = (4, 8);
        for cols in [2048, 4096] {
            let capped = plan(&backward(cols), &h200, OCCUPANCY).unwrap();
            assert_eq!(capped.kind(), PathKind::Shared);
            assert_eq!(capped.block(), 128);
            assert_eq!(by_shared(128, capped.shared_bytes()).unwrap(), FEWER_BLOCKS_RESIDENT, "{cols}");
            // The padding is the least that gets there, in the driver's allocation steps.
            assert!(by_shared(128, capped.shared_bytes() - SHARED_ALLOCATION_BYTES).unwrap() <= 11);
            let planned = plan(&backward(cols), &h100(), OCCUPANCY).unwrap();
            assert_eq!(planned.shared_bytes(), cols as u32 * 4, "{cols}");
            assert_eq!(Plan { path: planned.path, ..capped }, planned);
        }
        // Up to 1024 columns: blocks of two warps, no padding.
        for cols in [768, 1024] {
            let small = plan(&backward(cols), &h200, OCCUPANCY).unwrap();
            assert_eq!((small.kind(), small.block(), small.shared_bytes()), (PathKind::Shared, 64, cols as u32 * 4));
            assert_eq!(plan(&backward(cols), &h100(), OCCUPANCY).unwrap().block(), 128);
        }
        // Other widths, f32, gathered sums, no weight: as on the H100.
        let unchanged = [
            backward(8192),
            with(backward(1024), f32_rows),
            with(backward(4096), f32_rows),
            with(backward(1024), |s| {
                (s.class, s.column_sums) = (OpClass::NormBackwardParams, 2);
            }),
            with(backward(4096), |s| {
                (s.class, s.column_sums) = (OpClass::NormBackwardParams, 2);
            }),
            with(backward(4096), |s| {
                s.passes_column_bytes = 0;
            }),
        ];
        for problem in unchanged {
            assert_eq!(
                plan(&problem, &h200, OCCUPANCY).unwrap(),
                plan(&problem, &h100(), OCCUPANCY).unwrap(),
                "{problem:?}"
            );
        }
    }

    #[test]
    fn the_widest_warp_tier_requests_a_wave_ahead_where_its_warps_are_few_and_the_wave_small() {
        let h200 = DeviceInfo { dram_bytes_per_second: 4_800_000_000_000, ..h100() };
        let planned = |cols, cache_bytes_per_col| {
            let problem = with(problem(49152, cols, 8), |s| {
                s.cache_bytes_per_col = cache_bytes_per_col;
            });
            (problem, plan(&problem, &h200, OCCUPANCY).unwrap())
        };
        let not_asked = || -> crate::Result<u32> { unreachable!("occupancy asked") };
        // 16-bit rows of 1024 columns, 5 blocks of 128 an SM (92-96 registers): a wave of the
        // 20 warps an SM's rows, 5.4 MB, an eighth of L2 or less.
        let (bf16, warp32) = planned(1024, 2);
        assert_eq!(warp32.path, Path::Warp { width: 32, elements: 32 });
        assert_eq!(rows_ahead(&bf16, &warp32, &h200, || Ok(5)).unwrap(), 5 * 4 * 132);
        // More warps an SM hide the DRAM themselves (cross entropy's 62 registers: 8 blocks).
        assert_eq!(rows_ahead(&bf16, &warp32, &h200, || Ok(6)).unwrap(), 0);
        // The narrower tiers, the block paths, f32 rows, rows read once (no element outputs:
        // their kernels hold no request) and the H100 request none, asking nothing.
        let (narrow, warp16) = planned(256, 2);
        assert_eq!(warp16.path, Path::Warp { width: 16, elements: 16 });
        let (wide, shared) = planned(4096, 2);
        assert_eq!(shared.kind(), PathKind::Shared);
        let (f32_rows, f32_warp32) = planned(1024, 4);
        assert_eq!(f32_warp32.path, warp32.path);
        let once = with(bf16, |s| {
            (s.class, s.reads_once) = (OpClass::RowStatistics, true);
        });
        let cases = [
            (narrow, warp16, &h200),
            (wide, shared, &h200),
            (f32_rows, f32_warp32, &h200),
            (once, warp32, &h200),
            (bf16, warp32, &h100()),
        ];
        for (problem, plan, device) in cases {
            assert_eq!(rows_ahead(&problem, &plan, device, not_asked).unwrap(), 0, "{plan:?}");
        }
    }

    #[test]
    fn wide_rows_take_shared_memory_then_clusters_then_uncached() {
        let device = h100();
        let p = plan(&problem(4096, 4096, 4), &device, OCCUPANCY).unwrap();
        assert_eq!(p.kind(), PathKind::Shared);
        assert_eq!(p.shared_bytes(), 4096 * 4);
        // 131072 f32 = 512 KB: more than any block may have; four blocks hold 128 KB each.
        let p = plan(&problem(4096, 131072, 4), &device, OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Cluster { cluster: 4, block: 1024, shared_bytes: 131072 });
        assert_eq!(p.grid % 4, 0);
        // Backward caches y and dy: twice the bytes; 256 KB rows in two blocks.
        let mut backward = problem(4096, 32768, 4);
        backward.spec.cache_bytes_per_col = 8;
        assert_eq!(
            plan(&backward, &device, OCCUPANCY).unwrap().path,
            Path::Cluster { cluster: 2, block: 1024, shared_bytes: 131072 }
        );
        // 1 MB rows: eight blocks of 128 KB; 2 MB (a backward's two arrays): sixteen, past
        // the portable size. Eight waves of the resident clusters (132 / 16 in this model).
        let p = plan(&problem(4096, 262144, 4), &device, OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Cluster { cluster: 8, block: 1024, shared_bytes: 131072 });
        let mut backward = problem(4096, 262144, 4);
        backward.spec.cache_bytes_per_col = 8;
        let p = plan(&backward, &device, OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Cluster { cluster: 16, block: 1024, shared_bytes: 131072 });
        assert_eq!(p.grid, 132 / 16 * CLUSTER_WAVES * 16);
        // Past sixteen blocks' shared memory, and on GPUs without clusters: uncached.
        assert_eq!(plan(&problem(64, 1 << 20, 4), &device, OCCUPANCY).unwrap().kind(), PathKind::Uncached);
        assert_eq!(plan(&problem(4096, 131072, 4), &ampere(), OCCUPANCY).unwrap().kind(), PathKind::Uncached);
    }

    #[test]
    fn rows_read_once_stream_past_the_warp_path_in_small_blocks() {
        let mut once = problem(49152, 1024, 8);
        once.spec.reads_once = true;
        assert_eq!(plan(&once, &h100(), OCCUPANCY).unwrap().kind(), PathKind::Warp);
        // A thread takes four packs or more where a block of one warp or more allows.
        for (cols, pack, block) in [(1152, 8, 32), (1536, 8, 32), (2048, 8, 64), (3072, 8, 64), (4096, 8, 128)]
            .into_iter()
            .chain([(1152, 4, 64), (1536, 4, 64), (2048, 4, 128), (262144, 8, 128)])
        {
            (once.cols, once.pack, once.block_pack) = (cols, pack, pack);
            assert_eq!(plan(&once, &h100(), OCCUPANCY).unwrap().path, Path::Uncached { block }, "{cols} x pack {pack}");
        }
        // Forcing a path still takes it.
        once.force = Some(PathKind::Cluster);
        assert_eq!(plan(&once, &h100(), OCCUPANCY).unwrap().kind(), PathKind::Cluster);
    }

    #[test]
    fn packs_held_in_registers_let_fewer_blocks_hold_a_row() {
        // The f32 backward at 262144 columns: 2 MB a row, 256 KB a block of eight; a pack of
        // y and of dy in each of 1024 threads' registers leaves 224 KB for shared memory.
        let mut backward = problem(4096, 262144, 4);
        backward.spec.cache_bytes_per_col = 8;
        backward.spec.cluster_held_packs = 1;
        let p = plan(&backward, &h100(), OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Cluster { cluster: 8, block: 1024, shared_bytes: (8192 - 1024) * 4 * 8 });
        // Blocks of 512 hold half as much: sixteen blocks again, 128 KB less 64 KB held.
        backward.block_limit = 512;
        let p = plan(&backward, &h100(), OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Cluster { cluster: 16, block: 512, shared_bytes: (4096 - 512) * 4 * 8 });
        // A slice no larger than what the threads hold needs no shared memory.
        let mut narrow = problem(8, 4096, 4);
        narrow.spec.cluster_held_packs = 1;
        narrow.force = Some(PathKind::Cluster);
        let p = plan(&narrow, &h100(), OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Cluster { cluster: 2, block: 1024, shared_bytes: 0 });
        // Gathered column sums stay in shared memory: the slice's 2048 columns of one f32
        // sum beside what its held packs leave of the cache.
        narrow.spec.column_sums = 1;
        let p = plan(&narrow, &h100(), OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Cluster { cluster: 2, block: 1024, shared_bytes: 2048 * 4 });
    }

    #[test]
    fn clusters_are_forced_on_any_width_and_refused_without_them() {
        let mut narrow = problem(8, 33, 1);
        narrow.force = Some(PathKind::Cluster);
        let p = plan(&narrow, &h100(), OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Cluster { cluster: 2, block: 1024, shared_bytes: 17 * 4 });
        assert_eq!(p.grid, 16);
        assert_eq!(p.cluster(), 2);
        assert_eq!(plan(&problem(8, 4096, 4), &h100(), OCCUPANCY).unwrap().cluster(), 1);
        assert!(plan(&narrow, &ampere(), OCCUPANCY).is_err());
    }

    #[test]
    fn shared_block_is_the_largest_that_keeps_occupancy() {
        let device = h100();
        // 16 KB rows: 128 threads give min(16, 13) = 13 blocks; 256 give min(8, 13) = 8.
        let p = plan(&problem(4096, 4096, 4), &device, OCCUPANCY).unwrap();
        assert_eq!(p.block(), 128);
        // 128 KB rows: one block per SM at any size: take 1024 threads.
        let p = plan(&problem(4096, 32768, 4), &device, OCCUPANCY).unwrap();
        assert_eq!(p.block(), 1024);
    }

    /// Occupancy of a kernel of `registers` a thread (65536 an SM, allocated by the warp),
    /// limited by shared memory as [`by_shared`].
    fn by_registers(registers: u32) -> impl Fn(u32, u32) -> crate::Result<u32> {
        move |block, bytes| Ok(by_shared(block, bytes)?.min(65536 / (block * registers)))
    }

    /// Resident clusters of a kernel of `registers` a thread, every SM holding
    /// [`by_registers`] blocks (GPC boundaries ignored).
    fn clusters_by_registers(registers: u32) -> impl Fn(u32, u32, u32) -> crate::Result<u32> {
        move |cluster, block, bytes| Ok(132 * by_registers(registers)(block, bytes)? / cluster)
    }

    #[test]
    fn blocks_of_384_keep_three_64_kb_rows_of_a_kernel_of_56_registers() {
        let device = h100();
        let shared = by_registers(56);
        let occupancy = Occupancies { shared: &shared, cluster: &by_cluster };
        // 16-bit rows of 32001 columns from their heads: 3 blocks an SM by shared memory;
        // 3 of 384 threads fit 56 registers (64512 of 65536), 3 of 512 would not.
        let phased = with(Problem { block_pack: 8, ..problem(4096, 32001, 1) }, |s| {
            s.cache_bytes_per_col = 2;
        });
        assert_eq!(plan(&phased, &device, occupancy).unwrap().block(), 384);
        // With 40 registers 3 blocks of 512 fit, and the largest is taken.
        let shared = by_registers(40);
        let occupancy = Occupancies { shared: &shared, cluster: &by_cluster };
        assert_eq!(plan(&phased, &device, occupancy).unwrap().block(), 512);
    }

    #[test]
    fn cluster_blocks_reading_columns_halve_while_l1_holds_what_they_read() {
        let device = h100();
        // A kernel of 64 registers: one block of 1024 an SM, two of 512.
        let (by_blocks, cluster) = (by_registers(64), clusters_by_registers(64));
        let occupancy = Occupancies { shared: &by_blocks, cluster: &cluster };
        let backward = |cols, column_bytes| {
            with(Problem { block_pack: 8, ..problem(4096, cols, 1) }, |s| {
                s.cache_bytes_per_col = 4;
                s.passes_column_bytes = column_bytes;
            })
        };
        // 32001 16-bit columns: two 64 KB slices an SM leave ~100 KB of L1 for 64 KB of weight.
        let p = plan(&backward(32001, 2), &device, occupancy).unwrap();
        assert_eq!(p.path, Path::Cluster { cluster: 2, block: 512, shared_bytes: 64000 });
        // 50257: two 100 KB slices leave ~30 KB for 100 KB of weight; an f32 weight at 32001
        // reads 128 KB. One block of 1024 an SM.
        let p = plan(&backward(50257, 2), &device, occupancy).unwrap();
        assert_eq!(p.path, Path::Cluster { cluster: 2, block: 1024, shared_bytes: 100512 });
        assert_eq!(plan(&backward(32001, 4), &device, occupancy).unwrap().block(), 1024);
        // Passes that read no column data keep the largest block.
        let softmax = Problem { force: Some(PathKind::Cluster), ..backward(32001, 0) };
        assert_eq!(plan(&softmax, &device, occupancy).unwrap().block(), 1024);
    }

    #[test]
    fn the_gathering_shared_path_stages_aligned_rows_where_two_caches_keep_its_blocks_an_sm() {
        let device = h100();
        // The norm backward with its parameter gradients: x and dy cached (`bytes` a
        // column), `sums` f32 sums (LayerNorm two, RMSNorm one).
        let gathering = |cols, bytes, sums| {
            with(problem(49152, cols, 8), |s| {
                s.cache_bytes_per_col = bytes;
                s.column_sums = sums;
                s.passes_column_bytes = 2;
                s.class = OpClass::NormBackwardParams;
            })
        };
        // Occupancy by shared memory, or (where less) by registers of 48 a thread.
        let by_both = |block: u32, bytes: u32| Ok(by_shared(block, bytes)?.min(65536 / (48 * block)));
        let planned =
            |problem: Problem| plan(&problem, &device, Occupancies { shared: &by_both, ..OCCUPANCY }).unwrap();
        let slab = |cols: usize, sums| column_gather_bytes(1, sums, column_gather_stride(cols as u64)) as u32;
        // Registers keep 10 blocks of 128 an SM at 1024 columns, and one block an SM is all
        // that fits RMSNorm's 16-bit rows at 16384 or f32 LayerNorm's at 8192: two caches.
        for (cols, bytes, sums) in [(1024, 4, 2), (1024, 8, 1), (16384, 4, 1), (8192, 8, 2)] {
            let p = planned(gathering(cols, bytes, sums));
            assert_eq!((p.kind(), p.stages), (PathKind::Shared, ROW_CACHE_STAGES), "{cols}");
            assert_eq!(p.shared_bytes(), slab(cols, sums) + ROW_CACHE_STAGES * bytes * cols as u32, "{cols}");
            assert!(p.describe().contains("rows staged in 2 caches"), "{}", p.describe());
        }
        // Two caches would cost blocks an SM (16-bit LayerNorm at 4096: four of 48 KB, three
        // of 64), or not fit beside the sums (at 16384): one.
        for cols in [4096, 8192, 16384] {
            let p = planned(gathering(cols, 4, 2));
            assert_eq!((p.kind(), p.stages, p.shared_bytes()), (PathKind::Shared, 1, slab(cols, 2) + 4 * cols as u32));
        }
        // Nothing gathered, or rows run from their heads: one cache.
        assert_eq!(planned(gathering(1024, 4, 0)).stages, 1);
        let phased = planned(Problem { pack: 1, ..gathering(1024, 4, 2) });
        assert_eq!((phased.kind(), phased.stages), (PathKind::Shared, 1));
    }

    #[test]
    fn gathering_clusters_take_two_blocks_an_sm_where_threads_keep_two_packs() {
        let device = h100();
        // A gathering kernel of 64 registers: one block of 1024 an SM, two of 512.
        let (by_blocks, cluster) = (by_registers(64), clusters_by_registers(64));
        let occupancy = Occupancies { shared: &by_blocks, cluster: &cluster };
        // LayerNorm's backward with its parameter gradients: x and dy cached, two f32 sums,
        // weight read in the passes.
        let gathering = |rows, cols, cache_bytes_per_col, pack| {
            with(problem(rows, cols, pack), |s| {
                s.cache_bytes_per_col = cache_bytes_per_col;
                s.column_sums = 2;
                s.passes_column_bytes = 4;
            })
        };
        let cluster_of = |problem: Problem| match plan(&problem, &device, occupancy).unwrap().path {
            Path::Cluster { cluster, block, .. } => (cluster, block),
            path => panic!("{}: {path:?}", problem.cols),
        };
        // f32 (16 bytes a column): the fewest blocks of slices of 64-96 KB, two an SM, in
        // blocks of 512 (two packs a thread or more) ...
        for (rows, cols, cluster) in [(49152, 32768, 8), (4096, 40960, 8), (4096, 49152, 8), (4096, 65536, 16)] {
            assert_eq!(cluster_of(gathering(rows, cols, 8, 4)), (cluster, 512), "{cols}");
        }
        // ... but where two blocks hold a row and the sums take no more shared memory than
        // the cached rows, those two.
        assert_eq!(cluster_of(gathering(49152, 16384, 8, 4)).0, 2);
        let rms = with(gathering(49152, 32768, 8, 4), |s| {
            s.column_sums = 1;
        });
        assert_eq!(cluster_of(rms), (2, 1024));
        assert_eq!(cluster_of(Problem { cols: 40960, ..rms }), (8, 512));
        // bf16 (12 bytes a column): at 24576 a block of 512 would leave threads 1.5 packs
        // of its 768; 384 gives each two.
        assert_eq!(cluster_of(gathering(49152, 32768, 4, 8)), (4, 512));
        assert_eq!(cluster_of(gathering(49152, 24576, 4, 8)), (4, 384));
        // The same rows without the sums keep the largest blocks, the fewest that hold them.
        let plain = with(gathering(49152, 32768, 8, 4), |s| {
            s.column_sums = 0;
            s.cache_bytes_per_col = 16;
        });
        assert_eq!(cluster_of(plain), (4, 1024));
    }

    #[test]
    fn owned_parts_hold_every_pack_of_rows_run_from_their_heads_only_for_a_column_array() {
        // 16-bit rows of 65536 columns whose arrays start on 16 bytes, run from their heads
        // because the f32 weight does not: every pack of a block's part is aligned, and the
        // block caches each of them beside its sums.
        let device = h100();
        let phased = with(Problem { block_pack: 8, force: Some(PathKind::Cluster), ..problem(5, 65536, 1) }, |s| {
            s.cache_bytes_per_col = 4;
            s.column_sums = 1;
            s.passes_column_bytes = 4;
        });
        let Path::Cluster { cluster, shared_bytes, .. } = plan(&phased, &device, OCCUPANCY).unwrap().path else {
            panic!("not a cluster plan");
        };
        let part = cluster_part_cols(65536, 8, cluster);
        let needed = part * 4 + column_gather_bytes(1, 1, column_gather_stride(part));
        assert!(shared_bytes as u64 >= needed, "{shared_bytes} B for {needed} B");
        // Where the width is not a multiple of the pack no row is aligned: the packs after
        // the longest head, no more.
        let odd = Problem { cols: 65537, ..phased };
        assert_eq!(odd.slice_packs(4), part_packs(cluster_part_cols(65537, 8, 4), 8, false));
        assert_eq!(phased.slice_packs(4), 65536 / 8 / 4);
    }

    #[test]
    fn gathering_clusters_over_rows_run_from_their_heads_take_two_blocks_an_sm_clusters_of_two_too() {
        let device = h100();
        // A kernel of 72 registers, as the f32 gathering kernel of phased rows took before
        // its register cap: one block of 512 an SM, two of 384.
        let (by_blocks, cluster) = (by_registers(72), clusters_by_registers(72));
        let occupancy = Occupancies { shared: &by_blocks, cluster: &cluster };
        let phased = |cols, sums: u32| {
            with(Problem { block_pack: 4, ..problem(4096, cols, 1) }, |s| {
                s.cache_bytes_per_col = 8;
                s.column_sums = sums;
                s.passes_column_bytes = 4;
            })
        };
        let cluster_of = |problem: Problem| match plan(&problem, &device, occupancy).unwrap().path {
            Path::Cluster { cluster, block, .. } => (cluster, block),
            path => panic!("{}: {path:?}", problem.cols),
        };
        // RMSNorm (one sum): the fewest blocks were two of 512 at 12345 and 32001 columns,
        // and their sums fit the caches; rows run from their heads still take two an SM.
        assert_eq!(cluster_of(phased(12345, 1)), (2, 384));
        assert_eq!(cluster_of(phased(32001, 1)), (4, 384));
        // LayerNorm (two sums): four blocks of 512 at 32001 and 50257, now eight of 384.
        assert_eq!(cluster_of(phased(32001, 2)), (8, 384));
        assert_eq!(cluster_of(phased(50257, 2)), (8, 384));
    }

    #[test]
    fn gathering_clusters_of_four_blocks_or_more_that_keep_one_block_an_sm_take_blocks_of_512() {
        let device = h100();
        // f32 LayerNorm's backward with its parameter gradients (16 bytes a column) where
        // even sixteen blocks' slices keep one block an SM.
        let gathering = |cols| {
            with(problem(4096, cols, 4), |s| {
                s.cache_bytes_per_col = 8;
                s.column_sums = 2;
                s.passes_column_bytes = 4;
            })
        };
        let cluster_of = |cols| match plan(&gathering(cols), &device, OCCUPANCY).unwrap().path {
            Path::Cluster { cluster, block, .. } => (cluster, block),
            path => panic!("{cols}: {path:?}"),
        };
        // 8192 columns a block at 131072 (128 KB, 4 packs a thread of 512), 10240 at 163840
        // (5 packs): halved; 12288 at 196608 (6 packs): not.
        assert_eq!(cluster_of(131072), (16, 512));
        assert_eq!(cluster_of(163840), (16, 512));
        assert_eq!(cluster_of(196608), (16, 1024));
    }

    #[test]
    fn a_transformed_cache_keeps_the_most_threads_resident() {
        let device = h100();
        // An int8 row of 32000 columns: 7 blocks by shared memory. Rows first: 7 of 256
        // (1792 threads); threads first: 4 of 512 (2048), before 2 of 1024 (a tie).
        let int8 = |transformed| {
            with(problem(4096, 32000, 8), |s| {
                s.cache_bytes_per_col = 1;
                s.cache_transformed = transformed;
            })
        };
        assert_eq!(plan(&int8(false), &device, OCCUPANCY).unwrap().block(), 256);
        assert_eq!(plan(&int8(true), &device, OCCUPANCY).unwrap().block(), 512);
        // 4096 columns: 16 blocks of 128 already hold 2048 threads, and win the tie.
        let narrow = with(problem(4096, 4096, 8), |s| {
            s.cache_bytes_per_col = 1;
            s.cache_transformed = true;
        });
        assert_eq!(plan(&narrow, &device, OCCUPANCY).unwrap().block(), 128);
    }

    #[test]
    fn columns_are_gathered_where_the_rows_and_their_sums_fit() {
        // The norm backward gathering `sums` column sums beside `cache_bytes_per_col`.
        let gathering = |cache_bytes_per_col, sums| RowSpec {
            cache_bytes_per_col,
            column_sums: sums,
            ..RowSpec::rows_of(OpClass::NormBackwardParams, 2)
        };
        let (h100, without_clusters) = (h100(), DeviceInfo { compute_capability: (8, 0), ..h100() });
        let at = |device, cols, cache_bytes_per_col, sums| {
            gathers_columns(&gathering(cache_bytes_per_col, sums), cols, false, device)
        };
        // bf16 x and dy cached (4 bytes a column) beside LayerNorm's two f32 sums (8 more):
        // 16384 columns take 192 KB of the 227 a block may have, 32768 twice that.
        for device in [&h100, &without_clusters] {
            for cols in [1, 256, 512, 1024, 4096, 16384] {
                assert!(at(device, cols, 4, 2), "{cols}");
            }
            // f32 rows of RMSNorm: 8 bytes cached and one sum.
            assert!(at(device, 16384, 8, 1));
        }
        assert!(!at(&without_clusters, 32768, 8, 2));
        assert!(!at(&without_clusters, 20000, 8, 1));
        // With clusters, each block holds its slice's where the sums take no more shared
        // memory than the cached rows: up to 16 blocks of 227 KB, 230K columns of f32
        // LayerNorm (16 bytes a column), 450K of 16-bit RMSNorm (8 bytes).
        for (cols, cache_bytes_per_col, sums) in [(32768, 4, 1), (32768, 8, 2), (20000, 8, 1), (230_000, 8, 2)] {
            assert!(at(&h100, cols, cache_bytes_per_col, sums), "{cols}");
        }
        assert!(at(&h100, 450_000, 4, 1));
        assert!(!at(&h100, 240_000, 8, 2));
        assert!(!at(&h100, 470_000, 4, 1));
        // 16-bit LayerNorm: two sums, 8 bytes, beside 4 cached, where sixteen blocks' slices
        // fit two blocks an SM: up to 150K columns.
        assert!(at(&h100, 32768, 4, 2) && at(&h100, 150_000, 4, 2));
        assert!(!at(&h100, 160_000, 4, 2));
        // Rows run from their heads gather only where the sums take no more shared memory
        // than the cached rows, in one block too: not 16-bit LayerNorm's.
        let phased =
            |cols, cache_bytes_per_col, sums| gathers_columns(&gathering(cache_bytes_per_col, sums), cols, true, &h100);
        assert!(at(&h100, 4097, 4, 2) && !phased(4097, 4, 2));
        for (cols, cache_bytes_per_col, sums) in [(4097, 4, 1), (4097, 8, 2), (50257, 4, 1), (50257, 8, 2)] {
            assert!(phased(cols, cache_bytes_per_col, sums), "{cols}");
        }
    }

    #[test]
    fn block_sizes_respect_the_kernel_limit() {
        let device = h100();
        let mut limited = problem(4096, 1 << 20, 4);
        limited.block_limit = 768;
        assert_eq!(plan(&limited, &device, OCCUPANCY).unwrap().path, Path::Uncached { block: 512 });
        let mut limited = problem(4096, 131072, 4);
        limited.block_limit = 768;
        assert_eq!(plan(&limited, &device, OCCUPANCY).unwrap().block(), 512);
        let mut limited = problem(4096, 32768, 4);
        limited.block_limit = 512;
        assert_eq!(plan(&limited, &device, OCCUPANCY).unwrap().block(), 512);
    }

    #[test]
    fn a_lower_warp_limit_sends_wider_rows_to_the_block_paths() {
        let device = h100();
        let mut p = problem(49152, 1024, 4);
        p.spec.class = OpClass::NormBackward;
        assert_eq!(plan(&p, &device, OCCUPANCY).unwrap().kind(), PathKind::Shared);
        p.cols = 512;
        assert_eq!(plan(&p, &device, OCCUPANCY).unwrap().kind(), PathKind::Warp);
        p.cols = 1024;
        p.force = Some(PathKind::Warp);
        assert_eq!(plan(&p, &device, OCCUPANCY).unwrap().kind(), PathKind::Warp);
    }

    #[test]
    fn rows_sharing_a_phase_take_the_block_paths_in_aligned_packs() {
        let device = h100();
        // 50257 f16 columns: no row but the first may start aligned, yet all the arrays
        // share one offset from 16 bytes, so the block paths run packs of 8.
        let mut odd = problem(4096, 50257, 1);
        odd.block_pack = 8;
        odd.spec.cache_bytes_per_col = 2;
        let p = plan(&odd, &device, OCCUPANCY).unwrap();
        assert_eq!((p.kind(), p.pack, p.phased), (PathKind::Shared, 8, true));
        assert_eq!(p.row_path(), RowPath::SharedPhased);
        odd.force = Some(PathKind::Uncached);
        let p = plan(&odd, &device, OCCUPANCY).unwrap();
        assert_eq!((p.pack, p.row_path(), p.block()), (8, RowPath::UncachedPhased, UNCACHED_PHASED_16_BIT_MAX_BLOCK));
        // f32 rows from their heads (packs of 4) keep the largest block.
        let f32_rows = with(Problem { block_pack: 4, ..odd }, |s| {
            s.cache_bytes_per_col = 4;
        });
        assert_eq!(plan(&f32_rows, &device, OCCUPANCY).unwrap().block(), 1024);
        odd.force = Some(PathKind::Cluster);
        let p = plan(&odd, &device, OCCUPANCY).unwrap();
        assert_eq!((p.pack, p.row_path()), (8, RowPath::ClusterPhased));
        // The warp path keeps the pack every row allows.
        odd.cols = 1000;
        odd.force = None;
        let p = plan(&odd, &device, OCCUPANCY).unwrap();
        assert_eq!((p.kind(), p.pack, p.phased), (PathKind::Warp, 1, false));
        // Aligned rows run the aligned kernels.
        let p = plan(&problem(4096, 4096, 8), &device, OCCUPANCY).unwrap();
        assert_eq!((p.pack, p.phased, p.row_path()), (8, false, RowPath::Shared));
    }

    #[test]
    fn every_path_is_listed_once_in_order() {
        for (i, kind) in PathKind::ALL.into_iter().enumerate() {
            // Exhaustive: a new path fails to compile here until `ALL` lists it.
            let index = match kind {
                PathKind::Warp => 0,
                PathKind::Shared => 1,
                PathKind::Uncached => 2,
                PathKind::Cluster => 3,
            };
            assert_eq!(index, i, "{kind:?}");
        }
    }

    #[test]
    fn forcing_a_path_is_honoured_or_refused() {
        let device = h100();
        let mut forced = problem(8, 64, 4);
        forced.force = Some(PathKind::Uncached);
        assert_eq!(plan(&forced, &device, OCCUPANCY).unwrap().kind(), PathKind::Uncached);
        forced.force = Some(PathKind::Shared);
        assert_eq!(plan(&forced, &device, OCCUPANCY).unwrap().kind(), PathKind::Shared);
        let mut too_wide = problem(8, 2048, 4);
        too_wide.force = Some(PathKind::Warp);
        assert!(plan(&too_wide, &device, OCCUPANCY).is_err());
    }
}
