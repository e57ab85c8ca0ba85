//! Which implementation of a row-wise op (softmax, the norms) runs for a shape: a pure
//! function of the shape, dtype, alignment and device limits, so every decision is unit-tested on the CPU.
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
    CLUSTER_STATIC_SHARED_BYTES, MAX_CLUSTER_BLOCKS, PACK_BYTES, ROW_CLUSTER_SIZES, ROW_STATIC_SHARED_BYTES,
    ROW_WARP_BLOCK_SIZE, WARP_SIZE,
};
use rill_kernels_gpu::layout::{
    cluster_part_cols, column_gather_bytes, column_gather_stride, part_packs, rows_per_access,
};
use rill_kernels_gpu::table::{RowPath, requests_rows_ahead};

use super::spec::RowSpec;

/// Widest row of any path: the block paths count a thread's packs in 32 bits (one
/// instruction a step instead of a pair), and a count below 2^31 cannot wrap as it steps.
pub const MAX_COLS: usize = i32::MAX as usize;

/// Widest row the warp path takes: 32 lanes of the largest register tier.
pub const WARP_MAX_COLS: usize = 32 * RowPath::Warp32.warp_elements();

/// Block sizes the block paths choose among. 384 lets a kernel of 41-56 registers keep three 64 KB
/// blocks an SM at 12 warps each, where blocks of 512 would keep two; 768 is left out, as it lost
/// where it would have been chosen (docs/DECISIONS.md, "Block sizes").
pub const BLOCK_SIZES: [u32; 5] = [128, 256, 384, 512, 1024];

/// The shared path's smallest block, two warps, beside [`BLOCK_SIZES`]: twice the rows in
/// flight an SM of blocks of 128, where a thread still takes two packs of a row of 1024
/// columns (docs/DECISIONS.md, "Fewer blocks an SM and blocks of 64 for the 16-bit norm backward on
/// fast DRAM").
pub const SMALL_BLOCK: u32 = 64;

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
    /// [`ROW_CACHE_STAGES`](rill_kernels_gpu::abi::ROW_CACHE_STAGES) for a shared-path backward that gathers column sums from aligned
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

    /// Whether the shared-path kernel may stage rows in [`ROW_CACHE_STAGES`](rill_kernels_gpu::abi::ROW_CACHE_STAGES) caches: a
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

/// The rows of more than [`MAX_COLS`] columns no path takes: an `Unsupported` error saying
/// so, else `Ok`.
pub(super) fn check_width(problem: &Problem) -> crate::Result<()> {
    if problem.cols > MAX_COLS {
        return Err(Unsupported(format!(
            "rows of at most {MAX_COLS} columns are supported, not {}: split the row, or view it as several",
            problem.cols
        )));
    }
    Ok(())
}

/// The ladder's plan on the path `problem.force` names, or an `Unsupported` error saying
/// why the call cannot take it.
pub(super) fn forced_plan(
    problem: &Problem,
    path: PathKind,
    device: &DeviceInfo,
    occupancy: Occupancies<'_>,
) -> crate::Result<Plan> {
    match path {
        PathKind::Warp if problem.cols > WARP_MAX_COLS => Err(Unsupported(format!(
            "the warp path takes rows of at most {WARP_MAX_COLS} columns, not {}",
            problem.cols
        ))),
        PathKind::Warp => Ok(warp_plan(problem, device)),
        PathKind::Uncached => Ok(uncached_plan(problem, device)),
        PathKind::Shared => shared_plan(problem, device, occupancy.shared)?.ok_or_else(|| {
            Unsupported(format!("a row of {} columns does not fit in this device's shared memory", problem.cols))
        }),
        PathKind::Cluster => cluster_plan(problem, device, occupancy.cluster)?.ok_or_else(|| {
            Unsupported(format!(
                "no cluster of up to {} blocks holds a row of {} columns on this device (clusters need sm_90)",
                ROW_CLUSTER_SIZES[ROW_CLUSTER_SIZES.len() - 1],
                problem.cols
            ))
        }),
    }
}

/// The ladder, as OneFlow's: the plan for a call no tuning table plans. Rows of up to
/// [`WARP_MAX_COLS`] on the warp path; rows read once (no cache would pay) uncached; else
/// the shared path where the row fits a block, a cluster where it fits one, uncached where
/// neither does. Each path's knobs from the device's limits alone.
pub(super) fn ladder_plan(problem: &Problem, device: &DeviceInfo, occupancy: Occupancies<'_>) -> crate::Result<Plan> {
    if problem.cols <= WARP_MAX_COLS {
        return Ok(warp_plan(problem, device));
    }
    if problem.spec.reads_once {
        return Ok(uncached_plan(problem, device));
    }
    if let Some(plan) = shared_plan(problem, device, occupancy.shared)? {
        return Ok(plan);
    }
    Ok(cluster_plan(problem, device, occupancy.cluster)?.unwrap_or_else(|| uncached_plan(problem, device)))
}

