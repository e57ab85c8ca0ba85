//! The block's shared memory: its static arrays (the cluster exchange among them) and its
//! dynamic array, their addresses, and loads and stores in the shared window.

use super::trap;
#[cfg(feature = "cluster")]
use crate::abi::CLUSTER_EXCHANGE_BYTES;
use crate::abi::ROW_STATIC_SHARED_BYTES;
use core::arch::{asm, global_asm};

global_asm!(".extern .shared .align 16 .b8 rill_dynamic_shared[];");
global_asm!(".shared .align 16 .b8 rill_reduce_scratch[{bytes}];", bytes = const ROW_STATIC_SHARED_BYTES);
#[cfg(feature = "cluster")]
global_asm!(".shared .align 16 .b8 rill_cluster_exchange[{bytes}];", bytes = const CLUSTER_EXCHANGE_BYTES);

/// Two words for each of 32 warps of static shared memory, for block-wide reductions
/// ([`ROW_STATIC_SHARED_BYTES`], which the host leaves room for).
#[inline(always)]
pub fn reduce_scratch() -> *mut u32 {
    let p: u64;
    // SAFETY: takes the address of the static shared array declared above.
    unsafe {
        asm!("cvta.shared.u64 {p}, rill_reduce_scratch;", p = out(reg64) p,
            options(pure, nomem, nostack));
    }
    p as *mut u32
}

/// Static shared memory where the blocks of a cluster exchange a reduction's partials
/// (see [`CLUSTER_EXCHANGE_BYTES`]).
#[cfg(feature = "cluster")]
#[inline(always)]
pub fn cluster_exchange() -> SharedAddr {
    let a: u32;
    // SAFETY: takes the shared-window address of the static array declared above.
    unsafe { asm!("mov.u32 {a}, rill_cluster_exchange;", a = out(reg32) a, options(pure, nomem, nostack)) };
    SharedAddr(a)
}

/// An address in the block's shared-memory window (what `ld.shared`/`st.shared` take).
#[derive(Clone, Copy)]
pub struct SharedAddr(pub(super) u32);

impl SharedAddr {
    /// This address advanced by `bytes`.
    #[inline(always)]
    pub fn offset(self, bytes: u32) -> Self {
        SharedAddr(self.0 + bytes)
    }

    /// Bytes from `start` up to this address (at or past it).
    #[inline(always)]
    pub fn bytes_past(self, start: SharedAddr) -> u32 {
        self.0 - start.0
    }
}

/// Start of the block's dynamic shared memory (sized by the launch), as a shared-window
/// address.
#[inline(always)]
pub fn dynamic_shared_addr() -> SharedAddr {
    let a: u32;
    // SAFETY: takes the shared-window address of the dynamic shared array declared above.
    unsafe {
        asm!("mov.u32 {a}, rill_dynamic_shared;", a = out(reg32) a, options(pure, nomem, nostack));
    }
    SharedAddr(a)
}

/// Start of the block's dynamic shared memory (sized by the launch), as a generic pointer.
#[inline(always)]
pub fn dynamic_shared<T>() -> *mut T {
    let p: u64;
    // SAFETY: takes the address of the dynamic shared array declared above.
    unsafe {
        asm!("cvta.shared.u64 {p}, rill_dynamic_shared;", p = out(reg64) p,
            options(pure, nomem, nostack));
    }
    p as *mut T
}

/// Loads `bytes` bytes (16, 8, 4, 2 or 1; a constant after inlining) of shared memory in one
/// access, as words. Not `pure`: shared memory changes under it, so it stays in program
/// order with the stores.
///
/// # Safety
/// `addr` must be inside the block's shared memory, valid for reads of `bytes` bytes
/// and aligned to `bytes`.
#[inline(always)]
pub unsafe fn load_shared(addr: SharedAddr, bytes: usize) -> [u32; 4] {
    let mut w = [0u32; 4];
    // SAFETY: forwarded to the caller; each arm reads exactly `bytes` bytes.
    unsafe {
        match bytes {
            16 => asm!("ld.shared.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
                a = out(reg32) w[0], b = out(reg32) w[1], c = out(reg32) w[2], d = out(reg32) w[3],
                p = in(reg32) addr.0, options(readonly, nostack)),
            8 => asm!("ld.shared.v2.u32 {{{a}, {b}}}, [{p}];", a = out(reg32) w[0], b = out(reg32) w[1],
                p = in(reg32) addr.0, options(readonly, nostack)),
            4 => asm!("ld.shared.u32 {a}, [{p}];", a = out(reg32) w[0], p = in(reg32) addr.0,
                options(readonly, nostack)),
            2 => {
                let h: u16;
                asm!("ld.shared.u16 {h}, [{p}];", h = out(reg16) h, p = in(reg32) addr.0,
                    options(readonly, nostack));
                w[0] = h as u32;
            }
            1 => {
                let h: u16;
                asm!("ld.shared.u8 {h}, [{p}];", h = out(reg16) h, p = in(reg32) addr.0,
                    options(readonly, nostack));
                w[0] = h as u32;
            }
            _ => trap(),
        }
    }
    w
}

vector_store!(
    /// Stores to the block's shared memory.
    store_shared,
    "shared",
    SharedAddr,
    reg32
);
