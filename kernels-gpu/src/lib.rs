//! Device code of rill, compiled to PTX by rustc's own NVPTX backend.
//!
//! The crate builds for two targets:
//! - `nvptx64-nvidia-cuda` (through `rill-builder`): everything, exported kernels included;
//! - the host: the shared ABI ([`abi`]) and the portable math ([`scalar`], [`functor`]), so the
//!   host crate shares names and parameter layouts with the kernels, and the math is unit-tested
//!   on the CPU against f64.
//!
//! Layout: [`arch`] is the only user of NVPTX intrinsics and inline PTX, in one file per role
//! (thread, warp, shared and global memory, async copies, clusters, conversions, math);
//! `pack` holds the vectorized accesses and the Load/Store traits; `ops/` holds one generic
//! body per op family; `entry` instantiates the exported kernels from the tables in [`abi`].
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, stdarch_nvptx, asm_experimental_arch, float_minimum_maximum))]
// The device build and the crate's own tests need the `f16` type and enum const parameters;
// what the host crate shares with the kernels (the table, the ABI, the portable math) needs
// neither, so it compiles on stable Rust.
#![cfg_attr(any(target_arch = "nvptx64", test), feature(f16, adt_const_params))]

pub mod abi;
pub mod arch;
pub mod layout;
// Only the BatchNorm kernels walk channels; the host build keeps it for its tests.
#[cfg(any(not(target_arch = "nvptx64"), feature = "batch_norm"))]
#[cfg_attr(not(target_arch = "nvptx64"), allow(dead_code))]
mod channel_walk;
pub mod functor;
pub mod math;
pub mod scalar;
pub mod table;

#[cfg(target_arch = "nvptx64")]
pub mod reduce;
pub mod unroll;

#[cfg(target_arch = "nvptx64")]
pub mod pack;

#[cfg(target_arch = "nvptx64")]
mod ops;

#[cfg(target_arch = "nvptx64")]
mod entry;

#[cfg(all(target_arch = "nvptx64", feature = "fuse"))]
pub mod fuse;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    arch::trap()
}
