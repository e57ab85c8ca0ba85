//! Device, context and stream handling.

use crate::driver::{self, OwnedStream, PrimaryContext, sys};
use crate::error::{DriverContext, Error, Result, invalid};
use crate::module::Modules;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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
    /// The DRAM's peak bandwidth in bytes per second, from the memory clock and bus width
    /// the driver reports (0 where it does not): with the SM count, how many bytes each SM
    /// must keep in flight, which decides some row plans (the dispatcher's `fast_dram`).
    pub dram_bytes_per_second: u64,
    /// The CUDA version the installed driver supports (`cuDriverGetVersion`), e.g. (13, 0).
    pub driver_api: (u32, u32),
}

/// An identity no other GPU or user module of the process takes, even after it is gone:
/// what caches kept above the GPU (the row engine's plans) key their entries by, so an
/// entry of a dropped GPU or unloaded module is never found again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Owner(u64);

impl Owner {
    pub(crate) fn new() -> Owner {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Owner(NEXT.fetch_add(1, Ordering::Relaxed))
    }
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
    /// Who this GPU's kernels are to caches kept above it (the row engine's plans).
    owner: Owner,
    /// `None` for an offline GPU ([`Gpu::offline`]).
    context: Option<PrimaryContext>,
}

/// The driver's `CUDA_ERROR_NO_DEVICE`, which an offline GPU's driver calls fail with.
const NO_DEVICE: u32 = 100;

