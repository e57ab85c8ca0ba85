//! Users' own fused kernels: PTX a user's crate built with `rill-builder` from rill's row
//! engine and their own Load/Store functors (`rill_kernels_gpu::fused_softmax!`), run through
//! rill's planner and launcher.
//!
//! [`FusedModule::load`] loads the PTX; [`FusedModule::softmax`] finds a family of kernels by
//! name and checks the user's parameter struct against the size the kernels were built with
//! (`<name>_facts` in the PTX); [`FusedSoftmax::run`] plans the path, pack, block and grid as
//! rill's own softmax does and launches.

use crate::Stream;
use crate::error::{DriverContext, Error, Result, invalid};
use crate::gpu::Gpu;
use crate::launch::{LaunchConfig, launch};
use crate::module::Kernel;
use crate::ops::rows::{RowCall, RowKernels, rows_cols};
use crate::softmax::{PathKind, Plan};
use rill_kernels_gpu::abi::{FusedArgs, FusedFacts};
use rill_kernels_gpu::table::RowPath;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::marker::PhantomData;
use std::sync::{Mutex, PoisonError};

/// A user's PTX module, loaded into a GPU's primary context, with the kernels looked up so
/// far.
pub struct FusedModule {
    module: cust::sys::CUmodule,
    /// The kernels and globals the PTX declares: a name outside them is answered here,
    /// without a failing driver call (which the sanitizers would report).
    symbols: HashSet<String>,
    kernels: Mutex<HashMap<String, Kernel>>,
    // Keeps the context alive until the module is unloaded (in `drop`).
    gpu: Gpu,
}

// SAFETY: a module handle and its functions may be used from any thread of the context;
// the kernel cache is behind a mutex.
unsafe impl Send for FusedModule {}
// SAFETY: as above.
unsafe impl Sync for FusedModule {}

impl FusedModule {
    /// Loads `ptx` (the driver JIT-compiles it for this GPU).
    ///
    /// ```no_run
    /// # use rill::fuse::{FusedModule, RowArray};
    /// # fn main() -> rill::Result<()> {
    /// # let gpu = rill::Gpu::new(0)?;
    /// # let stream = gpu.stream()?;
    /// # const PTX: &str = "";
    /// // PTX a kernel crate built with `fused_softmax!(scaled, Scaled, ScaledLoad, make, 4)`.
    /// #[repr(C)]
    /// #[derive(Clone, Copy)]
    /// struct Scaled { x: u64, y: u64, scale: f32 }
    /// let module = FusedModule::load(&gpu, PTX)?;
    /// let fused = module.softmax::<Scaled>("scaled")?;
    /// let x = rill::Tensor::<f32>::zeros(&gpu, &[4, 1000])?;
    /// let mut y = rill::Tensor::<f32>::zeros(&gpu, &[4, 1000])?;
    /// let arrays = [RowArray { address: x.view().address(), element_bytes: 4 },
    ///               RowArray { address: y.view().address(), element_bytes: 4 }];
    /// let extra = Scaled { x: x.view().address(), y: y.view().address(), scale: 0.5 };
    /// // SAFETY: x and y hold 4 x 1000 f32 and live past the stream's work.
    /// unsafe { fused.run(&stream, (4, 1000), &arrays, extra)? };
    /// # Ok(())
    /// # }
    /// ```
    pub fn load(gpu: &Gpu, ptx: &str) -> Result<FusedModule> {
        let Ok(text) = CString::new(ptx) else {
            invalid!("the PTX text holds a NUL byte: give the file rill-builder wrote");
        };
        gpu.bind()?;
        let mut module = std::ptr::null_mut();
        // SAFETY: `text` is a NUL-terminated PTX string; the driver writes one module handle.
        unsafe { cust::sys::cuModuleLoadData(&mut module, text.as_ptr().cast()) }.during("cuModuleLoadData")?;
        Ok(FusedModule { module, symbols: declared_symbols(ptx), kernels: Mutex::default(), gpu: gpu.clone() })
    }

