//! Fusing a user's own functor into rill's kernels, from the user's own `no_std` crate.
//!
//! A user's crate depends on this one with the `fuse` feature, writes a [`Load`] (what a
//! row's elements are: a dequantization, a bias, a mask) and a [`Store`] (where the
//! outputs go), and instantiates rill's row engine for them with [`fused_softmax!`] or
//! [`fused_norm!`] (LayerNorm and RMSNorm forward): one entry point per path and pack the
//! host's planner may choose, and a `<name>_facts` global the host reads
//! ([`FusedFacts`](crate::abi::FusedFacts)). An elementwise [`Functor`] instantiates rill's
//! elementwise body with [`fused_elementwise!`]. The host crate loads the PTX
//! (`rill::fuse`) and runs it through the same planner and launcher as rill's own ops.
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

pub use crate::abi::{DType, ElementwiseArgs, FusedArgs, FusedFacts, FusedFamily, NormArgs, RowArgs, RowShape};
pub use crate::arch::{GlobalAddr, fma, load_global_nc};
pub use crate::functor::Functor;
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
    // SAFETY: forwarded to the caller.
    unsafe { crate::ops::rows::row_view(address, shape, path) }
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

/// LayerNorm or RMSNorm (as `args.rms` says) of the rows `load` reads, written through
/// `store`: rill's norm forward on `PATH` at packs of `P`, with `args`' weight and bias (of
/// `G`), `eps` and per-row outputs.
///
/// # Safety
/// As [`softmax`], and `args` as the host's norm validated it (the entries `fused_norm!`
/// makes get it so; rows are always aligned, never phased).
#[inline(always)]
pub unsafe fn norm<L, S, G: Scalar, const P: usize, const PATH: RowPath>(args: &NormArgs, load: &L, store: &S)
where
    L: Load<P> + LoadOne,
    S: Store<P> + StoreOne + Copy,
{
    // SAFETY: forwarded to the caller.
    unsafe { crate::ops::norm::fused::<L, S, G, P, PATH>(args, load, store) }
}

/// Runs elementwise functor `F` over `args` (`K` inputs of `I`, an output of `O`): rill's
/// elementwise body, at the pack the host chose.
///
/// # Safety
/// `args` as the host's elementwise launcher validated it (the entries
/// `fused_elementwise!` makes get it so).
#[inline(always)]
pub unsafe fn elementwise<F: Functor<K>, I: Scalar, O: Scalar, const K: usize>(args: &ElementwiseArgs) {
    // SAFETY: forwarded to the caller.
    unsafe { crate::ops::elementwise::run::<F, I, O, K>(args) }
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
        $crate::fused_rows!(@entries $name, $crate::abi::FusedArgs<$extra>, $make, $pack, (softmax),
            [Warp8 Warp16 Warp24 Warp32 Shared Uncached], [SharedPhased UncachedPhased]);
        $crate::fused_rows!(@facts $name, Softmax, $extra, $load, $pack);
    };
}

/// Instantiates rill's LayerNorm and RMSNorm forward for a user's functors:
/// `fused_norm!(name, Extra, Load, make, pack, Weight)` exports `name_<Path>_p<pack>` and
/// `name_<Path>_p1` on every non-cluster path, each taking a
/// [`FusedArgs<Extra, NormArgs>`](crate::abi::FusedArgs) (rill's norm parameters: the
/// kind, `eps`, the weight and bias of dtype `Weight`, the per-row mean and rstd), and the
/// global `name_facts`. `make` is as for [`fused_softmax!`]: one `make` serves both.
#[macro_export]
macro_rules! fused_norm {
    ($name:ident, $extra:ty, $load:ty, $make:ident, $pack:literal, $weight:ident) => {
        $crate::fused_rows!(@entries $name, $crate::abi::FusedArgs<$extra, $crate::abi::NormArgs>, $make, $pack,
            (norm, $weight), [Warp8 Warp16 Warp24 Warp32 Shared Uncached], []);
        $crate::fused_rows!(@facts $name, Norm, $extra, $load, $pack, $weight);
    };
}

