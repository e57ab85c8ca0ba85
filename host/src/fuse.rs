//! Users' own fused kernels: PTX a user's crate built with `rill-builder` from rill's bodies
//! and their own functors (`rill_kernels_gpu::fused_softmax!`, `fused_norm!`,
//! `fused_elementwise!`), run through rill's planner and launcher.
//!
//! [`FusedModule::load`] loads the PTX; [`FusedModule::softmax`], [`FusedModule::norm`] and
//! [`FusedModule::elementwise`] find a family of kernels by name and check the user's types
//! against those the kernels were built with (`<name>_facts` in the PTX); their `run` plans
//! the path, pack, block and grid as rill's own op does and launches.

use crate::driver::{LoadedModule, sys};
use crate::error::{DriverContext, Error, Result, invalid};
use crate::gpu::Gpu;
use crate::gpu::Owner;
use crate::launch::{LaunchConfig, launch};
use crate::module::Kernel;
use crate::norm::{NormKind, NormParts};
use crate::ops::elementwise::launch_over;
use crate::ops::rows::{FamilyIndex, OpClass, RowCall, RowKernels, RowSpec, UserKernels, rows_cols};
use crate::softmax::{PathKind, Plan};
use crate::tensor::{AsViewMut, Element, View};
use crate::{DType, Stream};
use rill_kernels_gpu::abi::{FusedArgs, FusedFacts, FusedFamily, NormArgs, RowArgs, RowShape};
use rill_kernels_gpu::table::RowPath;
use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::marker::PhantomData;
use std::sync::{Mutex, PoisonError};

