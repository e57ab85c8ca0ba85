//! Reductions shared by every row-wise op: within a thread group of a warp (by shuffles)
//! and across a block (shuffles, then one value per warp through shared memory).

use crate::arch::{FULL_MASK, WARP_SIZE, block_dim_x, reduce_scratch, shfl_xor, sync_threads, thread_idx_x};

/// An associative, commutative combination with its identity.
pub trait Reduce {
    const IDENTITY: f32;
    fn combine(a: f32, b: f32) -> f32;
}

pub struct Max;
impl Reduce for Max {
    const IDENTITY: f32 = f32::NEG_INFINITY;
    #[inline(always)]
    fn combine(a: f32, b: f32) -> f32 {
        a.max(b)
    }
}

pub struct Sum;
impl Reduce for Sum {
    const IDENTITY: f32 = 0.0;
    #[inline(always)]
    fn combine(a: f32, b: f32) -> f32 {
        a + b
    }
}

/// `R` over the `width` lanes of this lane's group (a power of two up to 32); every lane
/// of the group gets the result (butterfly).
///
/// # Safety
/// All 32 lanes of the warp must call it together, with the same `width`.
#[inline(always)]
pub unsafe fn group_all_reduce<R: Reduce>(mut value: f32, width: u32) -> f32 {
    let mut mask = width / 2;
    while mask > 0 {
        // SAFETY: forwarded (all lanes converge here).
        value = R::combine(value, unsafe { shfl_xor(FULL_MASK, value, mask, width) });
        mask /= 2;
    }
    value
}

/// `R` over the whole block; every thread gets the result.
///
/// # Safety
/// Every thread of the block must call it (it has barriers), and the block size must be a
/// multiple of 32.
#[inline(always)]
pub unsafe fn block_all_reduce<R: Reduce>(value: f32) -> f32 {
    let scratch = reduce_scratch();
    let warp = thread_idx_x() / WARP_SIZE;
    let lane = thread_idx_x() % WARP_SIZE;
    let warps = block_dim_x() / WARP_SIZE;
    // SAFETY: all threads reach every barrier; slot `warp` < 32 is written by one lane, and
    // the final barrier keeps the next reduction from overwriting slots still being read.
    unsafe {
        let partial = group_all_reduce::<R>(value, WARP_SIZE);
        if lane == 0 {
            scratch.add(warp as usize).write(partial);
        }
        sync_threads();
        let mine = if lane < warps { scratch.add(lane as usize).read() } else { R::IDENTITY };
        let total = group_all_reduce::<R>(mine, WARP_SIZE);
        sync_threads();
        total
    }
}
