//! Forced loop unrolling.
//!
//! LLVM leaves a loop rolled when its body is large (a GELU over a pack of eight), and a
//! rolled loop that indexes a register array moves the array to local memory. Kernels loop
//! over packs and lanes through [`unroll`] instead, which expands to straight-line calls.

/// Calls `f(0)`, `f(1)`, ..., `f(N - 1)` as straight-line code. `N` is at most 32.
#[inline(always)]
pub fn unroll<const N: usize>(mut f: impl FnMut(usize)) {
    const { assert!(N <= 32, "unroll supports at most 32 iterations") };
    macro_rules! step {
        ($($i:literal)*) => { $(if $i < N { f($i); })* };
    }
    step!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
}

/// `[f(0), ..., f(N - 1)]` built by [`unroll`] (`core::array::from_fn` is a loop that LLVM
/// may leave rolled).
#[inline(always)]
pub fn unrolled_array<T: Copy + Default, const N: usize>(mut f: impl FnMut(usize) -> T) -> [T; N] {
    let mut out = [T::default(); N];
    unroll::<N>(|i| out[i] = f(i));
    out
}
