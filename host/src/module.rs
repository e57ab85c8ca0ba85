//! The PTX modules, embedded at build time and loaded once each, on first use, and the
//! function handles of their kernels, cached per [`KernelKey`].

use crate::error::{DriverContext, Error, Result};
use cust::sys::{
    CUfunction, CUfunction_attribute, cuFuncGetAttribute, cuFuncSetAttribute,
    cuOccupancyMaxActiveBlocksPerMultiprocessor,
};
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

#[derive(Default)]
pub(crate) struct Modules {
    loaded: Mutex<HashMap<Module, cust::module::Module>>,
    kernels: Mutex<HashMap<KernelKey, Kernel>>,
    /// By function handle (unique while its module is loaded): rill's kernels', and users'
    /// fused kernels' until their module goes ([`Modules::forget`]).
    functions: Mutex<HashMap<usize, FunctionState>>,
}

impl Modules {
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
            Entry::Vacant(entry) => entry.insert(cust::module::Module::from_ptx(text, &[]).during("cuModuleLoadData")?),
        };
        let function = loaded_module
            .get_function(symbol)
            .map_err(|_| Error::Unsupported(format!("kernel `{symbol}` is not in PTX module `{}`", module.name())))?;
        let kernel = Kernel::new(function.to_raw(), symbol)?;
        kernels.insert(key, kernel);
        Ok(kernel)
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
    use super::{Module, ptx};
    use std::io::Read;

    /// The kernels a build outside this workspace unpacks (`kernels/`) are the ones this
    /// source builds: after a kernel change, `cargo xtask ship-kernels` writes them anew.
    #[test]
    fn shipped_kernels_are_the_sources() {
        let built_for = env!("RILL_KERNELS_BUILT_FOR");
        if built_for != env!("RILL_KERNELS_SHIPPED_ARCH") {
            println!("kernels built for `{built_for}` (empty: unpacked from kernels/): nothing to compare");
            return;
        }
        let shipped_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
        for module in Module::ALL {
            let Some(built) = ptx(module) else { continue };
            // The builder's `shipped_file`.
            let file = shipped_dir.join(format!("{}.ptx.zst", module.name()));
            let compressed = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let mut shipped = String::new();
            ruzstd::decoding::StreamingDecoder::new(compressed.as_slice())
                .expect("a zstd frame")
                .read_to_string(&mut shipped)
                .expect("zstd-compressed PTX");
            assert!(
                shipped == built,
                "{} differs from the {} module this source builds: run `cargo xtask ship-kernels`",
                file.display(),
                module.name()
            );
        }
    }
}
