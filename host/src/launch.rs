//! Launch geometry and the single place kernels are launched.

use crate::driver::sys::{self, cuLaunchKernel};
use crate::error::{DriverContext, Result};
use crate::gpu::{DeviceInfo, Stream};
use crate::module::Kernel;
use std::ffi::c_void;
use std::ptr::null_mut;

mod counts;
pub use counts::{LaunchCounts, count_launches, launch_counts};
pub(crate) use counts::{Tally, count};

/// Grid, block and dynamic shared memory of one launch (1-D grids and blocks), and the
/// blocks per cluster (1: no clusters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: u32,
    pub block: u32,
    pub shared_bytes: u32,
    pub cluster: u32,
}

impl LaunchConfig {
    /// A grid-stride kernel's launch over `threads` threads in blocks of `block` (see
    /// [`grid_stride_blocks`]), without shared memory or clusters.
    pub fn grid_stride(threads: u64, block: u32, device: &DeviceInfo) -> Self {
        LaunchConfig { grid: grid_stride_blocks(threads, block, device), block, shared_bytes: 0, cluster: 1 }
    }
}

/// Waves of resident blocks a grid-stride kernel is given at most (OneFlow's kNumWaves):
/// enough to hide the tail of the last wave, few enough to amortize per-block set-up.
pub const WAVES: u32 = 32;

/// Blocks for `threads` threads in blocks of `block`, capped at [`WAVES`] waves of the
/// device's resident blocks (OneFlow's GetNumBlocks); at least 1.
pub fn grid_stride_blocks(threads: u64, block: u32, device: &DeviceInfo) -> u32 {
    // At least one block resident per SM, whatever the block size.
    let resident = device.multiprocessors as u64 * (device.max_threads_per_multiprocessor / block).max(1) as u64;
    let needed = threads.div_ceil(block as u64);
    needed.min(resident * WAVES as u64).max(1) as u32
}

/// Launches `kernel` with `params` as its only (by-value) parameter, inside an NVTX range
/// named after the kernel so profilers show which op it was (a no-op without a profiler),
/// and counts it where counting is on ([`count_launches`]). A launch with clusters goes
/// through `cuLaunchKernelEx`.
///
/// # Safety
/// `P` must be the `#[repr(C)]` parameter struct the kernel was compiled for, and every
/// device address in it must be valid for the accesses the kernel makes with `config`.
pub(crate) unsafe fn launch<P: Copy>(stream: &Stream, kernel: Kernel, config: LaunchConfig, params: &P) -> Result<()> {
    stream.gpu().bind()?;
    let mut param_ptrs = [params as *const P as *mut c_void];
    let _range = crate::nvtx::range(kernel.symbol);
    let launched = if config.cluster > 1 {
        let mut attribute = clusters::cluster_attribute(config.cluster);
        let ex = clusters::config(config, stream.as_raw(), &mut attribute);
        // SAFETY: as below; `ex` points at `attribute`, alive for the call.
        unsafe {
            sys::cuLaunchKernelEx(&ex, kernel.function, param_ptrs.as_mut_ptr(), null_mut()).during("cuLaunchKernelEx")
        }
    } else {
        let LaunchConfig { grid, block, shared_bytes, .. } = config;
        let (raw_stream, params) = (stream.as_raw(), param_ptrs.as_mut_ptr());
        // SAFETY: the driver copies the parameter bytes before returning; validity of what
        // they point to is the caller's obligation.
        unsafe {
            cuLaunchKernel(kernel.function, grid, 1, 1, block, 1, 1, shared_bytes, raw_stream, params, null_mut())
                .during("cuLaunchKernel")
        }
    };
    if launched.is_ok() {
        count(Tally::Launched, kernel.symbol);
    }
    launched
}

/// Clusters of `config.cluster` blocks of `kernel` that can be resident at once (0: it
/// cannot launch that way), from the driver's occupancy calculator. Clusters past the
/// portable size are first allowed for the kernel (the launch needs that too).
pub(crate) fn active_clusters(kernel: Kernel, config: LaunchConfig) -> Result<u32> {
    if config.cluster > clusters::PORTABLE_SIZE {
        // SAFETY: sets an attribute of a loaded function.
        unsafe {
            let allowed = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED;
            sys::cuFuncSetAttribute(kernel.function, allowed, 1).during("cuFuncSetAttribute")?;
        }
    }
    let mut attribute = clusters::cluster_attribute(config.cluster);
    let ex = clusters::config(config, std::ptr::null_mut(), &mut attribute);
    let mut count = 0i32;
    // SAFETY: writes one int; `ex` points at `attribute`, alive for the call.
    unsafe {
        sys::cuOccupancyMaxActiveClusters(&mut count, kernel.function, &ex).during("cuOccupancyMaxActiveClusters")?;
    }
    Ok(count.max(0) as u32)
}

/// The driver's extended launch (CUDA 12.0), used only for launches with clusters.
mod clusters {
    use super::LaunchConfig;
    use crate::driver::sys::{
        CUlaunchAttribute, CUlaunchAttributeID, CUlaunchAttributeValue, CUlaunchAttributeValue_union__bindgen_ty_1,
        CUlaunchConfig, CUstream,
    };

    /// Blocks per cluster every sm_90 GPU runs.
    pub(super) const PORTABLE_SIZE: u32 = 8;

    /// The launch attribute of clusters of `blocks` blocks.
    pub(super) fn cluster_attribute(blocks: u32) -> CUlaunchAttribute {
        CUlaunchAttribute {
            id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
            pad: [0; 4],
            value: CUlaunchAttributeValue {
                clusterDim: CUlaunchAttributeValue_union__bindgen_ty_1 { x: blocks, y: 1, z: 1 },
            },
        }
    }

    /// `config` on `stream` with `attribute`, which must outlive the driver call it is for.
    pub(super) fn config(config: LaunchConfig, stream: CUstream, attribute: &mut CUlaunchAttribute) -> CUlaunchConfig {
        CUlaunchConfig {
            gridDimX: config.grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: config.block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: config.shared_bytes,
            hStream: stream,
            attrs: attribute,
            numAttrs: 1,
        }
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
            dram_bytes_per_second: 3_352_320_000_000,
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
