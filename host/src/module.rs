//! The PTX modules, embedded at build time and loaded once each, on first use, and the
//! function handles of their kernels, cached per [`KernelKey`].

use crate::driver::LoadedModule;
use crate::driver::sys::{
    CUfunction, CUfunction_attribute, cuFuncGetAttribute, cuFuncSetAttribute,
    cuOccupancyMaxActiveBlocksPerMultiprocessor,
};
use crate::error::{DriverContext, Error, Result};
use foldhash::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Mutex, PoisonError};

pub use rill_kernels_gpu::table::{KernelKey, Module};

/// The text of PTX module `module`, as the builder produced it; `None` for the RMSNorm
/// ladder unless the `norm-ladder` feature embeds it (the benchmark's comparators are not
/// part of the library).
pub fn ptx(module: Module) -> Option<&'static str> {
    match module {
        Module::Elementwise => Some(include_str!(concat!(env!("OUT_DIR"), "/elementwise.ptx"))),
        Module::Softmax => Some(include_str!(concat!(env!("OUT_DIR"), "/softmax.ptx"))),
        Module::Norm => Some(include_str!(concat!(env!("OUT_DIR"), "/norm.ptx"))),
        #[cfg(feature = "norm-ladder")]
        Module::NormLadder => Some(include_str!(concat!(env!("OUT_DIR"), "/norm_ladder.ptx"))),
        #[cfg(not(feature = "norm-ladder"))]
        Module::NormLadder => None,
        Module::Cluster => Some(include_str!(concat!(env!("OUT_DIR"), "/cluster.ptx"))),
        Module::BatchNorm => Some(include_str!(concat!(env!("OUT_DIR"), "/batch_norm.ptx"))),
    }
}

/// The machine code of PTX module `module` for sm_`arch`, compiled from its PTX by `ptxas`
/// where it ships for that arch (`host/kernels/`); `None` where it does not, or this build's
/// PTX is not the shipped one.
fn cubin(module: Module, arch: u32) -> Option<&'static [u8]> {
    macro_rules! embedded {
        ($module:literal, $arch:literal) => {
            include_bytes!(concat!(env!("OUT_DIR"), "/", $module, ".sm_", $arch, ".cubin")).as_slice()
        };
    }
    let bytes = match (module, arch) {
        (Module::Elementwise, 80) => embedded!("elementwise", "80"),
        (Module::Elementwise, 90) => embedded!("elementwise", "90"),
        (Module::Softmax, 80) => embedded!("softmax", "80"),
        (Module::Softmax, 90) => embedded!("softmax", "90"),
        (Module::Norm, 80) => embedded!("norm", "80"),
        (Module::Norm, 90) => embedded!("norm", "90"),
        #[cfg(feature = "norm-ladder")]
        (Module::NormLadder, 80) => embedded!("norm_ladder", "80"),
        #[cfg(feature = "norm-ladder")]
        (Module::NormLadder, 90) => embedded!("norm_ladder", "90"),
        (Module::Cluster, 90) => embedded!("cluster", "90"),
        (Module::BatchNorm, 80) => embedded!("batch_norm", "80"),
        (Module::BatchNorm, 90) => embedded!("batch_norm", "90"),
        _ => &[],
    };
    (!bytes.is_empty()).then_some(bytes)
}

/// The machine code of `module` a GPU of compute capability `(major, minor)` runs: of its
/// major arch and the newest minor up to its own (machine code runs on later minors of its
/// major, never across majors).
fn cubin_for(module: Module, (major, minor): (u32, u32)) -> Option<&'static [u8]> {
    (0..=minor).rev().find_map(|minor| cubin(module, 10 * major + minor))
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
    pub(crate) fn new(function: CUfunction, symbol: &'static str) -> Result<Kernel> {
        let mut threads = 0i32;
        // SAFETY: writes one int for a loaded function.
        unsafe {
            cuFuncGetAttribute(&mut threads, CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function)
                .during("cuFuncGetAttribute")?;
        }
        Ok(Kernel { function, symbol, max_threads_per_block: threads.max(0) as u32 })
    }

    /// Lets the kernel launch with `bytes` of dynamic shared memory (above the default 48 KB).
    fn allow_dynamic_shared(self, bytes: u32) -> Result<()> {
        let attribute = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        // SAFETY: sets an attribute of a loaded function.
        unsafe { cuFuncSetAttribute(self.function, attribute, bytes as i32).during("cuFuncSetAttribute") }
    }

    /// Asks for `percent` of the SM's shared-memory capacity as shared memory, the rest as
    /// L1 cache (a preference the driver may round).
    fn prefer_shared_carveout(self, percent: u32) -> Result<()> {
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

    /// Blocks the whole device keeps resident: [`Kernel::blocks_per_multiprocessor`] on
    /// every multiprocessor, at least one each (a grid of one resident wave).
    pub(crate) fn resident_blocks(self, block: u32, shared_bytes: u32, device: &crate::DeviceInfo) -> Result<u32> {
        Ok(self.blocks_per_multiprocessor(block, shared_bytes)?.max(1) * device.multiprocessors)
    }
}