    /// The fused softmax kernels `fused_softmax!(name, E, ...)` made, for parameters `E`;
    /// `InvalidInput` where the module has no such family or `E`'s size is not the one the
    /// kernels were built with.
    pub fn softmax<E: Copy>(&self, name: &str) -> Result<FusedSoftmax<'_, E>> {
        let facts = self.facts(name)?;
        if facts.extra_bytes as usize != size_of::<E>() {
            invalid!(
                "`{name}`'s kernels take {} bytes of parameters, {} has {}: give the `#[repr(C)]` struct the kernel \
                 crate passed to `fused_softmax!`",
                facts.extra_bytes,
                std::any::type_name::<E>(),
                size_of::<E>()
            );
        }
        Ok(FusedSoftmax { module: self, name: name.to_string(), facts, force: None, _extra: PhantomData })
    }

    /// Launches the module's kernel `name` as it is, with `params` as its only parameter:
    /// for a user's own kernels outside the planner (the example's dequantization).
    ///
    /// # Safety
    /// `P` must be the `#[repr(C)]` struct the kernel takes, and every address in it valid
    /// for what the kernel does with `config`'s geometry.
    pub unsafe fn launch<P: Copy>(&self, stream: &Stream, name: &str, config: LaunchConfig, params: &P) -> Result<()> {
        let kernel = self.kernel(name)?;
        // SAFETY: the caller's promise.
        unsafe { launch(stream, kernel, config, params) }
    }

    /// The `(path, pack)` kernel of family `name`.
    pub(crate) fn row_kernel(&self, name: &str, path: RowPath, pack: usize) -> Result<Kernel> {
        self.kernel(&format!("{name}_{path:?}_p{pack}"))
    }

    fn kernel(&self, symbol: &str) -> Result<Kernel> {
        let mut kernels = self.kernels.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = match kernels.entry(symbol.to_string()) {
            Entry::Occupied(found) => return Ok(*found.get()),
            Entry::Vacant(entry) => entry,
        };
        if !self.symbols.contains(symbol) {
            return Err(Error::Unsupported(format!("the fused module has no kernel `{symbol}`")));
        }
        let name =
            CString::new(symbol).map_err(|_| Error::InvalidInput(format!("kernel name {symbol:?} holds NUL")))?;
        self.gpu.bind()?;
        let mut function = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name; writes one function handle.
        unsafe { cust::sys::cuModuleGetFunction(&mut function, self.module, name.as_ptr()) }
            .during("cuModuleGetFunction")?;
        // The symbol names the launch's NVTX range for the module's life: a few dozen
        // names a module, leaked once each.
        let kernel = Kernel::new(function, Box::leak(symbol.to_string().into_boxed_str()))?;
        Ok(*entry.insert(kernel))
    }

    /// The global `<name>_facts` the kernels' macro wrote.
    fn facts(&self, name: &str) -> Result<FusedFacts> {
        let symbol = format!("{name}_facts");
        if !self.symbols.contains(&symbol) {
            invalid!("the fused module has no kernels named `{name}` (no `{symbol}` of fused_softmax!)");
        }
        let global = CString::new(symbol.as_str()).map_err(|_| Error::InvalidInput(format!("{name:?} holds NUL")))?;
        self.gpu.bind()?;
        let (mut address, mut bytes) = (0, 0usize);
        // SAFETY: a loaded module and a NUL-terminated name; writes an address and a size.
        unsafe { cust::sys::cuModuleGetGlobal_v2(&mut address, &mut bytes, self.module, global.as_ptr()) }
            .during("cuModuleGetGlobal")?;
        if bytes != size_of::<FusedFacts>() {
            invalid!(
                "`{symbol}` has {bytes} bytes, not a FusedFacts: build the kernels with this rill's fused_softmax!"
            );
        }
        let mut facts = FusedFacts::default();
        // SAFETY: copies the global's `size_of::<FusedFacts>()` bytes into `facts`.
        unsafe {
            cust::sys::cuMemcpyDtoH_v2((&mut facts as *mut FusedFacts).cast(), address, bytes)
                .during("cuMemcpyDtoH")?;
        }
        Ok(facts)
    }
}

