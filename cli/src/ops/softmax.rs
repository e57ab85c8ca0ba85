//! The softmax family: ops that normalize, or reduce, each row over the last axis.

use crate::args::{Io, file};
use crate::run::{Context, Holds, Invocation, NpyElement, Ran};
use clap::{Args, Subcommand};
use rill::softmax::{self, Plan};
use rill::{Stream, Tensor};
use std::path::PathBuf;

/// The softmax family, named as in PyTorch.
#[derive(Subcommand, Debug)]
#[command(rename_all = "snake_case")]
pub enum Op {
    /// Softmax over the last axis.
    Softmax(Forward),
    /// Log-softmax over the last axis.
    LogSoftmax(Forward),
    /// Gradient of softmax from its output (--input) and that output's gradient.
    SoftmaxBackward(SoftmaxBackward),
    /// Gradient of log_softmax from its output (--input) and that output's gradient.
    LogSoftmaxBackward(SoftmaxBackward),
    /// softmax(input * scale + mask), mask [m, last dim], m dividing input's rows.
    ScaledMaskedSoftmax(ScaledMaskedSoftmax),
    /// softmax(input * scale), query i (second-to-last axis) seeing keys 0..=i.
    ///
    /// --input needs at least two dimensions.
    ScaledCausalSoftmax(ScaledCausalSoftmax),
    /// Per-row loss -log_softmax(input)[target], float32 of shape [rows].
    ///
    /// One loss per row of --input, rows being the product of all but its last dimension.
    /// PyTorch's cross_entropy with reduction='none' and ignore_index=-100: rows whose target is
    /// -100 have loss 0.
    CrossEntropy(CrossEntropy),
    /// Gradient of cross_entropy wrt input, from the loss gradient.
    ///
    /// Writes a gradient of --input's shape and dtype; rows whose target is -100 get 0.
    CrossEntropyBackward(CrossEntropyBackward),
    /// log(sum(exp(input))) over the last axis, of --input's shape without that axis.
    ///
    /// PyTorch's logsumexp(input, dim) over the last axis. The output is float32 whatever the
    /// dtype of --input.
    Logsumexp(Forward),
}

/// `--dim`, which the softmax family takes as PyTorch does, though only the last axis is
/// normalized.
#[derive(Args, Debug)]
pub struct Dim {
    /// The axis normalized: it must be the last (-1 or ndim - 1).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub dim: i64,
}

/// A forward op of --input alone.
#[derive(Args, Debug)]
pub struct Forward {
    #[command(flatten)]
    pub io: Io,
    #[command(flatten)]
    pub dim: Dim,
}

#[derive(Args, Debug)]
pub struct SoftmaxBackward {
    #[command(flatten)]
    pub io: Io,
    /// The gradient of the forward's output, of --input's shape and dtype.
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub grad_output: PathBuf,
    #[command(flatten)]
    pub dim: Dim,
}

#[derive(Args, Debug)]
pub struct ScaledMaskedSoftmax {
    #[command(flatten)]
    pub io: Io,
    /// Added after scaling: [m, last dim], m dividing --input's rows (row r takes mask row r % m).
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub mask: PathBuf,
    #[command(flatten)]
    pub scale: Scale,
    #[command(flatten)]
    pub dim: Dim,
}

#[derive(Args, Debug)]
pub struct ScaledCausalSoftmax {
    #[command(flatten)]
    pub io: Io,
    #[command(flatten)]
    pub scale: Scale,
    #[command(flatten)]
    pub dim: Dim,
}

#[derive(Args, Debug)]
pub struct Scale {
    /// Multiplies --input, e.g. 0.125 = 1/sqrt(head size 64).
    // Hyphen values, not just negative numbers: clap's number check rejects exponents like -1e-3.
    #[arg(long, value_name = "S", value_parser = finite, allow_hyphen_values = true)]
    pub scale: f32,
}

/// The loss options PyTorch has; the kernels implement one value of each, so no other is
/// accepted.
#[derive(Args, Debug)]
pub struct LossOptions {
    /// none, the only reduction: one loss per row (reduce the output yourself).
    #[arg(long, value_name = "none", default_value = "none", value_parser = reduction)]
    pub reduction: Reduction,
    /// -100, the only ignore index: the kernels hard-code PyTorch's default.
    #[arg(long, default_value = "-100", value_parser = ignore_index, allow_negative_numbers = true)]
    pub ignore_index: IgnoreIndex,
}

/// PyTorch's `reduction='none'`, the one the kernels compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reduction;

/// PyTorch's `ignore_index=-100`, the one the kernels hard-code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IgnoreIndex;

#[derive(Args, Debug)]
pub struct CrossEntropy {
    #[command(flatten)]
    pub io: Io,
    /// Class indices, int64 ('<i8', or '<i4' read as int64), of shape [rows].
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub target: PathBuf,
    #[command(flatten)]
    pub loss: LossOptions,
}

#[derive(Args, Debug)]
pub struct CrossEntropyBackward {
    #[command(flatten)]
    pub forward: CrossEntropy,
    /// The gradient of the per-row loss: float32 of shape [rows].
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub grad_output: PathBuf,
}