/// The attributes a launch sets on a kernel: the dynamic shared memory it may take and,
/// where it has a preference, the shared-memory carveout (percent of the SM's capacity).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Attributes {
    pub(crate) dynamic_shared: u32,
    pub(crate) carveout: Option<u32>,
}

/// What rill set on a kernel, and asked the driver about it, so that a call asks again
/// nothing the driver has answered: the row planner's attribute settings and occupancy questions
/// were much of a small call's host time (docs/DECISIONS.md, "Remembered plans").
#[derive(Default)]
struct FunctionState {
    dynamic_shared: Option<u32>,
    carveout: Option<u32>,
    /// Blocks per multiprocessor by block size, dynamic shared bytes and attributes.
    occupancy: HashMap<(u32, u32, Attributes), u32>,
    /// Resident clusters by cluster size, block size and shared bytes: the planner weighs
    /// every cluster size on each call, and the driver's answer never changes.
    clusters: HashMap<(u32, u32, u32), u32>,
}

pub(crate) struct Modules {
    /// The GPU's, which picks the machine code a module loads; `None` where `RILL_LOAD_PTX`
    /// asks for the PTX alone (to time the driver's compile of it).
    compute_capability: Option<(u32, u32)>,
    loaded: Mutex<HashMap<Module, LoadedModule>>,
    kernels: Mutex<HashMap<KernelKey, Kernel>>,
    /// By function handle (unique while its module is loaded): rill's kernels', and users'
    /// fused kernels' until their module goes ([`Modules::forget`]).
    functions: Mutex<HashMap<usize, FunctionState>>,
}

impl Modules {
    pub(crate) fn new(compute_capability: (u32, u32)) -> Self {
        let ptx_alone = std::env::var_os("RILL_LOAD_PTX").is_some_and(|value| !value.is_empty() && value != "0");
        Modules {
            compute_capability: (!ptx_alone).then_some(compute_capability),
            loaded: Mutex::default(),
            kernels: Mutex::default(),
            functions: Mutex::default(),
        }
    }

