//! Comparing device results with f64 references.

use rill::{DType, Element};

/// Relative error bound for outputs of `dtype`: a few ulp for f32, the storage rounding
/// (plus f32 compute) for the 16-bit types.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
        DType::I64 | DType::U32 | DType::I8 => 0.0,
    }
}

/// Below this magnitude errors are measured against it rather than against the value:
/// the smallest normal number of the dtype (f16 subnormals have absolute, not relative,
/// precision).
pub fn relative_floor(dtype: DType) -> f64 {
    match dtype {
        DType::F32 | DType::BF16 | DType::I64 | DType::U32 | DType::I8 => f32::MIN_POSITIVE as f64,
        DType::F16 => 6.103_515_625e-5,
    }
}

/// The worst element of a comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct Worst {
    pub index: usize,
    pub got: f64,
    pub want: f64,
    pub error: f64,
}

/// Max relative error of `got` against `want`; a NaN or infinite result (for a finite
/// reference) counts as infinitely wrong, so poisoned, unwritten outputs never pass.
pub fn max_relative_error<T: Element>(got: &[T], want: &[f64]) -> Option<Worst> {
    let floor = relative_floor(T::DTYPE);
    max_error_with_floor(got, want, |_| floor)
}

/// Max of `|got - want| / max(|want|, floor(i))`: errors of elements smaller than their
/// floor are measured against the floor (for values whose absolute error is what matters,
/// such as log-probabilities near 0 or gradients that cancel). Non-finite results where
/// the reference is finite count as infinitely wrong; NaN matches only a NaN reference.
pub fn max_error_with_floor<T: Element>(got: &[T], want: &[f64], floor: impl Fn(usize) -> f64) -> Option<Worst> {
    assert_eq!(got.len(), want.len());
    max_error_of(|i| got[i].to_f64(), want, floor)
}

/// [`max_error_with_floor`] of results read by index (`got(i)` for each `i` of `want`).
pub fn max_error_of(got: impl Fn(usize) -> f64, want: &[f64], floor: impl Fn(usize) -> f64) -> Option<Worst> {
    want.iter()
        .enumerate()
        .map(|(index, &w)| {
            let g = got(index);
            let error = if w.is_nan() {
                if g.is_nan() { 0.0 } else { f64::INFINITY }
            } else if g.is_finite() {
                (g - w).abs() / w.abs().max(floor(index))
            } else if g == w {
                0.0
            } else {
                f64::INFINITY
            };
            Worst { index, got: g, want: w, error }
        })
        .max_by(|a, b| a.error.total_cmp(&b.error))
}

/// A value no op produces from finite inputs: outputs are filled with it before launch.
pub fn poison<T: Element>() -> T {
    T::from_f64(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_never_passes() {
        let worst = max_relative_error(&[1.0f32, f32::NAN], &[1.0, 2.0]).unwrap();
        assert_eq!(worst.index, 1);
        assert!(worst.error.is_infinite());
    }

    #[test]
    fn error_is_relative_above_the_floor() {
        let worst = max_relative_error(&[1.01f32], &[1.0]).unwrap();
        assert!((worst.error - 0.01).abs() < 1e-6);
    }
}