fn finite(value: &str) -> Result<f32, String> {
    match value.parse::<f32>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => Err("must be a finite number".into()),
    }
}

fn reduction(value: &str) -> Result<Reduction, String> {
    if value == "none" {
        Ok(Reduction)
    } else {
        Err("the only supported reduction is none (one loss per row); reduce the output yourself (PyTorch's \
             mean averages over rows whose target is not -100)"
            .into())
    }
}

fn ignore_index(value: &str) -> Result<IgnoreIndex, String> {
    match value.parse::<i64>() {
        Ok(-100) => Ok(IgnoreIndex),
        Ok(_) => Err("the kernels hard-code -100 (PyTorch's default), so only --ignore-index -100 is accepted; \
                      map ignored targets to -100"
            .into()),
        Err(_) => Err("must be an integer (-100)".into()),
    }
}

impl Op {
    pub fn invocation(&self) -> Invocation<'_> {
        match self {
            Op::Softmax(args) => args.invocation("softmax"),
            Op::LogSoftmax(args) => args.invocation("log_softmax"),
            Op::SoftmaxBackward(args) => args.invocation("softmax_backward"),
            Op::LogSoftmaxBackward(args) => args.invocation("log_softmax_backward"),
            Op::ScaledMaskedSoftmax(args) => Invocation::new("scaled_masked_softmax", &args.io)
                .file("mask", Holds::Float, &args.mask)
                .dim(args.dim.dim),
            Op::ScaledCausalSoftmax(args) => Invocation::new("scaled_causal_softmax", &args.io).dim(args.dim.dim),
            Op::CrossEntropy(args) => args.invocation("cross_entropy"),
            Op::CrossEntropyBackward(args) => {
                args.forward.invocation("cross_entropy_backward").file("grad-output", Holds::Float32, &args.grad_output)
            }
            Op::Logsumexp(args) => args.invocation("logsumexp"),
        }
    }

    pub fn execute<T: NpyElement>(&self, cx: &Context) -> rill::Result<Ran> {
        let x = cx.tensor::<T>("input")?;
        let operand = |flag| cx.tensor::<T>(flag);
        let target = || cx.tensor::<i64>("target");
        let like_x = |kernel: &dyn Fn(&Stream, &mut Tensor<T>) -> rill::Result<Plan>| call(cx, x.shape(), kernel);
        match self {
            Op::Softmax(_) => like_x(&|s, y| softmax::softmax(s, &x, y)),
            Op::LogSoftmax(_) => like_x(&|s, y| softmax::log_softmax(s, &x, y)),
            Op::SoftmaxBackward(_) => like_x(&|s, dx| softmax::softmax_backward(s, &x, &operand("grad-output")?, dx)),
            Op::LogSoftmaxBackward(_) => {
                like_x(&|s, dx| softmax::log_softmax_backward(s, &x, &operand("grad-output")?, dx))
            }
            Op::ScaledMaskedSoftmax(args) => {
                like_x(&|s, y| softmax::scaled_masked_softmax(s, &x, &operand("mask")?, args.scale.scale, y))
            }
            Op::ScaledCausalSoftmax(args) => like_x(&|s, y| softmax::scaled_causal_softmax(s, &x, args.scale.scale, y)),
            Op::CrossEntropy(_) => {
                // One loss per row: all but the last dimension (a scalar is rejected by the op).
                let rows = x.shape().iter().rev().skip(1).product();
                call::<f32>(cx, &[rows], |s, loss| softmax::cross_entropy(s, &x, &target()?, loss))
            }
            Op::CrossEntropyBackward(_) => like_x(&|s, dx| {
                softmax::cross_entropy_backward(s, &x, &target()?, &cx.tensor::<f32>("grad-output")?, dx)
            }),
            Op::Logsumexp(_) => {
                // One value per row, of --input's shape without the last axis (a scalar is
                // rejected by the op).
                let rows = &x.shape()[..x.shape().len().saturating_sub(1)];
                call::<f32>(cx, rows, |s, out| softmax::logsumexp(s, &x, out))
            }
        }
    }
}

