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
