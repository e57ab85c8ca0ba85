//! What the row-wise ops (softmax, the norms) share on the host: shape checks, the pack
//! choice, and one launch routine that plans a path ([`choose::plan`], from the GPU's
//! tuning table, else its fallback) and runs it (or, for the ops' `plan_only`, returns the
//! plan).

pub mod choose;
pub mod dispatch;
pub mod enumerate;
pub mod profiles;
pub mod spec;
pub mod tuning;

use crate::Stream;
use crate::error::{Error, Result, invalid};
use crate::gpu::Owner;
use crate::launch::{LaunchConfig, Tally, active_clusters, count, launch};
use crate::module::{Attributes, Kernel, KernelKey};
use crate::tensor::{Element, View};
use choose::{Ahead, Fallback};
use dispatch::{Occupancies, Problem, RESERVED_SHARED_BYTES, rows_ahead, wave_ahead};
pub use dispatch::{Path, PathKind, Plan};
use foldhash::HashMap;
use rill_kernels_gpu::abi::DType;
use rill_kernels_gpu::abi::{
    CLUSTER_STATIC_SHARED_BYTES, PACK_BYTES, ROW_STATIC_SHARED_BYTES, ROW_WARP_BLOCK_SIZE, RowArgs,
};
use rill_kernels_gpu::layout::column_gather_bytes;
use rill_kernels_gpu::table::{NormKernelKind, RowPath, SoftmaxKind};
use smallvec::SmallVec;
pub use spec::{OpClass, RowSpec};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use tuning::TuningTable;

/// Rows and columns of a tensor normalized over its last axis.
pub(crate) fn rows_cols(op: &str, shape: &[usize]) -> Result<(usize, usize)> {
    let Some((&cols, outer)) = shape.split_last() else {
        invalid!("`{op}` needs at least one dimension (it normalizes the last); got a scalar");
    };
    let rows = outer.iter().product();
    if rows == 0 || cols == 0 {
        invalid!("`{op}` got an empty tensor of shape {shape:?}");
    }
    Ok((rows, cols))
}

/// Checks that `dim` names the last axis of an `ndim`-dimensional tensor (negative counts
/// from the end, as PyTorch): the only layout the row-wise kernels normalize.
pub fn check_last_dim(dim: i64, ndim: usize) -> Result<()> {
    let last = ndim as i64 - 1;
    if dim != -1 && dim != last {
        invalid!(
            "dim {dim}: rill normalizes the last axis of a row-major tensor (dim -1 or {last}); move the axis last first"
        );
    }
    Ok(())
}

pub(crate) fn same_shape(op: &str, what: &str, got: &[usize], want: &[usize]) -> Result<()> {
    if got != want {
        invalid!("`{op}`: {what} has shape {got:?} but must have shape {want:?}");
    }
    Ok(())
}

pub(crate) fn check_aligned(op: &str, what: &str, address: u64, bytes: u64) -> Result<()> {
    if !address.is_multiple_of(bytes) {
        invalid!("`{op}`: {what} is not aligned to its {bytes}-byte elements");
    }
    Ok(())
}

/// The kernels a row call chooses among: rill's own family, or a user's; the path and pack
/// are left to the planner.
#[derive(Clone, Copy)]
pub(crate) enum RowKernels<'a> {
    Library(LibraryKernels),
    /// A user's family in their own module (`crate::fuse`).
    Fused(&'a dyn UserKernels),
}

/// What the engine asks of a user's row kernel family: its kernels, and who its plans are
/// remembered for. `crate::fuse` implements it; the engine knows nothing else of modules.
pub(crate) trait UserKernels {
    /// The family's kernel on `path` at `pack`; `Unsupported` where there is none.
    fn kernel(&self, path: RowPath, pack: usize) -> Result<Kernel>;

    /// Whose kernels these are (their module's [`Owner`], which may unload before the
    /// GPU goes) and the family's place among the owner's families.
    fn owner(&self) -> (Owner, FamilyIndex);
}

/// A fused family's place among its module's families, fixed at load.
pub(crate) type FamilyIndex = u32;

/// One of rill's row kernel families: the op's kind and dtypes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum LibraryKernels {
    Softmax {
        kind: SoftmaxKind,
        dtype: DType,
    },
    /// `dtypes`: x, y, and the weight and bias.
    Norm {
        kind: NormKernelKind,
        dtypes: (DType, DType, DType),
    },
}

impl From<LibraryKernels> for RowKernels<'_> {
    fn from(kernels: LibraryKernels) -> Self {
        RowKernels::Library(kernels)
    }
}

