//! BatchNorm over the channel axis, forward (eval or training, with ReLU or Add + ReLU fused)
//! and backward.

use super::{Extra, eps, extra_output, with};
use crate::args::{Io, file};
use crate::npy::NpyData;
use crate::run::{Context, Holds, Invocation, NpyElement, Ran};
use clap::{Args, Subcommand, ValueEnum};
use rill::Tensor;
use rill::batch_norm::{self, Backward, Forward, Layout, Options, mask_words};
use std::path::PathBuf;

/// BatchNorm, named as in PyTorch.
#[derive(Subcommand, Debug)]
#[command(rename_all = "snake_case")]
pub enum Op {
    /// (input - mean) * invstd * weight + bias per channel, as torch.nn.functional.batch_norm.
    ///
    /// Eval (the default) normalizes with the running statistics; --training with the batch's,
    /// writing the updated running ones to --output-running-* (PyTorch updates them in place).
    BatchNorm(BatchNorm),
    /// Gradient of a training batch_norm wrt input (and weight, bias, addend).
    ///
    /// As torch.ops.aten.native_batch_norm_backward with train=True, from the forward's --input,
    /// --weight and saved statistics.
    BatchNormBackward(BatchNormBackward),
}

/// What the forward and backward both take besides their files.
#[derive(Args, Debug)]
pub struct Common {
    #[command(flatten)]
    pub io: Io,
    /// The weight: float32 [C].
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub weight: Option<PathBuf>,
    /// Where the channel axis is.
    #[arg(long, value_enum, default_value_t = MemoryFormat::Contiguous)]
    pub memory_format: MemoryFormat,
    /// The activation fused after the normalize (the backward takes the forward's).
    #[arg(long, value_enum, default_value_t = Activation::None)]
    pub activation: Activation,
}

/// Where the channel axis is in the arrays given.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
#[value(rename_all = "snake_case")]
pub enum MemoryFormat {
    /// (N, C, L...), as PyTorch's contiguous_format.
    Contiguous,
    /// The .npy array is already in channels-last order, of shape (N, L..., C), e.g. NCHW x
    /// saved as x.transpose(0, 2, 3, 1); so are the other arrays of --input's shape.
    ChannelsLast,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    None,
    /// relu(bn(input)), or with --addend relu(bn(input) + addend).
    Relu,
}

#[derive(Args, Debug)]
pub struct BatchNorm {
    #[command(flatten)]
    pub common: Common,
    /// The bias: float32 [C].
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub bias: Option<PathBuf>,
    /// The running mean: float32 [C]; eval normalizes with it, training updates it.
    #[arg(long, value_name = "FILE", value_parser = file, requires = "running_var")]
    pub running_mean: Option<PathBuf>,
    /// The running (unbiased) variance: float32 [C], as --running-mean.
    #[arg(long, value_name = "FILE", value_parser = file, requires = "running_mean")]
    pub running_var: Option<PathBuf>,
    /// Normalizes with the batch's statistics (and updates the running ones).
    #[arg(long)]
    pub training: bool,
    /// The batch's weight in the running statistics' update; none: a cumulative average.
    #[arg(long, default_value = "0.1", value_parser = momentum, allow_hyphen_values = true)]
    pub momentum: Momentum,
    /// The batches the running statistics average so far (BatchNorm's num_batches_tracked):
    /// --momentum none weights this one 1 / (N + 1).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub num_batches_tracked: u64,
    /// Added to the variance.
    // Hyphen values so that a negative eps reaches its check (see the softmax family's Scale).
    #[arg(long, default_value = "1e-5", value_parser = eps, allow_hyphen_values = true)]
    pub eps: f32,
    /// Added before the ReLU (Add + ReLU: relu(bn(input) + addend)); of --input's shape and dtype.
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub addend: Option<PathBuf>,
    /// Writes the batch mean: float32 [C], the backward's --save-mean.
    #[arg(long, value_name = "FILE", value_parser = file, requires = "training")]
    pub output_mean: Option<PathBuf>,
    /// Writes 1 / sqrt(batch variance + eps): float32 [C], the backward's --save-invstd.
    #[arg(long, value_name = "FILE", value_parser = file, requires = "training")]
    pub output_invstd: Option<PathBuf>,
    /// Writes the ReLU's mask, the backward's --mask: int32 [ceil(numel / 32)], bit i % 32 of
    /// word i / 32 set where output element i (in memory order) is positive.
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub output_mask: Option<PathBuf>,
    /// Writes the updated running mean: float32 [C].
    #[arg(long, value_name = "FILE", value_parser = file, requires = "training", requires = "running_mean")]
    pub output_running_mean: Option<PathBuf>,
    /// Writes the updated running variance: float32 [C].
    #[arg(long, value_name = "FILE", value_parser = file, requires = "training", requires = "running_mean")]
    pub output_running_var: Option<PathBuf>,
}