/// A user's PTX module, loaded into a GPU's primary context, with the kernels looked up so
/// far.
pub struct FusedModule {
    // Unloaded after `drop` forgot its kernels, before the context goes (fields drop in order).
    module: LoadedModule,
    /// The kernels and globals the PTX declares: a name outside them is answered here,
    /// without a failing driver call (which the sanitizers would report).
    symbols: HashSet<String>,
    kernels: Mutex<HashMap<String, Kernel>>,
    /// Each family's place and facts, read once at load: reading one is a copy from the
    /// device, which would wait for the stream's work in every call (and break stream
    /// capture). A global that is not a family's facts keeps the message its use gets.
    facts: HashMap<String, (FamilyIndex, std::result::Result<FusedFacts, String>)>,
    /// Who the module's kernels are to the row engine's remembered plans, which are never
    /// found again once it unloads.
    owner: Owner,
    // Keeps the context alive until the module is unloaded (in `drop`).
    gpu: Gpu,
}

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
        if ptx.contains('\0') {
            invalid!("the PTX text holds a NUL byte: give the file rill-builder wrote");
        }
        gpu.bind()?;
        let mut loaded = FusedModule {
            module: LoadedModule::from_ptx(ptx)?,
            symbols: declared_symbols(ptx),
            kernels: Mutex::default(),
            facts: HashMap::new(),
            owner: Owner::new(),
            gpu: gpu.clone(),
        };
        let names = loaded.symbols.iter().filter_map(|symbol| symbol.strip_suffix(FACTS_SUFFIX));
        for (index, name) in (0..).zip(names) {
            let facts = match loaded.read_facts(name) {
                Err(Error::InvalidInput(message)) => Err(message),
                read => Ok(read?),
            };
            loaded.facts.insert(name.to_string(), (index, facts));
        }
        Ok(loaded)
    }

    /// The fused softmax kernels `fused_softmax!(name, E, ...)` made, for parameters `E`;
    /// `InvalidInput` where the module has no such family or `E`'s size is not the one the
    /// kernels were built with.
    pub fn softmax<E: Copy>(&self, name: &str) -> Result<FusedSoftmax<'_, E>> {
        let (index, facts) = self.facts_of::<E>(name, FusedFamily::Softmax)?;
        Ok(FusedSoftmax { rows: FusedRows::new(self, name, index, facts), _extra: PhantomData })
    }

    /// The fused norm kernels `fused_norm!(name, E, ..., G)` made, for parameters `E` and
    /// weight and bias of `G`; `InvalidInput` where the module has no such family, `E`'s size
    /// or `G` is not the kernels'.
    pub fn norm<E: Copy, G: Element>(&self, name: &str) -> Result<FusedNorm<'_, E, G>> {
        let (index, facts) = self.facts_of::<E>(name, FusedFamily::Norm)?;
        if facts.weight != G::DTYPE.code() {
            let built = [DType::F32, DType::F16, DType::BF16].into_iter().find(|d| d.code() == facts.weight);
            invalid!(
                "`{name}`'s kernels take a weight and bias of {}, not {}: give `FusedModule::norm` the dtype the \
                 kernel crate passed to `fused_norm!`",
                built.map_or("another dtype", DType::name),
                G::DTYPE.name()
            );
        }
        Ok(FusedNorm { rows: FusedRows::new(self, name, index, facts), _types: PhantomData })
    }

    /// The fused elementwise kernel `fused_elementwise!(name, ...)` made from `I` to `O`;
    /// `InvalidInput` where the module has no such family, `Unsupported` where it has no
    /// kernel for these dtypes.
    pub fn elementwise<I: Element, O: Element>(&self, name: &str) -> Result<FusedElementwise<'_, I, O>> {
        let (_, facts) = self.facts_of::<()>(name, FusedFamily::Elementwise)?;
        let kernel = self.kernel(&format!("{name}_{}_{}", I::DTYPE.name(), O::DTYPE.name()))?;
        Ok(FusedElementwise { name: name.to_string(), facts, kernel, _types: PhantomData })
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
        if let Some(&kernel) = kernels.get(symbol) {
            return Ok(kernel);
        }
        if !self.symbols.contains(symbol) {
            return Err(Error::Unsupported(format!("the fused module has no kernel `{symbol}`")));
        }
        self.gpu.bind()?;
        let function = self.module.function(symbol).ok_or_else(|| {
            Error::Unsupported(format!("the fused module declares `{symbol}` but the driver finds no such kernel"))
        })?;
        // The symbol names the launch's NVTX range for the module's life: a few dozen
        // names a module, leaked once each.
        let kernel = Kernel::new(function, Box::leak(symbol.to_string().into_boxed_str()))?;
        kernels.insert(symbol.to_string(), kernel);
        Ok(kernel)
    }

    /// The place and facts of family `name`, checked to be a `family` whose parameters are
    /// `E`.
    fn facts_of<E>(&self, name: &str, family: FusedFamily) -> Result<(FamilyIndex, FusedFacts)> {
        let (index, facts) = self.facts(name)?;
        if facts.family != family {
            invalid!("`{name}` is a fused {:?} family, not a {family:?} one", facts.family);
        }
        if facts.extra_bytes as usize != size_of::<E>() {
            invalid!(
                "`{name}`'s kernels take {} bytes of parameters, {} has {}: give the `#[repr(C)]` struct the kernel \
                 crate passed to its `fused_*!` macro",
                facts.extra_bytes,
                std::any::type_name::<E>(),
                size_of::<E>()
            );
        }
        Ok((index, facts))
    }

    /// The place and facts of family `name`, as read at load.
    fn facts(&self, name: &str) -> Result<(FamilyIndex, FusedFacts)> {
        match self.facts.get(name) {
            Some((index, Ok(facts))) => Ok((*index, *facts)),
            Some((_, Err(message))) => Err(Error::InvalidInput(message.clone())),
            None => invalid!(
                "the fused module has no kernels named `{name}` (no `{name}{FACTS_SUFFIX}` of a `fused_*!` macro)"
            ),
        }
    }

    /// The global `<name>_facts` the kernels' macro wrote.
    fn read_facts(&self, name: &str) -> Result<FusedFacts> {
        let symbol = format!("{name}{FACTS_SUFFIX}");
        let global = CString::new(symbol.as_str()).map_err(|_| Error::InvalidInput(format!("{name:?} holds NUL")))?;
        self.gpu.bind()?;
        let (mut address, mut bytes) = (0, 0usize);
        // SAFETY: a loaded module and a NUL-terminated name; writes an address and a size.
        unsafe { sys::cuModuleGetGlobal_v2(&mut address, &mut bytes, self.module.as_raw(), global.as_ptr()) }
            .during("cuModuleGetGlobal")?;
        if bytes != size_of::<FusedFacts>() {
            invalid!(
                "`{symbol}` has {bytes} bytes, not a FusedFacts: build the kernels with this rill's `fused_*!` macros"
            );
        }
        let mut words = [0u32; size_of::<FusedFacts>() / 4];
        // SAFETY: copies the global's `size_of::<FusedFacts>()` bytes into `words`, as many.
        unsafe {
            sys::cuMemcpyDtoH_v2(words.as_mut_ptr().cast(), address, bytes).during("cuMemcpyDtoH")?;
        }
        let [family, extra_bytes, pack, cache_bytes_per_col, weight, inputs, broadcasts_last_input, transforms] = words;
        // The family is read as a word, not copied into the enum: a word no family has would
        // not be a value of it.
        let Some(family) = [FusedFamily::Softmax, FusedFamily::Norm, FusedFamily::Elementwise]
            .into_iter()
            .find(|f| *f as u32 == family)
        else {
            invalid!(
                "`{symbol}` names no fused family ({family}): build the kernels with this rill's `fused_*!` macros"
            );
        };
        Ok(FusedFacts {
            family,
            extra_bytes,
            pack,
            cache_bytes_per_col,
            weight,
            inputs,
            broadcasts_last_input,
            transforms,
        })
    }
}

