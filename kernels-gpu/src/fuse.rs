//! Fusing a user's own functor into rill's kernels, from the user's own `no_std` crate.
//!
//! A user's crate depends on this one with the `fuse` feature, writes a [`Load`] (what a
//! row's elements are: a dequantization, a bias, a mask) and a [`Store`] (where the
//! outputs go), and instantiates rill's row engine for them with [`fused_softmax!`]: one
//! entry point per path and pack the host's planner may choose, and a `<name>_facts`
//! global the host reads ([`FusedFacts`](crate::abi::FusedFacts)). The host crate loads the
//! PTX (`rill::fuse`) and runs it through the same planner and launcher as rill's softmax.
//!
//! ```ignore
//! #![cfg_attr(target_arch = "nvptx64", no_std)]
//! #![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]
//! #![feature(adt_const_params)]
//!
//! /// The kernels' own parameters, shared with the host (a `#[repr(C)]` struct).
//! #[repr(C)]
//! #[derive(Clone, Copy)]
//! pub struct Scaled { pub x: u64, pub y: u64, pub scale: f32 }
//!
//! #[cfg(target_arch = "nvptx64")]
//! mod device {
//!     use rill_kernels_gpu::fuse::*;
//!     pub struct ScaledLoad(DirectLoad<f32>, f32);
//!     impl<const N: usize> Load<N> for ScaledLoad { /* fetch, convert */ }
//!     unsafe fn make<const PATH: RowPath>(shape: &RowShape, e: &super::Scaled) -> (ScaledLoad, DirectStore<f32>) {
//!         unsafe { (ScaledLoad(DirectLoad(row_view(e.x, shape, PATH)), e.scale), DirectStore(row_view(e.y, shape, PATH))) }
//!     }
//!     rill_kernels_gpu::fused_softmax!(scaled_softmax, super::Scaled, ScaledLoad, make, 4);
//! }
//! ```

pub use crate::abi::{FusedArgs, FusedFacts, RowShape};
pub use crate::arch::{GlobalAddr, load_global_nc};
pub use crate::pack::{DirectLoad, DirectStore, Load, LoadOne, Pack, RowMajor, Store, StoreOne};
pub use crate::scalar::{Scalar, bf16};
pub use crate::table::RowPath;

/// A row-major `(rows, cols)` view of `T` at `address` as the kernel on `path` indexes it:
/// starting `shape.phase` elements past a 16-byte boundary on the phased paths (the host
/// passes a phase only to those), aligned on the others.
///
/// # Safety
/// `address` must be a generic address of global memory holding `shape.rows x shape.cols`
/// elements of `T`, aligned as the host's plan assumed (it checked the addresses it was
/// given).
#[inline(always)]
pub unsafe fn row_view<T: Scalar>(address: u64, shape: &RowShape, path: RowPath) -> RowMajor<T> {
    let first = if path.phased() { shape.phase as u64 } else { 0 };
    // SAFETY: forwarded to the caller.
    unsafe { RowMajor::<T>::past_boundary(address, shape.cols, first) }
}

/// Softmax over the rows `load` reads, written through `store`: rill's softmax body on
/// `PATH` at packs of `P`.
///
/// # Safety
/// `load` and `store` must cover `shape`'s rows, the launch have the geometry the host
/// planned for `PATH`, and rows not aligned to `P` come only with a phased or warp path
/// (the host's planner guarantees all three for the entries `fused_softmax!` makes).
#[inline(always)]
pub unsafe fn softmax<L, S, const P: usize, const PATH: RowPath>(shape: &RowShape, load: &L, store: &S)
where
    L: Load<P> + LoadOne,
    S: Store<P> + StoreOne + Copy,
{
    // SAFETY: forwarded to the caller.
    unsafe { crate::ops::softmax::fused::<L, S, P, PATH>(shape, load, store) }
}

/// Instantiates rill's softmax for a user's functors: `fused_softmax!(name, Extra, Load,
/// make, pack)` exports `name_<Path>_p<pack>` and `name_<Path>_p1` on every non-cluster
/// path (and the phased block paths at `pack`), each taking a
/// [`FusedArgs<Extra>`](crate::abi::FusedArgs), and the global `name_facts`.
///
/// `make` is `unsafe fn make<const PATH: RowPath>(&RowShape, &Extra) -> (Load, Store)` in
/// scope; `Load` implements [`Load<N>`] for every `N`, and `Store` [`Store<N>`] (both `pack`
/// and 1 run). The user's crate enables `abi_ptx` and `adt_const_params`.
#[macro_export]
macro_rules! fused_softmax {
    ($name:ident, $extra:ty, $load:ty, $make:ident, $pack:literal) => {
        $crate::fused_softmax!(@entries $name, $extra, $make, $pack,
            [Warp8 Warp16 Warp24 Warp32 Shared Uncached], [SharedPhased UncachedPhased]);
        const _: () = {
            #[used]
            #[unsafe(export_name = concat!(stringify!($name), "_facts"))]
            static FACTS: $crate::abi::FusedFacts = $crate::abi::FusedFacts {
                extra_bytes: ::core::mem::size_of::<$extra>() as u32,
                pack: $pack,
                cache_bytes_per_col: ::core::mem::size_of::<<$load as $crate::pack::Load<$pack>>::Exact>() as u32,
            };
        };
    };
    (@entries $name:ident, $extra:ty, $make:ident, $pack:literal, [$($path:ident)*], [$($phased:ident)*]) => {
        $($crate::fused_softmax!(@entry $name, $extra, $make, $path, $pack);
          $crate::fused_softmax!(@entry $name, $extra, $make, $path, 1);)*
        $($crate::fused_softmax!(@entry $name, $extra, $make, $phased, $pack);)*
    };
    (@entry $name:ident, $extra:ty, $make:ident, $path:ident, $pack:literal) => {
        const _: () = {
            #[unsafe(export_name = concat!(stringify!($name), "_", stringify!($path), "_p", stringify!($pack)))]
            unsafe extern "ptx-kernel" fn entry(args: $crate::abi::FusedArgs<$extra>) {
                const PATH: $crate::table::RowPath = $crate::table::RowPath::$path;
                // SAFETY: the host planned this launch for PATH and the pack, and the user's
                // `make` is trusted with the parameters it was given.
                unsafe {
                    let (load, store) = $make::<PATH>(&args.shape, &args.extra);
                    $crate::fuse::softmax::<_, _, $pack, PATH>(&args.shape, &load, &store);
                }
            }
        };
    };
}
