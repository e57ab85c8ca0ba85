//! Forced loop unrolling.
//!
//! LLVM leaves a loop rolled when its body is large (a GELU over a pack of eight), and a
//! rolled loop that indexes a register array moves the array to local memory. Kernels loop
//! over packs and lanes through [`unroll`] instead, which expands to straight-line calls.

/// Calls `f(0)`, `f(1)`, ..., `f(N - 1)` as straight-line code. `N` is at most 16.
#[inline(always)]
pub fn unroll<const N: usize>(mut f: impl FnMut(usize)) {
    const { assert!(N <= 16, "unroll supports at most 16 iterations") };
    macro_rules! step {
        ($($i:literal)*) => { $(if $i < N { f($i); })* };
    }
    step!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
}
