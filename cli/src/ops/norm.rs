//! The norms over the last axis, forward (with or without a residual added first) and
//! backward.

use super::{Extra, eps, extra_output, with};
use crate::args::{Io, file};
use crate::run::{Context, Failure, Holds, Invocation, NpyElement, Ran};
use clap::{Args, Subcommand};
use half::f16;
use rill::Tensor;
use rill::norm::{Backward, Forward, Norm, NormKind, Plan};
use std::path::PathBuf;

/// The norms, named as in PyTorch.
#[derive(Subcommand, Debug)]
#[command(rename_all = "snake_case")]
pub enum Op {
    /// (input - mean) * rstd * weight + bias over the last axis.
    LayerNorm(LayerNorm),
    /// input * rstd * weight over the last axis, rstd = 1 / sqrt(mean(input^2) + eps).
    RmsNorm(RmsNorm),
    /// layer_norm(input + residual), also writing the sum (--output-sum).
    AddLayerNorm(AddNorm<LayerNorm>),
    /// rms_norm(input + residual), also writing the sum (--output-sum).
    AddRmsNorm(AddNorm<RmsNorm>),
    /// Gradient of layer_norm wrt input (and weight, bias) from the forward's input and statistics.
    ///
    /// Takes the forward's --input (for add_layer_norm, its --output-sum) and --weight.
    LayerNormBackward(LayerNormBackward),
    /// Gradient of rms_norm wrt input (and weight) from the forward's input and rstd.
    ///
    /// Takes the forward's --input (for add_rms_norm, its --output-sum) and --weight.
    RmsNormBackward(RmsNormBackward),
}

/// What every norm, forward and backward, takes besides its files.
#[derive(Args, Debug)]
pub struct NormCommon {
    #[command(flatten)]
    pub io: Io,
    /// The normalized shape: N or [N], N being --input's last dimension, the only axis normalized.
    #[arg(long, value_name = "N", value_parser = normalized_shape)]
    pub normalized_shape: Option<NormalizedShape>,
    /// The weight: [N], float32 or --input's dtype (a bias, if any, the same).
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub weight: Option<PathBuf>,
}

/// `--normalized-shape` as given, and the sizes it lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NormalizedShape {
    pub text: String,
    pub dims: Vec<usize>,
}

#[derive(Args, Debug)]
pub struct LayerNorm {
    #[command(flatten)]
    pub common: NormCommon,
    /// The bias: [N], float32 or --input's dtype (a weight, if any, the same).
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub bias: Option<PathBuf>,
    /// Added to the variance.
    // Hyphen values so that a negative eps reaches its check (see the softmax family's Scale).
    #[arg(long, default_value = "1e-5", value_parser = eps, allow_hyphen_values = true)]
    pub eps: f32,
    /// Writes the per-row mean: float32, --input's shape with the last dimension 1.
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub output_mean: Option<PathBuf>,
    #[command(flatten)]
    pub rstd: OutputRstd,
}

#[derive(Args, Debug)]
pub struct RmsNorm {
    #[command(flatten)]
    pub common: NormCommon,
    /// Added to the mean square (PyTorch's rms_norm defaults to the dtype's epsilon: pass it to
    /// match).
    // Hyphen values so that a negative eps reaches its check (see the softmax family's Scale).
    #[arg(long, default_value = "1e-6", value_parser = eps, allow_hyphen_values = true)]
    pub eps: f32,
    #[command(flatten)]
    pub rstd: OutputRstd,
}

#[derive(Args, Debug)]
pub struct OutputRstd {
    /// Writes the per-row reciprocal standard deviation: float32, --input's shape with the last
    /// dimension 1 (as torch.native_layer_norm).
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub output_rstd: Option<PathBuf>,
}