impl Forward {
    fn invocation(&self, name: &'static str) -> Invocation<'_> {
        Invocation::new(name, &self.io).dim(self.dim.dim)
    }
}

impl SoftmaxBackward {
    fn invocation(&self, name: &'static str) -> Invocation<'_> {
        Invocation::new(name, &self.io).file("grad-output", Holds::Float, &self.grad_output).dim(self.dim.dim)
    }
}

impl CrossEntropy {
    fn invocation(&self, name: &'static str) -> Invocation<'_> {
        // The kernels compute exactly these options, so there is nothing to pass on.
        let LossOptions { reduction: Reduction, ignore_index: IgnoreIndex } = self.loss;
        Invocation::new(name, &self.io).file("target", Holds::Indices, &self.target)
    }
}

/// Runs a call writing an output of `U` and `shape`, described by the dispatcher's plan.
fn call<U: NpyElement>(
    cx: &Context,
    shape: &[usize],
    kernel: impl FnOnce(&Stream, &mut Tensor<U>) -> rill::Result<Plan>,
) -> rill::Result<Ran> {
    cx.compute(shape, |stream, out| Ok(kernel(stream, out)?.describe()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops;
    use crate::testing::{self, Files, rejected, selected, usage};
    use clap::error::ErrorKind;

    fn op(args: &str) -> Op {
        let ops::Op::Softmax(op) = testing::op(args) else { panic!("`{args}` is not in the softmax family") };
        op
    }

    #[test]
    fn ops_are_named_as_in_pytorch() {
        let names = "softmax log_softmax softmax_backward log_softmax_backward scaled_masked_softmax \
                     scaled_causal_softmax cross_entropy cross_entropy_backward logsumexp";
        assert_eq!(testing::names::<Op>().join(" "), names);
    }

    #[test]
    fn parses_flags_with_a_space_or_an_equals_sign() {
        for args in
            ["run softmax --input x.npy --dim -1 --output y.npy", "run softmax --input=x.npy --dim=-1 --output=y.npy"]
        {
            let Op::Softmax(softmax) = op(args) else { panic!("{args}: not softmax") };
            assert_eq!(softmax.io.input, PathBuf::from("x.npy"));
            assert_eq!(softmax.io.output, PathBuf::from("y.npy"));
            assert_eq!(softmax.dim.dim, -1);
        }
        let Op::LogSoftmaxBackward(backward) =
            op("run log_softmax_backward --input y --grad-output dy --output dx --dim 2")
        else {
            panic!("not log_softmax_backward")
        };
        assert_eq!((backward.grad_output.to_str(), backward.dim.dim), (Some("dy"), 2));
    }

    #[test]
    fn options_select_the_kernel_and_files() {
        let Op::Softmax(softmax) = op("run softmax --input x --output y") else { panic!("not softmax") };
        assert_eq!(softmax.dim.dim, -1);
        let Op::ScaledMaskedSoftmax(masked) =
            op("run scaled_masked_softmax --input x --mask m --scale -1.25e-1 --output y")
        else {
            panic!("not scaled_masked_softmax")
        };
        assert_eq!(masked.scale.scale, -0.125);
        let Op::ScaledCausalSoftmax(causal) = op("run scaled_causal_softmax --input x --scale 0.5 --output y") else {
            panic!("not scaled_causal_softmax")
        };
        assert_eq!(causal.scale.scale, 0.5);
        let loss = "run cross_entropy --input x --target t --output y --reduction none --ignore-index -100";
        assert!(matches!(op(loss), Op::CrossEntropy(_)));
        let (files, extra) = selected("cross_entropy_backward --input x --target t --grad-output g");
        assert_eq!((files, extra), (vec!["input", "target", "grad-output"], vec![]));
        assert_eq!(selected("log_softmax_backward --input y --grad-output dy").0, ["input", "grad-output"]);
    }

    #[test]
    fn logsumexp_takes_the_last_axis_like_softmax() {
        let Op::Logsumexp(args) = op("run logsumexp --input x.npy --output y.npy") else { panic!("not logsumexp") };
        assert_eq!((args.io.input.to_str(), args.io.output.to_str(), args.dim.dim), (Some("x.npy"), Some("y.npy"), -1));
        let Op::Logsumexp(args) = op("run logsumexp --input=x --dim=2 --output=y --verbose") else { panic!() };
        assert_eq!(args.dim.dim, 2);
        assert_eq!(selected("logsumexp --input x").0, ["input"]);
        assert_eq!(rejected("run logsumexp --input x --output y --dim last"), ErrorKind::ValueValidation);
        assert_eq!(rejected("run logsumexp --input x --output y --target t"), ErrorKind::UnknownArgument);
        assert_eq!(rejected("run logsumexp --output y"), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn rejects_bad_arguments_with_exit_status_2() {
        assert_eq!(rejected("run scaled_causal_softmax --input x --output y"), ErrorKind::MissingRequiredArgument);
        assert_eq!(rejected("run softmax --input x --output y --dim last"), ErrorKind::ValueValidation);
        assert_eq!(rejected("run scaled_causal_softmax --input x --output y --scale nan"), ErrorKind::ValueValidation);
        // --scale takes "--output" as its value, so "y" is left over.
        assert_eq!(rejected("run scaled_causal_softmax --input x --scale --output y"), ErrorKind::UnknownArgument);
        // Unsupported values say what is supported.
        let message = |args: &str| testing::parse(args).map(|_| ()).unwrap_err().to_string();
        let loss = "run cross_entropy --input x --target t --output y";
        assert!(message(&format!("{loss} --reduction mean")).contains("only supported reduction is none"));
        assert!(message(&format!("{loss} --ignore-index 0")).contains("only --ignore-index -100"));
    }

    #[test]
    fn the_axis_must_be_the_last_one() {
        let files = Files::new("softmax-axis");
        let x = files.f32("x.npy", &[2, 4]);
        assert!(usage(files.failure(&format!("softmax --input {x} --dim 0"))).contains("dim 0"));
        assert!(usage(files.failure(&format!("logsumexp --input {x} --dim -2"))).contains("dim -2"));
    }
}
