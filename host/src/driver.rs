//! The CUDA driver as rill reaches it: cudarc's bindings ([`sys`]), which open the driver
//! library (`libcuda.so.1`, `nvcuda.dll`) at run time, on first use, so that building rill
//! needs no CUDA toolkit and nothing to link (unless another crate of the build, such as
//! candle's CUDA backend, has cudarc link it); and the handles rill owns (a device's primary
//! context, streams, device memory, modules), each released when dropped. Every call's
//! result is checked ([`DriverContext`]).

pub use cudarc::driver::sys;

use crate::error::{DriverContext, Error, Result};
use std::ffi::{CStr, CString};

/// The driver library's names: the NVIDIA driver installs the first (Linux) or the last.
const LIBRARY_NAMES: [&str; 3] = ["libcuda.so.1", "libcuda.so", "nvcuda.dll"];

/// Whether the driver library opens, which every driver call needs: where it does not (a
/// machine without the NVIDIA driver), [`Gpu::new`](crate::Gpu::new) fails with an error
/// instead of the bindings' panic. Asked here, not of the bindings, because a build in which
/// another crate has cudarc link the library instead of loading it has no such question.
pub(crate) fn library_present() -> bool {
    // SAFETY: opening the driver library runs no code of rill's; it is closed again at once.
    LIBRARY_NAMES.into_iter().any(|name| unsafe { libloading::Library::new(name) }.is_ok())
}

/// `cuInit`, then device `ordinal`.
pub(crate) fn device(ordinal: u32) -> Result<sys::CUdevice> {
    if !library_present() {
        return Err(Error::Driver {
            call: "cuInit",
            code: sys::CUresult::CUDA_ERROR_NO_DEVICE as u32,
            message: "no CUDA driver: libcuda.so.1 (the NVIDIA driver's library) is not installed".into(),
        });
    }
    // SAFETY: cuInit takes flags 0; cuDeviceGet writes one handle.
    unsafe { sys::cuInit(0) }.during("cuInit")?;
    let ordinal = i32::try_from(ordinal).map_err(|_| Error::InvalidInput(format!("no GPU {ordinal}")))?;
    let mut device = 0;
    unsafe { sys::cuDeviceGet(&mut device, ordinal) }.during("cuDeviceGet")?;
    Ok(device)
}

/// Attribute `attribute` of `device`.
pub(crate) fn attribute(device: sys::CUdevice, attribute: sys::CUdevice_attribute) -> Result<i32> {
    let mut value = 0;
    // SAFETY: writes one int for a device cuDeviceGet returned.
    unsafe { sys::cuDeviceGetAttribute(&mut value, attribute, device) }.during("cuDeviceGetAttribute")?;
    Ok(value)
}

/// The device's name, as `nvidia-smi` shows it.
pub(crate) fn name(device: sys::CUdevice) -> Result<String> {
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: writes a NUL-terminated string of at most the buffer's length.
    unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, device) }.during("cuDeviceGetName")?;
    // SAFETY: the driver wrote a NUL-terminated string into the buffer.
    Ok(unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned())
}

/// The CUDA version the driver supports, e.g. (13, 0).
pub(crate) fn driver_version() -> Result<(u32, u32)> {
    let mut version = 0;
    // SAFETY: writes one int.
    unsafe { sys::cuDriverGetVersion(&mut version) }.during("cuDriverGetVersion")?;
    let version = version.max(0) as u32;
    Ok((version / 1000, version % 1000 / 10))
}

/// A device's primary context (the one PyTorch and cudarc use), retained while this lives.
pub(crate) struct PrimaryContext {
    context: sys::CUcontext,
    device: sys::CUdevice,
}

