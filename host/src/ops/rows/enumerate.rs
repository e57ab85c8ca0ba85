//! Every feasible plan for a row op's spec and shape on a device: each path's knobs (the
//! warp tier and the rows it requests ahead; the block size, the row caches and the blocks
//! an SM; the cluster size) crossed, and kept where their launch fits the device's limits.
//! The rule-based planner ([`super::dispatch::plan`]) picks one plan by preference; this
//! lists what there is to pick from, for a chooser that reads a tuning table and a tuner
//! that times the candidates. Pure: occupancy comes from a model of the published limits
//! ([`Limits`]), never from a driver.
#![cfg_attr(not(test), allow(dead_code))] // Nothing outside the tests calls it until the chooser lands.

use super::dispatch::{
    BLOCK_SIZES, MAX_COLS, Path, Plan, Problem, SMALL_BLOCK, STREAMING_BLOCK_SIZES, WARP_MAX_COLS, block_grid,
    cluster_grid, warp_tier_plan, wave_rows,
};
use super::profiles::{ArchLimits, arch_limits};
use crate::DeviceInfo;
use rill_kernels_gpu::abi::{
    CLUSTER_STATIC_SHARED_BYTES, ROW_CACHE_STAGES, ROW_CLUSTER_SIZES, ROW_STATIC_SHARED_BYTES, ROW_WARP_BLOCK_SIZE,
    WARP_SIZE,
};
use rill_kernels_gpu::layout::column_gather_bytes;
use rill_kernels_gpu::table::{RowPath, requests_rows_ahead};

/// A device's limits: what its driver reports ([`DeviceInfo`]: SMs, threads and shared
/// memory an SM, shared memory a block), and its compute capability's facts for the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    pub device: DeviceInfo,
    pub arch: ArchLimits,
}

/// What one block of a launch asks of an SM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockDemand {
    pub threads: u32,
    /// Registers a thread.
    pub registers: u32,
    /// The kernel's static shared memory.
    pub static_shared: u32,
    /// The launch's dynamic shared memory.
    pub dynamic_shared: u32,
}

impl Limits {
    /// `device`'s limits; `None` where its compute capability's facts are not known
    /// ([`arch_limits`]).
    pub fn of(device: DeviceInfo) -> Option<Limits> {
        Some(Limits { arch: arch_limits(device.compute_capability)?, device })
    }

    /// Whether one block of `demand` launches: its threads, its registers a thread and a
    /// block (the hardware's check counts a block's warps in whole sets of sub-partitions),
    /// and its shared memory within the opt-in limit.
    pub fn launches(&self, demand: BlockDemand) -> bool {
        let arch = &self.arch;
        let checked_warps = demand.threads.div_ceil(WARP_SIZE).next_multiple_of(arch.register_sub_partitions);
        let block_registers = self.warp_registers(demand.registers) * checked_warps as u64;
        let shared = demand.static_shared as u64 + demand.dynamic_shared as u64;
        (1..=arch.max_threads_per_block).contains(&demand.threads)
            && demand.registers <= arch.max_registers_per_thread
            && block_registers <= arch.registers_per_block as u64
            && shared <= self.device.max_shared_bytes_per_block_optin as u64
    }

    /// Blocks of `demand` an SM keeps resident, 0 where one does not launch: the fewest its
    /// block slots, threads, registers (a warp's from one sub-partition's share) and shared
    /// memory (a block's own and the driver's reserved bytes, in allocation units) allow.
    /// The driver's occupancy calculation at the largest shared-memory carveout.
    pub fn blocks_per_sm(&self, demand: BlockDemand) -> u32 {
        if !self.launches(demand) {
            return 0;
        }
        let arch = &self.arch;
        let warps = demand.threads.div_ceil(WARP_SIZE);
        let by_threads = self.device.max_threads_per_multiprocessor / WARP_SIZE / warps;
        let sub_partition = arch.registers_per_multiprocessor / arch.register_sub_partitions;
        let warps_a_sub_partition = (sub_partition as u64 / self.warp_registers(demand.registers).max(1)) as u32;
        let by_registers = warps_a_sub_partition * arch.register_sub_partitions / warps;
        let allotted = (demand.static_shared + demand.dynamic_shared + arch.reserved_shared_bytes_per_block)
            .next_multiple_of(arch.shared_allocation_unit);
        let by_shared = self.device.max_shared_bytes_per_multiprocessor / allotted;
        arch.max_blocks_per_multiprocessor.min(by_threads).min(by_registers).min(by_shared)
    }

    /// Clusters of `cluster` blocks of `demand` resident at once, 0 where such a cluster
    /// does not launch (the capability has no clusters of that size): every SM's blocks, in
    /// whole clusters. Not modeled: a cluster's blocks share one GPC, whose SMs a profile
    /// does not give, so GPCs' leftover SMs are counted too.
    pub fn resident_clusters(&self, cluster: u32, demand: BlockDemand) -> u32 {
        if cluster == 0 || (cluster > 1 && cluster > self.arch.max_cluster_blocks) {
            return 0;
        }
        let blocks = self.blocks_per_sm(demand) as u64 * self.device.multiprocessors as u64;
        (blocks / cluster as u64) as u32
    }

    /// The most threads a block of a kernel of `registers` a thread launches with (what the
    /// driver reports as the kernel's `max_threads_per_block`): whole warps, within the
    /// block limit, whose registers fit a block.
    pub fn block_threads(&self, registers: u32) -> u32 {
        let threads = |warps| warps * WARP_SIZE;
        let launches = |threads| self.launches(BlockDemand { threads, registers, static_shared: 0, dynamic_shared: 0 });
        (1..=self.arch.max_threads_per_block / WARP_SIZE).rev().map(threads).find(|&t| launches(t)).unwrap_or(0)
    }

