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