impl Drop for FusedModule {
    fn drop(&mut self) {
        // SAFETY: the module was loaded by `load` and is unloaded once; its kernels go with
        // it (every `Kernel` copy lives in `kernels` or in a call that borrowed `self`). A
        // failure leaves nothing to undo.
        unsafe {
            let _ = self.gpu.bind();
            cust::sys::cuModuleUnload(self.module);
        }
    }
}

/// A family of fused softmax kernels whose functors take `E`.
pub struct FusedSoftmax<'m, E> {
    module: &'m FusedModule,
    name: String,
    facts: FusedFacts,
    force: Option<PathKind>,
    _extra: PhantomData<E>,
}

/// An array the kernels' functors read or write along the rows: its address and element
/// bytes (they decide the pack, as for rill's own ops).
#[derive(Clone, Copy, Debug)]
pub struct RowArray {
    pub address: u64,
    pub element_bytes: usize,
}

impl<E: Copy> FusedSoftmax<'_, E> {
    /// Runs every call on `path` (an error where the shape does not fit it).
    pub fn forced(self, path: PathKind) -> Self {
        FusedSoftmax { force: Some(path), ..self }
    }

    /// Softmax of the `rows x cols` values the kernels' Load reads, through their Store;
    /// returns the plan it ran. `arrays` are every array the functors access in packs at a
    /// row's columns (the rows' own and per-column ones, not per-row values): the widest
    /// pack runs where all are aligned to it and `cols` is a multiple of it, pack 1
    /// otherwise. Rows always start at their first element (no phased plans).
    ///
    /// # Safety
    /// `extra` holds what the kernels' functors dereference: arrays of `rows x cols`
    /// elements (`rows` for per-row data, `cols` for per-column), live and not accessed out
    /// of stream order until the kernel has run, at the addresses `arrays` lists.
    pub unsafe fn run(
        &self,
        stream: &Stream,
        (rows, cols): (usize, usize),
        arrays: &[RowArray],
        extra: E,
    ) -> Result<Plan> {
        let op = self.name.as_str();
        rows_cols(op, &[rows, cols])?;
        let kernels = RowKernels::Fused { module: self.module, name: op };
        let args = FusedArgs { shape: Default::default(), extra };
        let mut call =
            RowCall::over(stream, op, kernels, (rows, cols), self.facts.pack as usize, args, self.force, true);
        call.problem.cache_bytes_per_col = self.facts.cache_bytes_per_col;
        call.arrays = arrays.iter().map(|a| (a.address, a.element_bytes)).collect();
        call.run()
    }
}

/// The entry points and globals `ptx` declares (`.visible .entry name(`, `.visible .global
/// ... name[` or `name =`).
fn declared_symbols(ptx: &str) -> HashSet<String> {
    ptx.lines()
        .filter_map(|line| line.trim_start().strip_prefix(".visible "))
        .filter_map(|declaration| {
            let name_start = if let Some(entry) = declaration.strip_prefix(".entry ") {
                entry
            } else if declaration.starts_with(".global ") {
                let head = declaration.split(['[', '=']).next()?;
                head.trim_end().rsplit(' ').next()?
            } else {
                return None;
            };
            let name: String =
                name_start.chars().take_while(|&c| c.is_alphanumeric() || c == '_' || c == '$').collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::declared_symbols;

    #[test]
    fn the_ptx_declarations_give_the_symbols() {
        let ptx = "//\n.visible .global .align 4 .b8 scaled_facts[12] = {4, 0, 0, 0};\n\
                   .visible .entry scaled_Warp8_p4(\n\t.param .align 8 .b8 args[40]\n)\n\
                   .func helper(\n.visible .global .align 4 .u32 plain = 3;\n";
        let mut symbols: Vec<String> = declared_symbols(ptx).into_iter().collect();
        symbols.sort();
        assert_eq!(symbols, ["plain", "scaled_Warp8_p4", "scaled_facts"]);
    }
}
