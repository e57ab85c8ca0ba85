//! The command line: `rill run <op>` with one subcommand per op, whose flags are named after
//! the op's arguments in PyTorch (`torch.add(input, other)`, `addcmul(input, tensor1, tensor2)`,
//! `gelu(input, approximate)`, `Tensor.to(dtype)`, `softmax(input, dim)`,
//! `cross_entropy(input, target, reduction, ignore_index)`,
//! `layer_norm(input, normalized_shape, weight, bias, eps)`, `grad_output` for backward ops).
//! Values are checked here as far as they can be without reading the files.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// What `rill run --help` adds after the ops, wrapped by hand (clap wraps only with a terminal
/// size crate).
const RUN_NOTES: &str = "\
Float inputs must all be float32 or all float16 ('<f4' or '<f2' .npy files); the output has
the shape and dtype of --input, except that `to` writes --dtype and `cross_entropy` writes
float32 losses of shape [rows], rows being the product of all but the last dimension of
--input. bfloat16 cannot be stored in a .npy file, so it is not offered.";

/// Runs one rill op on the GPU on NumPy .npy files.
///
/// Exit status: 0 on success, 1 when the op or the device fails, 2 for bad arguments.
#[derive(Parser, Debug)]
#[command(name = "rill", subcommand_required = true, arg_required_else_help = true)]
pub struct Cli {
    /// Prints the implementation chosen (for the softmax family, the dispatcher's plan) to
    /// stderr.
    #[arg(long, global = true, display_order = 101)]
    pub verbose: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Runs one op: reads its input files, writes --output.
    #[command(
        subcommand_required = true,
        arg_required_else_help = true,
        subcommand_value_name = "OP",
        subcommand_help_heading = "Ops",
        after_help = RUN_NOTES
    )]
    Run {
        #[command(subcommand)]
        op: Box<Op>,
    },
    /// Prints the GPU rill would use.
    Devices,
}

/// The ops, named as in PyTorch.
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
    /// Softmax over the last axis.
    Softmax(Softmax),
    /// Log-softmax over the last axis.
    LogSoftmax(Softmax),
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
    /// PyTorch's cross_entropy with reduction='none' and ignore_index=-100: rows whose target is
    /// -100 have loss 0.
    CrossEntropy(CrossEntropy),
    /// Gradient of cross_entropy wrt input, from the loss gradient.
    ///
    /// Writes a gradient of --input's shape and dtype; rows whose target is -100 get 0.
    CrossEntropyBackward(CrossEntropyBackward),
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

/// `--input`, which every op reads, and `--output`, which every op writes.
#[derive(Args, Debug)]
pub struct Io {
    /// The input array: float32 or float16.
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub input: PathBuf,
    /// The file written: the result, or for a backward op the gradient of --input.
    #[arg(long, value_name = "FILE", value_parser = file, display_order = 100)]
    pub output: PathBuf,
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

/// A float dtype a `.npy` file can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
}

/// `--dim`, which the softmax family takes as PyTorch does, though only the last axis is
/// normalized.
#[derive(Args, Debug)]
pub struct Dim {
    /// The axis normalized: it must be the last (-1 or ndim - 1).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub dim: i64,
}

#[derive(Args, Debug)]
pub struct Softmax {
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
    // Hyphen values so that a negative eps reaches its check (see Scale).
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
    // Hyphen values so that a negative eps reaches its check (see Scale).
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

/// A file name: an empty one is a mistake (an unset shell variable), not a file.
fn file(value: &str) -> Result<PathBuf, String> {
    if value.is_empty() { Err("needs a non-empty file name".into()) } else { Ok(PathBuf::from(value)) }
}

fn dtype(value: &str) -> Result<Dtype, String> {
    match value.strip_prefix("torch.").unwrap_or(value) {
        "float32" | "float" => Ok(Dtype::F32),
        "float16" | "half" => Ok(Dtype::F16),
        "bfloat16" => Err("bfloat16 has no .npy dtype, so `to` cannot write it; use float32 or float16".into()),
        _ => Err("must be float32 or float16".into()),
    }
}

fn finite(value: &str) -> Result<f32, String> {
    match value.parse::<f32>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => Err("must be a finite number".into()),
    }
}