impl Drop for FusedModule {
    fn drop(&mut self) {
        // The module unloads next (its field drops), and its kernels go with it: every
        // `Kernel` copy lives in `kernels`, the remembered plans forgotten here, or a call
        // that borrowed `self`. The context is made current for the unload; a failure
        // leaves nothing to undo.
        let kernels = self.kernels.get_mut().unwrap_or_else(PoisonError::into_inner);
        self.gpu.modules().forget(kernels.values().map(|kernel| kernel.function));
        let _ = self.gpu.bind();
    }
}

/// The suffix of the global in which a `fused_*!` macro describes a family's kernels.
const FACTS_SUFFIX: &str = "_facts";

/// What every fused row family holds: its module, name and facts, and a forced path.
struct FusedRows<'m> {
    module: &'m FusedModule,
    name: String,
    index: FamilyIndex,
    facts: FusedFacts,
    force: Option<PathKind>,
}

impl<'m> FusedRows<'m> {
    fn new(module: &'m FusedModule, name: &str, index: FamilyIndex, facts: FusedFacts) -> Self {
        FusedRows { module, name: name.to_string(), index, facts, force: None }
    }

    fn spec(&self) -> RowSpec {
        let FusedFacts { pack, cache_bytes_per_col, transforms, .. } = self.facts;
        row_spec(pack as usize, cache_bytes_per_col, transforms != 0)
    }

    /// A call of these kernels over `rows x cols` with `args`, whose functors access
    /// `arrays` along the rows.
    fn call<'c, A: RowArgs>(
        &'c self,
        stream: &'c Stream,
        (rows, cols): (usize, usize),
        arrays: &[RowArray],
        args: A,
    ) -> Result<RowCall<'c, A>> {
        let op = self.name.as_str();
        rows_cols(op, &[rows, cols])?;
        let kernels = RowKernels::Fused(self);
        let mut call = RowCall::over(stream, op, kernels, self.spec(), (rows, cols), args, self.force, true);
        call.arrays = arrays.iter().map(|a| (a.address, a.element_bytes)).collect();
        Ok(call)
    }
}

impl UserKernels for FusedRows<'_> {
    fn kernel(&self, path: RowPath, pack: usize) -> Result<Kernel> {
        self.module.row_kernel(&self.name, path, pack)
    }

    fn owner(&self) -> (Owner, FamilyIndex) {
        (self.module.owner, self.index)
    }
}

/// The row engine's description of a user's row family, from the facts its kernels
/// declare: its widest pack, its cache's exact dtype and whether each read of the cache
/// transforms it. Rows always start at their first element.
pub(crate) fn row_spec(widest: usize, cache_bytes_per_col: u32, cache_transformed: bool) -> RowSpec {
    RowSpec { widest, cache_bytes_per_col, cache_transformed, ..RowSpec::rows_of(OpClass::Fused, cache_bytes_per_col) }
}

/// A family of fused softmax kernels whose functors take `E`.
pub struct FusedSoftmax<'m, E> {
    rows: FusedRows<'m>,
    _extra: PhantomData<E>,
}

/// A family of fused LayerNorm/RMSNorm forward kernels whose functors take `E`, with weight
/// and bias of `G`.
pub struct FusedNorm<'m, E, G> {
    rows: FusedRows<'m>,
    _types: PhantomData<(E, G)>,
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
    pub fn forced(mut self, path: PathKind) -> Self {
        self.rows.force = Some(path);
        self
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
    pub unsafe fn run(&self, stream: &Stream, shape: (usize, usize), arrays: &[RowArray], extra: E) -> Result<Plan> {
        let args = FusedArgs { op: RowShape::default(), extra };
        self.rows.call(stream, shape, arrays, args)?.run()
    }
}

