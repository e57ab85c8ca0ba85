//! Floating-point instructions: the special-function-unit approximations and the fused
//! multiply-add that [`crate::math`] and [`crate::functor`] build on, which have host
//! versions so that math runs in CPU unit tests; and two-lane f16/bf16 arithmetic, device only.

#[cfg(target_arch = "nvptx64")]
pub use packed::*;

/// `2^x`. Device: `ex2.approx.ftz.f32` (max 2 ulp, one SFU op).
#[inline(always)]
pub fn ex2(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let y: f32;
        // SAFETY: a pure register-to-register instruction.
        unsafe {
            core::arch::asm!("ex2.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x,
                options(pure, nomem, nostack));
        }
        y
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        x.exp2()
    }
}

/// `log2(x)`. Device: `lg2.approx.ftz.f32`.
#[inline(always)]
pub fn lg2(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let y: f32;
        // SAFETY: a pure register-to-register instruction.
        unsafe {
            core::arch::asm!("lg2.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x,
                options(pure, nomem, nostack));
        }
        y
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        x.log2()
    }
}

/// `1/sqrt(x)`. Device: `rsqrt.approx.ftz.f32`.
#[inline(always)]
pub fn rsqrt(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let y: f32;
        // SAFETY: a pure register-to-register instruction.
        unsafe {
            core::arch::asm!("rsqrt.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x,
                options(pure, nomem, nostack));
        }
        y
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        1.0 / x.sqrt()
    }
}

/// `1/x`. Device: `rcp.approx.ftz.f32` (1 ulp), instead of the IEEE division sequence.
#[inline(always)]
pub fn rcp(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let y: f32;
        // SAFETY: a pure register-to-register instruction.
        unsafe {
            core::arch::asm!("rcp.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x,
                options(pure, nomem, nostack));
        }
        y
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        1.0 / x
    }
}

/// `a * b + c` rounded once (`fma.rn.f32`).
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let d: f32;
        // SAFETY: a pure register-to-register instruction.
        unsafe {
            core::arch::asm!("fma.rn.f32 {d}, {a}, {b}, {c};", d = out(reg32) d, a = in(reg32) a,
                b = in(reg32) b, c = in(reg32) c, options(pure, nomem, nostack));
        }
        d
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        a.mul_add(b, c)
    }
}

/// Two 16-bit lanes in one 32-bit register, one instruction for both (sm_80). Device only:
/// the host computes 16-bit values lane by lane in f32.
#[cfg(target_arch = "nvptx64")]
mod packed {
    use core::arch::asm;

    macro_rules! paired {
        ($(#[$doc:meta])* $name:ident, $args:literal, ($($arg:ident),*)) => {
            $(#[$doc])*
            #[inline(always)]
            pub fn $name($($arg: u32),*) -> u32 {
                let d: u32;
                // SAFETY: a pure register-to-register instruction (sm_80).
                unsafe {
                    asm!($args, d = out(reg32) d, $($arg = in(reg32) $arg),*,
                        options(pure, nomem, nostack));
                }
                d
            }
        };
    }

    paired!(
        /// Two f16 lanes: `a * b + c`, each rounded once.
        fma_f16x2,
        "fma.rn.f16x2 {d}, {a}, {b}, {c};",
        (a, b, c)
    );
    paired!(
        /// Two bf16 lanes: `a * b + c`, each rounded once.
        fma_bf16x2,
        "fma.rn.bf16x2 {d}, {a}, {b}, {c};",
        (a, b, c)
    );
    paired!(
        /// Two f16 lanes: max, NaN propagating.
        max_nan_f16x2,
        "max.NaN.f16x2 {d}, {a}, {b};",
        (a, b)
    );
    paired!(
        /// Two bf16 lanes: max, NaN propagating.
        max_nan_bf16x2,
        "max.NaN.bf16x2 {d}, {a}, {b};",
        (a, b)
    );
    paired!(
        /// The f32s of bits `hi` and `lo` as two bf16 lanes (`lo` the low one), each rounded
        /// to nearest even: one instruction where lane by lane took a conversion each and a
        /// merge.
        f32_pair_to_bf16x2,
        "cvt.rn.bf16x2.f32 {d}, {hi}, {lo};",
        (hi, lo)
    );
    paired!(
        /// The f32s of bits `hi` and `lo` as two f16 lanes, as [`f32_pair_to_bf16x2`].
        f32_pair_to_f16x2,
        "cvt.rn.f16x2.f32 {d}, {hi}, {lo};",
        (hi, lo)
    );
}