/// Granularity in which the driver allots a block's shared memory (sm_80 and later).
pub(super) const SHARED_ALLOCATION_BYTES: u32 = 128;

/// The warp path on the narrowest tier that holds the row.
fn warp_plan(problem: &Problem, device: &DeviceInfo) -> Plan {
    let cols = problem.cols.max(1) as u32;
    let narrowest = RowPath::WARP
        .into_iter()
        .map(|path| path.warp_elements() as u32)
        .find(|&e| cols <= WARP_SIZE * e)
        .unwrap_or(RowPath::Warp32.warp_elements() as u32);
    warp_tier_plan(problem, narrowest, device)
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

/// Rows ahead ([`RowShape::ahead`](rill_kernels_gpu::abi::RowShape::ahead)) whose lines a
/// warp-path `plan` requests into L2 as it starts each row: a wave of its resident warps'
/// rows (`resident_blocks` blocks an SM, asked only here), where its kernel holds the
/// request (a forward writing an element for each it reads, on a tier and element size the
/// kernels compile it for); else 0. Each grid gives a warp one row, so without the request a
/// row's loads wait on DRAM with only the resident rows in flight.
pub fn rows_ahead(
    problem: &Problem,
    plan: &Plan,
    device: &DeviceInfo,
    resident_blocks: impl FnOnce() -> crate::Result<u32>,
) -> crate::Result<u64> {
    let Path::Warp { width, elements } = plan.path else {
        return Ok(0);
    };
    // A forward with element outputs caches its row alone: its bytes a column are its cache's.
    let spec = &problem.spec;
    if !spec.class.writes_elements_forward()
        || !requests_rows_ahead(elements as usize, spec.cache_bytes_per_col as usize)
    {
        return Ok(0);
    }
    Ok(wave_rows(width, elements, resident_blocks()?, device))
}

/// A block per row, grid-strided ([`grid_stride_blocks`] over the rows' threads).
pub(super) fn block_grid(rows: usize, block: u32, device: &DeviceInfo) -> u32 {
    grid_stride_blocks(rows as u64 * block as u64, block, device)
}

/// The shared path, if the row fits: the largest block size that keeps as many blocks an SM
/// as 128 threads do (more threads per row at no cost in occupancy), one cache of the row.
fn shared_plan(problem: &Problem, device: &DeviceInfo, occupancy: Occupancy<'_>) -> crate::Result<Option<Plan>> {
    let bytes = problem.block_bytes(problem.cols as u64);
    if !fits_a_block(bytes, device) {
        return Ok(None);
    }
    let shared_bytes = bytes as u32;
    let baseline = occupancy(BLOCK_SIZES[0], shared_bytes)?;
    if baseline == 0 {
        return Ok(None);
    }
    let mut block = BLOCK_SIZES[0];
    for &candidate in BLOCK_SIZES[1..].iter().filter(|&&b| b <= problem.block_limit) {
        if occupancy(candidate, shared_bytes)? == baseline {
            block = candidate;
        }
    }
    let grid = block_grid(problem.rows, block, device);
    Ok(Some(problem.block_plan(Path::Shared { block, shared_bytes }, grid)))
}

/// Whether `bytes` of a row's cache fit one block's dynamic shared memory beside the row
/// kernels' static shared memory.
pub(super) fn fits_a_block(bytes: u64, device: &DeviceInfo) -> bool {
    bytes <= device.max_shared_bytes_per_block_optin.saturating_sub(ROW_STATIC_SHARED_BYTES) as u64
}

/// Whether a backward's rows can gather the column sums of `spec` (its gathering kernels'
/// paths):
/// rows the warp path may take, or whose caches and sums fit one block's shared memory, or
/// (sm_90) a cluster's, each block holding its slice's, where the sums take no more of it
/// than the cached rows or, on aligned rows, where the largest cluster's slices fit
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
    cols <= WARP_MAX_COLS as u64
        || ((!phased || sums_fit_caches) && fits_a_block(gathering.block_bytes(cols), device))
        || (sums_fit_caches && fits_a_cluster(cols, per_col, device))
        || (!phased && fits_a_cluster(cols, GATHERING_BLOCKS_AN_SM * per_col, device))
}

