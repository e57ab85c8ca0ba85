//! The PTX modules, embedded at build time and loaded once each, on first use.

use crate::error::{DriverContext, Error, Result};
use cust::module::Module;
use cust::sys::{
    CUfunction, CUfunction_attribute, cuFuncGetAttribute, cuFuncSetAttribute,
    cuOccupancyMaxActiveBlocksPerMultiprocessor,
};
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Mutex;

/// The PTX modules of the device crate (one per op family).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PtxModule {
    Elementwise,
    Softmax,
    Norm,
    /// The RMSNorm optimization ladder: naive kernels the benchmark compares against.
    NormLadder,
    /// The cluster path of softmax and the norms, built for sm_90: loaded only on GPUs with
    /// thread-block clusters.
    Cluster,
}

impl PtxModule {
    pub const ALL: [PtxModule; 5] =
        [PtxModule::Elementwise, PtxModule::Softmax, PtxModule::Norm, PtxModule::NormLadder, PtxModule::Cluster];

    pub fn name(self) -> &'static str {
        match self {
            PtxModule::Elementwise => "elementwise",
            PtxModule::Softmax => "softmax",
            PtxModule::Norm => "norm",
            PtxModule::NormLadder => "norm_ladder",
            PtxModule::Cluster => "cluster",
        }
    }

    /// The module's PTX text, as the builder produced it.
    pub fn ptx(self) -> &'static str {
        match self {
            PtxModule::Elementwise => include_str!(concat!(env!("OUT_DIR"), "/elementwise.ptx")),
            PtxModule::Softmax => include_str!(concat!(env!("OUT_DIR"), "/softmax.ptx")),
            PtxModule::Norm => include_str!(concat!(env!("OUT_DIR"), "/norm.ptx")),
            PtxModule::NormLadder => include_str!(concat!(env!("OUT_DIR"), "/norm_ladder.ptx")),
            PtxModule::Cluster => include_str!(concat!(env!("OUT_DIR"), "/cluster.ptx")),
        }
    }
}

/// A kernel's function handle, valid while its module is loaded (as long as the `Gpu`),
/// with its thread limit, read once at lookup.
#[derive(Clone, Copy)]
pub(crate) struct Kernel {
    pub(crate) function: CUfunction,
    /// Its PTX symbol, the name its launches' NVTX ranges carry.
    pub(crate) symbol: &'static str,
    /// The most threads per block it launches with (its registers decide).
    pub(crate) max_threads_per_block: u32,
}

// SAFETY: a CUfunction is a handle the driver lets any thread use within its context.
unsafe impl Send for Kernel {}

impl Kernel {
    fn new(function: CUfunction, symbol: &'static str) -> Result<Kernel> {
        let mut threads = 0i32;
        // SAFETY: writes one int for a loaded function.
        unsafe {
            cuFuncGetAttribute(&mut threads, CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function)
                .during("cuFuncGetAttribute")?;
        }
        Ok(Kernel { function, symbol, max_threads_per_block: threads.max(0) as u32 })
    }

    /// Lets the kernel launch with `bytes` of dynamic shared memory (above the default 48 KB).
    pub(crate) fn allow_dynamic_shared(self, bytes: u32) -> Result<()> {
        let attribute = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        // SAFETY: sets an attribute of a loaded function.
        unsafe { cuFuncSetAttribute(self.function, attribute, bytes as i32).during("cuFuncSetAttribute") }
    }

    /// Asks for `percent` of the SM's shared-memory capacity as shared memory, the rest as
    /// L1 cache (a preference the driver may round).
    pub(crate) fn prefer_shared_carveout(self, percent: u32) -> Result<()> {
        let attribute = CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT;
        // SAFETY: sets an attribute of a loaded function.
        unsafe { cuFuncSetAttribute(self.function, attribute, percent.min(100) as i32).during("cuFuncSetAttribute") }
    }

    /// Blocks of `block` threads and `shared_bytes` of dynamic shared memory the kernel keeps
    /// resident per multiprocessor (the occupancy API).
    pub(crate) fn blocks_per_multiprocessor(self, block: u32, shared_bytes: u32) -> Result<u32> {
        let mut blocks = 0i32;
        // SAFETY: writes one int for a loaded function.
        unsafe {
            cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut blocks,
                self.function,
                block as i32,
                shared_bytes as usize,
            )
            .during("cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
        }
        Ok(blocks.max(0) as u32)
    }
}

#[derive(Default)]
pub(crate) struct Modules {
    loaded: Mutex<HashMap<PtxModule, Module>>,
    kernels: Mutex<HashMap<&'static str, Kernel>>,
    /// Resident clusters by kernel, cluster size, block size and shared bytes: the planner
    /// weighs every cluster size on each call, and the driver's answer never changes.
    resident_clusters: Mutex<HashMap<ClusterShape, u32>>,
}

/// A kernel's symbol, cluster size, block size and dynamic shared bytes.
type ClusterShape = (&'static str, u32, u32, u32);

impl Modules {
    /// The kernel `symbol` of `module`, loading the module on first use. The caller has made
    /// the module's context current.
    pub(crate) fn kernel(&self, module: PtxModule, symbol: &'static str) -> Result<Kernel> {
        let mut kernels = self.kernels.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(kernel) = kernels.get(symbol) {
            return Ok(*kernel);
        }
        let mut loaded = self.loaded.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let loaded_module = match loaded.entry(module) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => entry.insert(Module::from_ptx(module.ptx(), &[]).during("cuModuleLoadData")?),
        };
        let function = loaded_module
            .get_function(symbol)
            .map_err(|_| Error::Unsupported(format!("kernel `{symbol}` is not in PTX module `{}`", module.name())))?;
        let kernel = Kernel::new(function.to_raw(), symbol)?;
        kernels.insert(symbol, kernel);
        Ok(kernel)
    }

    /// Clusters of `cluster` blocks of `block` threads and `shared_bytes` each that `kernel`
    /// keeps resident: `ask`'s answer, asked once per shape.
    pub(crate) fn resident_clusters(
        &self,
        kernel: Kernel,
        (cluster, block, shared_bytes): (u32, u32, u32),
        ask: impl FnOnce() -> Result<u32>,
    ) -> Result<u32> {
        let key = (kernel.symbol, cluster, block, shared_bytes);
        if let Some(&resident) =
            self.resident_clusters.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(&key)
        {
            return Ok(resident);
        }
        let resident = ask()?;
        self.resident_clusters.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(key, resident);
        Ok(resident)
    }
}
