//! Device, context and stream handling.

use crate::error::{DriverContext, Result};
use crate::module::Modules;
use cust::context::{Context, CurrentContext};
use cust::device::{Device, DeviceAttribute};
use cust::event::{Event, EventFlags};
use cust::stream::{Stream as CudaStream, StreamFlags};
use std::sync::Arc;

/// What dispatch and launch geometry need to know about the device, read once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub ordinal: u32,
    pub compute_capability: (u32, u32),
    pub multiprocessors: u32,
    pub max_threads_per_multiprocessor: u32,
    /// Shared memory a block may use once its kernel opts in.
    pub max_shared_bytes_per_block_optin: u32,
    /// Shared memory of one SM (carved out of the same storage as its L1 cache).
    pub max_shared_bytes_per_multiprocessor: u32,
    pub l2_bytes: u32,
    /// The CUDA version the installed driver supports (`cuDriverGetVersion`), e.g. (13, 0).
    pub driver_api: (u32, u32),
}

/// A GPU with its primary context and the lazily loaded PTX modules. Cheap to clone.
#[derive(Clone)]
pub struct Gpu {
    inner: Arc<GpuInner>,
}

struct GpuInner {
    info: DeviceInfo,
    // Dropped before the context (fields drop in order).
    modules: Modules,
    context: Context,
}

impl Gpu {
    /// Opens GPU `ordinal`. Fails with a driver error where there is no CUDA device.
    pub fn new(ordinal: u32) -> Result<Gpu> {
        cust::init(cust::CudaFlags::empty()).during("cuInit")?;
        let device = Device::get_device(ordinal).during("cuDeviceGet")?;
        let context = Context::new(device).during("cuDevicePrimaryCtxRetain")?;
        let attribute = |attr| device.get_attribute(attr).during("cuDeviceGetAttribute").map(|v| v as u32);
        let info = DeviceInfo {
            name: device.name().during("cuDeviceGetName")?,
            ordinal,
            compute_capability: (
                attribute(DeviceAttribute::ComputeCapabilityMajor)?,
                attribute(DeviceAttribute::ComputeCapabilityMinor)?,
            ),
            multiprocessors: attribute(DeviceAttribute::MultiprocessorCount)?,
            max_threads_per_multiprocessor: attribute(DeviceAttribute::MaxThreadsPerMultiprocessor)?,
            max_shared_bytes_per_block_optin: shared_memory_per_block_optin(device)?,
            max_shared_bytes_per_multiprocessor: attribute(DeviceAttribute::MaxSharedMemoryPerMultiprocessor)?,
            l2_bytes: attribute(DeviceAttribute::L2CacheSize)?,
            driver_api: cust::CudaApiVersion::get()
                .map(|v| (v.major() as u32, v.minor() as u32))
                .during("cuDriverGetVersion")?,
        };
        Ok(Gpu { inner: Arc::new(GpuInner { info, modules: Modules::default(), context }) })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// A new non-blocking stream on this GPU.
    pub fn stream(&self) -> Result<Stream> {
        self.bind()?;
        let inner = CudaStream::new(StreamFlags::NON_BLOCKING, None).during("cuStreamCreate")?;
        Ok(Stream { gpu: self.clone(), inner })
    }

    /// Makes this GPU's context current on the calling thread; every driver call goes
    /// through here first, so a `Gpu` may be used from any thread.
    pub(crate) fn bind(&self) -> Result<()> {
        CurrentContext::set_current(&self.inner.context).during("cuCtxSetCurrent")
    }

    pub(crate) fn modules(&self) -> &Modules {
        &self.inner.modules
    }
}

/// A CUDA stream: ops are queued on it and run in order, asynchronously to the host.
pub struct Stream {
    // Declared before `gpu` so the stream is destroyed while its context lives.
    inner: CudaStream,
    gpu: Gpu,
}

impl Stream {
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Waits for everything queued so far; reports errors of earlier launches.
    pub fn synchronize(&self) -> Result<()> {
        self.gpu.bind()?;
        self.inner.synchronize().during("cuStreamSynchronize")
    }

    /// Device time of the work `work` queues on this stream, in milliseconds, measured
    /// with CUDA events recorded around it (waits for that work to finish).
    pub fn time_ms(&self, work: impl FnOnce(&Stream) -> Result<()>) -> Result<f32> {
        self.gpu.bind()?;
        let start = Event::new(EventFlags::DEFAULT).during("cuEventCreate")?;
        let end = Event::new(EventFlags::DEFAULT).during("cuEventCreate")?;
        start.record(&self.inner).during("cuEventRecord")?;
        work(self)?;
        end.record(&self.inner).during("cuEventRecord")?;
        end.synchronize().during("cuEventSynchronize")?;
        end.elapsed_time_f32(&start).during("cuEventElapsedTime")
    }

    pub(crate) fn raw(&self) -> &CudaStream {
        &self.inner
    }
}

/// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`, which cust's enum lacks.
fn shared_memory_per_block_optin(device: Device) -> Result<u32> {
    let attribute = cust::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN;
    let mut value = 0i32;
    // SAFETY: writes one int for a valid device and attribute.
    unsafe { cust::sys::cuDeviceGetAttribute(&mut value, attribute, device.as_raw()).during("cuDeviceGetAttribute")? };
    Ok(value.max(0) as u32)
}
