//! Device intrinsics: the only module that touches `core::arch::nvptx` or inline PTX.
//!
//! One file per role, re-exported here so callers name `crate::arch::item` whatever the role:
//! - `thread`: the thread's and block's indices and dimensions, the block barrier, `trap`,
//!   and `pinned` (a value LLVM may not hoist out of the loop that computes it);
//! - `warp`: lane ids and masks, shuffles, ballots;
//! - `shared`: the block's static shared arrays (the cluster exchange included) and dynamic
//!   shared memory, shared-window addresses, loads and stores;
//! - `global`: global-state-space addresses, read-only loads (`ld.global.nc`, L1 hints), stores;
//! - `async_copy`: `cp.async` copies from global to shared memory and their groups;
//! - `cluster`: thread-block clusters (sm_90, the `cluster` feature): ranks and ids, the
//!   cluster barrier, mbarriers, `mapa` and `st.async` into another block's shared memory;
//! - `convert`: the f32 to bf16 conversion;
//! - `math`: the instructions that [`crate::math`] and [`crate::functor`] build on (`ex2`, `lg2`,
//!   `rsqrt`, `rcp`, `div`, `fma`) and the two-lane f16/bf16 `fma` and `max`:
//!   arithmetic, so not in `convert`.
//!
//! Everything exists on the NVPTX target only, except `convert` and the f32 instructions of
//! `math`, which have host versions so the portable math built on them ([`crate::math`],
//! [`crate::functor`]) runs in CPU unit tests.

/// Defines a store of the first `bytes` bytes of `w` (16, 8, 4, 2 or 1; a constant after
/// inlining) in one access to state space `$space`, at an `$addr` held in `$reg`; here, ahead
/// of the modules, because `global` and `shared` both use it.
#[cfg(target_arch = "nvptx64")]
macro_rules! vector_store {
    ($(#[$doc:meta])* $name:ident, $space:literal, $addr:ty, $reg:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `addr` must be valid for writes of `bytes` bytes and aligned to `bytes`.
        #[inline(always)]
        pub unsafe fn $name(addr: $addr, bytes: usize, w: [u32; 4]) {
            // SAFETY: forwarded to the caller; each arm writes exactly `bytes` bytes.
            unsafe {
                match bytes {
                    16 => asm!(concat!("st.", $space, ".v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};"),
                        p = in($reg) addr.0, a = in(reg32) w[0], b = in(reg32) w[1], c = in(reg32) w[2],
                        d = in(reg32) w[3], options(nostack)),
                    8 => asm!(concat!("st.", $space, ".v2.u32 [{p}], {{{a}, {b}}};"),
                        p = in($reg) addr.0, a = in(reg32) w[0], b = in(reg32) w[1], options(nostack)),
                    4 => asm!(concat!("st.", $space, ".u32 [{p}], {a};"), p = in($reg) addr.0,
                        a = in(reg32) w[0], options(nostack)),
                    2 => asm!(concat!("st.", $space, ".u16 [{p}], {h};"), p = in($reg) addr.0,
                        h = in(reg16) w[0] as u16, options(nostack)),
                    1 => asm!(concat!("st.", $space, ".u8 [{p}], {h};"), p = in($reg) addr.0,
                        h = in(reg16) w[0] as u16, options(nostack)),
                    _ => trap(),
                }
            }
        }
    };
}

#[cfg(target_arch = "nvptx64")]
mod async_copy;
#[cfg(target_arch = "nvptx64")]
mod cluster;
mod convert;
#[cfg(target_arch = "nvptx64")]
mod global;
mod math;
#[cfg(target_arch = "nvptx64")]
mod shared;
#[cfg(target_arch = "nvptx64")]
mod thread;
#[cfg(target_arch = "nvptx64")]
mod warp;

#[cfg(all(target_arch = "nvptx64", feature = "cluster"))]
pub use cluster::*;
#[cfg(target_arch = "nvptx64")]
pub use {async_copy::*, global::*, shared::*, thread::*, warp::*};
pub use {convert::*, math::*};