/// `--momentum`: `None` for PyTorch's cumulative average.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Momentum(pub Option<f32>);

#[derive(Args, Debug)]
pub struct BatchNormBackward {
    #[command(flatten)]
    pub common: Common,
    /// The gradient of the forward's output, of --input's shape and dtype.
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub grad_output: PathBuf,
    /// The forward's --output-mean: float32 [C].
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub save_mean: PathBuf,
    /// The forward's --output-invstd: float32 [C].
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub save_invstd: PathBuf,
    /// The forward's --output-mask (with --activation relu).
    #[arg(long, value_name = "FILE", value_parser = file, required_if_eq("activation", "relu"))]
    pub mask: Option<PathBuf>,
    /// Writes the weight's gradient: float32 [C].
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub grad_weight: Option<PathBuf>,
    /// Writes the bias's gradient: float32 [C].
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub grad_bias: Option<PathBuf>,
    /// Writes the gradient of the forward's --addend (Add + ReLU), of --input's shape and dtype.
    #[arg(long, value_name = "FILE", value_parser = file)]
    pub grad_addend: Option<PathBuf>,
}

fn momentum(value: &str) -> Result<Momentum, String> {
    if value == "none" {
        return Ok(Momentum(None));
    }
    match value.parse::<f32>() {
        Ok(momentum) if momentum.is_finite() => Ok(Momentum(Some(momentum))),
        _ => Err("must be a finite number, or none for a cumulative average".into()),
    }
}

impl Common {
    fn invocation(&self, name: &'static str) -> Invocation<'_> {
        Invocation::new(name, &self.io).optional_file("weight", Holds::Float32, &self.weight)
    }

    /// Why the first of `flags` given is refused without the ReLU, which each belongs to.
    fn without_relu(&self, flags: [(&str, &Option<PathBuf>); 2]) -> Option<String> {
        let (flag, _) = flags.into_iter().find(|(_, path)| path.is_some() && self.activation == Activation::None)?;
        Some(format!("--{flag} belongs to the fused ReLU: add --activation relu, or leave out --{flag}"))
    }

    fn layout(&self) -> Layout {
        match self.memory_format {
            MemoryFormat::Contiguous => Layout::ChannelsFirst,
            MemoryFormat::ChannelsLast => Layout::ChannelsLast,
        }
    }

    /// A zeroed float32 [C] for `x` ([0] where `x` has no channel axis, which the library refuses).
    fn per_channel<T: NpyElement>(&self, cx: &Context, x: &Tensor<T>) -> rill::Result<Tensor<f32>> {
        let channels = if self.layout() == Layout::ChannelsLast { x.shape().last() } else { x.shape().get(1) };
        Tensor::zeros(cx.gpu, &[channels.copied().unwrap_or(0)])
    }
}

impl Op {
    pub fn invocation(&self) -> Invocation<'_> {
        match self {
            Op::BatchNorm(args) => args
                .common
                .invocation("batch_norm")
                .optional_file("bias", Holds::Float32, &args.bias)
                .optional_file("running-mean", Holds::Float32, &args.running_mean)
                .optional_file("running-var", Holds::Float32, &args.running_var)
                .optional_file("addend", Holds::Float, &args.addend)
                .extra_output("output-mean", &args.output_mean)
                .extra_output("output-invstd", &args.output_invstd)
                .extra_output("output-mask", &args.output_mask)
                .extra_output("output-running-mean", &args.output_running_mean)
                .extra_output("output-running-var", &args.output_running_var)
                .misuse(args.misuse()),
            Op::BatchNormBackward(args) => args
                .common
                .invocation("batch_norm_backward")
                .file("grad-output", Holds::Float, &args.grad_output)
                .file("save-mean", Holds::Float32, &args.save_mean)
                .file("save-invstd", Holds::Float32, &args.save_invstd)
                .optional_file("mask", Holds::Mask, &args.mask)
                .extra_output("grad-weight", &args.grad_weight)
                .extra_output("grad-bias", &args.grad_bias)
                .extra_output("grad-addend", &args.grad_addend)
                .misuse(args.common.without_relu([("mask", &args.mask), ("grad-addend", &args.grad_addend)])),
        }
    }

    pub fn execute<T: NpyElement>(&self, cx: &Context) -> rill::Result<Ran> {
        let x = cx.tensor::<T>("input")?;
        let mut out = Tensor::<T>::zeros(cx.gpu, x.shape())?;
        let (common, extra) = match self {
            Op::BatchNorm(args) => (&args.common, args.run(cx, &x, &mut out)?),
            Op::BatchNormBackward(args) => (&args.common, args.run(cx, &x, &mut out)?),
        };
        let how = format!("{:?}, activation {:?}", common.layout(), common.activation);
        Ok(Ran { shape: x.shape().to_vec(), data: T::wrap(out.to_vec()?), how, extra })
    }
}

