//! Copies from global to shared memory that bypass registers (`cp.async`, sm_80), and the
//! groups a thread waits on.

use super::{GlobalAddr, SharedAddr, trap};
use core::arch::asm;

/// Starts copying `bytes` (16, 8 or 4; a constant after inlining) from global to shared
/// memory without passing through registers (`cp.async`, sm_80): 16-byte copies bypass
/// L1 (`.cg`). The data is there once this thread has run [`wait_async_copies`].
///
/// # Safety
/// `src` must be valid for reads and `dst` inside the block's shared memory, both for
/// `bytes` and aligned to them; nobody writes `src` during the kernel.
#[inline(always)]
pub unsafe fn copy_async(dst: SharedAddr, src: GlobalAddr, bytes: usize) {
    // SAFETY: forwarded to the caller.
    unsafe {
        match bytes {
            16 => asm!("cp.async.cg.shared.global [{d}], [{s}], 16;", d = in(reg32) dst.0, s = in(reg64) src.0,
                options(nostack)),
            8 => asm!("cp.async.ca.shared.global [{d}], [{s}], 8;", d = in(reg32) dst.0, s = in(reg64) src.0,
                options(nostack)),
            4 => asm!("cp.async.ca.shared.global [{d}], [{s}], 4;", d = in(reg32) dst.0, s = in(reg64) src.0,
                options(nostack)),
            _ => trap(),
        }
    }
}

/// Waits until this thread's [`copy_async`] copies have landed (`cp.async.wait_all`).
#[inline(always)]
pub fn wait_async_copies() {
    // SAFETY: waits on this thread's own copies only.
    unsafe { asm!("cp.async.wait_all;", options(nostack)) };
}

/// Closes a group of this thread's [`copy_async`] copies: the ones since the last group
/// (`cp.async.commit_group`), which [`wait_async_groups_but`] waits for in order.
#[inline(always)]
pub fn commit_async_copies() {
    // SAFETY: marks this thread's own copies only.
    unsafe { asm!("cp.async.commit_group;", options(nostack)) };
}

/// Waits until at most `pending` of this thread's latest copy groups are still in
/// flight (`cp.async.wait_group`, whose count is an immediate: above 7, waits as for 7).
#[inline(always)]
pub fn wait_async_groups_but(pending: u32) {
    macro_rules! wait_group {
        ($($n:literal)*) => {
            // SAFETY: waits on this thread's own copies only.
            match pending {
                $($n => unsafe { asm!(concat!("cp.async.wait_group ", $n, ";"), options(nostack)) },)*
                _ => unsafe { asm!("cp.async.wait_group 7;", options(nostack)) },
            }
        };
    }
    wait_group!(0 1 2 3 4 5 6);
}
