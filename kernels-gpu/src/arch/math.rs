//! Floating-point instructions: the special-function-unit approximations, the full-range
//! division and the fused multiply-add that [`crate::math`] and [`crate::functor`] build on,
//! which have host versions so that math runs in CPU unit tests; and two-lane f16/bf16
//! arithmetic, device only.

#[cfg(target_arch = "nvptx64")]
pub use packed::*;

/// Defines an f32 instruction `$ptx` (operands `{d}` and the arguments by name) as a
/// function, `$host` its value on the host.
macro_rules! f32_instruction {
    ($(#[$doc:meta])* $name:ident, $ptx:literal, ($($arg:ident),*), $host:expr) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name($($arg: f32),*) -> f32 {
            #[cfg(target_arch = "nvptx64")]
            {
                let d: f32;
                // SAFETY: a pure register-to-register instruction (sm_80).
                unsafe {
                    core::arch::asm!($ptx, d = out(reg32) d, $($arg = in(reg32) $arg),*,
                        options(pure, nomem, nostack));
                }
                d
            }
            #[cfg(not(target_arch = "nvptx64"))]
            {
                $host
            }
        }
    };
}

f32_instruction!(
    /// `2^x`. Device: `ex2.approx.ftz.f32` (max 2 ulp, one SFU op).
    ex2,
    "ex2.approx.ftz.f32 {d}, {x};",
    (x),
    x.exp2()
);
f32_instruction!(
    /// `log2(x)`. Device: `lg2.approx.ftz.f32`.
    lg2,
    "lg2.approx.ftz.f32 {d}, {x};",
    (x),
    x.log2()
);
f32_instruction!(
    /// `1/sqrt(x)`. Device: `rsqrt.approx.ftz.f32`.
    rsqrt,
    "rsqrt.approx.ftz.f32 {d}, {x};",
    (x),
    1.0 / x.sqrt()
);
f32_instruction!(
    /// `1/x`. Device: `rcp.approx.ftz.f32` (1 ulp), instead of the IEEE division sequence.
    rcp,
    "rcp.approx.ftz.f32 {d}, {x};",
    (x),
    1.0 / x
);
f32_instruction!(
    /// `a / b` over the whole range, within 2 ulp. Device: `div.full.f32`, the reciprocal
    /// with the operands scaled where `|b| > 2^126` (whose reciprocal `rcp.approx.ftz`
    /// flushes to 0): a few instructions more than `a * rcp(b)`, far fewer than IEEE `div.rn`.
    div,
    "div.full.f32 {d}, {a}, {b};",
    (a, b),
    a / b
);
f32_instruction!(
    /// `a * b + c` rounded once (`fma.rn.f32`).
    fma,
    "fma.rn.f32 {d}, {a}, {b}, {c};",
    (a, b, c),
    a.mul_add(b, c)
);

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