impl RowKernels<'_> {
    /// The kernel on `path` at `pack`; `Unsupported` where there is none.
    pub(crate) fn kernel(self, gpu: &crate::Gpu, path: RowPath, pack: usize) -> Result<Kernel> {
        match self {
            RowKernels::Library(LibraryKernels::Softmax { kind, dtype }) => {
                gpu.modules().kernel(KernelKey::Softmax { kind, path, dtype, pack })
            }
            RowKernels::Library(LibraryKernels::Norm { kind, dtypes }) => {
                gpu.modules().kernel(KernelKey::Norm { kind, path, dtypes, pack })
            }
            RowKernels::Fused(family) => family.kernel(path, pack),
        }
    }

    /// Whether the family has cluster-path kernels (`fused_softmax!` makes none).
    fn has_clusters(self) -> bool {
        !matches!(self, RowKernels::Fused(_))
    }

    /// The family as its remembered plans name it: whose kernels they are (the GPU's for
    /// rill's families) and which.
    fn planned(self, gpu: &crate::Gpu) -> (Owner, PlannedKernels) {
        match self {
            RowKernels::Library(kernels) => (gpu.owner(), PlannedKernels::Library(kernels)),
            RowKernels::Fused(family) => {
                let (owner, index) = family.owner();
                (owner, PlannedKernels::Fused(index))
            }
        }
    }
}

/// A row call's kernels as a [`PlanKey`] names them: rill's family, or a fused family by
/// its place in its module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum PlannedKernels {
    Library(LibraryKernels),
    Fused(FamilyIndex),
}

/// Everything a row call's plan depends on but the device: the kernels, the planner's
/// problem with the op's spec and its packs (before the kernels' limits are asked), and the
/// rows' phase. The arrays' addresses enter only through the packs and the phase.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct PlanKey {
    /// Whose kernels the plan launches: a GPU's, or a user's module's.
    owner: Owner,
    kernels: PlannedKernels,
    ungathered: Option<PlannedKernels>,
    problem: Problem,
    phase: Option<u32>,
}

/// What a row call's plan comes to, but its arguments: the plan, the kernel, whether it
/// gathers the column sums, the attributes its launch sets, and the launch geometry.
#[derive(Clone, Copy)]
struct Planned {
    plan: Plan,
    kernel: Kernel,
    gathers: bool,
    attributes: Option<Attributes>,
    config: LaunchConfig,
}

/// Row plans by [`PlanKey`], so that a call of a shape seen before skips the planner, its
/// kernel lookups and its occupancy questions (each a lock and a hash; docs/DECISIONS.md,
/// "Remembered plans"). Forgotten all at once when full: shapes that vary call by call
/// (rows of every length) must not grow it without bound. The engine keeps one for every
/// GPU and module ([`REMEMBERED`]): a key names its owner, whose identity no later owner
/// takes, so a plan of a dropped GPU or unloaded module is never found again.
#[derive(Default)]
pub(crate) struct RowPlans {
    plans: Mutex<HashMap<PlanKey, Planned>>,
}

/// The engine's remembered plans.
static REMEMBERED: LazyLock<RowPlans> = LazyLock::new(RowPlans::default);

/// Plans a [`RowPlans`] remembers before it starts over.
const REMEMBERED_PLANS: usize = 4096;

impl RowPlans {
    fn get(&self, key: &PlanKey) -> Option<Planned> {
        self.plans.lock().unwrap_or_else(PoisonError::into_inner).get(key).copied()
    }

    fn insert(&self, key: PlanKey, planned: Planned) {
        let mut plans = self.plans.lock().unwrap_or_else(PoisonError::into_inner);
        if plans.len() >= REMEMBERED_PLANS {
            plans.clear();
        }
        plans.insert(key, planned);
    }

    /// Forgets every plan: a GPU's tuning table changed.
    fn forget(&self) {
        self.plans.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }
}

/// How a GPU's row calls are planned: its tuning table (none: no entries), and what plans
/// the calls the table does not.
#[derive(Clone)]
pub(crate) struct Planning {
    table: Option<Arc<TuningTable>>,
    fallback: Fallback,
}

/// Each GPU's planning, by its [`Owner`]: chosen at its first row call ([`default_planning`])
/// unless [`set_tuning_table`] chose first.
static PLANNING: LazyLock<Mutex<HashMap<Owner, Planning>>> = LazyLock::new(Default::default);