/// A norm of input + residual.
#[derive(Args, Debug)]
pub struct AddNorm<N: Args> {
    #[command(flatten)]
    pub norm: N,
    /// Added to --input before the norm; of --input's shape and dtype.
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub residual: PathBuf,
    /// Writes input + residual, which the backward takes as its --input.
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub output_sum: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct NormBackward {
    #[command(flatten)]
    pub common: NormCommon,
    /// The gradient of the forward's output, of --input's shape and dtype.
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub grad_output: PathBuf,
    /// The forward's --output-rstd: float32, one value per row (any shape).
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub rstd: PathBuf,
    /// Writes the weight's gradient: [N] in the weight's dtype.
    #[arg(long, value_name = "FILE", value_parser = file, requires = "weight")]
    pub grad_weight: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct LayerNormBackward {
    #[command(flatten)]
    pub backward: NormBackward,
    /// The forward's --output-mean: float32, one value per row (any shape).
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub mean: PathBuf,
    /// Writes the bias's gradient: [N] in the weight's dtype (float32 without --weight).
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub grad_bias: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct RmsNormBackward {
    #[command(flatten)]
    pub backward: NormBackward,
}

/// Sizes written `N`, `[N]`, `(N,)` or as a list; whether they fit the input is checked once
/// it is read.
fn normalized_shape(value: &str) -> Result<NormalizedShape, String> {
    let dims = value.trim_matches(|c| matches!(c, '[' | ']' | '(' | ')')).split(',').map(str::trim);
    match dims.filter(|d| !d.is_empty()).map(str::parse).collect::<Result<Vec<usize>, _>>() {
        Ok(dims) => Ok(NormalizedShape { text: value.to_string(), dims }),
        Err(_) => Err("must be a list of sizes like 4096 or [4096]".into()),
    }
}

impl NormalizedShape {
    /// Checks that these are the last dimension of `shape`: the norms normalize the last axis
    /// only.
    pub fn check(&self, op: &str, shape: &[usize]) -> Result<(), Failure> {
        match (self.dims.as_slice(), shape.last()) {
            ([n], Some(last)) if n == last => Ok(()),
            (_, Some(last)) => Err(Failure::Usage(format!(
                "--normalized-shape {} does not fit --input of shape {shape:?}: rill normalizes the last axis \
                 only, so it must be [{last}]",
                self.text
            ))),
            (_, None) => Err(Failure::Usage(format!("{op} needs an --input of at least one dimension"))),
        }
    }
}

impl NormCommon {
    fn invocation(&self, name: &'static str) -> Invocation<'_> {
        Invocation::new(name, &self.io)
            .optional_file("weight", Holds::Param, &self.weight)
            .normalized_shape(self.normalized_shape.as_ref())
    }
}

/// A norm forward's own options, which the residual-add variant shares.
pub trait NormForward {
    fn invocation(&self, name: &'static str) -> Invocation<'_>;
}

impl NormForward for LayerNorm {
    fn invocation(&self, name: &'static str) -> Invocation<'_> {
        self.common
            .invocation(name)
            .optional_file("bias", Holds::Param, &self.bias)
            .extra_output("output-mean", &self.output_mean)
            .extra_output("output-rstd", &self.rstd.output_rstd)
    }
}

impl NormForward for RmsNorm {
    fn invocation(&self, name: &'static str) -> Invocation<'_> {
        self.common.invocation(name).extra_output("output-rstd", &self.rstd.output_rstd)
    }
}

impl<N: Args + NormForward> AddNorm<N> {
    fn invocation(&self, name: &'static str) -> Invocation<'_> {
        self.norm
            .invocation(name)
            .file("residual", Holds::Float, &self.residual)
            .extra_output("output-sum", &self.output_sum)
    }
}

impl NormBackward {
    fn invocation(&self, name: &'static str) -> Invocation<'_> {
        self.common
            .invocation(name)
            .file("grad-output", Holds::Float, &self.grad_output)
            .file("rstd", Holds::Float32, &self.rstd)
            .extra_output("grad-weight", &self.grad_weight)
    }
}

impl Op {
    pub fn invocation(&self) -> Invocation<'_> {
        match self {
            Op::LayerNorm(args) => args.invocation("layer_norm"),
            Op::RmsNorm(args) => args.invocation("rms_norm"),
            Op::AddLayerNorm(args) => args.invocation("add_layer_norm"),
            Op::AddRmsNorm(args) => args.invocation("add_rms_norm"),
            Op::LayerNormBackward(args) => args
                .backward
                .invocation("layer_norm_backward")
                .file("mean", Holds::Float32, &args.mean)
                .extra_output("grad-bias", &args.grad_bias),
            Op::RmsNormBackward(args) => args.backward.invocation("rms_norm_backward"),
        }
    }

    pub fn execute<T: NpyElement>(&self, cx: &Context) -> rill::Result<Ran> {
        // The weight and bias are float32 or T (checked), so f16 ones mean T is f16.
        if cx.is_f16("weight") || cx.is_f16("bias") {
            self.execute_with::<T, f16>(cx)
        } else {
            self.execute_with::<T, f32>(cx)
        }
    }

    /// Runs the norm on input `T` with weight and bias `G` (float32 or `T`; the weight's
    /// gradients are `G` too, float32 without a weight).
    fn execute_with<T: NpyElement, G: NpyElement>(&self, cx: &Context) -> rill::Result<Ran> {
        let x = cx.tensor::<T>("input")?;
        let weight = cx.optional::<G>("weight")?;
        let weight_note = if weight.is_some() { format!("; weight {}", G::DTYPE.name()) } else { String::new() };
        let mut extra = Vec::new();
        let (plan, y) = match self {
            Op::LayerNorm(LayerNorm { eps, .. }) | Op::AddLayerNorm(AddNorm { norm: LayerNorm { eps, .. }, .. }) => {
                forward(cx, NormKind::LayerNorm, *eps, &x, weight, &mut extra)?
            }
            Op::RmsNorm(RmsNorm { eps, .. }) | Op::AddRmsNorm(AddNorm { norm: RmsNorm { eps, .. }, .. }) => {
                forward(cx, NormKind::RmsNorm, *eps, &x, weight, &mut extra)?
            }
            Op::LayerNormBackward(_) => backward(cx, NormKind::LayerNorm, &x, weight, &mut extra)?,
            Op::RmsNormBackward(_) => backward(cx, NormKind::RmsNorm, &x, weight, &mut extra)?,
        };
        let params = if cx.wants("grad-weight") || cx.wants("grad-bias") {
            "; then the weight/bias gradients: two-stage column sums"
        } else {
            ""
        };
        Ok(Ran {
            shape: x.shape().to_vec(),
            data: T::wrap(y.to_vec()?),
            how: format!("{}{weight_note}{params}", plan.describe()),
            extra,
        })
    }
}

/// A norm forward of `x` (plus `--residual` if given), also writing the statistics and sum
/// asked for to `extra`.
fn forward<T: NpyElement, G: NpyElement>(
    cx: &Context,
    kind: NormKind,
    eps: f32,
    x: &Tensor<T>,
    weight: Option<Tensor<G>>,
    extra: &mut Vec<Extra>,
) -> rill::Result<(Plan, Tensor<T>)> {
    let shape = x.shape();
    let cols = shape.last().copied().unwrap_or(1);
    // One statistic per row, shaped as PyTorch's native_layer_norm writes them: [..., 1].
    let stats_shape = [shape.split_last().map_or(&[][..], |(_, outer)| outer), &[1]].concat();
    let bias = cx.optional::<G>("bias")?;
    // PyTorch takes a bias without a weight; the library's bias follows a weight.
    let weight = match (weight, &bias) {
        (None, Some(_)) => Some(Tensor::from_slice(cx.gpu, &vec![G::ONE; cols], &[cols])?),
        (weight, _) => weight,
    };
    let residual = cx.optional::<T>("residual")?;
    let mut sum = residual.as_ref().map(|_| Tensor::<T>::zeros(cx.gpu, shape)).transpose()?;
    let stats = |flag| cx.wants(flag).then(|| Tensor::<f32>::zeros(cx.gpu, &stats_shape)).transpose();
    let (mut mean, mut rstd) = (stats("output-mean")?, stats("output-rstd")?);
    let mut y = Tensor::<T>::zeros(cx.gpu, shape)?;
    let call = with(Forward::new(x, &mut y), residual.as_ref().zip(sum.as_mut()), |call, (r, s)| call.residual(r, s));
    let call = with(call, mean.as_mut(), |call, mean| call.save_mean(mean));
    let call = with(call, rstd.as_mut(), |call, rstd| call.save_rstd(rstd));
    let (norm, stream) = (Norm::new(), &cx.stream);
    let plan = match (&weight, &bias) {
        (Some(weight), Some(bias)) => norm.forward(stream, kind, eps, call.weight(weight).bias(bias))?,
        (Some(weight), None) => norm.forward(stream, kind, eps, call.weight(weight))?,
        (None, _) => norm.forward(stream, kind, eps, call)?,
    };
    stream.synchronize()?;
    extra.extend(extra_output("output-sum", sum.filter(|_| cx.wants("output-sum")))?);
    extra.extend(extra_output("output-mean", mean)?);
    extra.extend(extra_output("output-rstd", rstd)?);
    Ok((plan, y))
}

/// A norm backward from the forward's input `x` and statistics, also writing the parameter
/// gradients asked for to `extra`.
fn backward<T: NpyElement, G: NpyElement>(
    cx: &Context,
    kind: NormKind,
    x: &Tensor<T>,
    weight: Option<Tensor<G>>,
    extra: &mut Vec<Extra>,
) -> rill::Result<(Plan, Tensor<T>)> {
    let cols = x.shape().last().copied().unwrap_or(1);
    let dy = cx.tensor::<T>("grad-output")?;
    let mean = cx.optional::<f32>("mean")?;
    let rstd = cx.tensor::<f32>("rstd")?;
    let mut dx = Tensor::<T>::zeros(cx.gpu, x.shape())?;
    let call = with(Backward::new(x, &dy, &rstd, &mut dx), mean.as_ref(), |call, mean| call.mean(mean));
    let plan = match &weight {
        Some(weight) => with_grads::<T, G>(cx, kind, call, Some(weight), cols, extra)?,
        // No weight: clap refused its gradient, and dbias is float32.
        None => with_grads::<T, f32>(cx, kind, call, None, cols, extra)?,
    };
    Ok((plan, dx))
}

/// Runs a backward `call` with `weight`, computing the parameter gradients asked for, of the
/// weight's dtype `W`, and writes them to `extra`.
fn with_grads<'a, T: NpyElement, W: NpyElement>(
    cx: &Context,
    kind: NormKind,
    call: Backward<'a, T>,
    weight: Option<&'a Tensor<W>>,
    cols: usize,
    extra: &mut Vec<Extra>,
) -> rill::Result<Plan> {
    let grad = |wanted: bool| wanted.then(|| Tensor::<W>::zeros(cx.gpu, &[cols])).transpose();
    // The weight's gradient is computed whenever the bias's is: the library's dbias-only call
    // faults on the GPU (its column-sum kernel writes dweight unconditionally), so dweight is
    // kept in scratch when not asked for.
    let (mut dweight, mut dbias) =
        (grad(cx.wants("grad-weight") || cx.wants("grad-bias"))?, grad(cx.wants("grad-bias"))?);
    let norm = Norm::new();
    // The first parameter part given fixes the builder's dtype; the rest are set after it.
    let plan = match (&mut dweight, weight) {
        (Some(dw), weight) => {
            let call = with(call.dweight(dw), weight, |call, weight| call.weight(weight));
            norm.backward(&cx.stream, kind, with(call, dbias.as_mut(), |call, db| call.dbias(db)))?
        }
        (None, Some(weight)) => norm.backward(&cx.stream, kind, call.weight(weight))?,
        (None, None) => norm.backward(&cx.stream, kind, call)?,
    };
    cx.stream.synchronize()?;
    extra.extend(extra_output("grad-weight", dweight.filter(|_| cx.wants("grad-weight")))?);
    extra.extend(extra_output("grad-bias", dbias)?);
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops;
    use crate::testing::{self, Files, rejected, runtime, selected, usage};
    use clap::error::ErrorKind;

    fn op(args: &str) -> Op {
        let ops::Op::Norm(op) = testing::op(args) else { panic!("`{args}` is not a norm") };
        op
    }

    #[test]
    fn ops_are_named_as_in_pytorch() {
        let names = "layer_norm rms_norm add_layer_norm add_rms_norm layer_norm_backward rms_norm_backward";
        assert_eq!(testing::names::<Op>().join(" "), names);
    }

    #[test]
    fn options_select_the_kernel_and_files() {
        let Op::LayerNorm(norm) = op("run layer_norm --input x --output y") else { panic!("not layer_norm") };
        assert_eq!((norm.eps, norm.common.weight, norm.bias), (1e-5, None, None));
        let Op::AddRmsNorm(norm) = op("run add_rms_norm --input x --residual h --output y") else { panic!() };
        assert_eq!((norm.norm.eps, norm.residual.to_str()), (1e-6, Some("h")));
        let Op::RmsNorm(norm) = op("run rms_norm --input x --output y --normalized-shape [4096] --eps 0") else {
            panic!("not rms_norm")
        };
        assert_eq!((norm.common.normalized_shape.map(|shape| shape.dims), norm.eps), (Some(vec![4096]), 0.0));
        let (files, extra) = selected("add_layer_norm --input x --residual h --bias b --output-sum s --output-rstd r");
        assert_eq!((files, extra), (vec!["input", "bias", "residual"], vec!["output-rstd", "output-sum"]));
        assert_eq!(selected("rms_norm --input x --eps 1e-3 --output-rstd r").1, ["output-rstd"]);
        let Op::AddLayerNorm(norm) = op("run add_layer_norm --input x --residual h --output y") else { panic!() };
        assert_eq!(norm.norm.eps, 1e-5);
        let Op::LayerNormBackward(backward) = op(
            "run layer_norm_backward --input x --grad-output dy --mean m --rstd r --weight w --output dx --grad-weight dw",
        ) else {
            panic!("not layer_norm_backward")
        };
        assert_eq!(backward.backward.grad_weight, Some(PathBuf::from("dw")));
        let (files, extra) =
            selected("layer_norm_backward --input x --grad-output g --mean m --rstd r --weight w --grad-bias db");
        assert_eq!((files, extra), (vec!["input", "weight", "grad-output", "rstd", "mean"], vec!["grad-bias"]));
    }

    #[test]
    fn rejects_bad_arguments_with_exit_status_2() {
        assert_eq!(rejected("run layer_norm --input x --output y --eps -1e-5"), ErrorKind::ValueValidation);
        assert_eq!(rejected("run layer_norm --input x --output y --normalized-shape 4x4"), ErrorKind::ValueValidation);
        assert_eq!(rejected("run rms_norm --input x --output y --bias b"), ErrorKind::UnknownArgument);
        let backward = "run rms_norm_backward --input x --grad-output dy --rstd r --output dx";
        assert_eq!(rejected(&format!("{backward} --grad-weight dw")), ErrorKind::MissingRequiredArgument);
        assert_eq!(rejected(&format!("{backward} --grad-bias db")), ErrorKind::UnknownArgument);
    }

    #[test]
    fn normalized_shape_takes_numpy_and_python_spellings() {
        for (text, dims) in
            [("4096", vec![4096]), ("[4096]", vec![4096]), ("(4096,)", vec![4096]), ("[2, 3]", vec![2, 3])]
        {
            assert_eq!(normalized_shape(text), Ok(NormalizedShape { text: text.into(), dims }));
        }
        assert!(normalized_shape("-1").is_err());
    }

    #[test]
    fn the_axis_must_be_the_last_one() {
        let files = Files::new("norm-axis");
        let x = files.f32("x.npy", &[2, 4]);
        let message = usage(files.failure(&format!("layer_norm --input {x} --normalized-shape [3]")));
        assert!(message.contains("[3]") && message.contains("must be [4]"), "{message}");
        let message = usage(files.failure(&format!("rms_norm --input {x} --normalized-shape 2,4")));
        assert!(message.contains("must be [4]"), "{message}");
    }

    #[test]
    fn parameters_are_float32_or_the_input_dtype() {
        let files = Files::new("params");
        let (x, x16) = (files.f32("x.npy", &[2, 4]), files.f16("x16.npy", &[2, 4]));
        let (w, w16) = (files.f32("w.npy", &[4]), files.f16("w16.npy", &[4]));
        let message = runtime(files.failure(&format!("layer_norm --input {x} --weight {w16}")));
        assert!(message.contains("--weight") && message.contains("float32 or --input's dtype"), "{message}");
        let message = runtime(files.failure(&format!("layer_norm --input {x16} --weight {w} --bias {w16}")));
        assert!(message.contains("same dtype"), "{message}");
    }
}
