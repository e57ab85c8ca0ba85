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

/// `x`, through a register move LLVM may not move or merge: what is computed from it is
/// computed again where it is used, rather than hoisted out of a loop and held in registers
/// through every iteration.
#[inline(always)]
pub fn pinned(x: u32) -> u32 {
    let y: u32;
    // SAFETY: a register move; no memory is touched.
    unsafe { core::arch::asm!("mov.b32 {y}, {x};", y = out(reg32) y, x = in(reg32) x, options(nomem, nostack)) };
    y
}