/// Blocks an SM whose slices' caches and sums the largest cluster must hold for aligned
/// rows whose sums take more shared memory than their caches (16-bit LayerNorm) to gather.
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
/// keep resident, each block as large as the kernel allows (more loads in flight).
fn cluster_plan(
    problem: &Problem,
    device: &DeviceInfo,
    occupancy: ClusterOccupancy<'_>,
) -> crate::Result<Option<Plan>> {
    if !has_clusters(device) {
        return Ok(None);
    }
    let blocks = BLOCK_SIZES.into_iter().rev().filter(|&b| b <= problem.block_limit);
    for (cluster, block) in ROW_CLUSTER_SIZES.into_iter().flat_map(|cluster| blocks.clone().map(move |b| (cluster, b)))
    {
        if let Some(plan) = cluster_shape_plan(problem, device, occupancy, cluster, block)? {
            return Ok(Some(plan));
        }
    }
    Ok(None)
}

/// The cluster path in clusters of `cluster` blocks of `block` threads, where a block's
/// slice fits its shared memory and such clusters reside.
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

/// The cluster path's grid: [`CLUSTER_WAVES`] waves of `resident` clusters of `cluster`
/// blocks, or a cluster a row where there are fewer rows.
pub(super) fn cluster_grid(problem: &Problem, cluster: u32, resident: u32) -> u32 {
    let clusters = (problem.rows as u64).min(resident as u64 * CLUSTER_WAVES as u64).max(1);
    (clusters * cluster as u64) as u32
}

/// Block sizes the uncached path also takes for rows read once, below [`BLOCK_SIZES`]: whole
/// warps down to one, so that an SM holds more rows in flight where a row has few packs.
pub(super) const STREAMING_BLOCK_SIZES: [u32; 3] = [128, 64, 32];

/// The uncached path in the largest block the kernel allows (more threads per row, more
/// loads in flight).
fn uncached_plan(problem: &Problem, device: &DeviceInfo) -> Plan {
    let block = BLOCK_SIZES.into_iter().rev().find(|&b| b <= problem.block_limit).unwrap_or(BLOCK_SIZES[0]);
    problem.block_plan(Path::Uncached { block }, block_grid(problem.rows, block, device))
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::spec::OpClass;
    use super::*;
    use crate::launch::tests::h100;

    /// The ladder's plan (no table), as the chooser gives it.
    fn plan(problem: &Problem, device: &DeviceInfo, occupancy: Occupancies<'_>) -> crate::Result<Plan> {
        super::super::choose::plan(problem, device, occupancy, None).map(|(plan, _)| plan)
    }

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
        // The narrowest tier holding the row. 32 columns: 4 lanes of 8 elements, two rows an
        // access; 64-256: the 8-element tier, 256 in a whole warp; 512: 16 elements a lane.
        let p = plan(&problem(49152, 32, 8), &device, OCCUPANCY).unwrap();
        assert_eq!((p.path, p.grid), (Path::Warp { width: 4, elements: 8 }, 49152 / 2 * 4 / 128));
        for cols in [64, 128, 200, 256] {
            let p = plan(&problem(49152, cols, 8), &device, OCCUPANCY).unwrap();
            let width = (cols as u32).div_ceil(8).next_power_of_two();
            assert_eq!(p.path, Path::Warp { width, elements: 8 }, "{cols}");
        }
        let p = plan(&problem(49152, 100, 1), &device, OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Warp { width: 16, elements: 8 });
        let p = plan(&problem(49152, 512, 8), &device, OCCUPANCY).unwrap();
        assert_eq!((p.path, p.grid), (Path::Warp { width: 32, elements: 16 }, 49152 * 32 / 128));
        // 768: the 24-element tier, no empty fourth pack a lane.
        let p = plan(&problem(49152, 768, 8), &device, OCCUPANCY).unwrap();
        assert_eq!(p.path, Path::Warp { width: 32, elements: 24 });
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
    fn rows_read_once_stream_past_the_warp_path() {
        let mut once = problem(49152, 1024, 8);
        once.spec.reads_once = true;
        assert_eq!(plan(&once, &h100(), OCCUPANCY).unwrap().kind(), PathKind::Warp);
        for cols in [1152, 4096, 262144] {
            once.cols = cols;
            assert_eq!(plan(&once, &h100(), OCCUPANCY).unwrap().path, Path::Uncached { block: 1024 }, "{cols}");
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
    fn owned_parts_hold_every_pack_of_rows_run_from_their_heads_only_for_a_column_array() {
        // 16-bit rows of 65536 columns whose arrays start on 16 bytes, run from their heads
        // because the f32 weight does not: every pack of a block's part is aligned, and the
        // block caches each of them beside its sums.
        let device = h100();
        let phased = with(Problem { block_pack: 8, force: Some(PathKind::Cluster), ..problem(5, 65536, 1) }, |s| {
            s.cache_bytes_per_col = 4;
            s.column_sums = 1;
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
        assert_eq!((p.pack, p.row_path(), p.block()), (8, RowPath::UncachedPhased, 1024));
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
