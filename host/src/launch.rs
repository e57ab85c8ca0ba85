//! Launch geometry and the single place kernels are launched.

use crate::error::{DriverContext, Result};
use crate::gpu::{DeviceInfo, Stream};
use crate::module::Kernel;
use std::ffi::c_void;

/// Grid, block and dynamic shared memory of one launch (1-D grids and blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: u32,
    pub block: u32,
    pub shared_bytes: u32,
}

/// Waves of resident blocks a grid-stride kernel is given at most (OneFlow's kNumWaves):
/// enough to hide the tail of the last wave, few enough to amortize per-block set-up.
pub const WAVES: u32 = 32;

/// Blocks for `threads` threads in blocks of `block`, capped at [`WAVES`] waves of the
/// device's resident blocks (OneFlow's GetNumBlocks); at least 1.
pub fn grid_stride_blocks(threads: u64, block: u32, device: &DeviceInfo) -> u32 {
    let resident = device.multiprocessors as u64 * (device.max_threads_per_multiprocessor / block) as u64;
    let needed = threads.div_ceil(block as u64);
    needed.min(resident * WAVES as u64).max(1) as u32
}

/// Launches `kernel` with `params` as its only (by-value) parameter, inside an NVTX range
/// named after the kernel so profilers show which op it was (a no-op without a profiler).
///
/// # Safety
/// `P` must be the `#[repr(C)]` parameter struct the kernel was compiled for, and every
/// device address in it must be valid for the accesses the kernel makes with `config`.
pub(crate) unsafe fn launch<P: Copy>(stream: &Stream, kernel: Kernel, config: LaunchConfig, params: &P) -> Result<()> {
    stream.gpu().bind()?;
    let mut param_ptrs = [params as *const P as *mut c_void];
    let _range = crate::nvtx::range(kernel.symbol);
    // SAFETY: the driver copies the parameter bytes before returning; validity of what they
    // point to is the caller's obligation.
    unsafe {
        cust::sys::cuLaunchKernel(
            kernel.function,
            config.grid,
            1,
            1,
            config.block,
            1,
            1,
            config.shared_bytes,
            stream.raw().as_inner(),
            param_ptrs.as_mut_ptr(),
            std::ptr::null_mut(),
        )
        .during("cuLaunchKernel")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn h100() -> DeviceInfo {
        DeviceInfo {
            name: "H100".into(),
            ordinal: 0,
            compute_capability: (9, 0),
            multiprocessors: 132,
            max_threads_per_multiprocessor: 2048,
            max_shared_bytes_per_block_optin: 227 * 1024,
            max_shared_bytes_per_multiprocessor: 228 * 1024,
            l2_bytes: 50 << 20,
            driver_api: (13, 0),
        }
    }

    #[test]
    fn grid_covers_small_work_exactly() {
        assert_eq!(grid_stride_blocks(1, 256, &h100()), 1);
        assert_eq!(grid_stride_blocks(0, 256, &h100()), 1);
        assert_eq!(grid_stride_blocks(256, 256, &h100()), 1);
        assert_eq!(grid_stride_blocks(257, 256, &h100()), 2);
    }

    #[test]
    fn grid_is_capped_at_waves_of_resident_blocks() {
        // 132 SMs x 8 blocks of 256 x 32 waves.
        assert_eq!(grid_stride_blocks(1 << 40, 256, &h100()), 132 * 8 * 32);
    }
}