impl Gpu {
    /// Opens GPU `ordinal`. Fails with a driver error where there is no CUDA device.
    pub fn new(ordinal: u32) -> Result<Gpu> {
        use sys::CUdevice_attribute::*;
        let device = driver::device(ordinal)?;
        let context = PrimaryContext::retain(device)?;
        context.make_current()?;
        let attribute = |attribute| driver::attribute(device, attribute).map(|value| value.max(0) as u32);
        let info = DeviceInfo {
            name: driver::name(device)?,
            ordinal,
            compute_capability: (
                attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            multiprocessors: attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            max_threads_per_multiprocessor: attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?,
            max_shared_bytes_per_block_optin: attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            max_shared_bytes_per_multiprocessor: attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
            l2_bytes: attribute(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
            dram_bytes_per_second: dram_bytes_per_second(device),
            driver_api: driver::driver_version()?,
        };
        Ok(Gpu::with(info, Some(context)))
    }

    /// A GPU described by `info` but not opened, for checking calls where there is no CUDA
    /// device (a CI machine): every op checks its arguments as it would on the device and
    /// returns the same errors for bad ones, then fails at its first driver call with
    /// [`Error::Driver`] (code 100, `CUDA_ERROR_NO_DEVICE`) where a device would take over:
    /// planning, the kernel's lookup, the launch. Its streams are placeholders; tensors
    /// cannot be allocated on it, so views come from [`View::from_raw`] over addresses that
    /// are never dereferenced.
    ///
    /// ```
    /// # fn main() -> rill::Result<()> {
    /// let info = rill::DeviceInfo {
    ///     name: "an H100 that is not here".into(),
    ///     ordinal: 0,
    ///     compute_capability: (9, 0),
    ///     multiprocessors: 132,
    ///     max_threads_per_multiprocessor: 2048,
    ///     max_shared_bytes_per_block_optin: 232_448,
    ///     max_shared_bytes_per_multiprocessor: 233_472,
    ///     l2_bytes: 52_428_800,
    ///     dram_bytes_per_second: 3_352_320_000_000,
    ///     driver_api: (13, 0),
    /// };
    /// let gpu = rill::Gpu::offline(info);
    /// let stream = gpu.stream()?;
    /// // SAFETY: an offline GPU never touches the addresses.
    /// let x = unsafe { rill::View::<f32>::from_raw(0x1000, &[8, 4096])? };
    /// let mut y = unsafe { rill::ViewMut::<f32>::from_raw(0x100000, &[8, 4095])? };
    /// let wrong_shape = rill::softmax::softmax(&stream, &x, &mut y);
    /// assert!(matches!(wrong_shape, Err(rill::Error::InvalidInput(_))));
    /// let mut y = unsafe { rill::ViewMut::<f32>::from_raw(0x100000, &[8, 4096])? };
    /// let checked = rill::softmax::softmax(&stream, &x, &mut y);
    /// assert!(matches!(checked, Err(rill::Error::Driver { code: 100, .. })));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`Error::Driver`]: crate::Error::Driver
    /// [`View::from_raw`]: crate::View::from_raw
    pub fn offline(info: DeviceInfo) -> Gpu {
        Gpu::with(info, None)
    }

    /// A GPU of `info` and `context`, nothing loaded or planned yet.
    fn with(info: DeviceInfo, context: Option<PrimaryContext>) -> Gpu {
        let modules = Modules::new(info.compute_capability);
        Gpu { inner: Arc::new(GpuInner { info, modules, owner: Owner::new(), context }) }
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// A new non-blocking stream on this GPU.
    pub fn stream(&self) -> Result<Stream> {
        if self.inner.context.is_none() {
            // A placeholder no driver call ever gets: every one fails at `bind` first.
            return Ok(Stream { handle: Handle::Borrowed(std::ptr::null_mut()), gpu: self.clone() });
        }
        self.bind()?;
        Ok(Stream { handle: Handle::Owned(OwnedStream::non_blocking()?), gpu: self.clone() })
    }

    /// Makes this GPU's context current on the calling thread; every driver call goes
    /// through here first, so a `Gpu` may be used from any thread.
    pub(crate) fn bind(&self) -> Result<()> {
        match &self.inner.context {
            Some(context) => context.make_current(),
            None => Err(Error::Driver {
                call: "cuCtxSetCurrent",
                code: NO_DEVICE,
                message: "no CUDA device: this GPU is offline (`Gpu::offline`), so calls are checked, never run".into(),
            }),
        }
    }

    pub(crate) fn modules(&self) -> &Modules {
        &self.inner.modules
    }

    /// This GPU's identity, which no other GPU (or user module) of the process takes.
    pub(crate) fn owner(&self) -> Owner {
        self.inner.owner
    }
}

/// A raw CUDA stream handle (`CUstream`), as other CUDA libraries hand them out: cudarc's
/// `CudaStream::cu_stream()`, PyTorch's `torch.cuda.current_stream().cuda_stream`.
pub type RawStream = sys::CUstream;

/// A CUDA stream: ops are queued on it and run in order, asynchronously to the host.
pub struct Stream {
    // Declared before `gpu` so an owned stream is destroyed while its context lives.
    handle: Handle,
    gpu: Gpu,
}

/// Whether the stream is this library's to destroy.
enum Handle {
    Owned(OwnedStream),
    /// Another library's stream: never destroyed here.
    Borrowed(RawStream),
}

impl Stream {
    /// A stream another library created and owns, e.g. cudarc's or PyTorch's current one,
    /// so that rill's ops queue in order with that library's work. Dropping the `Stream`
    /// leaves the stream alone; rill synchronizes it only where asked to
    /// ([`Stream::synchronize`], [`Stream::time_ms`]). The null handle is the context's
    /// legacy default stream (PyTorch's default).
    ///
    /// Fails with [`Error::InvalidInput`] where the stream belongs to another context than
    /// `gpu`'s primary one.
    ///
    /// # Safety
    /// - `raw` is a live stream, or null, and stays live as long as the returned `Stream`;
    /// - it is not destroyed while work rill queued on it may still run.
    ///
    /// [`Error::InvalidInput`]: crate::Error::InvalidInput
    ///
    /// ```no_run
    /// # fn main() -> rill::Result<()> {
    /// # let gpu = rill::Gpu::new(0)?;
    /// # let stream = gpu.stream()?;
    /// // A stream another library made (here one of rill's own, for the example):
    /// let theirs = gpu.stream()?;
    /// // SAFETY: `theirs` outlives `ours` and is in GPU 0's primary context.
    /// let ours = unsafe { rill::Stream::from_raw(&gpu, theirs.as_raw())? };
    /// let x = rill::Tensor::<f32>::zeros(&gpu, &[1024])?;
    /// let mut y = rill::Tensor::<f32>::zeros(&gpu, &[1024])?;
    /// rill::elementwise::relu(&ours, &x, &mut y)?;
    /// # Ok(())
    /// # }
    /// ```
    pub unsafe fn from_raw(gpu: &Gpu, raw: RawStream) -> Result<Stream> {
        gpu.bind()?;
        if !raw.is_null() {
            let mut context = std::ptr::null_mut();
            // SAFETY: the caller's promise that `raw` is a live stream; writes one handle.
            unsafe { sys::cuStreamGetCtx(raw, &mut context) }.during("cuStreamGetCtx")?;
            if Some(context) != gpu.inner.context.as_ref().map(PrimaryContext::as_raw) {
                invalid!(
                    "the stream belongs to another CUDA context than GPU {}'s primary one: create it in the \
                     primary context (cudarc's `CudaContext::new`, PyTorch's default) or open that device",
                    gpu.info().ordinal
                );
            }
        }
        Ok(Stream { handle: Handle::Borrowed(raw), gpu: gpu.clone() })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The driver's handle, to queue another library's work in order with rill's.
    pub fn as_raw(&self) -> RawStream {
        match &self.handle {
            Handle::Owned(stream) => stream.as_raw(),
            Handle::Borrowed(raw) => *raw,
        }
    }

    /// Waits for everything queued so far; reports errors of earlier launches.
    pub fn synchronize(&self) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: the handle is live (owned, or the `from_raw` caller's promise).
        unsafe { sys::cuStreamSynchronize(self.as_raw()) }.during("cuStreamSynchronize")
    }

    /// Device time of the work `work` queues on this stream, in milliseconds, measured
    /// with CUDA events recorded around it (waits for that work to finish).
    pub fn time_ms(&self, work: impl FnOnce(&Stream) -> Result<()>) -> Result<f32> {
        self.gpu.bind()?;
        let (start, end) = (RawEvent::new()?, RawEvent::new()?);
        start.record(self)?;
        work(self)?;
        end.record(self)?;
        let mut millis = 0.0f32;
        // SAFETY: both events are live and recorded; writes one float.
        unsafe {
            sys::cuEventSynchronize(end.0).during("cuEventSynchronize")?;
            sys::cuEventElapsedTime(&mut millis, start.0, end.0).during("cuEventElapsedTime")?;
        }
        Ok(millis)
    }
}

impl Stream {
    /// Records the work `record` queues on this stream, without running it, as a [`Graph`]
    /// that replays it with one launch ([`Graph::launch`]): a chain of small ops then costs
    /// the host one launch instead of one each. The graph keeps the addresses, shapes and
    /// plans of the calls as recorded: replay it on the same tensors, overwritten in place.
    ///
    /// Every rill op can be recorded: none synchronizes or allocates outside stream order
    /// during a call. Run each op once before recording it: the first call of a shape asks
    /// the driver about the kernel (a lookup, an occupancy question), which the recording
    /// then need not. A stream that is the legacy default stream (a null
    /// [`Stream::from_raw`]) cannot record; the driver's error says so.
    ///
    /// ```no_run
    /// # fn main() -> rill::Result<()> {
    /// # let gpu = rill::Gpu::new(0)?;
    /// # let stream = gpu.stream()?;
    /// let x = rill::Tensor::<f32>::zeros(&gpu, &[8, 4096])?;
    /// let (mut y, mut z) = (rill::Tensor::<f32>::zeros(&gpu, &[8, 4096])?, rill::Tensor::<f32>::zeros(&gpu, &[8, 4096])?);
    /// let graph = stream.capture(|s| {
    ///     rill::softmax::softmax(s, &x, &mut y)?;
    ///     rill::elementwise::relu(s, &y, &mut z)
    /// })?;
    /// for _ in 0..100 {
    ///     graph.launch(&stream)?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn capture(&self, record: impl FnOnce(&Stream) -> Result<()>) -> Result<Graph> {
        use sys::CUstreamCaptureMode_enum::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        self.gpu.bind()?;
        // SAFETY: the handle is live; capture ends below on every path.
        unsafe { sys::cuStreamBeginCapture_v2(self.as_raw(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) }
            .during("cuStreamBeginCapture")?;
        let recorded = record(self);
        let mut graph = std::ptr::null_mut();
        // SAFETY: ends the capture begun above; writes one graph handle (null where it failed).
        let ended = unsafe { sys::cuStreamEndCapture(self.as_raw(), &mut graph) }.during("cuStreamEndCapture");
        let graph = GraphHandle(graph);
        recorded?;
        ended?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: a graph the capture made; writes one executable handle.
        unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph.0, 0) }.during("cuGraphInstantiate")?;
        Ok(Graph { exec, _graph: graph, gpu: self.gpu.clone() })
    }
}

/// Work recorded from a stream ([`Stream::capture`]), replayed by one launch.
pub struct Graph {
    exec: sys::CUgraphExec,
    _graph: GraphHandle,
    // Keeps the context alive until the graph is destroyed.
    gpu: Gpu,
}

// SAFETY: an executable graph may be launched from any thread of its context; `launch`
// takes `&self` and the driver serializes launches of one graph.
unsafe impl Send for Graph {}
// SAFETY: as above.
unsafe impl Sync for Graph {}

impl Graph {
    /// Queues the recorded work on `stream` (any stream of the same GPU), in order with what
    /// `stream` already holds.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: a live executable graph and a live stream handle.
        unsafe { sys::cuGraphLaunch(self.exec, stream.as_raw()) }.during("cuGraphLaunch")
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: the executable graph was instantiated by `capture` and is destroyed once
        // (the driver lets launched work finish first); a failure leaves nothing to undo.
        unsafe {
            let _ = self.gpu.bind();
            sys::cuGraphExecDestroy(self.exec);
        }
    }
}

/// A captured graph, destroyed when dropped (null where the capture made none).
struct GraphHandle(sys::CUgraph);

impl Drop for GraphHandle {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a graph the capture made, destroyed once.
            unsafe { sys::cuGraphDestroy(self.0) };
        }
    }
}

