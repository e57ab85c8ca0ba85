//! The elementwise ops: each output element from the inputs' elements at the same index (for
//! `bias_add_gelu`, the bias's element at the same column).

use crate::args::{Io, file};
use crate::run::{Context, Dtype, Holds, Invocation, NpyElement, Ran};
use clap::{Args, Subcommand, ValueEnum};
use half::f16;
use rill::{Stream, Tensor, elementwise};
use std::path::PathBuf;

/// The elementwise ops, named as in PyTorch.
#[derive(Subcommand, Debug)]
#[command(rename_all = "snake_case")]
pub enum Op {
    /// max(input, 0).
    Relu(Io),
    /// GELU, exact (erf) or with the tanh approximation.
    Gelu(Gelu),
    /// input * sigmoid(input).
    Silu(Io),
    /// 1 / (1 + exp(-input)).
    Sigmoid(Io),
    /// input + other.
    Add(Binary),
    /// input - other.
    Sub(Binary),
    /// input * other.
    Mul(Binary),
    /// input / other.
    Div(Binary),
    /// input + tensor1 * tensor2, rounded once (fused multiply-add).
    Addcmul(Addcmul),
    /// gelu(input + bias), bias of shape [last dimension of input].
    BiasAddGelu(BiasAddGelu),
    /// input converted to --dtype, rounding to nearest even (PyTorch's Tensor.to).
    ///
    /// Converting to the input's own dtype runs no kernel, as in PyTorch.
    To(To),
}

#[derive(Args, Debug)]
pub struct Gelu {
    #[command(flatten)]
    pub io: Io,
    /// none: exact, with erf; tanh: PyTorch's approximate='tanh'.
    #[arg(long, value_enum, default_value_t = Approximate::None)]
    pub approximate: Approximate,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Approximate {
    None,
    Tanh,
}

#[derive(Args, Debug)]
pub struct Binary {
    #[command(flatten)]
    pub io: Io,
    /// The second operand, of --input's shape and dtype.
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub other: PathBuf,
}

#[derive(Args, Debug)]
pub struct Addcmul {
    #[command(flatten)]
    pub io: Io,
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub tensor1: PathBuf,
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub tensor2: PathBuf,
}

#[derive(Args, Debug)]
pub struct BiasAddGelu {
    #[command(flatten)]
    pub io: Io,
    /// Added to every row: shape [last dimension of --input].
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub bias: PathBuf,
}

#[derive(Args, Debug)]
pub struct To {
    #[command(flatten)]
    pub io: Io,
    /// The dtype written (also accepted: float, half, torch.float32, torch.float16).
    #[arg(long, value_name = "float32|float16", value_parser = dtype)]
    pub dtype: Dtype,
}

impl Binary {
    fn invocation(&self, name: &'static str) -> Invocation<'_> {
        Invocation::new(name, &self.io).file("other", Holds::Float, &self.other)
    }
}

fn dtype(value: &str) -> Result<Dtype, String> {
    match value.strip_prefix("torch.").unwrap_or(value) {
        "float32" | "float" => Ok(Dtype::F32),
        "float16" | "half" => Ok(Dtype::F16),
        "bfloat16" => Err("bfloat16 has no .npy dtype, so `to` cannot write it; use float32 or float16".into()),
        _ => Err("must be float32 or float16".into()),
    }
}

impl Op {
    pub fn invocation(&self) -> Invocation<'_> {
        match self {
            Op::Relu(io) => Invocation::new("relu", io),
            Op::Gelu(args) => Invocation::new("gelu", &args.io),
            Op::Silu(io) => Invocation::new("silu", io),
            Op::Sigmoid(io) => Invocation::new("sigmoid", io),
            Op::Add(args) => args.invocation("add"),
            Op::Sub(args) => args.invocation("sub"),
            Op::Mul(args) => args.invocation("mul"),
            Op::Div(args) => args.invocation("div"),
            Op::Addcmul(args) => Invocation::new("addcmul", &args.io)
                .file("tensor1", Holds::Float, &args.tensor1)
                .file("tensor2", Holds::Float, &args.tensor2),
            Op::BiasAddGelu(args) => Invocation::new("bias_add_gelu", &args.io).file("bias", Holds::Float, &args.bias),
            Op::To(args) => Invocation::new("to", &args.io),
        }
    }