/// The entry points and facts of [`fused_softmax!`] and [`fused_norm!`].
#[doc(hidden)]
#[macro_export]
macro_rules! fused_rows {
    (@entries $name:ident, $args:ty, $make:ident, $pack:literal, $body:tt,
     [$($path:ident)*], [$($phased:ident)*]) => {
        $($crate::fused_rows!(@entry $name, $args, $make, $path, $pack, $body);
          $crate::fused_rows!(@entry $name, $args, $make, $path, 1, $body);)*
        $($crate::fused_rows!(@entry $name, $args, $make, $phased, $pack, $body);)*
    };
    (@entry $name:ident, $args:ty, $make:ident, $path:ident, $pack:literal, ($body:ident $(, $weight:ident)?)) => {
        const _: () = {
            #[unsafe(export_name = concat!(stringify!($name), "_", stringify!($path), "_p", stringify!($pack)))]
            unsafe extern "ptx-kernel" fn entry(args: $args) {
                const PATH: $crate::table::RowPath = $crate::table::RowPath::$path;
                // SAFETY: the host planned this launch for PATH and the pack, and the user's
                // `make` is trusted with the parameters it was given.
                #[allow(unused_imports)]
                use $crate::scalar::bf16;
                unsafe {
                    let (load, store) = $make::<PATH>($crate::abi::RowArgs::shape(&args), &args.extra);
                    $crate::fuse::$body::<_, _, $($weight,)? $pack, PATH>(&args.op, &load, &store);
                }
            }
        };
    };
    (@facts $name:ident, $family:ident, $extra:ty, $load:ty, $pack:literal $(, $weight:ident)?) => {
        const _: () = {
            #[allow(unused_imports)]
            use $crate::scalar::bf16;
            #[used]
            #[unsafe(export_name = concat!(stringify!($name), "_facts"))]
            static FACTS: $crate::abi::FusedFacts = $crate::abi::FusedFacts {
                family: $crate::abi::FusedFamily::$family,
                extra_bytes: ::core::mem::size_of::<$extra>() as u32,
                pack: $pack,
                cache_bytes_per_col: ::core::mem::size_of::<<$load as $crate::pack::Load<$pack>>::Exact>() as u32,
                weight: 0 $(+ <$weight as $crate::scalar::Scalar>::DTYPE.code())?,
                inputs: 0,
                broadcasts_last_input: 0,
                transforms: <$load as $crate::pack::Load<$pack>>::TRANSFORMS as u32,
            };
        };
    };
}

/// Instantiates rill's elementwise body for a user's [`Functor`]:
/// `fused_elementwise!(name, Functor, inputs, (f32 f32) (bf16 bf16) ...)` exports
/// `name_<input>_<output>` for each dtype pair (`f32`, `f16`, `bf16`), each taking an
/// [`ElementwiseArgs`], and the global `name_facts`. A functor has no parameters of its own:
/// its constants are its code.
#[macro_export]
macro_rules! fused_elementwise {
    ($name:ident, $functor:ty, $inputs:literal, $(($input:ident $output:ident))+) => {
        $(const _: () = {
            #[unsafe(export_name = concat!(stringify!($name), "_", stringify!($input), "_", stringify!($output)))]
            unsafe extern "ptx-kernel" fn entry(args: $crate::abi::ElementwiseArgs) {
                #[allow(unused_imports)]
                use $crate::scalar::bf16;
                // SAFETY: the host validated `args` for this entry's dtypes and the functor's
                // inputs.
                unsafe { $crate::fuse::elementwise::<$functor, $input, $output, $inputs>(&args) }
            }
        };)+
        const _: () = {
            #[used]
            #[unsafe(export_name = concat!(stringify!($name), "_facts"))]
            static FACTS: $crate::abi::FusedFacts = $crate::abi::FusedFacts {
                family: $crate::abi::FusedFamily::Elementwise,
                extra_bytes: 0,
                pack: 0,
                cache_bytes_per_col: 0,
                weight: 0,
                inputs: $inputs,
                broadcasts_last_input: <$functor as $crate::functor::Functor<$inputs>>::BROADCASTS_LAST_INPUT as u32,
                transforms: 0,
            };
        };
    };
}