/// A CUDA event on any stream handle.
struct RawEvent(sys::CUevent);

impl RawEvent {
    fn new() -> Result<RawEvent> {
        let mut event = std::ptr::null_mut();
        // SAFETY: writes one handle, owned by the returned value.
        unsafe { sys::cuEventCreate(&mut event, 0) }.during("cuEventCreate")?;
        Ok(RawEvent(event))
    }

    fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: the event is live, the stream's handle too.
        unsafe { sys::cuEventRecord(self.0, stream.as_raw()) }.during("cuEventRecord")
    }
}

impl Drop for RawEvent {
    fn drop(&mut self) {
        // SAFETY: the event was created by `new` and is destroyed once; a failure leaves
        // nothing to undo.
        unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

/// The DRAM's peak bandwidth: two transfers a memory clock (kHz) over the bus (bits). 0
/// where the driver does not report them (an attribute a driver may drop), which leaves
/// the planner on its plans for the slower DRAM rather than failing to open the device.
fn dram_bytes_per_second(device: sys::CUdevice) -> u64 {
    use sys::CUdevice_attribute::*;
    let attribute = |attribute| driver::attribute(device, attribute).map_or(0, |value| value.max(0) as u64);
    let (clock_khz, bus_bits) =
        (attribute(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE), attribute(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH));
    2 * clock_khz * 1000 * bus_bits / 8
}