    /// Registers a warp of threads of `registers` each is given.
    fn warp_registers(&self, registers: u32) -> u64 {
        (registers as u64 * WARP_SIZE as u64).next_multiple_of(self.arch.register_allocation_unit as u64)
    }
}

/// Registers a thread of the op's kernel on `path` in packs of `pack` takes (ptxas's figure,
/// which the driver reports as the kernel's register count), or `None` where the family has
/// no such kernel: all the enumerator knows of the kernels.
pub type Registers<'a> = &'a dyn Fn(RowPath, usize) -> Option<u32>;

/// Registers a thread assumed where the kernel's own figure is unknown (no driver to ask):
/// the most with which a block of 1024 threads, the largest the block paths take, still
/// launches.
pub const ASSUMED_REGISTERS: u32 = 64;

/// A feasible plan, and what its launch asks of the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub plan: Plan,
    /// Blocks of its kernel an SM keeps resident.
    pub blocks_per_sm: u32,
    /// Dynamic shared memory a block launches with: the plan's (its caches, padded where
    /// it keeps fewer blocks an SM), or on the warp path its lane groups' gathered sums.
    pub shared_bytes: u32,
    /// Registers a thread of its kernel takes.
    pub registers: u32,
}

/// Every feasible plan for `problem` on a device of `limits`, with kernels of `registers`:
/// each path's ([`warp_candidates`], [`shared_candidates`], [`cluster_candidates`],
/// [`uncached_candidates`]), in the pack each path takes (`problem.pack` on the warp path,
/// `problem.block_pack` on the block paths: the widest the arrays allow; narrower packs are
/// left out). `problem.force` is the chooser's to apply, not read here. None for rows past
/// [`MAX_COLS`].
pub fn enumerate(problem: &Problem, limits: &Limits, registers: Registers<'_>) -> Vec<Candidate> {
    if problem.cols > MAX_COLS {
        return Vec::new();
    }
    let mut candidates = warp_candidates(problem, limits, registers);
    candidates.extend(shared_candidates(problem, limits, registers));
    candidates.extend(cluster_candidates(problem, limits, registers));
    candidates.extend(uncached_candidates(problem, limits, registers));
    candidates
}

/// The warp path: each tier that holds the row, its lanes as few as a power of two covering
/// it, at the pack every row allows; where the tier's kernel requests rows ahead, also with
/// a wave of rows requested ([`with_rows_ahead`]).
fn warp_candidates(problem: &Problem, limits: &Limits, registers: Registers<'_>) -> Vec<Candidate> {
    if problem.cols > WARP_MAX_COLS {
        return Vec::new();
    }
    let cols = problem.cols.max(1) as u32;
    let tier = |path: RowPath| {
        let elements = path.warp_elements() as u32;
        if cols > WARP_SIZE * elements {
            return None;
        }
        let plan = warp_tier_plan(problem, elements, &limits.device);
        let Path::Warp { width, .. } = plan.path else {
            return None;
        };
        // A gathering backward's sums: a partial row for each lane group of a block.
        let sums = column_gather_bytes(ROW_WARP_BLOCK_SIZE / width, problem.spec.column_sums, problem.cols as u64);
        let demand = BlockDemand {
            threads: ROW_WARP_BLOCK_SIZE,
            registers: registers(path, problem.pack)?,
            static_shared: ROW_STATIC_SHARED_BYTES,
            dynamic_shared: u32::try_from(sums).ok()?,
        };
        candidate(problem, limits, plan, demand)
    };
    RowPath::WARP.into_iter().filter_map(tier).flat_map(|warp| with_rows_ahead(problem, limits, warp)).collect()
}

/// `warp` and, where its kernel holds the request for rows ahead (a forward writing an
/// element for each it reads, on a tier and element size the kernels compile it for),
/// `warp` requesting the rows of one wave of its resident warps ahead, the one request the
/// kernels make.
fn with_rows_ahead(problem: &Problem, limits: &Limits, warp: Candidate) -> impl Iterator<Item = Candidate> {
    let spec = &problem.spec;
    let ahead = match warp.plan.path {
        // Such a forward caches its row alone: its bytes a column are its elements'.
        Path::Warp { width, elements }
            if spec.class.writes_elements_forward()
                && requests_rows_ahead(elements as usize, spec.cache_bytes_per_col as usize) =>
        {
            let wave = wave_rows(width, elements, warp.blocks_per_sm, &limits.device);
            Some(Candidate { plan: Plan { ahead: wave, ..warp.plan }, ..warp })
        }
        _ => None,
    };
    std::iter::once(warp).chain(ahead)
}

/// The shared path at each block size (two warps and [`BLOCK_SIZES`]): one cache of the
/// row, or for a spec that gathers column sums from aligned rows also [`ROW_CACHE_STAGES`];
/// each also padded to keep fewer blocks an SM ([`fewer_blocks`]).
fn shared_candidates(problem: &Problem, limits: &Limits, registers: Registers<'_>) -> Vec<Candidate> {
    let path = if problem.block_phased() { RowPath::SharedPhased } else { RowPath::Shared };
    let Some(registers) = registers(path, problem.block_pack) else {
        return Vec::new();
    };
    let stages = [1, ROW_CACHE_STAGES].into_iter().filter(|&stages| stages == 1 || problem.stages_rows());
    let blocks = [SMALL_BLOCK].into_iter().chain(BLOCK_SIZES).filter(|&block| block <= problem.block_limit);
    let mut candidates = Vec::new();
    for (stages, block) in stages.flat_map(|stages| blocks.clone().map(move |block| (stages, block))) {
        let Ok(cached) = u32::try_from(problem.staged_block_bytes(problem.cols as u64, stages)) else {
            continue;
        };
        let grid = block_grid(problem.rows, block, &limits.device);
        let demand = |dynamic_shared| BlockDemand {
            threads: block,
            registers,
            static_shared: ROW_STATIC_SHARED_BYTES,
            dynamic_shared,
        };
        let launch = |shared_bytes| {
            let plan = problem.block_plan(Path::Shared { block, shared_bytes }, grid);
            candidate(problem, limits, Plan { stages, ..plan }, demand(shared_bytes))
        };
        let Some(unpadded) = launch(cached) else {
            continue;
        };
        candidates.push(unpadded);
        candidates.extend(fewer_blocks(limits, demand(cached), unpadded.blocks_per_sm).filter_map(launch));
    }
    candidates
}