    /// The kernel `key` names, loading its module on first use; `Unsupported` where the
    /// table has no such kernel. The caller has made the module's context current.
    pub(crate) fn kernel(&self, key: KernelKey) -> Result<Kernel> {
        let mut kernels = self.kernels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kernel) = kernels.get(&key) {
            return Ok(*kernel);
        }
        let symbol = key.symbol().ok_or_else(|| Error::Unsupported(format!("rill has no kernel {key:?}")))?;
        let module = key.module();
        let text = ptx(module).ok_or_else(|| {
            Error::Unsupported(format!("PTX module `{}` is not in this build (see its cargo feature)", module.name()))
        })?;
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        let loaded_module = match loaded.entry(module) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => entry.insert(self.load(module, text)?),
        };
        let function = loaded_module
            .function(symbol)
            .ok_or_else(|| Error::Unsupported(format!("kernel `{symbol}` is not in PTX module `{}`", module.name())))?;
        let kernel = Kernel::new(function, symbol)?;
        kernels.insert(key, kernel);
        Ok(kernel)
    }

    /// Loads `module`: its machine code for this GPU where it ships (no JIT compile), else,
    /// or where the driver refuses it (one older than the `ptxas` that made it), its PTX `text`.
    fn load(&self, module: Module, text: &str) -> Result<LoadedModule> {
        let machine_code = self.compute_capability.and_then(|capability| cubin_for(module, capability));
        match machine_code.map(LoadedModule::from_cubin) {
            Some(Ok(loaded)) => Ok(loaded),
            _ => LoadedModule::from_ptx(text),
        }
    }

    /// Sets `attributes` on `kernel`, but those it has already.
    pub(crate) fn set_attributes(&self, kernel: Kernel, attributes: Attributes) -> Result<()> {
        let mut functions = self.functions.lock().unwrap_or_else(PoisonError::into_inner);
        Self::set_on(functions.entry(kernel.function as usize).or_default(), kernel, attributes)
    }

    fn set_on(state: &mut FunctionState, kernel: Kernel, attributes: Attributes) -> Result<()> {
        if state.dynamic_shared != Some(attributes.dynamic_shared) {
            kernel.allow_dynamic_shared(attributes.dynamic_shared)?;
            state.dynamic_shared = Some(attributes.dynamic_shared);
        }
        if let Some(percent) = attributes.carveout.filter(|&p| state.carveout != Some(p)) {
            kernel.prefer_shared_carveout(percent)?;
            state.carveout = Some(percent);
        }
        Ok(())
    }

    /// Blocks of `block` threads and `shared_bytes` of dynamic shared memory that `kernel`
    /// keeps resident per multiprocessor with `attributes` (the occupancy API), asked of the
    /// driver once per kernel, shape and attributes (which it sets for the question).
    pub(crate) fn blocks_per_multiprocessor(
        &self,
        kernel: Kernel,
        (block, shared_bytes): (u32, u32),
        attributes: Attributes,
    ) -> Result<u32> {
        let mut functions = self.functions.lock().unwrap_or_else(PoisonError::into_inner);
        let state = functions.entry(kernel.function as usize).or_default();
        let key = (block, shared_bytes, attributes);
        if let Some(&blocks) = state.occupancy.get(&key) {
            return Ok(blocks);
        }
        Self::set_on(state, kernel, attributes)?;
        let blocks = kernel.blocks_per_multiprocessor(block, shared_bytes)?;
        state.occupancy.insert(key, blocks);
        Ok(blocks)
    }

    /// Drops what is known of `functions`, whose module is being unloaded (a later module's
    /// functions may take the same handles).
    pub(crate) fn forget(&self, functions: impl IntoIterator<Item = CUfunction>) {
        let mut known = self.functions.lock().unwrap_or_else(PoisonError::into_inner);
        for function in functions {
            known.remove(&(function as usize));
        }
    }

    /// Clusters of `cluster` blocks of `block` threads and `shared_bytes` each that `kernel`
    /// keeps resident: `ask`'s answer, asked once per shape.
    pub(crate) fn resident_clusters(
        &self,
        kernel: Kernel,
        (cluster, block, shared_bytes): (u32, u32, u32),
        ask: impl FnOnce() -> Result<u32>,
    ) -> Result<u32> {
        let (function, key) = (kernel.function as usize, (cluster, block, shared_bytes));
        let lock = || self.functions.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&resident) = lock().get(&function).and_then(|state| state.clusters.get(&key)) {
            return Ok(resident);
        }
        // Asked with the lock released: `ask` sets the kernel's attributes through it.
        let resident = ask()?;
        lock().entry(function).or_default().clusters.insert(key, resident);
        Ok(resident)
    }
}

#[cfg(test)]
mod tests {
    use super::{Module, cubin, cubin_for};

    /// The kernels a build outside this workspace unpacks (`kernels/`) are the ones this
    /// source builds (the build script compares them where it builds from source): after a
    /// kernel change, `cargo xtask ship-kernels` writes them anew.
    #[test]
    fn shipped_kernels_are_the_sources() {
        let stale = env!("RILL_STALE_SHIPPED_KERNELS");
        assert!(
            stale.is_empty(),
            "the shipped {stale} kernels differ from this source's: run `cargo xtask ship-kernels`"
        );
    }

    /// A GPU loads machine code of its own major arch, of the newest minor up to its own.
    #[test]
    fn machine_code_is_of_the_gpus_major_arch_and_no_newer_minor() {
        for module in Module::ALL {
            assert_eq!(cubin_for(module, (8, 0)), cubin(module, 80));
            assert_eq!(cubin_for(module, (8, 9)), cubin(module, 80));
            assert_eq!(cubin_for(module, (9, 0)), cubin(module, 90));
            assert_eq!(cubin_for(module, (7, 5)), None);
            assert_eq!(cubin_for(module, (10, 0)), None);
            assert_eq!(cubin_for(module, (12, 0)), None);
        }
    }
}
