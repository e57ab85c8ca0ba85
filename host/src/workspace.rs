//! Stream-ordered scratch memory for the partial sums ops pass between their kernels.

use crate::Stream;
use crate::error::{DriverContext, Result, invalid};
use crate::gpu::RawStream;
use std::mem::ManuallyDrop;

/// f32 scratch from the device's default memory pool, allocated and freed in stream order
/// (`cuMemAllocAsync`, `cuMemFreeAsync`) on any stream handle, owned or borrowed.
pub(crate) struct Workspace {
    address: u64,
    stream: RawStream,
}

impl Workspace {
    /// `len` uninitialized f32s, usable by work queued on `stream` after this call.
    fn new(stream: &Stream, len: usize) -> Result<Workspace> {
        let Some(bytes) = len.checked_mul(size_of::<f32>()) else {
            invalid!("a workspace of {len} f32s does not fit the address space");
        };
        let mut address = 0;
        if bytes > 0 {
            // SAFETY: writes one device pointer; the stream handle is live.
            unsafe { crate::driver::sys::cuMemAllocAsync(&mut address, bytes, stream.as_raw()) }
                .during("cuMemAllocAsync")?;
        }
        Ok(Workspace { address, stream: stream.as_raw() })
    }

    /// Runs `work` on `len` f32s of scratch at the address it is given, then frees them once
    /// the work `work` queued on `stream` has run: `work`'s result, or the free's error.
    pub(crate) fn scoped<R>(stream: &Stream, len: usize, work: impl FnOnce(u64) -> Result<R>) -> Result<R> {
        let workspace = Workspace::new(stream, len)?;
        let done = work(workspace.address);
        workspace.free()?;
        done
    }

    /// Frees the memory once the work queued before this call has run.
    fn free(self) -> Result<()> {
        let workspace = ManuallyDrop::new(self);
        workspace.release().during("cuMemFreeAsync")
    }

    fn release(&self) -> crate::driver::sys::CUresult {
        if self.address == 0 {
            return crate::driver::sys::CUresult::CUDA_SUCCESS;
        }
        // SAFETY: the address came from `cuMemAllocAsync` and is freed once, in the order of
        // the stream it was allocated on.
        unsafe { crate::driver::sys::cuMemFreeAsync(self.address, self.stream) }
    }
}

impl Drop for Workspace {
    /// Where `scoped`'s work unwinds: freed all the same; a failure there leaves nothing
    /// to undo.
    fn drop(&mut self) {
        self.release();
    }
}