/// `demand`'s dynamic shared memory padded so that fewer of its blocks share an SM (the
/// kernel uses only its cache's bytes; the rest leaves each block more of the SM and L1
/// less): for each cap on blocks an SM from `resident` - 1 down to one, the least padding
/// (whole allocation units) that keeps at most that many, where a block still launches
/// with it. One entry a cap, so fewer than the SM's block slots.
fn fewer_blocks(limits: &Limits, demand: BlockDemand, resident: u32) -> impl Iterator<Item = u32> + '_ {
    let arch = &limits.arch;
    (1..resident).rev().filter_map(move |cap| {
        // The least allotment of which `cap` + 1 blocks overfill the SM's shared memory.
        let per_sm = limits.device.max_shared_bytes_per_multiprocessor;
        let allotted = (per_sm / (cap + 1) + 1).next_multiple_of(arch.shared_allocation_unit);
        let padded = allotted.checked_sub(demand.static_shared + arch.reserved_shared_bytes_per_block)?;
        let padded = padded.max(demand.dynamic_shared);
        limits.launches(BlockDemand { dynamic_shared: padded, ..demand }).then_some(padded)
    })
}

/// The cluster path, where the capability has clusters: each cluster size it allows and
/// each of [`BLOCK_SIZES`], where a block's slice of the row ([`Problem::slice_bytes`]) fits its
/// shared memory and the clusters reside.
fn cluster_candidates(problem: &Problem, limits: &Limits, registers: Registers<'_>) -> Vec<Candidate> {
    let path = if problem.block_phased() { RowPath::ClusterPhased } else { RowPath::Cluster };
    let Some(registers) = registers(path, problem.block_pack) else {
        return Vec::new();
    };
    let blocks = BLOCK_SIZES.into_iter().filter(|&block| block <= problem.block_limit);
    let shapes = ROW_CLUSTER_SIZES.into_iter().flat_map(|cluster| blocks.clone().map(move |block| (cluster, block)));
    let launch = |(cluster, block)| {
        let shared_bytes = u32::try_from(problem.slice_bytes(cluster, block)).ok()?;
        let demand = BlockDemand {
            threads: block,
            registers,
            static_shared: CLUSTER_STATIC_SHARED_BYTES,
            dynamic_shared: shared_bytes,
        };
        let grid = cluster_grid(problem, cluster, limits.resident_clusters(cluster, demand));
        let plan = problem.block_plan(Path::Cluster { cluster, block, shared_bytes }, grid);
        candidate(problem, limits, plan, demand)
    };
    shapes.filter_map(launch).collect()
}

/// The uncached path at each of [`BLOCK_SIZES`], and for rows read once at each of
/// [`STREAMING_BLOCK_SIZES`] too (whole warps down to one).
fn uncached_candidates(problem: &Problem, limits: &Limits, registers: Registers<'_>) -> Vec<Candidate> {
    let path = if problem.block_phased() { RowPath::UncachedPhased } else { RowPath::Uncached };
    let Some(registers) = registers(path, problem.block_pack) else {
        return Vec::new();
    };
    let streaming =
        STREAMING_BLOCK_SIZES.into_iter().filter(|block| problem.spec.reads_once && !BLOCK_SIZES.contains(block));
    let blocks = streaming.chain(BLOCK_SIZES).filter(|&block| block <= problem.block_limit);
    let launch = |block| {
        let plan = problem.block_plan(Path::Uncached { block }, block_grid(problem.rows, block, &limits.device));
        let demand =
            BlockDemand { threads: block, registers, static_shared: ROW_STATIC_SHARED_BYTES, dynamic_shared: 0 };
        candidate(problem, limits, plan, demand)
    };
    blocks.filter_map(launch).collect()
}

/// `plan` launched in blocks of `demand`, where they (or its clusters) reside; for a spec
/// that gathers column sums, its grid at most one wave of them, as the engine launches it:
/// each writes a row of the partial sums.
fn candidate(problem: &Problem, limits: &Limits, plan: Plan, demand: BlockDemand) -> Option<Candidate> {
    let cluster = plan.cluster();
    let resident = limits.resident_clusters(cluster, demand).saturating_mul(cluster);
    if resident == 0 {
        return None;
    }
    let grid = if problem.spec.column_sums > 0 { plan.grid.min(resident) } else { plan.grid };
    let (blocks_per_sm, shared_bytes, registers) =
        (limits.blocks_per_sm(demand), demand.dynamic_shared, demand.registers);
    Some(Candidate { plan: Plan { grid, ..plan }, blocks_per_sm, shared_bytes, registers })
}

#[cfg(test)]
mod tests {
    use super::super::choose::{self, Ahead, Fallback};
    use super::super::dispatch::{Occupancies, PathKind, gathers_columns, rows_ahead, warp_max_cols, wave_ahead};
    use super::super::profiles;
    use super::super::spec::{OpClass, RowSpec};
    use super::super::tuning::{self, Alignment, Knobs, RowsBucket, TuningTable, WIDER};
    use super::*;
    use crate::fuse;
    use crate::ops::{norm, softmax};
    use rill_kernels_gpu::abi::{DType, max_pack};
    use rill_kernels_gpu::table::{KernelKey, NormKernelKind, SoftmaxKind};

