//! Reductions shared by every row-wise op: within a thread group of a warp (by shuffles)
//! and across a block (shuffles, then one value per warp through shared memory). A value
//! may be two words (an online softmax's max and sum, a norm backward's two sums), so a
//! row that needs two statistics can reduce once: one set of barriers instead of two,
//! which pays where barriers are long (a cluster's; see `RowSplit::MERGES_REDUCTIONS`).

use crate::arch::{FULL_MASK, WARP_SIZE, block_dim_x, reduce_scratch, shfl_xor_u32, sync_threads, thread_idx_x};
use crate::unroll::unroll;

/// A value as reductions move it between lanes and through shared memory: up to
/// [`MAX_WORDS`] 32-bit words.
pub trait Words: Copy {
    /// Words in use (shuffled and stored), at most [`MAX_WORDS`].
    const COUNT: usize;
    fn to_words(self) -> [u32; MAX_WORDS];
    fn from_words(words: [u32; MAX_WORDS]) -> Self;
}

/// The largest reduction value, in words (the block scratch and cluster slots hold this).
pub const MAX_WORDS: usize = crate::abi::REDUCE_WORDS;

impl Words for f32 {
    const COUNT: usize = 1;
    #[inline(always)]
    fn to_words(self) -> [u32; MAX_WORDS] {
        [self.to_bits(), 0]
    }
    #[inline(always)]
    fn from_words(words: [u32; MAX_WORDS]) -> Self {
        f32::from_bits(words[0])
    }
}

impl<const N: usize> Words for [f32; N] {
    const COUNT: usize = {
        assert!(N <= MAX_WORDS);
        N
    };
    #[inline(always)]
    fn to_words(self) -> [u32; MAX_WORDS] {
        let mut words = [0; MAX_WORDS];
        unroll::<N>(|k| words[k] = self[k].to_bits());
        words
    }
    #[inline(always)]
    fn from_words(words: [u32; MAX_WORDS]) -> Self {
        let mut values = [0.0; N];
        unroll::<N>(|k| values[k] = f32::from_bits(words[k]));
        values
    }
}

/// An associative, commutative combination with its identity. Commutative bit for bit
/// (`combine(a, b) == combine(b, a)`), so every lane of a butterfly ends with the same value.
pub trait Reduce {
    type Value: Words;
    const IDENTITY: Self::Value;
    fn combine(a: Self::Value, b: Self::Value) -> Self::Value;
}

/// The max, NaN where any value is (IEEE `maximum`, `max.NaN.f32`, as PyTorch's `amax`;
/// `f32::max` drops a NaN): a row's NaN reaches its max whichever thread meets it, so every
/// statistic taken relative to the max is NaN too.
pub struct Max;
impl Reduce for Max {
    type Value = f32;
    const IDENTITY: f32 = f32::NEG_INFINITY;
    #[inline(always)]
    fn combine(a: f32, b: f32) -> f32 {
        a.maximum(b)
    }
}

pub struct Sum;
impl Reduce for Sum {
    type Value = f32;
    const IDENTITY: f32 = 0.0;
    #[inline(always)]
    fn combine(a: f32, b: f32) -> f32 {
        a + b
    }
}

/// Two sums at once.
pub struct SumPair;
impl Reduce for SumPair {
    type Value = [f32; 2];
    const IDENTITY: [f32; 2] = [0.0; 2];
    #[inline(always)]
    fn combine(a: [f32; 2], b: [f32; 2]) -> [f32; 2] {
        [a[0] + b[0], a[1] + b[1]]
    }
}

/// `R` over the `width` lanes of this lane's group (a power of two up to 32); every lane
/// of the group gets the result (butterfly).
///
/// # Safety
/// All 32 lanes of the warp must call it together, with the same `width`.
#[inline(always)]
pub unsafe fn group_all_reduce<R: Reduce>(mut value: R::Value, width: u32) -> R::Value {
    let mut mask = width / 2;
    while mask > 0 {
        let mut words = value.to_words();
        unroll::<MAX_WORDS>(|k| {
            if k < <R::Value as Words>::COUNT {
                // SAFETY: forwarded (all lanes converge here).
                words[k] = unsafe { shfl_xor_u32(FULL_MASK, words[k], mask, width) };
            }
        });
        value = R::combine(value, R::Value::from_words(words));
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
pub unsafe fn block_all_reduce<R: Reduce>(value: R::Value) -> R::Value {
    // Word `k` of warp `w`'s partial at `k * 32 + w`: a warp reads each word conflict-free.
    let scratch = reduce_scratch();
    let warp = thread_idx_x() / WARP_SIZE;
    let lane = thread_idx_x() % WARP_SIZE;
    let warps = block_dim_x() / WARP_SIZE;
    let count = <R::Value as Words>::COUNT;
    // SAFETY: all threads reach every barrier; the slots of warp `warp` (< 32) are written
    // by one lane, and the final barrier keeps the next reduction from overwriting slots
    // still being read.
    unsafe {
        let partial = group_all_reduce::<R>(value, WARP_SIZE).to_words();
        if lane == 0 {
            unroll::<MAX_WORDS>(|k| {
                if k < count {
                    scratch.add(k * WARP_SIZE as usize + warp as usize).write(partial[k]);
                }
            });
        }
        sync_threads();
        let mine = if lane < warps {
            let mut words = [0; MAX_WORDS];
            unroll::<MAX_WORDS>(|k| {
                if k < count {
                    words[k] = scratch.add(k * WARP_SIZE as usize + lane as usize).read();
                }
            });
            R::Value::from_words(words)
        } else {
            R::IDENTITY
        };
        let total = group_all_reduce::<R>(mine, WARP_SIZE);
        sync_threads();
        total
    }
}
