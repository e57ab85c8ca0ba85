//! f64 CPU references for every op, and the table of elementwise ops the tests and
//! benchmarks iterate over.

use crate::random::Domain;

pub fn gelu(x: f64) -> f64 {
    0.5 * x * libm::erfc(-x / std::f64::consts::SQRT_2)
}

/// `x/2 (1 + tanh(u))`, written as the equal `x / (1 + e^(-2u))`: in f64 too, `1 + tanh(u)`
/// cancels to 0 for large negative u, where the result is tiny but not 0.
pub fn gelu_tanh(x: f64) -> f64 {
    let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    x / (1.0 + (-2.0 * u).exp())
}

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// One elementwise op as the test matrix sees it.
#[derive(Clone, Copy, Debug)]
pub struct ElementwiseOp {
    /// The op's name in the library and the runner.
    pub name: &'static str,
    pub arity: usize,
    /// Where each input is drawn from.
    pub domains: &'static [Domain],
    /// The last input is a row vector broadcast along rows.
    pub broadcasts_last: bool,
    pub reference: fn(&[f64]) -> f64,
}

const ACTIVATION: Domain = Domain::Symmetric(8.0);
const ARITHMETIC: Domain = Domain::Symmetric(4.0);
const DIVISOR: Domain = Domain::AwayFromZero(0.25, 4.0);

/// Every elementwise op except `cast` (which changes dtype and is tested per dtype pair).
pub const ELEMENTWISE_OPS: &[ElementwiseOp] = &[
    ElementwiseOp {
        name: "relu",
        arity: 1,
        domains: &[ACTIVATION],
        broadcasts_last: false,
        reference: |x| x[0].max(0.0),
    },
    ElementwiseOp { name: "gelu", arity: 1, domains: &[ACTIVATION], broadcasts_last: false, reference: |x| gelu(x[0]) },
    ElementwiseOp {
        name: "gelu_tanh",
        arity: 1,
        domains: &[ACTIVATION],
        broadcasts_last: false,
        reference: |x| gelu_tanh(x[0]),
    },
    ElementwiseOp {
        name: "silu",
        arity: 1,
        domains: &[ACTIVATION],
        broadcasts_last: false,
        reference: |x| x[0] * sigmoid(x[0]),
    },
    ElementwiseOp {
        name: "sigmoid",
        arity: 1,
        domains: &[ACTIVATION],
        broadcasts_last: false,
        reference: |x| sigmoid(x[0]),
    },
    ElementwiseOp {
        name: "add",
        arity: 2,
        domains: &[ARITHMETIC, ARITHMETIC],
        broadcasts_last: false,
        reference: |x| x[0] + x[1],
    },
    ElementwiseOp {
        name: "sub",
        arity: 2,
        domains: &[ARITHMETIC, ARITHMETIC],
        broadcasts_last: false,
        reference: |x| x[0] - x[1],
    },
    ElementwiseOp {
        name: "mul",
        arity: 2,
        domains: &[ARITHMETIC, ARITHMETIC],
        broadcasts_last: false,
        reference: |x| x[0] * x[1],
    },
    ElementwiseOp {
        name: "div",
        arity: 2,
        domains: &[ARITHMETIC, DIVISOR],
        broadcasts_last: false,
        reference: |x| x[0] / x[1],
    },
    ElementwiseOp {
        name: "fma",
        arity: 3,
        domains: &[ARITHMETIC, ARITHMETIC, ARITHMETIC],
        broadcasts_last: false,
        reference: |x| x[0] * x[1] + x[2],
    },
    ElementwiseOp {
        name: "bias_add_gelu",
        arity: 2,
        domains: &[ARITHMETIC, ARITHMETIC],
        broadcasts_last: true,
        reference: |x| gelu(x[0] + x[1]),
    },
];

/// Softmax (or log-softmax) of each row of `x` (`rows x cols`, row-major), in f64.
/// A row of all `-inf` gives NaN, as in PyTorch.
pub fn softmax_rows(x: &[f64], cols: usize, log: bool) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
        y.extend(row.iter().map(|v| if log { v - max - sum.ln() } else { (v - max).exp() / sum }));
    }
    y
}

/// `ln(sum(e^x))` of each row of `cols`: `max + ln(sum(e^(x - max)))`, shifted by 0 where the
/// max is infinite, as PyTorch's `logsumexp`: a row holding `+inf` gives `+inf`, a row of
/// `-inf` gives `-inf` (not the NaN of `inf - inf`).
pub fn logsumexp_rows(x: &[f64], cols: usize) -> Vec<f64> {
    x.chunks(cols)
        .map(|row| {
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let shift = if max.is_infinite() { 0.0 } else { max };
            shift + row.iter().map(|v| (v - shift).exp()).sum::<f64>().ln()
        })
        .collect()
}

