//! The RMSNorm optimization ladder: four deliberately simple forward kernels, each one idea
//! further than the last, written the way the profiling article's steps are. They are the
//! benchmark's comparators, not rill's RMSNorm (that is `ops::norm`): each is correct and
//! stays inside its arrays for any `cols`, but none is tuned.
//!
//! `y[r, c] = x[r, c] * rsqrt(mean_c(x[r, :]^2) + eps) * gamma[c]`, computed in f32.
//! 1. [`thread_per_row`]: one thread per row, two scalar passes over it;
//! 2. [`shared_tree`]: one block per row, a strided loop, a tree reduction in shared memory;
//! 3. [`warp_strided`]: one block per row, a strided loop, warp-shuffle reductions;
//! 4. [`warp_vectorized`]: as 3, moving 16 bytes per access (`Pack<T, N>`, "float4").
//!
//! `N` is the elements per access the kernel table gives each rung: 1 for rungs 1-3.

use crate::abi::NormLadderArgs;
use crate::arch::{
    GlobalAddr, block_dim_x, block_idx_x, dynamic_shared, fma, grid_dim_x, rsqrt, sync_threads, thread_idx_x,
};
use crate::pack::Pack;
use crate::reduce::{Sum, block_all_reduce};
use crate::scalar::Scalar;
use crate::unroll::unroll;

/// The three arrays of a launch, as global addresses.
struct Arrays {
    x: GlobalAddr,
    gamma: GlobalAddr,
    y: GlobalAddr,
}

impl Arrays {
    /// # Safety
    /// The addresses in `args` must be generic addresses of global memory.
    #[inline(always)]
    unsafe fn new(args: &NormLadderArgs) -> Self {
        // SAFETY: forwarded to the caller.
        unsafe {
            Arrays {
                x: GlobalAddr::from_generic(args.input),
                gamma: GlobalAddr::from_generic(args.gamma),
                y: GlobalAddr::from_generic(args.output),
            }
        }
    }
}

/// Element `index` of the array at `base`, in f32 (one scalar load).
///
/// # Safety
/// As [`Pack::load`] for a pack of one.
#[inline(always)]
unsafe fn load<T: Scalar>(base: GlobalAddr, index: u64) -> f32 {
    // SAFETY: forwarded to the caller.
    unsafe { Pack::<T, 1>::load(base, index) }.get(0).to_f32()
}

/// Stores `value` as element `index` of the array at `base` (one scalar store).
///
/// # Safety
/// As [`Pack::store`] for a pack of one.
#[inline(always)]
unsafe fn store<T: Scalar>(base: GlobalAddr, index: u64, value: f32) {
    let mut pack = Pack::<T, 1>::new();
    pack.set(0, T::from_f32(value));
    // SAFETY: forwarded to the caller.
    unsafe { pack.store(base, index) }
}

/// `1 / sqrt(mean of squares + eps)` from a row's sum of squares.
#[inline(always)]
fn rstd(sum_of_squares: f32, args: &NormLadderArgs) -> f32 {
    rsqrt(fma(sum_of_squares, args.inv_cols, args.eps))
}

/// Rung 1: thread `t` of the grid owns rows `t`, `t + threads`, ...; it sums the squares
/// of its row in one pass and writes it in a second, one element per access (neighbouring
/// threads read addresses a row apart: nothing coalesces).
///
/// # Safety
/// `args` must describe live arrays: `x` and `y` of `rows x cols` `T`s, `gamma` of `cols`,
/// each aligned to `T`, `y` not overlapping the others.
#[inline(always)]
pub unsafe fn thread_per_row<T: Scalar, const N: usize>(args: &NormLadderArgs) {
    const { assert!(N == 1, "rung 1 makes scalar accesses") };
    // SAFETY (whole body): every index is `row * cols + col` with row < rows and
    // col < cols, or `col` < cols for gamma.
    unsafe {
        let a = Arrays::new(args);
        let threads = grid_dim_x() as u64 * block_dim_x() as u64;
        let mut row = block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64;
        while row < args.rows {
            let start = row * args.cols;
            let mut sum = 0.0f32;
            let mut col = 0;
            while col < args.cols {
                let v = load::<T>(a.x, start + col);
                sum = fma(v, v, sum);
                col += 1;
            }
            let r = rstd(sum, args);
            let mut col = 0;
            while col < args.cols {
                let v = load::<T>(a.x, start + col) * r * load::<T>(a.gamma, col);
                store::<T>(a.y, start + col, v);
                col += 1;
            }
            row += threads;
        }
    }
}

