//! The PTX modules, embedded at build time and loaded once each, on first use.

use crate::error::{DriverContext, Error, Result};
use cust::module::Module;
use cust::sys::CUfunction;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Mutex;

/// The PTX modules of the device crate (one per op family).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PtxModule {
    Elementwise,
    Softmax,
}

impl PtxModule {
    pub const ALL: [PtxModule; 2] = [PtxModule::Elementwise, PtxModule::Softmax];

    pub fn name(self) -> &'static str {
        match self {
            PtxModule::Elementwise => "elementwise",
            PtxModule::Softmax => "softmax",
        }
    }

    /// The module's PTX text, as the builder produced it.
    pub fn ptx(self) -> &'static str {
        match self {
            PtxModule::Elementwise => include_str!(concat!(env!("OUT_DIR"), "/elementwise.ptx")),
            PtxModule::Softmax => include_str!(concat!(env!("OUT_DIR"), "/softmax.ptx")),
        }
    }
}

/// A kernel's function handle, valid while its module is loaded (as long as the `Gpu`).
#[derive(Clone, Copy)]
pub(crate) struct Kernel(pub(crate) CUfunction);

// SAFETY: a CUfunction is a handle the driver lets any thread use within its context.
unsafe impl Send for Kernel {}

#[derive(Default)]
pub(crate) struct Modules {
    loaded: Mutex<HashMap<PtxModule, Module>>,
    kernels: Mutex<HashMap<&'static str, Kernel>>,
}

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
        let kernel = Kernel(function.to_raw());
        kernels.insert(symbol, kernel);
        Ok(kernel)
    }
}
