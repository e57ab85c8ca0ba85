//! Elementwise functors: the math of each elementwise op, in f32, independent of storage
//! types and of how the kernel walks memory (OneFlow's elementwise functor split).
//!
//! A functor may also offer a two-lane path on packed 16-bit pairs (half2/bfloat162
//! instructions); the kernel takes it when input and output share a 16-bit type.

use crate::arch::div;
use crate::math::{erfc, exp, sigmoid};
use crate::scalar::Scalar;

/// The math of one elementwise op with `K` inputs.
pub trait Functor<const K: usize> {
    /// The last input is a row vector broadcast along rows: input `K-1` has `cols` elements
    /// and element `i` of the output reads its element `i % cols`.
    const BROADCASTS_LAST_INPUT: bool = false;

    fn apply(x: [f32; K]) -> f32;

    /// Two outputs at once from packed pairs of `T` lanes, or `None` where the op or the
    /// type has no paired instruction.
    #[inline(always)]
    fn apply_pair<T: Scalar>(_x: [u32; K]) -> Option<u32> {
        None
    }
}

/// `max(x, 0)`, NaN propagating (as PyTorch).
pub struct Relu;
impl Functor<1> for Relu {
    #[inline(always)]
    fn apply([x]: [f32; 1]) -> f32 {
        if x < 0.0 { 0.0 } else { x }
    }
    #[inline(always)]
    fn apply_pair<T: Scalar>([x]: [u32; 1]) -> Option<u32> {
        T::max_nan_pair(x, 0)
    }
}

/// GELU with the exact erf form: `x/2 * erfc(-x/sqrt(2))`, accurate for negative x too.
pub struct Gelu;
impl Functor<1> for Gelu {
    #[inline(always)]
    fn apply([x]: [f32; 1]) -> f32 {
        0.5 * x * erfc(-x * core::f32::consts::FRAC_1_SQRT_2)
    }
}

/// GELU with the tanh approximation, `x/2 * (1 + tanh(u))` with
/// `u = sqrt(2/pi) (x + 0.044715 x^3)`, computed as `x * sigmoid(2u)` (the same function,
/// without the cancellation of `1 + tanh(u)` for negative x).
pub struct GeluTanh;
impl Functor<1> for GeluTanh {
    #[inline(always)]
    fn apply([x]: [f32; 1]) -> f32 {
        const TWO_SQRT_2_OVER_PI: f32 = 2.0 * 0.797_884_6;
        let u2 = TWO_SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x);
        x * sigmoid(u2)
    }
}

/// `x / (1 + e^-x)`, PyTorch's form, by the full-range division: `x * sigmoid(x)` flushed
/// the subnormal sigmoid of `x` below about -87.3 to 0, where the product is a normal number
/// (`silu(-88)` is -5.3e-37).
pub struct Silu;
impl Functor<1> for Silu {
    #[inline(always)]
    fn apply([x]: [f32; 1]) -> f32 {
        div(x, 1.0 + exp(-x))
    }
}

/// `1 / (1 + e^-x)`.
pub struct Sigmoid;
impl Functor<1> for Sigmoid {
    #[inline(always)]
    fn apply([x]: [f32; 1]) -> f32 {
        sigmoid(x)
    }
}

/// Type conversion: the storage types do the work, rounding to nearest even once.
pub struct Cast;
impl Functor<1> for Cast {
    #[inline(always)]
    fn apply([x]: [f32; 1]) -> f32 {
        x
    }
}

/// `a + b`.
pub struct Add;
impl Functor<2> for Add {
    #[inline(always)]
    fn apply([a, b]: [f32; 2]) -> f32 {
        a + b
    }
    #[inline(always)]
    fn apply_pair<T: Scalar>([a, b]: [u32; 2]) -> Option<u32> {
        T::fma_pair(a, T::splat_pair(1.0), b)
    }
}

/// `a - b`.
pub struct Sub;
impl Functor<2> for Sub {
    #[inline(always)]
    fn apply([a, b]: [f32; 2]) -> f32 {
        a - b
    }
    #[inline(always)]
    fn apply_pair<T: Scalar>([a, b]: [u32; 2]) -> Option<u32> {
        T::fma_pair(b, T::splat_pair(-1.0), a)
    }
}

/// `a * b`.
pub struct Mul;
impl Functor<2> for Mul {
    #[inline(always)]
    fn apply([a, b]: [f32; 2]) -> f32 {
        a * b
    }
    #[inline(always)]
    fn apply_pair<T: Scalar>([a, b]: [u32; 2]) -> Option<u32> {
        // Adding -0 keeps the sign of a zero product.
        T::fma_pair(a, b, T::splat_pair(-0.0))
    }
}

/// `a / b` within 2 ulp over the whole range ([`div`]; `a * rcp(b)` gave 0 for any `|b|`
/// above 2^126), without IEEE division's longer sequence.
pub struct Div;
impl Functor<2> for Div {
    #[inline(always)]
    fn apply([a, b]: [f32; 2]) -> f32 {
        div(a, b)
    }
}

/// `a * b + c`, rounded once.
pub struct Fma;
impl Functor<3> for Fma {
    #[inline(always)]
    fn apply([a, b, c]: [f32; 3]) -> f32 {
        crate::arch::fma(a, b, c)
    }
    #[inline(always)]
    fn apply_pair<T: Scalar>([a, b, c]: [u32; 3]) -> Option<u32> {
        T::fma_pair(a, b, c)
    }
}

/// `gelu(x + bias)` with the bias broadcast along rows (a transformer MLP's epilogue).
pub struct BiasAddGelu;
impl Functor<2> for BiasAddGelu {
    const BROADCASTS_LAST_INPUT: bool = true;
    #[inline(always)]
    fn apply([x, bias]: [f32; 2]) -> f32 {
        Gelu::apply([x + bias])
    }
}