impl<E: Copy, G: Element> FusedNorm<'_, E, G> {
    /// Runs every call on `path` (an error where the shape does not fit it).
    pub fn forced(mut self, path: PathKind) -> Self {
        self.rows.force = Some(path);
        self
    }

    /// `kind` over the `rows x cols` values the kernels' Load reads, written through their
    /// Store, with `parts`' weight, bias and per-row outputs (checked as rill's own norm
    /// checks them); returns the plan it ran. `arrays` as for [`FusedSoftmax::run`].
    ///
    /// ```no_run
    /// # use rill::fuse::{FusedModule, RowArray};
    /// # use rill::norm::{NormKind, NormParts};
    /// # fn main() -> rill::Result<()> {
    /// # let gpu = rill::Gpu::new(0)?;
    /// # let stream = gpu.stream()?;
    /// # const PTX: &str = "";
    /// // PTX a kernel crate built with `fused_norm!(scaled_norm, Scaled, ScaledLoad, make, 4, f32)`.
    /// #[repr(C)]
    /// #[derive(Clone, Copy)]
    /// struct Scaled { x: u64, y: u64, scale: f32 }
    /// let module = FusedModule::load(&gpu, PTX)?;
    /// let fused = module.norm::<Scaled, f32>("scaled_norm")?;
    /// let x = rill::Tensor::<f32>::zeros(&gpu, &[4, 1000])?;
    /// let mut y = rill::Tensor::<f32>::zeros(&gpu, &[4, 1000])?;
    /// let w = rill::Tensor::<f32>::zeros(&gpu, &[1000])?;
    /// let arrays = [RowArray { address: x.view().address(), element_bytes: 4 },
    ///               RowArray { address: y.view().address(), element_bytes: 4 }];
    /// let extra = Scaled { x: x.view().address(), y: y.view().address(), scale: 0.5 };
    /// // SAFETY: x and y hold 4 x 1000 f32 and live past the stream's work.
    /// unsafe { fused.run(&stream, NormKind::RmsNorm, 1e-6, (4, 1000), &arrays, NormParts::new().weight(&w), extra)? };
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Safety
    /// As [`FusedSoftmax::run`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run(
        &self,
        stream: &Stream,
        kind: NormKind,
        eps: f32,
        (rows, cols): (usize, usize),
        arrays: &[RowArray],
        parts: NormParts<'_, G>,
        extra: E,
    ) -> Result<Plan> {
        let args = FusedArgs { op: NormArgs { eps, ..NormArgs::default() }, extra };
        let mut call = self.rows.call(stream, (rows, cols), arrays, args)?;
        call.spec.column_bytes =
            parts.fill(&self.rows.name, kind, (rows, cols), &mut call.args.op, &mut call.columns)?;
        call.run()
    }
}

/// A user's elementwise kernel from `I` to `O` (`fused_elementwise!`).
pub struct FusedElementwise<'m, I, O> {
    name: String,
    facts: FusedFacts,
    kernel: Kernel,
    _types: PhantomData<(&'m FusedModule, I, O)>,
}

impl<I: Element, O: Element> FusedElementwise<'_, I, O> {
    /// `output = functor(inputs...)`, element by element, as rill's elementwise ops run
    /// (same checks, packs and grid): the inputs as many as the functor takes, of the
    /// output's shape (a broadcasting functor's last one `[cols]`, the output's last
    /// dimension). Safe: the functor reads and writes only these views.
    ///
    /// ```no_run
    /// # use rill::fuse::FusedModule;
    /// # fn main() -> rill::Result<()> {
    /// # let gpu = rill::Gpu::new(0)?;
    /// # let stream = gpu.stream()?;
    /// # const PTX: &str = "";
    /// // PTX a kernel crate built with `fused_elementwise!(squared_relu, SquaredRelu, 1, (f32 f32))`.
    /// let module = FusedModule::load(&gpu, PTX)?;
    /// let x = rill::Tensor::<f32>::zeros(&gpu, &[1024])?;
    /// let mut y = rill::Tensor::<f32>::zeros(&gpu, &[1024])?;
    /// module.elementwise::<f32, f32>("squared_relu")?.run(&stream, &[x.view()], &mut y)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn run(&self, stream: &Stream, inputs: &[View<'_, I>], output: &mut impl AsViewMut<O>) -> Result<()> {
        let op = self.name.as_str();
        if inputs.len() != self.facts.inputs as usize {
            invalid!("`{op}` takes {} inputs; got {}", self.facts.inputs, inputs.len());
        }
        let broadcast = self.facts.broadcasts_last_input != 0;
        launch_over(stream, op, broadcast, |_| Ok(self.kernel), inputs, output)
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
