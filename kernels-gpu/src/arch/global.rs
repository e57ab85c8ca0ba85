//! Global memory: addresses in the global state space, read-only loads (`ld.global.nc`,
//! with or without an L1 hint) and stores.

use super::trap;
use core::arch::asm;

/// A device address known to be in the global state space.
#[derive(Clone, Copy)]
pub struct GlobalAddr(pub(super) u64);

impl GlobalAddr {
    /// # Safety
    /// `generic` must be a generic address of global memory (as `cuMemAlloc` returns).
    #[inline(always)]
    pub unsafe fn from_generic(generic: u64) -> Self {
        let g: u64;
        // SAFETY: a pure address conversion; the caller vouches the address is global.
        unsafe {
            asm!("cvta.to.global.u64 {g}, {p};", g = out(reg64) g, p = in(reg64) generic,
                options(pure, nomem, nostack));
        }
        GlobalAddr(g)
    }

    /// This address advanced by `bytes`.
    #[inline(always)]
    pub fn offset(self, bytes: u64) -> Self {
        GlobalAddr(self.0 + bytes)
    }
}

/// Defines a read-only global load of 16, 8, 4, 2 or 1 bytes with the `ld.global.nc`
/// qualifiers `$hint` (empty, or an L1 eviction hint).
macro_rules! global_nc_load {
    ($(#[$doc:meta])* $name:ident, $hint:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `addr` must be valid for reads of `bytes` bytes (16, 8, 4, 2 or 1; a constant after
        /// inlining), aligned to `bytes`, and not written by anyone during the kernel (the
        /// load goes through the read-only path, `.nc`).
        #[inline(always)]
        pub unsafe fn $name(addr: GlobalAddr, bytes: usize) -> [u32; 4] {
            let mut w = [0u32; 4];
            // SAFETY: forwarded to the caller; each arm reads exactly `bytes` bytes.
            unsafe {
                match bytes {
                    16 => asm!(concat!("ld.global.nc", $hint, ".v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];"),
                        a = out(reg32) w[0], b = out(reg32) w[1], c = out(reg32) w[2], d = out(reg32) w[3],
                        p = in(reg64) addr.0, options(pure, readonly, nostack)),
                    8 => asm!(concat!("ld.global.nc", $hint, ".v2.u32 {{{a}, {b}}}, [{p}];"),
                        a = out(reg32) w[0], b = out(reg32) w[1], p = in(reg64) addr.0,
                        options(pure, readonly, nostack)),
                    4 => asm!(concat!("ld.global.nc", $hint, ".u32 {a}, [{p}];"), a = out(reg32) w[0],
                        p = in(reg64) addr.0, options(pure, readonly, nostack)),
                    2 => {
                        let h: u16;
                        asm!(concat!("ld.global.nc", $hint, ".u16 {h}, [{p}];"), h = out(reg16) h,
                            p = in(reg64) addr.0, options(pure, readonly, nostack));
                        w[0] = h as u32;
                    }
                    1 => {
                        let h: u16;
                        asm!(concat!("ld.global.nc", $hint, ".u8 {h}, [{p}];"), h = out(reg16) h,
                            p = in(reg64) addr.0, options(pure, readonly, nostack));
                        w[0] = h as u32;
                    }
                    _ => trap(),
                }
            }
            w
        }
    };
}

global_nc_load!(
    /// One access of `bytes` bytes, as words.
    load_global_nc,
    ""
);
global_nc_load!(
    /// As [`load_global_nc`], for data read once: it does not allocate in L1, so streaming
    /// rows through an SM leaves its L1 to what is re-read (a norm's gamma and beta).
    load_global_stream,
    ".L1::no_allocate"
);

vector_store!(
    /// Stores to global memory.
    store_global,
    "global",
    GlobalAddr,
    reg64
);
vector_store!(
    /// As [`store_global`], for outputs nothing in the kernel reads again while it re-reads
    /// its inputs from L2 (`.cs`: the lines are the first L2 evicts), so the outputs do not
    /// push those inputs out.
    store_global_streaming,
    "global.cs",
    GlobalAddr,
    reg64
);

/// Starts reading into L2 this thread's share of the 128-byte lines that `row` (`bytes` > 0
/// bytes) touches, thread `thread` of the `threads` that share the row: lines `thread`,
/// `thread + threads`, ..., each named by an address inside the row (the row's first byte
/// for the line it starts in). A hint: nothing comes back and nothing waits for it, so a
/// later read of the row waits on L2 rather than DRAM.
///
/// # Safety
/// `row..row + bytes` must lie in an allocation of global memory.
#[inline(always)]
pub unsafe fn request_row_l2(row: GlobalAddr, bytes: u64, thread: u32, threads: u32) {
    const LINE: u64 = 128;
    let first_line = row.0 & !(LINE - 1);
    let lines = (row.0 + bytes - first_line).div_ceil(LINE);
    let mut line = thread as u64;
    while line < lines {
        let address = (first_line + line * LINE).max(row.0);
        // SAFETY: `address` lies inside the row (the caller's allocation); the instruction
        // writes nothing.
        unsafe { asm!("prefetch.global.L2 [{a}];", a = in(reg64) address, options(readonly, nostack)) };
        line += threads as u64;
    }
}

/// Starts reading the line holding `base[index]` into L1 (`prefetch.L1`), so a read of it a
/// little later hits there. A hint: nothing comes back and nothing waits for it. The address
/// is computed inside the instruction's block: computed outside, it is the same value the
/// later read uses, and the register allocator then keeps it (and more) live in between
/// (docs/DECISIONS.md, "Per-row values read once a row").
///
/// # Safety
/// `base` must point into an allocation of global memory holding `base[index]`.
#[inline(always)]
pub unsafe fn prefetch_l1_element<T>(base: *const T, index: u64) {
    // SAFETY: forwarded to the caller; the instruction writes nothing.
    unsafe {
        asm!(
            "{{ .reg .b64 %a; mad.lo.u64 %a, {i}, {size}, {b}; prefetch.L1 [%a]; }}",
            i = in(reg64) index,
            b = in(reg64) base as u64,
            size = const core::mem::size_of::<T>(),
            options(readonly, nostack)
        )
    }
}
