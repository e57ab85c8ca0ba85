//! Fast f32 math for the ops, built on the primitives in [`crate::arch`].
//!
//! Each function stays within a few ulp of the f64 result over the ranges the ops see
//! (checked against f64 in the tests below), using one or two special-function-unit
//! operations and no IEEE division: at 3 TB/s an f16 elementwise op has a budget of only a
//! handful of SFU operations per element.
//!
//! The polynomial coefficients were fitted for this crate by least squares on Chebyshev
//! nodes against f64 references.

use crate::arch::{ex2, fma, lg2, rcp};

pub const LOG2_E: f32 = core::f32::consts::LOG2_E;
pub const LN_2: f32 = core::f32::consts::LN_2;

/// `e^x`.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    ex2(x * LOG2_E)
}

/// Natural logarithm.
#[inline(always)]
pub fn log(x: f32) -> f32 {
    lg2(x) * LN_2
}

/// `1 / (1 + e^-x)`, exact to the last few ulp for both signs (no cancellation).
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    rcp(1.0 + exp(-x))
}

/// Horner evaluation of `c[0] x^(n-1) + ... + c[n-1]`.
#[inline(always)]
fn horner<const N: usize>(x: f32, c: [f32; N]) -> f32 {
    let mut acc = c[0];
    let mut i = 1;
    while i < N {
        acc = fma(acc, x, c[i]);
        i += 1;
    }
    acc
}

/// `erfc(z) = t * exp(-z^2 + P(t))` with `t = 1 / (1 + z/2)`, for `z >= 0`; relative error
/// under 4e-7 for z in [0, 9] in f64 (f32 evaluation adds up to ~8e-6 near z = 9, from
/// rounding the exponent's argument); the result underflows to 0 past ~9.2.
const ERFC_T: [f32; 10] = [
    0.156_923_53,
    -0.743_797_9,
    1.298_993_1,
    -0.877_143_2,
    0.061_878_663,
    -0.070_064_72,
    0.057_368_49,
    0.382_200_12,
    0.999_111_65,
    -1.265_469_7,
];

/// `erf(x) = x * Q(x^2)` for `|x| <= 0.5` (relative error about 1e-9 in f64).
const ERF_SMALL: [f32; 5] =
    [0.004_719_458, -0.026_757_924, 0.112_828_34, -0.376_126_08, core::f32::consts::FRAC_2_SQRT_PI];

/// `tanh(x) = x + x^3 * R(x^2)` for `|x| <= 0.625` (relative error about 2e-8 in f64).
const TANH_SMALL: [f32; 5] = [-0.006_104_731, 0.021_003_492, -0.053_852_465, 0.133_327_83, -0.333_333_28];

/// Complementary error function; accurate relative to its value in both tails, which is
/// what keeps GELU accurate for large negative inputs.
#[inline(always)]
pub fn erfc(x: f32) -> f32 {
    let z = x.abs();
    let t = rcp(fma(0.5, z, 1.0));
    let r = t * ex2(fma(-z, z, horner(t, ERFC_T)) * LOG2_E);
    if x < 0.0 { 2.0 - r } else { r }
}

/// Error function.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let z = x.abs();
    if z <= 0.5 { x * horner(x * x, ERF_SMALL) } else { (1.0 - erfc(z)).copysign(x) }
}

/// Hyperbolic tangent.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let z = x.abs();
    if z <= 0.625 {
        let x2 = x * x;
        fma(x * x2, horner(x2, TANH_SMALL), x)
    } else {
        fma(-2.0, rcp(exp(2.0 * z) + 1.0), 1.0).copysign(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max_rel_err(f: impl Fn(f32) -> f32, reference: impl Fn(f64) -> f64, lo: f32, hi: f32) -> f64 {
        let n = 200_001;
        (0..n)
            .map(|i| lo + (hi - lo) * i as f32 / (n - 1) as f32)
            .map(|x| {
                let want = reference(x as f64);
                let got = f(x) as f64;
                (got - want).abs() / want.abs().max(f32::MIN_POSITIVE as f64)
            })
            .fold(0.0, f64::max)
    }

    #[test]
    fn erfc_is_accurate_relative_to_its_value() {
        // Up to ~3e-7 from the fit; past z ~ 6 the rounding of the exponent's argument
        // (about 1 ulp of 2^7) adds up to ~8e-6.
        let error = max_rel_err(erfc, libm::erfc, -6.0, 9.0);
        assert!(error < 1e-5, "{error:e}");
        let error = max_rel_err(erfc, libm::erfc, -6.0, 4.0);
        assert!(error < 2e-6, "{error:e}");
    }

    #[test]
    fn erf_is_accurate_near_zero_and_beyond() {
        assert!(max_rel_err(erf, libm::erf, -6.0, 6.0) < 1e-6);
        assert!(max_rel_err(erf, libm::erf, -1e-3, 1e-3) < 1e-6);
    }

    #[test]
    fn tanh_is_accurate_near_zero_and_beyond() {
        assert!(max_rel_err(tanh, f64::tanh, -10.0, 10.0) < 1e-6);
        assert!(max_rel_err(tanh, f64::tanh, -1e-3, 1e-3) < 1e-6);
    }

    #[test]
    fn exp_log_sigmoid_are_accurate() {
        assert!(max_rel_err(exp, f64::exp, -80.0, 80.0) < 1e-5);
        assert!(max_rel_err(log, f64::ln, 1e-6, 1e6) < 1e-6);
        assert!(max_rel_err(sigmoid, |x| 1.0 / (1.0 + (-x).exp()), -80.0, 80.0) < 1e-5);
    }
}