// SAFETY: a context handle may be used from any thread (the driver API is thread-safe).
unsafe impl Send for PrimaryContext {}
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    pub(crate) fn retain(device: sys::CUdevice) -> Result<Self> {
        let mut context = std::ptr::null_mut();
        // SAFETY: writes one handle for a device cuDeviceGet returned.
        unsafe { sys::cuDevicePrimaryCtxRetain(&mut context, device) }.during("cuDevicePrimaryCtxRetain")?;
        Ok(PrimaryContext { context, device })
    }

    /// Makes the context current on the calling thread.
    pub(crate) fn make_current(&self) -> Result<()> {
        // SAFETY: the context is retained while `self` lives.
        unsafe { sys::cuCtxSetCurrent(self.context) }.during("cuCtxSetCurrent")
    }

    pub(crate) fn as_raw(&self) -> sys::CUcontext {
        self.context
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: releases the retain `retain` took; nothing of rill's uses it afterwards.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

/// A non-blocking stream of the current context, destroyed when dropped.
pub(crate) struct OwnedStream(sys::CUstream);

// SAFETY: a stream handle may be used from any thread.
unsafe impl Send for OwnedStream {}
unsafe impl Sync for OwnedStream {}

impl OwnedStream {
    pub(crate) fn non_blocking() -> Result<Self> {
        let mut stream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: writes one handle; the caller made a context current.
        unsafe { sys::cuStreamCreate(&mut stream, flags) }.during("cuStreamCreate")?;
        Ok(OwnedStream(stream))
    }

    pub(crate) fn as_raw(&self) -> sys::CUstream {
        self.0
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        // SAFETY: the stream is this handle's; the driver lets queued work finish first.
        unsafe { sys::cuStreamDestroy_v2(self.0) };
    }
}

/// `bytes` (more than 0) of device memory in the current context, freed when dropped.
pub(crate) struct DeviceMemory {
    address: sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceMemory {
    pub(crate) fn alloc(bytes: usize) -> Result<Self> {
        let mut address = 0;
        // SAFETY: writes one address; the caller made a context current.
        unsafe { sys::cuMemAlloc_v2(&mut address, bytes) }.during("cuMemAlloc")?;
        Ok(DeviceMemory { address, bytes })
    }

    pub(crate) fn address(&self) -> sys::CUdeviceptr {
        self.address
    }

    /// Sets every byte to 0.
    pub(crate) fn zero(&mut self) -> Result<()> {
        // SAFETY: the range is this allocation's.
        unsafe { sys::cuMemsetD8_v2(self.address, 0, self.bytes) }.during("cuMemsetD8")
    }

    /// Copies `host` (the allocation's size) in, synchronously.
    pub(crate) fn copy_from_host(&mut self, host: &[u8]) -> Result<()> {
        assert_eq!(host.len(), self.bytes, "a copy covers the whole allocation");
        // SAFETY: both ranges are `bytes` long and live for the call.
        unsafe { sys::cuMemcpyHtoD_v2(self.address, host.as_ptr().cast(), self.bytes) }.during("cuMemcpyHtoD")
    }

    /// Copies the allocation out to `host` (its size), synchronously.
    pub(crate) fn copy_to_host(&self, host: &mut [u8]) -> Result<()> {
        assert_eq!(host.len(), self.bytes, "a copy covers the whole allocation");
        // SAFETY: both ranges are `bytes` long and live for the call.
        unsafe { sys::cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), self.address, self.bytes) }.during("cuMemcpyDtoH")
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: the allocation is this handle's and nothing of rill's refers to it now.
        unsafe { sys::cuMemFree_v2(self.address) };
    }
}

/// A module loaded into the current context, unloaded when dropped.
pub(crate) struct LoadedModule(sys::CUmodule);

// SAFETY: a module handle may be used from any thread.
unsafe impl Send for LoadedModule {}
unsafe impl Sync for LoadedModule {}

impl LoadedModule {
    /// Loads PTX text (which the driver compiles for the GPU).
    pub(crate) fn from_ptx(text: &str) -> Result<Self> {
        let text = CString::new(text).map_err(|_| Error::InvalidInput("PTX text holds a NUL byte".into()))?;
        Self::load(text.as_bytes_with_nul())
    }

    /// Loads machine code for the GPU (a cubin).
    pub(crate) fn from_cubin(image: &[u8]) -> Result<Self> {
        Self::load(image)
    }

    fn load(image: &[u8]) -> Result<Self> {
        let mut module = std::ptr::null_mut();
        // SAFETY: the image is NUL-terminated PTX or an ELF image, read during the call only.
        unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr().cast()) }.during("cuModuleLoadData")?;
        Ok(LoadedModule(module))
    }

    /// The module's kernel `name`; `None` where it has none.
    pub(crate) fn function(&self, name: &str) -> Option<sys::CUfunction> {
        let name = CString::new(name).ok()?;
        let mut function = std::ptr::null_mut();
        // SAFETY: writes one handle; the module is loaded while `self` lives.
        let found = unsafe { sys::cuModuleGetFunction(&mut function, self.0, name.as_ptr()) };
        (found == sys::CUresult::CUDA_SUCCESS).then_some(function)
    }

    pub(crate) fn as_raw(&self) -> sys::CUmodule {
        self.0
    }
}

impl Drop for LoadedModule {
    fn drop(&mut self) {
        // SAFETY: the module is this handle's; its functions are not used after it goes.
        unsafe { sys::cuModuleUnload(self.0) };
    }
}