fn eps(value: &str) -> Result<f32, String> {
    match value.parse::<f32>() {
        Ok(eps) if eps.is_finite() && eps >= 0.0 => Ok(eps),
        _ => Err("must be a finite number >= 0".into()),
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

/// Sizes written `N`, `[N]`, `(N,)` or as a list; whether they fit the input is checked once
/// it is read.
fn normalized_shape(value: &str) -> Result<NormalizedShape, String> {
    let dims = value.trim_matches(|c| matches!(c, '[' | ']' | '(' | ')')).split(',').map(str::trim);
    match dims.filter(|d| !d.is_empty()).map(str::parse).collect::<Result<Vec<usize>, _>>() {
        Ok(dims) => Ok(NormalizedShape { text: value.to_string(), dims }),
        Err(_) => Err("must be a list of sizes like 4096 or [4096]".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    fn parse(args: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("rill").chain(args.split_whitespace()))
    }

    fn op(args: &str) -> Op {
        match parse(args) {
            Ok(Cli { command: Command::Run { op }, .. }) => *op,
            other => panic!("`{args}` did not parse as an op: {other:?}"),
        }
    }

    /// The kind of error `args` gives, after checking that it exits 2 as bad arguments must.
    fn rejected(args: &str) -> ErrorKind {
        match parse(args) {
            Ok(cli) => panic!("`{args}` was accepted: {cli:?}"),
            Err(err) => {
                assert_eq!(err.exit_code(), 2, "`{args}`: {err}");
                err.kind()
            }
        }
    }

    #[test]
    fn the_command_is_well_formed() {
        Cli::command().debug_assert();
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
    fn defaults_follow_pytorch() {
        let Op::Gelu(gelu) = op("run gelu --input x --output y") else { panic!("not gelu") };
        assert_eq!(gelu.approximate, Approximate::None);
        let Op::Gelu(gelu) = op("run gelu --input x --output y --approximate tanh") else { panic!("not gelu") };
        assert_eq!(gelu.approximate, Approximate::Tanh);
        let Op::Softmax(softmax) = op("run softmax --input x --output y") else { panic!("not softmax") };
        assert_eq!(softmax.dim.dim, -1);
        let Op::LayerNorm(norm) = op("run layer_norm --input x --output y") else { panic!("not layer_norm") };
        assert_eq!((norm.eps, norm.common.weight, norm.bias), (1e-5, None, None));
        let Op::AddRmsNorm(norm) = op("run add_rms_norm --input x --residual h --output y") else { panic!() };
        assert_eq!((norm.norm.eps, norm.residual.to_str()), (1e-6, Some("h")));
    }

    #[test]
    fn parses_values() {
        let Op::To(to) = op("run to --input x --output y --dtype torch.float16") else { panic!("not to") };
        assert_eq!(to.dtype, Dtype::F16);
        let Op::To(to) = op("run to --input x --output y --dtype float") else { panic!("not to") };
        assert_eq!(to.dtype, Dtype::F32);
        let Op::ScaledMaskedSoftmax(masked) =
            op("run scaled_masked_softmax --input x --mask m --scale -1.25e-1 --output y")
        else {
            panic!("not scaled_masked_softmax")
        };
        assert_eq!(masked.scale.scale, -0.125);
        let Op::RmsNorm(norm) = op("run rms_norm --input x --output y --normalized-shape [4096] --eps 0") else {
            panic!("not rms_norm")
        };
        assert_eq!(norm.common.normalized_shape.map(|shape| shape.dims), Some(vec![4096]));
        assert_eq!(norm.eps, 0.0);
        let Op::CrossEntropy(_) =
            op("run cross_entropy --input x --target t --output y --reduction none --ignore-index -100")
        else {
            panic!("not cross_entropy")
        };
        let Op::LayerNormBackward(backward) = op(
            "run layer_norm_backward --input x --grad-output dy --mean m --rstd r --weight w --output dx --grad-weight dw",
        ) else {
            panic!("not layer_norm_backward")
        };
        assert_eq!(backward.backward.grad_weight, Some(PathBuf::from("dw")));
    }

    #[test]
    fn verbose_may_come_anywhere() {
        for args in [
            "--verbose run relu --input x --output y",
            "run --verbose relu --input x --output y",
            "run relu --input x --verbose --output y",
            "run relu --input x --output y --verbose",
        ] {
            assert!(parse(args).is_ok_and(|cli| cli.verbose), "{args}");
        }
        assert!(parse("run relu --input x --output y").is_ok_and(|cli| !cli.verbose));
        assert!(matches!(parse("devices --verbose"), Ok(Cli { command: Command::Devices, verbose: true })));
    }

    #[test]
    fn rejects_bad_arguments_with_exit_status_2() {
        assert_eq!(rejected(""), ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand);
        assert_eq!(rejected("run"), ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand);
        assert_eq!(rejected("frobnicate"), ErrorKind::InvalidSubcommand);
        assert_eq!(rejected("run fma --input x --output y"), ErrorKind::InvalidSubcommand);
        assert_eq!(rejected("devices now"), ErrorKind::UnknownArgument);
        assert_eq!(rejected("run relu --input x"), ErrorKind::MissingRequiredArgument);
        assert_eq!(rejected("run add --input x --output y"), ErrorKind::MissingRequiredArgument);
        assert_eq!(rejected("run scaled_causal_softmax --input x --output y"), ErrorKind::MissingRequiredArgument);
        assert_eq!(rejected("run relu --input x --output y --dim -1"), ErrorKind::UnknownArgument);
        assert_eq!(rejected("run relu --input x --output y stray"), ErrorKind::UnknownArgument);
        assert_eq!(rejected("run relu --input x --input z --output y"), ErrorKind::ArgumentConflict);
        assert_eq!(rejected("run relu --input --output y"), ErrorKind::InvalidValue);
        assert_eq!(rejected("run relu --input= --output y"), ErrorKind::ValueValidation);
        assert_eq!(rejected("run softmax --input x --output y --dim last"), ErrorKind::ValueValidation);
        assert_eq!(rejected("run gelu --input x --output y --approximate fast"), ErrorKind::InvalidValue);
        assert_eq!(rejected("run to --input x --output y"), ErrorKind::MissingRequiredArgument);
        assert_eq!(rejected("run to --input x --output y --dtype int8"), ErrorKind::ValueValidation);
        assert_eq!(rejected("run scaled_causal_softmax --input x --output y --scale nan"), ErrorKind::ValueValidation);
        // --scale takes "--output" as its value, so "y" is left over.
        assert_eq!(rejected("run scaled_causal_softmax --input x --scale --output y"), ErrorKind::UnknownArgument);
        assert_eq!(rejected("run layer_norm --input x --output y --eps -1e-5"), ErrorKind::ValueValidation);
        assert_eq!(rejected("run layer_norm --input x --output y --normalized-shape 4x4"), ErrorKind::ValueValidation);
        assert_eq!(rejected("run rms_norm --input x --output y --bias b"), ErrorKind::UnknownArgument);
        let backward = "run rms_norm_backward --input x --grad-output dy --rstd r --output dx";
        assert_eq!(rejected(&format!("{backward} --grad-weight dw")), ErrorKind::MissingRequiredArgument);
        assert_eq!(rejected(&format!("{backward} --grad-bias db")), ErrorKind::UnknownArgument);
    }

    #[test]
    fn unsupported_values_say_what_is_supported() {
        let message = |args: &str| parse(args).map(|_| ()).unwrap_err().to_string();
        let loss = "run cross_entropy --input x --target t --output y";
        assert!(message(&format!("{loss} --reduction mean")).contains("only supported reduction is none"));
        assert!(message(&format!("{loss} --ignore-index 0")).contains("only --ignore-index -100"));
        assert!(message("run to --input x --output y --dtype bfloat16").contains("bfloat16 has no .npy dtype"));
    }

    #[test]
    fn help_exits_0() {
        for args in
            ["--help", "help", "run --help", "run softmax --help", "help run layer_norm", "run cross_entropy -h"]
        {
            let err = parse(args).map(|_| ()).unwrap_err();
            assert_eq!((err.kind(), err.exit_code()), (ErrorKind::DisplayHelp, 0), "{args}");
        }
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
}
