//! Element types as the kernels see them: storage type, f32 compute type, and the packed
//! two-lane form for the half2/bfloat162 instructions.

use crate::abi::DType;

/// bf16 has no Rust type: it travels as its bit pattern.
#[allow(non_camel_case_types)]
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct bf16(pub u16);

/// f32 to bf16 bits with round-to-nearest-even; NaN stays a (quiet) NaN.
#[inline(always)]
pub const fn bf16_bits_round_to_nearest_even(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let rounding_bias = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding_bias) >> 16) as u16
}

/// A storage element type. Kernels load these, compute in f32, and store these.
pub trait Scalar: Copy + 'static {
    const DTYPE: DType;
    /// Bytes per element.
    const BYTES: usize = Self::DTYPE.size();

    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;

    /// The element's bits, zero-extended (used to move elements through 32-bit words).
    fn to_bits(self) -> u32;
    fn from_bits(bits: u32) -> Self;

    /// Two lanes of `x` packed in one word, for the paired instructions below. Evaluated at
    /// compile time for constants.
    #[inline(always)]
    fn splat_pair(x: f32) -> u32 {
        let b = Self::from_f32(x).to_bits();
        b | (b << 16)
    }

    /// `lo` and `hi` as the two lanes of a word (`lo` low), rounded as [`Scalar::from_f32`]
    /// rounds each; only for 16-bit types, whose device forms convert both at once.
    #[inline(always)]
    fn pair_from_f32(lo: f32, hi: f32) -> u32 {
        Self::from_f32(lo).to_bits() | (Self::from_f32(hi).to_bits() << 16)
    }

    /// `a * b + c` on two packed lanes, rounded once per lane, where the type has it.
    #[inline(always)]
    fn fma_pair(_a: u32, _b: u32, _c: u32) -> Option<u32> {
        None
    }

    /// NaN-propagating max on two packed lanes, where the type has it.
    #[inline(always)]
    fn max_nan_pair(_a: u32, _b: u32) -> Option<u32> {
        None
    }
}

impl Scalar for f32 {
    const DTYPE: DType = DType::F32;

    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn to_bits(self) -> u32 {
        f32::to_bits(self)
    }
    #[inline(always)]
    fn from_bits(bits: u32) -> Self {
        f32::from_bits(bits)
    }
}

#[cfg(any(target_arch = "nvptx64", test))]
impl Scalar for f16 {
    const DTYPE: DType = DType::F16;

    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x as f16
    }
    #[inline(always)]
    fn to_bits(self) -> u32 {
        f16::to_bits(self) as u32
    }
    #[inline(always)]
    fn from_bits(bits: u32) -> Self {
        f16::from_bits(bits as u16)
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn pair_from_f32(lo: f32, hi: f32) -> u32 {
        crate::arch::f32_pair_to_f16x2(hi.to_bits(), lo.to_bits())
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn fma_pair(a: u32, b: u32, c: u32) -> Option<u32> {
        Some(crate::arch::fma_f16x2(a, b, c))
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn max_nan_pair(a: u32, b: u32) -> Option<u32> {
        Some(crate::arch::max_nan_f16x2(a, b))
    }
}

impl Scalar for bf16 {
    const DTYPE: DType = DType::BF16;

    /// Exact: bf16 is the top half of an f32.
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16(crate::arch::f32_to_bf16_bits(x))
    }
    #[inline(always)]
    fn to_bits(self) -> u32 {
        self.0 as u32
    }
    #[inline(always)]
    fn from_bits(bits: u32) -> Self {
        bf16(bits as u16)
    }
    /// Software rounding, so constants fold at compile time.
    #[inline(always)]
    fn splat_pair(x: f32) -> u32 {
        let b = bf16_bits_round_to_nearest_even(x) as u32;
        b | (b << 16)
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn pair_from_f32(lo: f32, hi: f32) -> u32 {
        crate::arch::f32_pair_to_bf16x2(hi.to_bits(), lo.to_bits())
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn fma_pair(a: u32, b: u32, c: u32) -> Option<u32> {
        Some(crate::arch::fma_bf16x2(a, b, c))
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn max_nan_pair(a: u32, b: u32) -> Option<u32> {
        Some(crate::arch::max_nan_bf16x2(a, b))
    }
}

/// Quantized values (int8), which users' fused loads read and dequantize (`crate::fuse`).
impl Scalar for i8 {
    const DTYPE: DType = DType::I8;

    /// Exact, without a conversion instruction ([`crate::arch::i8_lane_to_f32`]): `q as f32` takes
    /// two conversions on the quarter-rate pipe, which makes a dequantizing softmax bound by the
    /// SMs' issue rather than by memory (docs/DECISIONS.md, "int8 lanes converted by their float
    /// bits").
    #[inline(always)]
    fn to_f32(self) -> f32 {
        crate::arch::i8_lane_to_f32(self as u8 as u32 ^ 0x8080_8080, 0)
    }
    /// Rounded toward zero and saturated, as Rust's `as` does.
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x as i8
    }
    #[inline(always)]
    fn to_bits(self) -> u32 {
        self as u8 as u32
    }
    #[inline(always)]
    fn from_bits(bits: u32) -> Self {
        bits as u8 as i8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int8_travels_as_its_byte() {
        for q in [i8::MIN, -1, 0, 1, i8::MAX] {
            assert_eq!(i8::from_bits(q.to_bits()), q);
            assert!(q.to_bits() <= 0xff);
        }
        for q in i8::MIN..=i8::MAX {
            assert_eq!(q.to_f32(), q as f32);
        }
        assert_eq!(i8::from_f32(300.0), i8::MAX);
        assert_eq!(i8::from_f32(-2.7), -2);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
        assert_eq!(bf16_bits_round_to_nearest_even(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3 * 2^-8 is halfway too: ties to even rounds up.
        assert_eq!(bf16_bits_round_to_nearest_even(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(bf16_bits_round_to_nearest_even(1.0 + 1.5 / 256.0), 0x3f81);
        assert_eq!(bf16_bits_round_to_nearest_even(f32::INFINITY), 0x7f80);
        assert_eq!(bf16_bits_round_to_nearest_even(f32::MAX), 0x7f80);
        assert_eq!(bf16_bits_round_to_nearest_even(-0.0), 0x8000);
        assert!(bf16(bf16_bits_round_to_nearest_even(f32::NAN)).to_f32().is_nan());
    }

    #[test]
    fn bf16_round_trip_matches_f64_rounding() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..100_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let x = f32::from_bits(state as u32);
            if !x.is_finite() || x.abs() > 1e38 {
                continue;
            }
            let got = bf16::from_f32(x).to_f32() as f64;
            // The nearest bf16 values below and above x, by truncating and stepping.
            let below = f32::from_bits(x.to_bits() & 0xffff_0000) as f64;
            let above = f32::from_bits((x.to_bits() & 0xffff_0000) + 0x1_0000) as f64;
            let err = (got - x as f64).abs();
            assert!(err <= (x as f64 - below).abs().min((above - x as f64).abs()), "x = {x:e}");
        }
    }
}
