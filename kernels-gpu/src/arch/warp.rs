//! Lanes of a warp: lane ids and masks, shuffles and votes.

use super::thread_idx_x;
use core::arch::asm;

pub use crate::abi::WARP_SIZE;
/// Member mask of a full warp.
pub const FULL_MASK: u32 = 0xffff_ffff;

/// Lane index within the warp.
#[inline(always)]
pub fn lane_id() -> u32 {
    thread_idx_x() % WARP_SIZE
}

/// Mask of the lanes below this one (`%lanemask_lt`).
#[inline(always)]
pub fn lanemask_lt() -> u32 {
    let m: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {m}, %lanemask_lt;", m = out(reg32) m, options(pure, nomem, nostack)) };
    m
}

/// Operand `c` of `shfl.sync` for a thread group of `width` lanes (a power of two up to 32):
/// the segment mask in bits 8..13 and the clamp value in bits 0..4, as CUDA's `__shfl_*_sync`.
#[inline(always)]
const fn shfl_clamp(width: u32) -> u32 {
    ((WARP_SIZE - width) << 8) | 0x1f
}

macro_rules! shuffle {
    ($(#[$doc:meta])* $name:ident, $mode:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// Every lane named in `mask` must execute this same shuffle (convergence), and
        /// `width` must be a power of two no larger than 32.
        #[inline(always)]
        pub unsafe fn $name(mask: u32, value: u32, operand: u32, width: u32) -> u32 {
            let out: u32;
            // SAFETY: forwarded to the caller (convergence of the lanes in `mask`).
            unsafe {
                asm!(concat!("shfl.sync.", $mode, ".b32 {out}, {value}, {operand}, {clamp}, {mask};"),
                    out = out(reg32) out, value = in(reg32) value, operand = in(reg32) operand,
                    clamp = in(reg32) shfl_clamp(width), mask = in(reg32) mask,
                    options(nomem, nostack));
            }
            out
        }
    };
}

shuffle!(
    /// Value of lane `lane ^ operand` within each group of `width` lanes.
    shfl_xor_u32,
    "bfly"
);
shuffle!(
    /// Value of lane `lane + operand` within each group of `width` lanes (own value past the end).
    shfl_down_u32,
    "down"
);
shuffle!(
    /// Value of lane `operand` of this lane's group of `width` lanes.
    shfl_idx_u32,
    "idx"
);

/// [`shfl_down_u32`] on an f32.
///
/// # Safety
/// As [`shfl_down_u32`].
#[inline(always)]
pub unsafe fn shfl_down(mask: u32, value: f32, delta: u32, width: u32) -> f32 {
    // SAFETY: forwarded to the caller.
    f32::from_bits(unsafe { shfl_down_u32(mask, value.to_bits(), delta, width) })
}

/// [`shfl_idx_u32`] on an f32.
///
/// # Safety
/// As [`shfl_idx_u32`].
#[inline(always)]
pub unsafe fn shfl_idx(mask: u32, value: f32, lane: u32, width: u32) -> f32 {
    // SAFETY: forwarded to the caller.
    f32::from_bits(unsafe { shfl_idx_u32(mask, value.to_bits(), lane, width) })
}

/// One bit per lane in `mask`: set where `predicate` holds (`vote.sync.ballot.b32`).
///
/// # Safety
/// Every lane named in `mask` must execute this same vote.
#[inline(always)]
pub unsafe fn ballot(mask: u32, predicate: bool) -> u32 {
    let out: u32;
    // SAFETY: forwarded to the caller (convergence of the lanes in `mask`).
    unsafe {
        asm!("{{ .reg .pred p; setp.ne.u32 p, {pred}, 0; vote.sync.ballot.b32 {out}, p, {mask}; }}",
            out = out(reg32) out, pred = in(reg32) predicate as u32, mask = in(reg32) mask,
            options(nomem, nostack));
    }
    out
}
