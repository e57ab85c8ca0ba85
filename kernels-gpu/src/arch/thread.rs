//! The thread's place in the launch, the block's barrier, and aborting the kernel.

use core::arch::nvptx;

#[inline(always)]
pub fn thread_idx_x() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_thread_idx_x() as u32 }
}

#[inline(always)]
pub fn block_idx_x() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_block_idx_x() as u32 }
}

#[inline(always)]
pub fn block_dim_x() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_block_dim_x() as u32 }
}

#[inline(always)]
pub fn grid_dim_x() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_grid_dim_x() as u32 }
}

/// Block-wide barrier (`bar.sync 0`).
///
/// # Safety
/// Every thread of the block must reach it (no divergent call sites).
#[inline(always)]
pub unsafe fn sync_threads() {
    // SAFETY: forwarded to the caller.
    unsafe { nvptx::_syncthreads() }
}

/// Aborts the kernel; the launch then reports an error to the host.
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: `trap` ends the thread; nothing after it runs.
    unsafe { nvptx::trap() }
}