    /// Registers a thread of the kernels the tests plan for: [`ASSUMED_REGISTERS`]; a
    /// lighter kernel, whose blocks of 128 fill an SM's threads (and which more blocks than
    /// the planner keeps may share); a heavier one, whose blocks of 1024 do not launch and
    /// whose warp path keeps 20 warps an SM.
    const REGISTER_FIGURES: [u32; 3] = [ASSUMED_REGISTERS, 32, 96];

    /// Rows x columns of the benchmark sweep.
    fn sweep() -> Vec<(usize, usize)> {
        let wide = [256, 512, 1000, 1024, 2048, 4096, 8192, 16384, 32768].map(|cols| (49152, cols));
        let vocabularies = [32001, 50257, 65536, 131072, 262144].map(|cols| (4096, cols));
        let small = [1, 8, 64].into_iter().flat_map(|rows| [1024, 4096, 8192].map(|cols| (rows, cols)));
        wide.into_iter().chain(vocabularies).chain(small).collect()
    }

    /// Whose kernels a call runs.
    #[derive(Clone, Copy, Debug)]
    enum Family {
        Softmax(SoftmaxKind, DType),
        Norm(NormKernelKind, (DType, DType, DType)),
        /// A user's `fused_softmax!` family: every path but the clusters, at any pack.
        Fused,
    }

    impl Family {
        /// Registers a thread of the family's kernels: `figure`, or a kernel's cap where that
        /// is lower; `None` where the kernel table has no such kernel.
        fn registers(self, figure: u32) -> impl Fn(RowPath, usize) -> Option<u32> {
            move |path, pack| {
                let key = match self {
                    Family::Softmax(kind, dtype) => KernelKey::Softmax { kind, path, dtype, pack },
                    Family::Norm(kind, dtypes) => KernelKey::Norm { kind, path, dtypes, pack },
                    Family::Fused => return (!path.clustered()).then_some(figure),
                };
                key.symbol()?;
                Some(key.register_cap().map_or(figure, |cap| cap.min(figure)))
            }
        }
    }

    /// Every call of the sweep's ops over `rows x cols` in `dtype`, as the ops make them:
    /// the softmax family; the norm forwards with and without a residual (LayerNorm's f32
    /// weight and bias, RMSNorm's weight in the rows' dtype); the norm backward with no
    /// weight, a weight of either dtype, and gathering its parameter gradients where
    /// `norm.rs` would; a user's fused softmax, its cache transformed or not. Each over
    /// arrays that start on 16 bytes, at other offsets, and (where the op runs rows from
    /// their heads) at one shared offset.
    fn calls(rows: usize, cols: usize, dtype: DType, device: &DeviceInfo) -> Vec<(Problem, Family)> {
        let bytes = dtype.size() as u32;
        let f32_ = DType::F32;
        let mut specs = Vec::new();
        for kind in SoftmaxKind::ALL {
            specs.push((softmax::spec(kind, bytes), Family::Softmax(kind, dtype)));
        }
        for (class, kernels) in
            [(OpClass::Norm, NormKernelKind::Forward), (OpClass::AddNorm, NormKernelKind::AddForward)]
        {
            for (weight, arrays) in [(f32_, 2), (dtype, 1)] {
                let spec = RowSpec {
                    column_bytes: (arrays * cols * weight.size()) as u32,
                    ..norm::forward_spec(class, bytes, bytes)
                };
                specs.push((spec, Family::Norm(kernels, (dtype, dtype, weight))));
            }
        }
        let backward = |weight: Option<DType>| {
            norm::backward_spec(bytes, weight.map(|w| (w.size() as u32, (cols * w.size()) as u32)))
        };
        for weight in [None, Some(f32_), Some(dtype)] {
            let kernels = Family::Norm(NormKernelKind::Backward, (dtype, dtype, weight.unwrap_or(dtype)));
            specs.push((backward(weight), kernels));
        }
        for cache_transformed in [false, true] {
            let spec = fuse::row_spec(max_pack(bytes as usize, bytes as usize), f32_.size() as u32, cache_transformed);
            specs.push((spec, Family::Fused));
        }
        let mut calls: Vec<_> =
            specs.into_iter().flat_map(|(spec, family)| packs(rows, cols, spec).map(move |p| (p, family))).collect();
        // The backward gathering its parameter gradients: RMSNorm's one sum, LayerNorm's two.
        for (weight, sums) in [(f32_, 1), (f32_, 2), (dtype, 1), (dtype, 2)] {
            let spec = backward(Some(weight));
            let gathering = RowSpec { class: OpClass::NormBackwardParams, column_sums: sums, ..spec };
            let kernels = Family::Norm(NormKernelKind::BackwardParams, (dtype, dtype, weight));
            for problem in packs(rows, cols, spec) {
                let aligned = problem.pack > 1;
                let phased = problem.block_pack > problem.pack;
                let gathers = (aligned || (cols > warp_max_cols(&spec) && phased))
                    && gathers_columns(&gathering, cols, !aligned, device);
                if gathers {
                    calls.push((Problem { spec: gathering, ..problem }, kernels));
                }
            }
        }
        calls
    }