/// How a GPU's row calls are planned unless its user sets a table: by the file
/// `RILL_TUNING_TABLE` names (by the ladder alone where it says `ladder`), else by the
/// checked-in table for the device ([`TuningTable::builtin`]), the measured rules planning
/// what a table does not. Read once a process; an error says what is wrong with the file.
fn default_planning(device: &crate::DeviceInfo) -> Result<Planning> {
    static FROM_ENVIRONMENT: LazyLock<Result<Option<Planning>, String>> = LazyLock::new(|| {
        let Some(path) = std::env::var_os("RILL_TUNING_TABLE") else {
            return Ok(None);
        };
        if path == "ladder" {
            return Ok(Some(Planning { table: None, fallback: Fallback::Ladder }));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let table = TuningTable::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Some(Planning { table: Some(Arc::new(table)), fallback: Fallback::Rules }))
    });
    match &*FROM_ENVIRONMENT {
        Ok(Some(planning)) => Ok(planning.clone()),
        Ok(None) => Ok(Planning { table: TuningTable::builtin(device).map(Arc::new), fallback: Fallback::Rules }),
        Err(error) => Err(Error::InvalidInput(format!("RILL_TUNING_TABLE={error}"))),
    }
}

/// How `gpu`'s row calls are planned.
fn planning(gpu: &crate::Gpu) -> Result<Planning> {
    let mut plannings = PLANNING.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(planning) = plannings.get(&gpu.owner()) {
        return Ok(planning.clone());
    }
    let planning = default_planning(gpu.info())?;
    plannings.insert(gpu.owner(), planning.clone());
    Ok(planning)
}

/// The tuning table `gpu`'s row calls are planned by; `None` where there is none.
pub fn tuning_table(gpu: &crate::Gpu) -> Result<Option<Arc<TuningTable>>> {
    Ok(planning(gpu)?.table)
}

/// Plans `gpu`'s row calls by `table` from now on (`None`: by none), instead of the
/// checked-in table for the device or the one `RILL_TUNING_TABLE` names; calls the table
/// has no entry for, and those whose entry's plan does not fit them, are planned by rill's
/// rules. Plans made before are forgotten.
pub fn set_tuning_table(gpu: &crate::Gpu, table: Option<TuningTable>) {
    let planning = Planning { table: table.map(Arc::new), fallback: Fallback::Rules };
    PLANNING.lock().unwrap_or_else(PoisonError::into_inner).insert(gpu.owner(), planning);
    REMEMBERED.forget();
}

/// (address, element bytes) of a row call's arrays, inline up to the six rill's own ops
/// pass, so a call allocates nothing for them (a user's fused kernels with more spill to
/// the heap).
pub(crate) type RowArrays = SmallVec<[(u64, usize); 6]>;

/// (address, element bytes) of a row call's per-column arrays: a norm's weight and bias.
pub(crate) type ColumnArrays = SmallVec<[(u64, usize); 2]>;

/// One launch of a row-wise kernel, before planning: the op's spec, its arrays' addresses
/// and its kernels' arguments.
pub(crate) struct RowCall<'a, A: RowArgs> {
    pub op: &'a str,
    pub kernels: RowKernels<'a>,
    /// What the planner must know of the op (the one thing about it the op declares).
    pub spec: RowSpec,
    pub rows: usize,
    pub cols: usize,
    /// (address, element bytes) of every array read or written in packs along the row; the
    /// pack is the widest only if all are aligned to it (or to 16 bytes, for wider types).
    pub arrays: RowArrays,
    /// (address, element bytes) of per-column arrays (a norm's weight and bias) read in packs
    /// beside the row's on the aligned plans; the phased kernels read them from aligned
    /// shifted copies (16-bit rows) or an element at a time (f32 rows), so their offset does
    /// not take part in the rows' phase.
    pub columns: ColumnArrays,
    pub args: A,
    /// Kernels that gather nothing, planned with where the gathering ones have no kernel on
    /// the path the planner picks ([`Prepared::gathers`] then says so).
    pub ungathered: Option<RowKernels<'a>>,
    force: Option<PathKind>,
    /// Whether to launch the plan, or only return it (`plan_only` on the ops): everything
    /// before the launch (checks, occupancy questions, the kernel's lookup) runs either way,
    /// so the answer and its errors are the launch's; the kernel it would launch is counted
    /// as planned ([`crate::count_launches`]).
    launch: bool,
    pub stream: &'a Stream,
}