/// Gradient of [`softmax_rows`] from its output `y` and the output gradient `dy`.
pub fn softmax_backward_rows(y: &[f64], dy: &[f64], cols: usize, log: bool) -> Vec<f64> {
    let mut dx = Vec::with_capacity(y.len());
    for (yr, dyr) in y.chunks(cols).zip(dy.chunks(cols)) {
        if log {
            let sum: f64 = dyr.iter().sum();
            dx.extend(yr.iter().zip(dyr).map(|(y, dy)| dy - y.exp() * sum));
        } else {
            let sum: f64 = yr.iter().zip(dyr).map(|(y, dy)| y * dy).sum();
            dx.extend(yr.iter().zip(dyr).map(|(y, dy)| (dy - sum) * y));
        }
    }
    dx
}

/// Per-row cross entropy `-log_softmax(x)[target]`; 0 for the ignore index -100.
pub fn cross_entropy_rows(x: &[f64], target: &[i64], cols: usize) -> Vec<f64> {
    let logp = softmax_rows(x, cols, true);
    target.iter().enumerate().map(|(r, &t)| if t == -100 { 0.0 } else { -logp[r * cols + t as usize] }).collect()
}

/// Gradient of [`cross_entropy_rows`] with respect to `x`, given the loss gradient.
pub fn cross_entropy_backward_rows(x: &[f64], target: &[i64], dloss: &[f64], cols: usize) -> Vec<f64> {
    let p = softmax_rows(x, cols, false);
    p.iter()
        .enumerate()
        .map(|(i, &p)| {
            let (r, c) = (i / cols, i % cols);
            let t = target[r];
            if t == -100 { 0.0 } else { (p - if c as i64 == t { 1.0 } else { 0.0 }) * dloss[r] }
        })
        .collect()
}

/// The magnitude of the terms [`softmax_backward_rows`] adds up for each element (the same
/// formula on absolute values): the scale of the rounding error any f32 evaluation makes,
/// used as the floor of the relative error where the terms cancel.
pub fn softmax_backward_magnitude_rows(y: &[f64], dy: &[f64], cols: usize, log: bool) -> Vec<f64> {
    let mut out = Vec::with_capacity(y.len());
    for (yr, dyr) in y.chunks(cols).zip(dy.chunks(cols)) {
        if log {
            // y is a log-probability: exp(y) is positive already.
            let sum: f64 = dyr.iter().map(|d| d.abs()).sum();
            out.extend(yr.iter().zip(dyr).map(|(y, dy)| dy.abs() + y.exp() * sum));
        } else {
            let sum: f64 = yr.iter().zip(dyr).map(|(y, dy)| (y * dy).abs()).sum();
            out.extend(yr.iter().zip(dyr).map(|(y, dy)| (dy.abs() + sum) * y.abs()));
        }
    }
    out
}

/// The magnitude of the terms of [`cross_entropy_backward_rows`]: `(p + onehot) |dloss|`.
pub fn cross_entropy_backward_magnitude_rows(x: &[f64], target: &[i64], dloss: &[f64], cols: usize) -> Vec<f64> {
    let p = softmax_rows(x, cols, false);
    p.iter()
        .enumerate()
        .map(|(i, &p)| {
            let (r, c) = (i / cols, i % cols);
            (p + if c as i64 == target[r] { 1.0 } else { 0.0 }) * dloss[r].abs()
        })
        .collect()
}

/// Per-row statistics of a norm, `(mean, rstd)`: LayerNorm's mean and `1 / sqrt(var + eps)`
/// with the biased variance (`rms` false), or RMSNorm's 0 and `1 / sqrt(mean(x^2) + eps)`
/// (`rms` true). Two passes in f64: exact enough for rows whose mean dwarfs their spread.
pub fn norm_stats_rows(x: &[f64], cols: usize, rms: bool, eps: f64) -> Vec<(f64, f64)> {
    x.chunks(cols)
        .map(|row| {
            let mean = if rms { 0.0 } else { row.iter().sum::<f64>() / cols as f64 };
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
            (mean, 1.0 / (var + eps).sqrt())
        })
        .collect()
}

/// `(x - mean) * rstd * weight + bias` per row, with the given statistics (one per row) and
/// the optional per-column weight and bias.
pub fn norm_apply_rows(
    x: &[f64],
    cols: usize,
    stats: &[(f64, f64)],
    weight: Option<&[f64]>,
    bias: Option<&[f64]>,
) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for (row, &(mean, rstd)) in x.chunks(cols).zip(stats) {
        y.extend(
            row.iter()
                .enumerate()
                .map(|(c, v)| (v - mean) * rstd * weight.map_or(1.0, |w| w[c]) + bias.map_or(0.0, |b| b[c])),
        );
    }
    y
}