    /// `spec`'s problems over `rows x cols` as `RowCall::prepare` finds their packs: arrays
    /// at other offsets (pack 1), on 16 bytes (the widest, where it divides the row), and
    /// at one offset (rows run from their heads in the widest), before the kernels' thread
    /// limit is known.
    fn packs(rows: usize, cols: usize, spec: RowSpec) -> impl Iterator<Item = Problem> {
        let widest = spec.widest;
        let problem =
            move |(pack, block_pack)| Problem { rows, cols, pack, block_pack, block_limit: 0, spec, force: None };
        let aligned = cols.is_multiple_of(widest).then_some((widest, widest));
        let phased = (spec.runs_from_heads && widest > 1).then_some((1, widest));
        [Some((1, 1)), aligned, phased].into_iter().flatten().map(problem)
    }

    /// `problem` with the block paths' thread limit the engine asks the kernels for
    /// (`RowCall::plan`); `None` where they have no kernel to ask.
    fn with_block_limit(problem: Problem, registers: Registers<'_>, limits: &Limits) -> Option<Problem> {
        let phased = problem.block_phased();
        let (shared, uncached) = if phased {
            (RowPath::SharedPhased, RowPath::UncachedPhased)
        } else {
            (RowPath::Shared, RowPath::Uncached)
        };
        let threads = |path| registers(path, problem.block_pack).map(|r| limits.block_threads(r));
        let block_limit =
            if problem.spec.column_sums > 0 { threads(shared)? } else { threads(uncached)?.min(threads(shared)?) };
        Some(Problem { block_limit, ..problem })
    }

    /// How a test plans a call: by a table and a fallback, or by one setting of the knobs.
    #[derive(Clone, Copy)]
    enum Choice<'a> {
        Table(Option<&'a TuningTable>, Fallback),
        Knobs(Knobs),
    }

    /// What the chooser gives `problem` by `choice` with the occupancy model of `limits`,
    /// finished as the engine finishes it (`RowCall::plan`): planned again without the
    /// column sums where the gathering kernels have none on its path, a gathering grid cut
    /// to one wave, the rows requested ahead asked; with the problem and kernels it was
    /// planned for. `None` where the engine finds no kernel, or the knobs do not fit.
    fn planned(
        problem: Problem,
        family: Family,
        limits: &Limits,
        figure: u32,
        choice: Choice<'_>,
    ) -> Option<(Problem, Family, Plan)> {
        let registers = family.registers(figure);
        let problem = with_block_limit(problem, &registers, limits)?;
        let (pack, phased) = (problem.block_pack, problem.block_phased());
        let demand = |path, threads, static_shared, dynamic_shared| {
            registers(path, pack).map(|registers| BlockDemand { threads, registers, static_shared, dynamic_shared })
        };
        let shared_path = if phased { RowPath::SharedPhased } else { RowPath::Shared };
        let cluster_path = if phased { RowPath::ClusterPhased } else { RowPath::Cluster };
        let shared = |block, bytes| {
            Ok(demand(shared_path, block, ROW_STATIC_SHARED_BYTES, bytes).map_or(0, |d| limits.blocks_per_sm(d)))
        };
        let cluster = |cluster, block, bytes| {
            let demand = demand(cluster_path, block, CLUSTER_STATIC_SHARED_BYTES, bytes);
            Ok(demand.map_or(0, |d| limits.resident_clusters(cluster, d)))
        };
        let occupancy = Occupancies { shared: &shared, cluster: &cluster };
        let (mut plan, ahead) = match choice {
            Choice::Table(table, fallback) => {
                choose::plan(&problem, &limits.device, occupancy, table, fallback).unwrap()
            }
            Choice::Knobs(knobs) => {
                let (plan, ahead) = choose::fit(knobs, &problem, &limits.device, occupancy).unwrap()?;
                (plan, if ahead { Ahead::Wave } else { Ahead::None })
            }
        };
        let Some(kernel_registers) = registers(plan.row_path(), plan.pack) else {
            let Family::Norm(NormKernelKind::BackwardParams, dtypes) = family else {
                return None;
            };
            let ungathered = Problem { spec: problem.spec.ungathered(), ..problem };
            return planned(ungathered, Family::Norm(NormKernelKind::Backward, dtypes), limits, figure, choice);
        };
        let sums = problem.spec.column_sums;
        let gathered = match plan.path {
            Path::Warp { width, .. } => column_gather_bytes(ROW_WARP_BLOCK_SIZE / width, sums, problem.cols as u64),
            _ => 0,
        } as u32;
        let blocks_an_sm = |threads| {
            let demand = BlockDemand {
                threads,
                registers: kernel_registers,
                static_shared: ROW_STATIC_SHARED_BYTES,
                dynamic_shared: gathered,
            };
            limits.blocks_per_sm(demand)
        };
        if sums > 0 {
            let sms = limits.device.multiprocessors;
            let resident = match plan.path {
                Path::Cluster { cluster: blocks, block, shared_bytes } => {
                    cluster(blocks, block, shared_bytes).unwrap().max(1) * blocks
                }
                Path::Shared { block, shared_bytes } => shared(block, shared_bytes).unwrap().max(1) * sms,
                _ => blocks_an_sm(plan.block()).max(1) * sms,
            };
            plan.grid = plan.grid.min(resident);
        }
        let resident = || Ok(blocks_an_sm(plan.block()));
        plan.ahead = match ahead {
            Ahead::None => 0,
            Ahead::Wave => wave_ahead(&problem, &plan, &limits.device, resident).unwrap(),
            Ahead::ByRules => rows_ahead(&problem, &plan, &limits.device, resident).unwrap(),
        };
        Some((problem, family, plan))
    }