impl<'a, A: RowArgs> RowCall<'a, A> {
    /// A call of the op `spec` describes over the rows of `x` (an error where it has none),
    /// its only array so far.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new<T: Element>(
        stream: &'a Stream,
        op: &'a str,
        kernels: RowKernels<'a>,
        spec: RowSpec,
        x: &View<'_, T>,
        args: A,
        force: Option<PathKind>,
        launch: bool,
    ) -> Result<Self> {
        let shape = rows_cols(op, x.shape())?;
        let mut call = RowCall::over(stream, op, kernels, spec, shape, args, force, launch);
        call.arrays.push((x.address(), size_of::<T>()));
        Ok(call)
    }

    /// A call of the op `spec` describes over `rows x cols`, with no arrays yet.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn over(
        stream: &'a Stream,
        op: &'a str,
        kernels: RowKernels<'a>,
        spec: RowSpec,
        (rows, cols): (usize, usize),
        args: A,
        force: Option<PathKind>,
        launch: bool,
    ) -> Self {
        RowCall {
            op,
            kernels,
            spec,
            rows,
            cols,
            arrays: RowArrays::new(),
            columns: ColumnArrays::new(),
            args,
            ungathered: None,
            force,
            launch,
            stream,
        }
    }

    /// The widest row the planner's rules give the warp path for this op.
    pub(crate) fn warp_max_cols(&self) -> usize {
        dispatch::warp_max_cols(&self.spec)
    }

    /// Whether the row length and every array allow the widest pack.
    pub(crate) fn aligned(&self) -> bool {
        let widest = self.spec.widest;
        self.cols.is_multiple_of(widest)
            && (self.arrays.iter().chain(&self.columns))
                .all(|&(address, bytes)| address % (widest * bytes).min(PACK_BYTES) as u64 == 0)
    }

    /// Whether the block paths may run the rows from their heads in the widest pack: the
    /// call allows it and every array starts at one offset from 16 bytes.
    pub(crate) fn shares_phase(&self) -> bool {
        self.spec.runs_from_heads && shared_phase(&self.arrays, self.spec.widest).is_some()
    }

    /// Plans the call and runs it (or, for `plan_only`, only plans it).
    pub(crate) fn run(self) -> Result<Plan> {
        self.prepare()?.launch()
    }

    /// Plans the call and readies its launch: the kernel looked up and its attributes set,
    /// the arguments' shape filled in; [`Prepared::launch`] launches it. A plan comes from
    /// memory where an earlier call had the same key ([`PlanKey`], [`RowKernels::plans`]).
    pub(crate) fn prepare(mut self) -> Result<Prepared<'a, A>> {
        let widest = self.spec.widest;
        let aligned = self.aligned();
        let pack = if aligned { widest } else { 1 };
        let phase = if self.spec.runs_from_heads { shared_phase(&self.arrays, widest) } else { None };
        let block_pack = if aligned || phase.is_some() { widest } else { 1 };
        let (rows, cols, spec, force) = (self.rows, self.cols, self.spec, self.force);
        // The kernels' thread limit is asked by `plan`.
        let problem = Problem { rows, cols, pack, block_pack, block_limit: 0, spec, force };
        let gpu = self.stream.gpu();
        let (owner, kernels) = self.kernels.planned(gpu);
        let ungathered = self.ungathered.map(|kernels| kernels.planned(gpu).1);
        let key = PlanKey { owner, kernels, ungathered, problem, phase };
        let planned = match REMEMBERED.get(&key) {
            Some(planned) => planned,
            None => {
                let planned = self.plan(&problem, self.kernels, self.ungathered)?;
                REMEMBERED.insert(key, planned);
                planned
            }
        };
        let Planned { plan, kernel, gathers, attributes, config } = planned;
        if !self.launch {
            count(Tally::Planned, kernel.symbol);
            return Ok(Prepared { plan, args: self.args, gathers, launch: None });
        }
        if let Some(attributes) = attributes {
            gpu.bind()?;
            gpu.modules().set_attributes(kernel, attributes)?;
        }
        let shape = self.args.shape_mut();
        shape.rows = rows as u64;
        shape.cols = cols as u64;
        shape.phase = if plan.phased { phase.unwrap_or(0) } else { 0 };
        shape.ahead = plan.ahead;
        shape.stages = plan.stages;
        if let Path::Warp { width, .. } = plan.path {
            shape.width = width;
        }
        Ok(Prepared { plan, args: self.args, gathers, launch: Some((self.stream, kernel, config)) })
    }

    /// Plans `problem` with `kernels` (gathering its spec's column sums, else planned again
    /// with `ungathered`), asking the driver what it has not answered before.
    fn plan(&self, problem: &Problem, kernels: RowKernels<'a>, ungathered: Option<RowKernels<'a>>) -> Result<Planned> {
        let &Problem { pack, block_pack, spec, .. } = problem;
        let column_sums = spec.column_sums;
        let phased = block_pack > pack;
        let gpu = self.stream.gpu();
        let capacity = gpu.info().max_shared_bytes_per_multiprocessor;
        gpu.bind()?;
        let kernel_for = |plan: &Plan| -> Result<Kernel> {
            let path = plan.row_path();
            kernels.kernel(gpu, path, plan.pack).map_err(|error| {
                error.reword_unsupported(|| format!("no `{}` kernel for these dtypes on the {path:?} path", self.op))
            })
        };
        // Asked only when the planner considers the shared path: with the carveout that
        // leaves the column data its L1 room where that comes first, else with all of the
        // SM's shared memory (the launch then leaves L1 what the blocks do not need).
        let first_carveout =
            if spec.columns_before_blocks { shared_carveout(0, spec.column_bytes, capacity) } else { 100 };
        let block_kernel = |path| kernel_for(&Plan { path, pack: block_pack, phased, grid: 1, ahead: 0, stages: 1 });
        let shared = |block: u32, bytes: u32| {
            let shared = block_kernel(Path::Shared { block, shared_bytes: bytes })?;
            let attributes =
                Attributes { dynamic_shared: bytes.max(ROW_STATIC_SHARED_BYTES), carveout: Some(first_carveout) };
            gpu.modules().blocks_per_multiprocessor(shared, (block, bytes), attributes)
        };
        // Asked only on GPUs with clusters, when a row does not fit one block; a family
        // without cluster kernels resides no clusters.
        let cluster = |cluster: u32, block: u32, bytes: u32| {
            if !kernels.has_clusters() {
                return Ok(0);
            }
            let kernel = block_kernel(Path::Cluster { cluster, block, shared_bytes: bytes })?;
            if block > kernel.max_threads_per_block {
                return Ok(0);
            }
            gpu.modules().resident_clusters(kernel, (cluster, block, bytes), || {
                gpu.modules().set_attributes(kernel, cluster_attributes(bytes))?;
                active_clusters(kernel, LaunchConfig { grid: cluster, block, shared_bytes: bytes, cluster })
            })
        };
        let threads = |path| block_kernel(path).map(|kernel| kernel.max_threads_per_block);
        let block_limit = if column_sums > 0 {
            threads(Path::Shared { block: 0, shared_bytes: 0 })?
        } else {
            threads(Path::Uncached { block: 0 })?.min(threads(Path::Shared { block: 0, shared_bytes: 0 })?)
        };
        let problem = Problem { block_limit, ..*problem };
        let occupancy = Occupancies { shared: &shared, cluster: &cluster };
        let Planning { table, fallback } = planning(gpu)?;
        let (mut plan, ahead) = choose::plan(&problem, gpu.info(), occupancy, table.as_deref(), fallback)?;
        let kernel = match (kernel_for(&plan), ungathered) {
            // The gathering kernels have none on the path planned (the op's estimate of where
            // they run did not hold on this device): planned again with kernels that gather
            // nothing, the op then sums the columns another way.
            (Err(Error::Unsupported(_)), Some(kernels)) if column_sums > 0 => {
                return self.plan(&Problem { spec: spec.ungathered(), ..problem }, kernels, None);
            }
            (kernel, _) => kernel?,
        };
        // The warp path's gathered sums: a partial row for each lane group of a block.
        let gathered_bytes = match plan.path {
            Path::Warp { width, .. } if column_sums > 0 => {
                column_gather_bytes(ROW_WARP_BLOCK_SIZE / width, column_sums, problem.cols as u64) as u32
            }
            _ => 0,
        };
        // The planned kernel with those sums' shared memory (none off the warp path): blocks
        // an SM of `block` threads, for the gathering grid and the rows requested ahead.
        let sums_attributes = Attributes { dynamic_shared: gathered_bytes, carveout: None };
        let blocks_an_sm =
            |block| gpu.modules().blocks_per_multiprocessor(kernel, (block, gathered_bytes), sums_attributes);
        if column_sums > 0 {
            // One wave of resident blocks (or clusters), a partial row each.
            let sms = gpu.info().multiprocessors;
            let resident_blocks = match plan.path {
                Path::Cluster { cluster: blocks, block, shared_bytes } => {
                    cluster(blocks, block, shared_bytes)?.max(1) * blocks
                }
                Path::Shared { block, shared_bytes } => shared(block, shared_bytes)?.max(1) * sms,
                _ => blocks_an_sm(plan.block())?.max(1) * sms,
            };
            plan.grid = plan.grid.min(resident_blocks);
        }
        let attributes = match plan.path {
            Path::Shared { block, shared_bytes, .. } => {
                let resident = if spec.columns_before_blocks { 0 } else { shared(block, shared_bytes)? };
                let needed = resident * (shared_bytes + ROW_STATIC_SHARED_BYTES + RESERVED_SHARED_BYTES);
                let carveout = shared_carveout(needed, spec.column_bytes, capacity);
                Some(Attributes { dynamic_shared: shared_bytes.max(ROW_STATIC_SHARED_BYTES), carveout: Some(carveout) })
            }
            Path::Cluster { shared_bytes, .. } => Some(cluster_attributes(shared_bytes)),
            // Its gathered sums: the kernel's allowance may be another call's (an occupancy
            // answered from memory sets nothing).
            Path::Warp { .. } if gathered_bytes > 0 => Some(sums_attributes),
            _ => None,
        };
        let resident = || blocks_an_sm(plan.block());
        plan.ahead = match ahead {
            Ahead::None => 0,
            Ahead::Wave => wave_ahead(&problem, &plan, gpu.info(), resident)?,
            Ahead::ByRules => rows_ahead(&problem, &plan, gpu.info(), resident)?,
        };
        let config = LaunchConfig {
            grid: plan.grid,
            block: plan.block(),
            shared_bytes: plan.shared_bytes() + gathered_bytes,
            cluster: plan.cluster(),
        };
        Ok(Planned { plan, kernel, gathers: column_sums > 0, attributes, config })
    }
}