/// LayerNorm (`rms` false) or RMSNorm (`rms` true) of each row of `x`, in f64.
pub fn norm_rows(
    x: &[f64],
    cols: usize,
    rms: bool,
    eps: f64,
    weight: Option<&[f64]>,
    bias: Option<&[f64]>,
) -> Vec<f64> {
    norm_apply_rows(x, cols, &norm_stats_rows(x, cols, rms, eps), weight, bias)
}

/// Gradient of a norm with respect to `x` from the output gradient `dy` and the forward's
/// statistics: `rstd * (g - mean(g) - xhat * mean(g * xhat))` with `g = dy * weight` and
/// `xhat = (x - mean) * rstd`; RMSNorm (`rms`) drops the `mean(g)` term.
pub fn norm_backward_rows(
    x: &[f64],
    dy: &[f64],
    cols: usize,
    stats: &[(f64, f64)],
    rms: bool,
    weight: Option<&[f64]>,
) -> Vec<f64> {
    norm_backward_terms(x, dy, cols, stats, rms, weight, false)
}

/// The magnitude of the terms [`norm_backward_rows`] adds up for each element (the same
/// formula on absolute values): the floor of the relative error where they cancel.
pub fn norm_backward_magnitude_rows(
    x: &[f64],
    dy: &[f64],
    cols: usize,
    stats: &[(f64, f64)],
    rms: bool,
    weight: Option<&[f64]>,
) -> Vec<f64> {
    norm_backward_terms(x, dy, cols, stats, rms, weight, true)
}

fn norm_backward_terms(
    x: &[f64],
    dy: &[f64],
    cols: usize,
    stats: &[(f64, f64)],
    rms: bool,
    weight: Option<&[f64]>,
    magnitude: bool,
) -> Vec<f64> {
    let abs = |v: f64| if magnitude { v.abs() } else { v };
    let mut dx = Vec::with_capacity(x.len());
    for ((xr, dyr), &(mean, rstd)) in x.chunks(cols).zip(dy.chunks(cols)).zip(stats) {
        let xhat: Vec<f64> = xr.iter().map(|v| (v - mean) * rstd).collect();
        let g: Vec<f64> = dyr.iter().enumerate().map(|(c, d)| d * weight.map_or(1.0, |w| w[c])).collect();
        let mean_g = if rms { 0.0 } else { g.iter().map(|&v| abs(v)).sum::<f64>() / cols as f64 };
        let mean_gx = g.iter().zip(&xhat).map(|(g, x)| abs(g * x)).sum::<f64>() / cols as f64;
        dx.extend(g.iter().zip(&xhat).map(|(&g, &x)| {
            if magnitude { rstd * (g.abs() + mean_g + x.abs() * mean_gx) } else { rstd * (g - mean_g - x * mean_gx) }
        }));
    }
    dx
}

/// A norm's parameter gradients, column sums over the rows, with the sums of their terms'
/// magnitudes (the scale of an f32 accumulation's rounding error).
pub struct NormParamGrads {
    /// `sum over rows of dy * xhat`.
    pub dweight: Vec<f64>,
    /// `sum over rows of dy`.
    pub dbias: Vec<f64>,
    pub dweight_magnitude: Vec<f64>,
    pub dbias_magnitude: Vec<f64>,
}

/// [`NormParamGrads`] of `x` and `dy` (`rows x cols`) with the forward's statistics.
pub fn norm_param_grads(x: &[f64], dy: &[f64], cols: usize, stats: &[(f64, f64)]) -> NormParamGrads {
    let mut grads = NormParamGrads {
        dweight: vec![0.0; cols],
        dbias: vec![0.0; cols],
        dweight_magnitude: vec![0.0; cols],
        dbias_magnitude: vec![0.0; cols],
    };
    for ((xr, dyr), &(mean, rstd)) in x.chunks(cols).zip(dy.chunks(cols)).zip(stats) {
        for (c, (v, d)) in xr.iter().zip(dyr).enumerate() {
            let term = d * (v - mean) * rstd;
            grads.dweight[c] += term;
            grads.dweight_magnitude[c] += term.abs();
            grads.dbias[c] += d;
            grads.dbias_magnitude[c] += d.abs();
        }
    }
    grads
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logsumexp_of_infinite_rows_is_pytorchs() {
        let (inf, nan) = (f64::INFINITY, f64::NAN);
        let got = logsumexp_rows(&[inf, 1.0, -inf, -inf, nan, 1.0, 0.0, 0.0], 2);
        assert_eq!(got[..2], [inf, -inf]);
        assert!(got[2].is_nan());
        assert!((got[3] - 2f64.ln()).abs() < 1e-15);
    }
}