    /// Asserts that `candidate` of `problem` breaks none of `limits`, each counted plainly
    /// (the model's roundings only add to what a block takes).
    fn assert_within_limits(candidate: &Candidate, problem: &Problem, limits: &Limits) {
        let Candidate { plan, blocks_per_sm, shared_bytes, registers } = *candidate;
        let (arch, device) = (&limits.arch, &limits.device);
        let what = || format!("{} on {}: {problem:?}", plan.describe(), device.name);
        let (block, cluster) = (plan.block(), plan.cluster());
        let clustered = plan.kind() == PathKind::Cluster;
        let static_shared = if clustered { CLUSTER_STATIC_SHARED_BYTES } else { ROW_STATIC_SHARED_BYTES };
        let taken = static_shared + shared_bytes;
        assert!(taken <= device.max_shared_bytes_per_block_optin, "{}", what());
        assert!((1..=arch.max_blocks_per_multiprocessor).contains(&blocks_per_sm), "{}", what());
        let resident_shared = blocks_per_sm * (taken + arch.reserved_shared_bytes_per_block);
        assert!(resident_shared <= device.max_shared_bytes_per_multiprocessor, "{}", what());
        assert!(blocks_per_sm * block <= device.max_threads_per_multiprocessor, "{}", what());
        assert!(registers <= arch.max_registers_per_thread, "{}", what());
        assert!(block * registers <= arch.registers_per_block, "{}", what());
        assert!(blocks_per_sm * block * registers <= arch.registers_per_multiprocessor, "{}", what());
        assert!(block <= arch.max_threads_per_block && block.is_multiple_of(WARP_SIZE), "{}", what());
        assert!(plan.grid >= 1 && plan.grid.is_multiple_of(cluster), "{}", what());
        if problem.spec.column_sums > 0 {
            assert!(plan.grid <= blocks_per_sm * device.multiprocessors, "one wave: {}", what());
        }
        match plan.path {
            Path::Warp { width, elements } => {
                assert!((width * elements) as usize >= problem.cols && width <= WARP_SIZE, "{}", what());
                assert_eq!((plan.pack, plan.phased), (problem.pack, false), "{}", what());
            }
            Path::Shared { .. } | Path::Uncached { .. } | Path::Cluster { .. } => {
                assert!(block <= problem.block_limit, "{}", what());
                assert_eq!((plan.pack, plan.phased), (problem.block_pack, problem.block_phased()), "{}", what());
                assert_eq!(plan.shared_bytes(), shared_bytes, "{}", what());
            }
        }
        if let Path::Shared { .. } = plan.path {
            let cached = problem.staged_block_bytes(problem.cols as u64, plan.stages);
            assert!(shared_bytes as u64 >= cached, "{}", what());
        }
        if clustered {
            assert!(device.compute_capability.0 >= 9 && cluster <= arch.max_cluster_blocks, "{}", what());
            let clusters = blocks_per_sm as u64 * device.multiprocessors as u64 / cluster as u64;
            assert!(clusters >= 1, "{}", what());
        }
    }