/// A planned row call, ready to launch ([`RowCall::prepare`]).
pub(crate) struct Prepared<'a, A> {
    pub plan: Plan,
    /// The kernel's arguments, which the op may still complete (a partial array sized by
    /// the plan's grid).
    pub args: A,
    /// Whether the kernel gathers the column sums of the call's spec ([`RowSpec::column_sums`]).
    pub gathers: bool,
    /// The stream, kernel and geometry; `None` for a call that only plans.
    launch: Option<(&'a Stream, Kernel, LaunchConfig)>,
}

impl<A: Copy> Prepared<'_, A> {
    /// Whether [`Prepared::launch`] launches anything.
    pub(crate) fn launches(&self) -> bool {
        self.launch.is_some()
    }

    /// Launches the call; returns its plan.
    pub(crate) fn launch(self) -> Result<Plan> {
        if let Some((stream, kernel, config)) = self.launch {
            // SAFETY: the symbol takes `A` for this op's dtypes and pack; the op checked every
            // array to hold its rows x cols elements (per-row arrays `rows`, per-column arrays
            // `cols`, a partial array a row per block of the grid), and `arrays` to be aligned
            // to the pack; the geometry is the plan's, with shared memory for what the kernel
            // gathers.
            unsafe { launch(stream, kernel, config, &self.args)? };
        }
        Ok(self.plan)
    }
}