impl BatchNorm {
    /// What the flags given lack or have too many of, which clap cannot tell from presence.
    fn misuse(&self) -> Option<String> {
        let eval = "eval reads the running statistics: give --running-mean and --running-var, or add --training";
        if !self.training && self.running_mean.is_none() {
            return Some(eval.into());
        }
        self.common.without_relu([("addend", &self.addend), ("output-mask", &self.output_mask)])
    }

    /// The forward of `x` into `y`, returning the further outputs computed.
    fn run<T: NpyElement>(&self, cx: &Context, x: &Tensor<T>, y: &mut Tensor<T>) -> rill::Result<Vec<Extra>> {
        let per_channel = || self.common.per_channel(cx, x);
        let (weight, bias, addend) =
            (cx.optional::<f32>("weight")?, cx.optional::<f32>("bias")?, cx.optional::<T>("addend")?);
        let (mut running_mean, mut running_var) = (cx.optional("running-mean")?, cx.optional("running-var")?);
        let mut batches = self.num_batches_tracked;
        let save = cx.wants("output-mean") || cx.wants("output-invstd");
        let (mut mean, mut invstd) = (save.then(per_channel).transpose()?, save.then(per_channel).transpose()?);
        let words = mask_words(x.len());
        let mut mask = cx.wants("output-mask").then(|| Tensor::<u32>::zeros(cx.gpu, &[words])).transpose()?;
        let call = Forward::new(x, y, self.common.layout());
        let call = with(call, weight.as_ref(), |call, weight| call.weight(weight));
        let call = with(call, bias.as_ref(), |call, bias| call.bias(bias));
        let running = running_mean.as_mut().zip(running_var.as_mut());
        let call = with(call, running, |call, (mean, var)| call.running(mean, var, &mut batches));
        let call = with(call, mean.as_mut().zip(invstd.as_mut()), |call, (mean, invstd)| call.save(mean, invstd));
        let call = match (self.common.activation, &addend) {
            (Activation::Relu, Some(addend)) => call.add_relu(addend, mask.as_mut()),
            (Activation::Relu, None) => call.relu(mask.as_mut()),
            // An addend or mask without the ReLU was refused.
            (Activation::None, _) => call,
        };
        let options = Options { training: self.training, momentum: self.momentum.0, eps: self.eps };
        batch_norm::forward(&cx.stream, options, call)?;
        cx.stream.synchronize()?;
        // Every statistic computed is returned; the runner writes those asked for.
        let stats = [("output-mean", mean), ("output-invstd", invstd)];
        let running = [("output-running-mean", running_mean), ("output-running-var", running_var)];
        let mut extra = Vec::new();
        for (flag, tensor) in stats.into_iter().chain(running) {
            extra.extend(extra_output(flag, tensor)?);
        }
        if let Some(mask) = mask {
            extra.push(("output-mask", vec![words], NpyData::from_words(mask.to_vec()?)));
        }
        Ok(extra)
    }
}