/// Rung 2: block `b` owns rows `b`, `b + blocks`, ...; its threads sum squares in a
/// block-strided loop, then halve the partial sums in shared memory until one is left
/// (a barrier per step), then write the row in a second strided loop.
///
/// # Safety
/// As [`thread_per_row`]; besides, the block size must be a power of two and the launch must
/// give `block size * 4` bytes of dynamic shared memory.
#[inline(always)]
pub unsafe fn shared_tree<T: Scalar, const N: usize>(args: &NormLadderArgs) {
    const { assert!(N == 1, "rung 2 makes scalar accesses") };
    let partial = dynamic_shared::<f32>();
    let tid = thread_idx_x();
    let block = block_dim_x();
    // SAFETY (whole body): indices as in `thread_per_row`; shared slots below the block size
    // (the launch's dynamic shared memory); `row` is the same for the whole block, so every
    // thread reaches every barrier.
    unsafe {
        let a = Arrays::new(args);
        let mut row = block_idx_x() as u64;
        while row < args.rows {
            let start = row * args.cols;
            let mut sum = 0.0f32;
            let mut col = tid as u64;
            while col < args.cols {
                let v = load::<T>(a.x, start + col);
                sum = fma(v, v, sum);
                col += block as u64;
            }
            partial.add(tid as usize).write(sum);
            sync_threads();
            let mut half = block / 2;
            while half > 0 {
                if tid < half {
                    let other = partial.add((tid + half) as usize).read();
                    let mine = partial.add(tid as usize);
                    mine.write(mine.read() + other);
                }
                sync_threads();
                half /= 2;
            }
            let total = partial.read();
            // Everyone has read slot 0 before the next row overwrites it.
            sync_threads();
            let r = rstd(total, args);
            let mut col = tid as u64;
            while col < args.cols {
                let v = load::<T>(a.x, start + col) * r * load::<T>(a.gamma, col);
                store::<T>(a.y, start + col, v);
                col += block as u64;
            }
            row += grid_dim_x() as u64;
        }
    }
}

/// Rung 3: as [`shared_tree`], with the partial sums combined by warp shuffles (one value
/// per warp through shared memory, [`block_all_reduce`]).
///
/// # Safety
/// As [`thread_per_row`]; besides, the block size must be a multiple of 32.
#[inline(always)]
pub unsafe fn warp_strided<T: Scalar, const N: usize>(args: &NormLadderArgs) {
    const { assert!(N == 1, "rung 3 makes scalar accesses") };
    // SAFETY: forwarded.
    unsafe { block_shuffle::<T, 1>(args) }
}

/// Rung 4: as [`warp_strided`], each access moving a pack of `N` elements (16 bytes: a
/// float4 for f32, eight halves for f16 and bf16).
///
/// # Safety
/// As [`warp_strided`]; besides, `cols` must be a multiple of `N` and `x`, `gamma` and `y`
/// aligned to `N` elements (the host checks, and otherwise runs rung 3).
#[inline(always)]
pub unsafe fn warp_vectorized<T: Scalar, const N: usize>(args: &NormLadderArgs) {
    // SAFETY: forwarded.
    unsafe { block_shuffle::<T, N>(args) }
}

/// Rungs 3 and 4: a block per row, packs of `N` in a block-strided loop, a shuffle
/// reduction, and a second strided loop that re-reads `x` and writes `y`.
///
/// # Safety
/// As [`warp_vectorized`].
#[inline(always)]
unsafe fn block_shuffle<T: Scalar, const N: usize>(args: &NormLadderArgs) {
    let tid = thread_idx_x() as u64;
    let block = block_dim_x() as u64;
    // Whole packs only: with `cols` a multiple of `N` (the caller's promise) that is the
    // row; were it not, the tail would be left unwritten, never overrun.
    let packs = args.cols / N as u64;
    // SAFETY (whole body): pack `row * packs + p` with p < packs lies inside row `row` of
    // `x` and `y` (`row * cols / N` is `row * packs`), pack `p` inside `gamma`; all aligned
    // to the pack (the caller's promise). `row` is uniform per block, so every thread
    // reaches every barrier of the reduction.
    unsafe {
        let a = Arrays::new(args);
        let mut row = block_idx_x() as u64;
        while row < args.rows {
            let start = row * packs;
            let mut sum = 0.0f32;
            let mut p = tid;
            while p < packs {
                let x = Pack::<T, N>::load(a.x, start + p);
                unroll::<N>(|i| {
                    let v = x.get(i).to_f32();
                    sum = fma(v, v, sum);
                });
                p += block;
            }
            let r = rstd(block_all_reduce::<Sum>(sum), args);
            let mut p = tid;
            while p < packs {
                let x = Pack::<T, N>::load(a.x, start + p);
                let gamma = Pack::<T, N>::load(a.gamma, p);
                let mut y = Pack::<T, N>::new();
                unroll::<N>(|i| y.set(i, T::from_f32(x.get(i).to_f32() * r * gamma.get(i).to_f32())));
                y.store(a.y, start + p);
                p += block;
            }
            row += grid_dim_x() as u64;
        }
    }
}