/// A cluster kernel's attributes for `shared_bytes` of dynamic shared memory (no carveout
/// preference).
fn cluster_attributes(shared_bytes: u32) -> Attributes {
    Attributes { dynamic_shared: shared_bytes.max(CLUSTER_STATIC_SHARED_BYTES), carveout: None }
}

/// The elements by which every array of `arrays` starts past a 16-byte boundary, where
/// they all share it and packs of `widest` (more than one element) are 16 bytes.
fn shared_phase(arrays: &[(u64, usize)], widest: usize) -> Option<u32> {
    let &(first, bytes) = arrays.first()?;
    let phase = first % PACK_BYTES as u64;
    let shared = widest > 1
        && widest * bytes == PACK_BYTES
        && phase.is_multiple_of(bytes as u64)
        && arrays.iter().all(|&(address, b)| b == bytes && address % PACK_BYTES as u64 == phase);
    shared.then_some((phase / bytes as u64) as u32)
}

/// The shared-memory carveout (percent of the SM's `capacity`) leaving `column_bytes` of
/// L1 (all of it shared memory where nothing needs L1), unless the resident blocks need
/// more (`needed` bytes): then all of it, since the driver rounds a preference to one of
/// its configurations and could round below their need. Reserving L1 for a norm's wide gamma and
/// beta can cost the shared path resident blocks, which it needs more; the residual-add forwards
/// run faster with the room than with the blocks, so they keep it first (docs/DECISIONS.md, "The
/// L1 carveout for column data").
fn shared_carveout(needed: u32, column_bytes: u32, capacity: u32) -> u32 {
    let room = capacity.saturating_sub(column_bytes);
    if needed > room { 100 } else { (room as u64 * 100 / capacity.max(1) as u64) as u32 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_kernels_gpu::abi::RowShape;
    use rill_kernels_gpu::layout::{cluster_part_cols, part_edge_col, part_packs, slab_run_words};

    #[test]
    fn carveout_leaves_room_for_column_data_but_not_at_the_blocks_cost() {
        let capacity = 228 * 1024;
        assert_eq!(shared_carveout(0, 0, capacity), 100);
        assert_eq!(shared_carveout(0, 57 * 1024, capacity), 75);
        assert_eq!(shared_carveout(0, 1 << 30, capacity), 0);
        // Three blocks of 64 KB (and their reserved and static bytes) outrank 128 KB of gamma
        // and beta.
        let three_rows = 3 * (65536 + ROW_STATIC_SHARED_BYTES + RESERVED_SHARED_BYTES);
        assert_eq!(shared_carveout(three_rows, 128 * 1024, capacity), 100);
        assert_eq!(shared_carveout(4 * 1024, 8 * 1024, capacity), 96);
    }

    #[test]
    fn aligned_packs_and_edges_cover_every_row_once() {
        for pack in [1u64, 4, 8] {
            for phase in 0..pack as u32 {
                for cols in [1u64, 2, 3, 7, 8, 9, 15, 16, 17, 33, 1000, 4097, 50257] {
                    let shape = RowShape { rows: 0, cols, width: 0, phase, ahead: 0, stages: 0 };
                    assert!(shape.edges(pack) <= 2 * pack - 2, "{shape:?} pack {pack}");
                    if phase == 0 && cols.is_multiple_of(pack) {
                        assert_eq!(shape.edges(pack), 0);
                    }
                    for row in 0..3 * pack {
                        let head = shape.head(row, pack);
                        let mut seen = vec![0; cols as usize];
                        for k in 0..shape.aligned_packs(pack) {
                            let col = head + k * pack;
                            assert!((phase as u64 + row * cols + col).is_multiple_of(pack));
                            (col..col + pack).for_each(|c| seen[c as usize] += 1);
                        }
                        let packs = shape.aligned_packs(pack) as u32;
                        for edge in 0..shape.edges(pack) as u32 {
                            seen[part_edge_col(0, packs, head as u32, pack as u32, edge) as usize] += 1;
                        }
                        assert!(seen.iter().all(|&n| n == 1), "{shape:?} pack {pack} row {row}: {seen:?}");
                    }
                }
            }
        }
    }

    /// The runs in which the kernels add a pack's terms to the gathered sums of rows run
    /// from their heads cover each of its words once, each aligned to its bytes.
    #[test]
    fn slab_runs_cover_a_pack_once_each_aligned_to_its_bytes() {
        for q in [1usize, 4, 8] {
            for shift in 0..4 {
                for widest in [1usize, 4] {
                    let mut covered = vec![0; q];
                    for start in 0..q {
                        let words = slab_run_words(shift, start, q, widest);
                        assert!(words <= widest && start + words <= q, "{q} {shift} {widest} {start}");
                        assert!((shift + start).is_multiple_of(words.max(1)), "{q} {shift} {widest} {start}");
                        covered[start..start + words].iter_mut().for_each(|n| *n += 1);
                    }
                    assert!(covered.iter().all(|&n| n == 1), "{q} {shift} {widest}: {covered:?}");
                }
            }
        }
        // A pack of 8 words from one past 16 bytes: 1, 2, 4 and 1.
        let runs: Vec<usize> = (0..8).map(|start| slab_run_words(1, start, 8, 4)).filter(|&w| w > 0).collect();
        assert_eq!(runs, [1, 2, 4, 1]);
    }

    /// A cluster's blocks split each row into parts of whole packs of columns; each block
    /// takes its part's aligned packs from the row's head on and its other elements one at
    /// a time, so every column is one block's, in every row, whatever its head, and no part
    /// outgrows what the planner sizes a block's shared memory for (every pack of a part
    /// where the width is a multiple of the pack, whatever the head).
    #[test]
    fn cluster_parts_cover_every_column_once_each_within_its_block() {
        for pack in [1u64, 4, 8] {
            for phase in 0..pack as u32 {
                for cols in [1u64, 7, 9, 17, 33, 1000, 4096, 4097, 32001, 50257] {
                    let shape = RowShape { rows: 0, cols, width: 0, phase, ahead: 0, stages: 0 };
                    for ranks in [2u32, 3, 4, 8, 16] {
                        let each = cluster_part_cols(cols, pack, ranks);
                        assert!(each.is_multiple_of(pack) && each * ranks as u64 >= cols);
                        for row in 0..2 * pack {
                            let head = shape.head(row, pack);
                            let mut seen = vec![0; cols as usize];
                            for rank in 0..ranks {
                                let (first, part, packs) = shape.cluster_part(pack, rank, ranks);
                                assert!(part <= each && packs <= part_packs(each, pack, cols.is_multiple_of(pack)));
                                assert!(part - packs * pack <= 2 * pack - 2, "{shape:?} {rank}/{ranks}");
                                let mut mark = |col: u64| {
                                    assert!((first..first + part).contains(&col), "{shape:?} {rank}/{ranks}");
                                    seen[col as usize] += 1;
                                };
                                for k in 0..packs {
                                    let col = first + head + k * pack;
                                    assert!((phase as u64 + row * cols + col).is_multiple_of(pack));
                                    (col..col + pack).for_each(&mut mark);
                                }
                                let edge_col = |edge| {
                                    part_edge_col(first as u32, packs as u32, head as u32, pack as u32, edge) as u64
                                };
                                for edge in 0..(part - packs * pack) as u32 {
                                    mark(edge_col(edge));
                                }
                            }
                            assert!(seen.iter().all(|&n| n == 1), "{shape:?} {ranks} row {row}: {seen:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn arrays_share_a_phase_only_at_one_offset_from_16_bytes() {
        assert_eq!(shared_phase(&[(0x1000, 2), (0x2000, 2)], 8), Some(0));
        assert_eq!(shared_phase(&[(0x1006, 2), (0x2006, 2), (0x3016, 2)], 8), Some(3));
        assert_eq!(shared_phase(&[(0x100c, 4), (0x201c, 4)], 4), Some(3));
        assert_eq!(shared_phase(&[(0x1002, 2), (0x2004, 2)], 8), None);
        assert_eq!(shared_phase(&[(0x1001, 2)], 8), None);
        assert_eq!(shared_phase(&[(0x1000, 2)], 1), None);
        assert_eq!(shared_phase(&[], 8), None);
    }

    #[test]
    fn plans_are_remembered_by_key_and_forgotten_all_at_once_when_full() {
        let plans = RowPlans::default();
        let owner = Owner::new();
        let key = |rows| PlanKey {
            owner,
            kernels: PlannedKernels::Library(LibraryKernels::Softmax { kind: SoftmaxKind::Forward, dtype: DType::F32 }),
            ungathered: None,
            problem: dispatch::tests::problem(rows, 1024, 4),
            phase: None,
        };
        let plan = Plan { path: Path::Uncached { block: 256 }, pack: 4, phased: false, grid: 1, ahead: 0, stages: 1 };
        let kernel = Kernel { function: std::ptr::null_mut(), symbol: "softmax", max_threads_per_block: 1024 };
        let config = LaunchConfig { grid: 1, block: 256, shared_bytes: 0, cluster: 1 };
        let planned = Planned { plan, kernel, gathers: false, attributes: None, config };
        plans.insert(key(1), planned);
        assert!(plans.get(&key(1)).is_some_and(|found| found.plan == plan));
        assert!(plans.get(&key(2)).is_none());
        assert!(plans.get(&PlanKey { phase: Some(3), ..key(1) }).is_none());
        assert!(plans.get(&PlanKey { kernels: PlannedKernels::Fused(0), ..key(1) }).is_none());
        // Another GPU's (or module's) plans.
        assert!(plans.get(&PlanKey { owner: Owner::new(), ..key(1) }).is_none());
        (2..=REMEMBERED_PLANS).for_each(|rows| plans.insert(key(rows), planned));
        assert!(plans.get(&key(1)).is_some());
        plans.insert(key(REMEMBERED_PLANS + 1), planned);
        assert!(plans.get(&key(1)).is_none());
        assert!(plans.get(&key(REMEMBERED_PLANS + 1)).is_some());
    }

    #[test]
    fn only_the_last_axis_is_accepted() {
        assert!(check_last_dim(-1, 3).is_ok());
        assert!(check_last_dim(2, 3).is_ok());
        assert!(check_last_dim(1, 3).is_err());
        assert!(check_last_dim(-2, 3).is_err());
    }

    #[test]
    fn empty_and_scalar_tensors_are_rejected() {
        assert!(rows_cols("softmax", &[]).is_err());
        assert!(rows_cols("softmax", &[4, 0]).is_err());
        assert!(rows_cols("softmax", &[0, 4]).is_err());
        assert_eq!(rows_cols("softmax", &[2, 3, 5]).unwrap(), (6, 5));
    }
}