    /// Checks one call on a device of `limits`, its kernels of `figure` registers: it has
    /// plans, none breaks a limit, and the chooser's by each of `choices`, as the engine
    /// finishes it, is one of them (compared whole: grid and rows ahead too). Err names a
    /// call whose chosen plan is not enumerated, or that the engine finds no kernel for by
    /// a table.
    fn check_call(
        problem: Problem,
        family: Family,
        limits: &Limits,
        figure: u32,
        choices: &[Choice<'_>],
    ) -> Result<(), String> {
        let registers = family.registers(figure);
        let device = &limits.device.name;
        // The engine refuses a call whose block paths have no kernels at its packs (cross
        // entropy's and logsumexp's at pack 1, which no call takes: their one array always
        // shares its own phase).
        let Some(problem) = with_block_limit(problem, &registers, limits) else {
            return Ok(());
        };
        let candidates = enumerate(&problem, limits, &registers);
        assert!(!candidates.is_empty(), "{family:?} on {device}: {problem:?}");
        for candidate in &candidates {
            assert_within_limits(candidate, &problem, limits);
        }
        for &choice in choices {
            let Some((problem, family, plan)) = planned(problem, family, limits, figure, choice) else {
                match choice {
                    Choice::Knobs(_) => continue,
                    Choice::Table(..) => return Err(format!("no kernel planned: {family:?} {problem:?} on {device}")),
                }
            };
            let registers = family.registers(figure);
            if !enumerate(&problem, limits, &registers).iter().any(|candidate| candidate.plan == plan) {
                return Err(format!("{}: {family:?} {problem:?} on {device}", plan.describe()));
            }
        }
        Ok(())
    }

    /// An index for each class of op (exhaustive: a new class fails to compile here, then
    /// the sweep's test until [`calls`] makes some).
    fn class_index(class: OpClass) -> usize {
        match class {
            OpClass::Softmax => 0,
            OpClass::MaskedSoftmax => 1,
            OpClass::CausalSoftmax => 2,
            OpClass::SoftmaxBackward => 3,
            OpClass::RowStatistics => 4,
            OpClass::CrossEntropyBackward => 5,
            OpClass::Norm => 6,
            OpClass::AddNorm => 7,
            OpClass::NormBackward => 8,
            OpClass::NormBackwardParams => 9,
            OpClass::Fused => 10,
        }
    }

    #[test]
    fn every_sweep_shape_has_plans_within_the_limits_of_every_profile_and_the_chosen_one_is_one() {
        let runs = REGISTER_FIGURES.into_iter().flat_map(|figure| {
            let shapes = sweep().into_iter();
            shapes.flat_map(move |(rows, cols)| [DType::F32, DType::F16, DType::BF16].map(|d| (figure, rows, cols, d)))
        });
        let runs: Vec<_> = runs.collect();
        let (mut classes, mut outside) = (std::collections::HashSet::new(), Vec::new());
        for limits in profiles::all().map(|device| Limits::of(device).unwrap()) {
            // The rules' plans, the ladder's, and the checked-in table's for the profile where
            // it has one.
            let table = TuningTable::builtin(&limits.device);
            let choices = [
                Choice::Table(None, Fallback::Rules),
                Choice::Table(None, Fallback::Ladder),
                Choice::Table(table.as_ref(), Fallback::Rules),
            ];
            for &(figure, rows, cols, dtype) in &runs {
                for (problem, family) in calls(rows, cols, dtype, &limits.device) {
                    classes.insert(class_index(problem.spec.class));
                    outside.extend(check_call(problem, family, &limits, figure, &choices).err());
                }
            }
        }
        assert_eq!(classes.len(), class_index(OpClass::Fused) + 1, "{classes:?}");
        assert!(outside.is_empty(), "{} plans outside the enumeration:\n{}", outside.len(), outside.join("\n"));
    }

    #[test]
    fn every_setting_of_the_knobs_that_fits_a_sweep_call_is_enumerated() {
        let choices: Vec<_> = Knobs::all().into_iter().map(Choice::Knobs).collect();
        let mut outside = Vec::new();
        for device in [profiles::h100_sxm(), profiles::h200(), profiles::a100_80gb_sxm(), profiles::l40s()] {
            let limits = Limits::of(device).unwrap();
            for (rows, cols) in [(49152, 256), (49152, 1024), (49152, 4096), (49152, 32768), (4096, 50257), (8, 8192)] {
                for dtype in [DType::F32, DType::BF16] {
                    for (problem, family) in calls(rows, cols, dtype, &limits.device) {
                        outside.extend(check_call(problem, family, &limits, ASSUMED_REGISTERS, &choices).err());
                    }
                }
            }
        }
        assert!(outside.is_empty(), "{} plans outside the enumeration:\n{}", outside.len(), outside.join("\n"));
    }

    #[test]
    fn the_checked_in_tables_parse_and_every_entry_fits_a_call_of_its_bucket_on_its_gpu() {
        for (file, text) in tuning::builtin_texts() {
            let table = TuningTable::parse(text).unwrap_or_else(|error| panic!("{file}: {error}"));
            let device = profiles::all().into_iter().find(|device| device.name == table.gpu);
            let device = device.unwrap_or_else(|| panic!("{file}: no profile of a {}", table.gpu));
            assert_eq!(device.compute_capability, table.compute_capability, "{file}");
            let limits = Limits::of(device).unwrap();
            for entry in &table.entries {
                let pattern = &entry.pattern;
                let what = || format!("{file}: {pattern:?} {}", entry.knobs);
                // The tuner names every field but the rows of its sweep's calls.
                let (Some(class), Some(bits), Some(bound), Some(alignment)) =
                    (&pattern.class, pattern.bits, pattern.cols, pattern.alignment)
                else {
                    panic!("{}", what());
                };
                assert_ne!(bound, WIDER, "{}", what());
                let cols = if alignment == Alignment::Aligned { bound } else { bound - 1 } as usize;
                let rows = match pattern.rows {
                    Some(RowsBucket::Few) => 8,
                    _ if cols > 32768 => 4096,
                    _ => 49152,
                };
                let dtype = if bits == 32 { DType::F32 } else { DType::BF16 };
                let fits = calls(rows, cols, dtype, &limits.device).into_iter().any(|(problem, family)| {
                    problem.spec.tuning_class() == class
                        && Alignment::of(&problem) == alignment
                        && planned(problem, family, &limits, ASSUMED_REGISTERS, Choice::Knobs(entry.knobs)).is_some()
                });
                assert!(fits, "{}", what());
            }
        }
    }

    #[test]
    fn occupancy_counts_registers_a_warp_from_each_sub_partition() {
        let limits = Limits::of(profiles::h100_sxm()).unwrap();
        let blocks = |threads, registers| {
            let demand = BlockDemand { threads, registers, static_shared: ROW_STATIC_SHARED_BYTES, dynamic_shared: 0 };
            limits.blocks_per_sm(demand)
        };
        // 64 registers: 8 warps a sub-partition, one block of 1024 or two of 512.
        assert_eq!((blocks(1024, 64), blocks(512, 64)), (1, 2));
        // 72 (2304 a warp): 7 warps a sub-partition, 28 an SM: one block of 512, two of 384.
        assert_eq!((blocks(512, 72), blocks(384, 72)), (1, 2));
        // 56: three blocks of 384, two of 512; 94 (3072 a warp): 20 warps, five blocks of 128.
        assert_eq!((blocks(384, 56), blocks(512, 56), blocks(128, 94)), (3, 2, 5));
        // Few registers: the SM's threads, then its block slots.
        assert_eq!((blocks(128, 16), blocks(32, 16)), (16, 32));
        // A block of 1024 at 96 registers does not launch; 640 threads do, in 20 warps
        // (the hardware's check rounds them to whole sets of four).
        assert_eq!((blocks(1024, 96), limits.block_threads(96), limits.block_threads(64)), (0, 640, 1024));
        assert_eq!(blocks(128, 256), 0);
    }

    #[test]
    fn occupancy_counts_shared_memory_with_the_reserved_bytes_in_allocation_units() {
        let limits = Limits::of(profiles::h100_sxm()).unwrap();
        let demand = |dynamic_shared| BlockDemand {
            threads: 128,
            registers: 32,
            static_shared: ROW_STATIC_SHARED_BYTES,
            dynamic_shared,
        };
        // Three 64 KB caches an SM (each with 1280 more bytes), not four.
        assert_eq!(limits.blocks_per_sm(demand(65536)), 3);
        // The opt-in limit holds a block's static and dynamic bytes.
        let most = limits.device.max_shared_bytes_per_block_optin - ROW_STATIC_SHARED_BYTES;
        assert_eq!((limits.blocks_per_sm(demand(most)), limits.blocks_per_sm(demand(most + 1))), (1, 0));
        // One byte past an allocation unit costs a whole one: 10 blocks of 23296 bytes fit
        // 228 KB, not of 23297 - 1280 + 1 more.
        assert_eq!(limits.blocks_per_sm(demand(23296 - 1280)), 10);
        assert_eq!(limits.blocks_per_sm(demand(23296 - 1280 + 1)), 9);
    }

    #[test]
    fn clusters_launch_on_capabilities_with_them_up_to_their_largest() {
        let demand =
            BlockDemand { threads: 512, registers: 64, static_shared: CLUSTER_STATIC_SHARED_BYTES, dynamic_shared: 0 };
        let (h100, a100) = (Limits::of(profiles::h100_sxm()).unwrap(), Limits::of(profiles::a100_80gb_sxm()).unwrap());
        assert_eq!(h100.resident_clusters(16, demand), 132 * 2 / 16);
        assert_eq!(h100.resident_clusters(32, demand), 0);
        assert_eq!((a100.resident_clusters(2, demand), a100.resident_clusters(1, demand)), (0, 108 * 2));
        // Wide rows: clusters of 16 on the H100, none on the A100.
        let problem = Problem {
            rows: 4096,
            cols: 262144,
            pack: 4,
            block_pack: 4,
            block_limit: 1024,
            spec: RowSpec::rows_of(OpClass::Softmax, 4),
            force: None,
        };
        let registers = |_: RowPath, _: usize| Some(ASSUMED_REGISTERS);
        let clusters = |limits| enumerate(&problem, limits, &registers).into_iter().map(|c| c.plan.cluster()).max();
        assert_eq!((clusters(&h100), clusters(&a100)), (Some(16), Some(1)));
    }

    #[test]
    fn padding_keeps_each_cap_on_blocks_an_sm_with_the_least_shared_memory() {
        // 16-bit rows of 2048 columns, x and dy cached (8 KB), in light kernels: 16 blocks
        // of 128 an SM by threads.
        let limits = Limits::of(profiles::h200()).unwrap();
        let problem = Problem {
            rows: 49152,
            cols: 2048,
            pack: 8,
            block_pack: 8,
            block_limit: 1024,
            spec: RowSpec { cache_bytes_per_col: 4, ..RowSpec::rows_of(OpClass::NormBackward, 2) },
            force: None,
        };
        let registers = |_: RowPath, _: usize| Some(32);
        let candidates = enumerate(&problem, &limits, &registers);
        for (i, a) in candidates.iter().enumerate() {
            assert!(candidates[i + 1..].iter().all(|b| b.plan != a.plan), "{} twice", a.plan.describe());
        }
        let shared =
            |block| candidates.iter().filter(move |c| c.plan.kind() == PathKind::Shared && c.plan.block() == block);
        let caps: Vec<_> = shared(128).map(|c| (c.blocks_per_sm, c.shared_bytes)).collect();
        // Unpadded first, then each cap from 15 blocks an SM down to one.
        assert_eq!(caps[0], (16, 8192));
        assert_eq!(caps.iter().map(|&(blocks, _)| blocks).collect::<Vec<_>>(), (1..=16).rev().collect::<Vec<_>>());
        for &(blocks, bytes) in &caps[1..] {
            let one_unit_less = BlockDemand {
                threads: 128,
                registers: 32,
                static_shared: ROW_STATIC_SHARED_BYTES,
                dynamic_shared: bytes - limits.arch.shared_allocation_unit,
            };
            assert!(bytes.is_multiple_of(limits.arch.shared_allocation_unit), "{bytes}");
            assert!(limits.blocks_per_sm(one_unit_less) > blocks, "{blocks}: {bytes}");
        }
        // Blocks of two warps too (24 an SM by their caches), and blocks of 1024 (two an
        // SM) padded to one.
        assert_eq!(shared(64).next().map(|c| c.blocks_per_sm), Some(24));
        assert_eq!(shared(1024).map(|c| c.blocks_per_sm).collect::<Vec<_>>(), [2, 1]);
    }

    #[test]
    fn the_widest_tiers_sixteen_bit_forwards_also_request_a_wave_of_rows_ahead() {
        let limits = Limits::of(profiles::h200()).unwrap();
        let forward = |class, bytes: usize, cols| Problem {
            rows: 49152,
            cols,
            pack: 16 / bytes,
            block_pack: 16 / bytes,
            block_limit: 1024,
            spec: RowSpec::rows_of(class, bytes as u32),
            force: None,
        };
        let registers = |_: RowPath, _: usize| Some(96);
        let ahead = |problem: Problem| {
            let candidates = enumerate(&problem, &limits, &registers).into_iter();
            candidates.filter(|c| c.plan.ahead > 0).map(|c| (c.plan.path, c.plan.ahead)).collect::<Vec<_>>()
        };
        // Five blocks of 128 an SM (20 warps), a row a warp: 20 x 132 rows.
        assert_eq!(ahead(forward(OpClass::Softmax, 2, 1024)), [(Path::Warp { width: 32, elements: 32 }, 20 * 132)]);
        // Not where the kernels do not compile the request: f32 rows, narrower tiers, ops
        // reading each row once, the backward.
        assert_eq!(ahead(forward(OpClass::Softmax, 4, 1024)), []);
        assert_eq!(ahead(forward(OpClass::Softmax, 2, 512)).len(), 1);
        assert_eq!(ahead(forward(OpClass::RowStatistics, 2, 1024)), []);
        assert_eq!(ahead(forward(OpClass::SoftmaxBackward, 2, 1024)), []);
    }
}