impl BatchNormBackward {
    /// The backward into `dx` from the forward's input `x`, returning the further gradients
    /// computed.
    fn run<T: NpyElement>(&self, cx: &Context, x: &Tensor<T>, dx: &mut Tensor<T>) -> rill::Result<Vec<Extra>> {
        let dy = cx.tensor::<T>("grad-output")?;
        let saved = (cx.tensor::<f32>("save-mean")?, cx.tensor::<f32>("save-invstd")?);
        let (weight, mask) = (cx.optional::<f32>("weight")?, cx.mask("mask")?);
        let grad = |flag| cx.wants(flag).then(|| self.common.per_channel(cx, x)).transpose();
        let (mut dweight, mut dbias) = (grad("grad-weight")?, grad("grad-bias")?);
        let mut daddend = cx.wants("grad-addend").then(|| Tensor::<T>::zeros(cx.gpu, x.shape())).transpose()?;
        let call = Backward::new(&dy, x, dx, self.common.layout(), (&saved.0, &saved.1));
        let call = with(call, weight.as_ref(), |call, weight| call.weight(weight));
        let call = with(call, dweight.as_mut(), |call, dweight| call.dweight(dweight));
        let call = with(call, dbias.as_mut(), |call, dbias| call.dbias(dbias));
        let call = match (&mask, daddend.as_mut()) {
            (Some(mask), Some(daddend)) => call.add_relu(mask, daddend),
            (Some(mask), None) => call.relu(mask),
            // The mask comes with the ReLU, and the addend's gradient was refused without it.
            (None, _) => call,
        };
        batch_norm::backward(&cx.stream, call)?;
        cx.stream.synchronize()?;
        let mut extra = Vec::new();
        extra.extend(extra_output("grad-weight", dweight)?);
        extra.extend(extra_output("grad-bias", dbias)?);
        extra.extend(extra_output("grad-addend", daddend)?);
        Ok(extra)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops;
    use crate::testing::{self, Files, rejected, runtime, selected, usage};
    use clap::error::ErrorKind;

    /// The forward that `args` (after `--input x --output y`) make.
    fn forward(args: &str) -> BatchNorm {
        let op = testing::op(&format!("run batch_norm --input x --output y {args}"));
        let ops::Op::BatchNorm(Op::BatchNorm(forward)) = op else { panic!("`{args}` is not batch_norm") };
        forward
    }

    const BACKWARD: &str = "batch_norm_backward --input x --grad-output dy --save-mean m --save-invstd s";

    #[test]
    fn ops_are_named_as_in_pytorch() {
        assert_eq!(testing::names::<Op>().join(" "), "batch_norm batch_norm_backward");
    }

    #[test]
    fn options_select_the_kernel_and_files() {
        let bn = forward("--running-mean m --running-var v");
        assert_eq!((bn.training, bn.momentum, bn.eps), (false, Momentum(Some(0.1)), 1e-5));
        assert_eq!((bn.common.layout(), bn.common.activation), (Layout::ChannelsFirst, Activation::None));
        let bn = forward("--training --momentum none --memory-format channels_last --activation relu");
        assert_eq!((bn.momentum, bn.common.layout()), (Momentum(None), Layout::ChannelsLast));
        let (files, extra) = selected(
            "batch_norm --input x --weight w --bias b --running-mean m --running-var v --training --activation relu \
             --addend a --output-mean sm --output-invstd si --output-mask k --output-running-mean rm \
             --output-running-var rv",
        );
        assert_eq!(files, ["input", "weight", "bias", "running-mean", "running-var", "addend"]);
        assert_eq!(extra, ["output-mean", "output-invstd", "output-mask", "output-running-mean", "output-running-var"]);
        let (files, extra) =
            selected(&format!("{BACKWARD} --weight w --activation relu --mask k --grad-weight dw --grad-addend da"));
        assert_eq!(files, ["input", "weight", "grad-output", "save-mean", "save-invstd", "mask"]);
        assert_eq!(extra, ["grad-weight", "grad-addend"]);
    }

    #[test]
    fn rejects_bad_arguments_with_exit_status_2() {
        for (args, kind) in [
            ("--training --momentum fast", ErrorKind::ValueValidation),
            ("--training --eps -1", ErrorKind::ValueValidation),
            ("--training --memory-format nhwc", ErrorKind::InvalidValue),
            ("--running-mean m", ErrorKind::MissingRequiredArgument),
            ("--running-mean m --running-var v --output-mean sm", ErrorKind::MissingRequiredArgument),
            ("--running-mean m --running-var v --output-running-var rv", ErrorKind::MissingRequiredArgument),
            ("--training --output-running-mean rm", ErrorKind::MissingRequiredArgument),
        ] {
            assert_eq!(rejected(&format!("run batch_norm --input x --output y {args}")), kind, "{args}");
        }
        let relu_without_mask = format!("run {BACKWARD} --output dx --activation relu");
        assert_eq!(rejected(&relu_without_mask), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn combinations_clap_cannot_tell_are_usage_errors() {
        let files = Files::new("batch-norm-usage");
        let message = usage(files.failure("batch_norm --input x"));
        assert!(message.contains("--running-mean") && message.contains("--training"), "{message}");
        for (args, flag) in [
            ("batch_norm --input x --training --addend a", "--addend"),
            ("batch_norm --input x --training --output-mask k", "--output-mask"),
            (&format!("{BACKWARD} --mask k"), "--mask"),
            (&format!("{BACKWARD} --grad-addend da"), "--grad-addend"),
        ] {
            let message = usage(files.failure(args));
            assert!(message.contains(flag) && message.contains("--activation relu"), "{message}");
        }
    }

    #[test]
    fn statistics_are_float32_and_the_mask_int32() {
        let files = Files::new("batch-norm-dtypes");
        let (x16, c16) = (files.f16("x16.npy", &[2, 3, 4]), files.f16("c16.npy", &[3]));
        let message = runtime(files.failure(&format!("batch_norm --input {x16} --training --weight {c16}")));
        assert!(message.contains("--weight") && message.contains("must be float32"), "{message}");
        let c = files.f32("c.npy", &[3]);
        let backward =
            format!("batch_norm_backward --input {x16} --grad-output {x16} --save-mean {c} --save-invstd {c}");
        let message = runtime(files.failure(&format!("{backward} --activation relu --mask {c}")));
        assert!(message.contains("--mask") && message.contains("int32"), "{message}");
    }
}