    pub fn execute<T: NpyElement>(&self, cx: &Context) -> rill::Result<Ran> {
        let x = cx.tensor::<T>("input")?;
        let operand = |flag| cx.tensor::<T>(flag);
        let kernel = |call: &dyn Fn(&Stream, &mut Tensor<T>) -> rill::Result<()>| {
            cx.compute(x.shape(), |stream, y| {
                call(stream, y).map(|()| "elementwise kernel (no dispatch choice)".into())
            })
        };
        match self {
            Op::Relu(_) => kernel(&|s, y| elementwise::relu(s, &x, y)),
            Op::Gelu(Gelu { approximate: Approximate::None, .. }) => kernel(&|s, y| elementwise::gelu(s, &x, y)),
            Op::Gelu(Gelu { approximate: Approximate::Tanh, .. }) => kernel(&|s, y| elementwise::gelu_tanh(s, &x, y)),
            Op::Silu(_) => kernel(&|s, y| elementwise::silu(s, &x, y)),
            Op::Sigmoid(_) => kernel(&|s, y| elementwise::sigmoid(s, &x, y)),
            Op::Add(_) => kernel(&|s, y| elementwise::add(s, &x, &operand("other")?, y)),
            Op::Sub(_) => kernel(&|s, y| elementwise::sub(s, &x, &operand("other")?, y)),
            Op::Mul(_) => kernel(&|s, y| elementwise::mul(s, &x, &operand("other")?, y)),
            Op::Div(_) => kernel(&|s, y| elementwise::div(s, &x, &operand("other")?, y)),
            // addcmul(input, tensor1, tensor2) = tensor1 * tensor2 + input.
            Op::Addcmul(_) => kernel(&|s, y| elementwise::fma(s, &operand("tensor1")?, &operand("tensor2")?, &x, y)),
            Op::BiasAddGelu(_) => kernel(&|s, y| elementwise::bias_add_gelu(s, &x, &operand("bias")?, y)),
            Op::To(To { dtype: Dtype::F32, .. }) => convert::<T, f32>(cx, &x),
            Op::To(To { dtype: Dtype::F16, .. }) => convert::<T, f16>(cx, &x),
        }
    }
}

/// `x` converted to `O`; like PyTorch's `Tensor.to`, converting to its own dtype is a no-op.
fn convert<I: NpyElement, O: NpyElement>(cx: &Context, x: &Tensor<I>) -> rill::Result<Ran> {
    if I::DTYPE == O::DTYPE {
        let how = format!("no kernel: the input is already {}", I::DTYPE.name());
        return Ok(Ran { shape: x.shape().to_vec(), data: I::wrap(x.to_vec()?), how, extra: Vec::new() });
    }
    cx.compute(x.shape(), |stream, y| {
        elementwise::cast::<I, O>(stream, x, y).map(|()| "elementwise cast kernel (no dispatch choice)".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops;
    use crate::testing::{self, rejected, selected};
    use clap::error::ErrorKind;

    fn op(args: &str) -> Op {
        let ops::Op::Elementwise(op) = testing::op(args) else { panic!("`{args}` is not elementwise") };
        op
    }

    #[test]
    fn ops_are_named_as_in_pytorch() {
        let names = "relu gelu silu sigmoid add sub mul div addcmul bias_add_gelu to";
        assert_eq!(testing::names::<Op>().join(" "), names);
    }

    #[test]
    fn options_select_the_kernel_and_files() {
        let Op::Gelu(gelu) = op("run gelu --input x --output y") else { panic!("not gelu") };
        assert_eq!(gelu.approximate, Approximate::None);
        let Op::Gelu(gelu) = op("run gelu --input x --output y --approximate tanh") else { panic!("not gelu") };
        assert_eq!(gelu.approximate, Approximate::Tanh);
        let Op::To(to) = op("run to --input x --output y --dtype torch.float16") else { panic!("not to") };
        assert_eq!(to.dtype, Dtype::F16);
        let Op::To(to) = op("run to --input x --output y --dtype float") else { panic!("not to") };
        assert_eq!(to.dtype, Dtype::F32);
        let Op::To(to) = op("run to --input x --output y --dtype half") else { panic!("not to") };
        assert_eq!(to.dtype, Dtype::F16);
        assert_eq!(selected("addcmul --input c --tensor1 a --tensor2 b").0, ["input", "tensor1", "tensor2"]);
    }

    #[test]
    fn rejects_bad_arguments_with_exit_status_2() {
        assert_eq!(rejected("run add --input x --output y"), ErrorKind::MissingRequiredArgument);
        assert_eq!(rejected("run gelu --input x --output y --approximate fast"), ErrorKind::InvalidValue);
        assert_eq!(rejected("run to --input x --output y"), ErrorKind::MissingRequiredArgument);
        assert_eq!(rejected("run to --input x --output y --dtype int8"), ErrorKind::ValueValidation);
        let message = testing::parse("run to --input x --output y --dtype bfloat16").unwrap_err().to_string();
        assert!(message.contains("bfloat16 has no .npy dtype"));
    }
}
