//! Elementwise kernels over flat arrays, as OneFlow's elementwise.cuh: a grid-stride loop
//! over packs with every thread issuing all its loads before any arithmetic, then the
//! elements past the last whole pack, one per thread.

use crate::abi::{ELEMENTWISE_PACKS_PER_THREAD as UNROLL, ElementwiseArgs};
use crate::arch::{GlobalAddr, block_dim_x, block_idx_x, grid_dim_x, thread_idx_x};
use crate::functor::Functor;
use crate::pack::Pack;
use crate::scalar::Scalar;
use crate::unroll::{unroll, unrolled_array};
use core::num::NonZeroU64;

/// Runs functor `F` over `args`, with the pack size the host chose.
///
/// # Safety
/// `args` must describe live device arrays: the output of `len` `O`s, inputs of `len` `I`s
/// (the broadcast one of `broadcast_len`, a non-zero multiple of `pack`), every address
/// aligned to `pack` elements, and no input aliasing the output unless it is the same array.
#[inline(always)]
pub unsafe fn run<F: Functor<K>, I: Scalar, O: Scalar, const K: usize>(args: &ElementwiseArgs) {
    // SAFETY: forwarded; each arm's pack size is the one the host checked alignment for.
    unsafe {
        match args.pack {
            8 if fits::<I, O>(8) => packs::<F, I, O, K, 8>(args),
            4 if fits::<I, O>(4) => packs::<F, I, O, K, 4>(args),
            2 => packs::<F, I, O, K, 2>(args),
            _ => packs::<F, I, O, K, 1>(args),
        }
    }
}

/// Whether a pack of `n` stays within one 16-byte access for both types.
const fn fits<I: Scalar, O: Scalar>(n: usize) -> bool {
    n * I::BYTES <= 16 && n * O::BYTES <= 16
}

#[inline(always)]
unsafe fn packs<F: Functor<K>, I: Scalar, O: Scalar, const K: usize, const N: usize>(args: &ElementwiseArgs) {
    // SAFETY (whole body): the caller vouches for the arrays; every pack index below is
    // under `len / N` and every tail index under `len`.
    unsafe {
        let inputs: [GlobalAddr; K] = core::array::from_fn(|k| GlobalAddr::from_generic(args.inputs[k]));
        let output = GlobalAddr::from_generic(args.output);
        let whole_packs = args.len / N as u64;
        // Never zero for broadcasting functors (the host checks); `max(1)` spares the
        // division-by-zero check.
        let broadcast_len = NonZeroU64::new(args.broadcast_len.max(1)).unwrap_or(NonZeroU64::MIN);
        let broadcast_packs = NonZeroU64::new((args.broadcast_len / N as u64).max(1)).unwrap_or(NonZeroU64::MIN);
        let thread = (block_idx_x() * block_dim_x() + thread_idx_x()) as u64;
        let stride = (grid_dim_x() * block_dim_x()) as u64;

        let input_pack = |k: usize, pack: u64| {
            let index = if F::BROADCASTS_LAST_INPUT && k == K - 1 { pack % broadcast_packs } else { pack };
            Pack::<I, N>::load(inputs[k], index)
        };

        let mut pack = thread;
        while pack + (UNROLL as u64 - 1) * stride < whole_packs {
            let loaded: [[Pack<I, N>; K]; UNROLL] =
                core::array::from_fn(|u| core::array::from_fn(|k| input_pack(k, pack + u as u64 * stride)));
            unroll::<UNROLL>(|u| apply::<F, I, O, K, N>(&loaded[u]).store(output, pack + u as u64 * stride));
            pack += UNROLL as u64 * stride;
        }
        while pack < whole_packs {
            let x: [Pack<I, N>; K] = core::array::from_fn(|k| input_pack(k, pack));
            apply::<F, I, O, K, N>(&x).store(output, pack);
            pack += stride;
        }

        let tail = whole_packs * N as u64;
        if thread < args.len - tail {
            let i = tail + thread;
            let x: [Pack<I, 1>; K] = core::array::from_fn(|k| {
                let index = if F::BROADCASTS_LAST_INPUT && k == K - 1 { i % broadcast_len } else { i };
                Pack::<I, 1>::load(inputs[k], index)
            });
            apply::<F, I, O, K, 1>(&x).store(output, i);
        }
    }
}

/// The functor over one pack: two lanes at a time where input and output share a 16-bit
/// type and the functor has a paired form, else in f32 (16-bit outputs converted two lanes
/// at a time).
#[inline(always)]
fn apply<F: Functor<K>, I: Scalar, O: Scalar, const K: usize, const N: usize>(x: &[Pack<I, N>; K]) -> Pack<O, N> {
    let value = |lane: usize| F::apply(core::array::from_fn(|k| x[k].get_f32(lane)));
    if I::BYTES == 2 && I::DTYPE as u8 == O::DTYPE as u8 && N >= 2 {
        let mut y = Pack::<O, N>::new();
        unroll::<N>(|i| {
            if i % 2 == 0 {
                let pair = F::apply_pair::<I>(core::array::from_fn(|k| x[k].pair(i / 2)));
                y.set_pair(i / 2, pair.unwrap_or_else(|| O::pair_from_f32(value(i), value(i + 1))));
            }
        });
        y
    } else {
        Pack::from_f32(unrolled_array(value))
    }
}
