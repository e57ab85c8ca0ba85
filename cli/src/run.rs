//! Running an op: the files an invocation names are read and checked, the library call its op
//! selects runs on the GPU, and the results are written.

use crate::args::{
    AddNorm, Approximate, Binary, CrossEntropy, Dim, Dtype, IgnoreIndex, Io, LayerNorm, LayerNormBackward, LossOptions,
    NormBackward, NormCommon, NormalizedShape, Op, Reduction, RmsNorm, RmsNormBackward, Softmax, SoftmaxBackward,
};
use crate::npy::{self, NpyArray, NpyData};
use half::f16;
use rill::norm::{Backward, Forward, Norm, NormKind, Plan};
use rill::{Element, Gpu, Stream, Tensor, elementwise, softmax};
use std::path::{Path, PathBuf};

/// What ends the program early: bad arguments (exit 2) or a failure while running (exit 1).
#[derive(Debug)]
pub enum Failure {
    Usage(String),
    Runtime(String),
}

impl From<rill::Error> for Failure {
    fn from(err: rill::Error) -> Self {
        Failure::Runtime(err.to_string())
    }
}

fn no_device(err: rill::Error) -> Failure {
    Failure::Runtime(format!("no CUDA device: {err}"))
}

pub fn devices() -> Result<(), Failure> {
    let gpu = Gpu::new(0).map_err(no_device)?;
    let info = gpu.info();
    let (major, minor) = info.compute_capability;
    println!(
        "0: {} (compute capability {major}.{minor}, {} multiprocessors, {} MiB L2)",
        info.name,
        info.multiprocessors,
        f64::from(info.l2_bytes) / (1024.0 * 1024.0)
    );
    Ok(())
}

/// What an input file must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Holds {
    /// float32 or float16, the same for every such file of a call: the op's element type.
    Float,
    /// int64 class indices (`int32` files are widened when read).
    Indices,
    /// float32 whatever the op's element type (per-row loss gradients, a norm's statistics).
    Float32,
    /// float32 or the op's element type (a norm's weight and bias); does not set the
    /// element type.
    Param,
}

/// The library call an invocation makes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kernel {
    Relu,
    Gelu,
    GeluTanh,
    Silu,
    Sigmoid,
    Add,
    Sub,
    Mul,
    Div,
    Addcmul,
    BiasAddGelu,
    To(Dtype),
    Softmax { log: bool },
    SoftmaxBackward { log: bool },
    ScaledMaskedSoftmax(f32),
    ScaledCausalSoftmax(f32),
    CrossEntropy,
    CrossEntropyBackward,
    Norm { kind: NormKind, residual: bool, eps: f32 },
    NormBackward(NormKind),
}

/// An op's command line as the runner uses it: the library call, the files to read with what
/// each must hold, and the files to write. Flags are named without their leading `--`.
#[derive(Debug)]
pub struct Invocation<'a> {
    pub name: &'static str,
    kernel: Kernel,
    /// `(flag, holds, path)` of every input file given, `input` first.
    files: Vec<(&'static str, Holds, &'a Path)>,
    output: &'a Path,
    /// `(flag, path)` of the further outputs asked for (a norm's statistics, sum and parameter
    /// gradients).
    extra_outputs: Vec<(&'static str, &'a Path)>,
    dim: i64,
    normalized_shape: Option<&'a NormalizedShape>,
}

impl<'a> Invocation<'a> {
    fn new(name: &'static str, kernel: Kernel, io: &'a Io) -> Self {
        Invocation {
            name,
            kernel,
            files: vec![("input", Holds::Float, &io.input)],
            output: &io.output,
            extra_outputs: Vec::new(),
            dim: -1,
            normalized_shape: None,
        }
    }

    fn file(mut self, flag: &'static str, holds: Holds, path: &'a Path) -> Self {
        self.files.push((flag, holds, path));
        self
    }

    fn optional_file(self, flag: &'static str, holds: Holds, path: &'a Option<PathBuf>) -> Self {
        match path {
            Some(path) => self.file(flag, holds, path),
            None => self,
        }
    }

    fn extra_output(mut self, flag: &'static str, path: &'a Option<PathBuf>) -> Self {
        self.extra_outputs.extend(path.as_deref().map(|path| (flag, path)));
        self
    }

    fn dim(mut self, dim: &Dim) -> Self {
        self.dim = dim.dim;
        self
    }

    fn norm(name: &'static str, kernel: Kernel, common: &'a NormCommon) -> Self {
        let mut invocation =
            Invocation::new(name, kernel, &common.io).optional_file("weight", Holds::Param, &common.weight);
        invocation.normalized_shape = common.normalized_shape.as_ref();
        invocation
    }

    fn wants(&self, flag: &str) -> bool {
        self.extra_outputs.iter().any(|(f, _)| *f == flag)
    }
}

impl Op {
    /// The invocation this op's arguments make.
    pub fn invocation(&self) -> Invocation<'_> {
        use Holds::Float;
        match self {
            Op::Relu(io) => Invocation::new("relu", Kernel::Relu, io),
            Op::Gelu(args) => {
                let kernel = match args.approximate {
                    Approximate::None => Kernel::Gelu,
                    Approximate::Tanh => Kernel::GeluTanh,
                };
                Invocation::new("gelu", kernel, &args.io)
            }
            Op::Silu(io) => Invocation::new("silu", Kernel::Silu, io),
            Op::Sigmoid(io) => Invocation::new("sigmoid", Kernel::Sigmoid, io),
            Op::Add(args) => args.invocation("add", Kernel::Add),
            Op::Sub(args) => args.invocation("sub", Kernel::Sub),
            Op::Mul(args) => args.invocation("mul", Kernel::Mul),
            Op::Div(args) => args.invocation("div", Kernel::Div),
            Op::Addcmul(args) => Invocation::new("addcmul", Kernel::Addcmul, &args.io)
                .file("tensor1", Float, &args.tensor1)
                .file("tensor2", Float, &args.tensor2),
            Op::BiasAddGelu(args) => {
                Invocation::new("bias_add_gelu", Kernel::BiasAddGelu, &args.io).file("bias", Float, &args.bias)
            }
            Op::To(args) => Invocation::new("to", Kernel::To(args.dtype), &args.io),
            Op::Softmax(args) => args.invocation("softmax", false),
            Op::LogSoftmax(args) => args.invocation("log_softmax", true),
            Op::SoftmaxBackward(args) => args.invocation("softmax_backward", false),
            Op::LogSoftmaxBackward(args) => args.invocation("log_softmax_backward", true),
            Op::ScaledMaskedSoftmax(args) => {
                let kernel = Kernel::ScaledMaskedSoftmax(args.scale.scale);
                Invocation::new("scaled_masked_softmax", kernel, &args.io)
                    .file("mask", Float, &args.mask)
                    .dim(&args.dim)
            }
            Op::ScaledCausalSoftmax(args) => {
                let kernel = Kernel::ScaledCausalSoftmax(args.scale.scale);
                Invocation::new("scaled_causal_softmax", kernel, &args.io).dim(&args.dim)
            }
            Op::CrossEntropy(args) => args.invocation("cross_entropy", Kernel::CrossEntropy),
            Op::CrossEntropyBackward(args) => args
                .forward
                .invocation("cross_entropy_backward", Kernel::CrossEntropyBackward)
                .file("grad-output", Holds::Float32, &args.grad_output),
            Op::LayerNorm(args) => args.invocation("layer_norm", false),
            Op::RmsNorm(args) => args.invocation("rms_norm", false),
            Op::AddLayerNorm(args) => args.invocation("add_layer_norm"),
            Op::AddRmsNorm(args) => args.invocation("add_rms_norm"),
            Op::LayerNormBackward(args) => args.invocation(),
            Op::RmsNormBackward(args) => args.invocation(),
        }
    }
}

impl Binary {
    fn invocation(&self, name: &'static str, kernel: Kernel) -> Invocation<'_> {
        Invocation::new(name, kernel, &self.io).file("other", Holds::Float, &self.other)
    }
}

impl Softmax {
    fn invocation(&self, name: &'static str, log: bool) -> Invocation<'_> {
        Invocation::new(name, Kernel::Softmax { log }, &self.io).dim(&self.dim)
    }
}

impl SoftmaxBackward {
    fn invocation(&self, name: &'static str, log: bool) -> Invocation<'_> {
        Invocation::new(name, Kernel::SoftmaxBackward { log }, &self.io)
            .file("grad-output", Holds::Float, &self.grad_output)
            .dim(&self.dim)
    }
}

impl CrossEntropy {
    fn invocation(&self, name: &'static str, kernel: Kernel) -> Invocation<'_> {
        // The kernels compute exactly these options, so there is nothing to pass on.
        let LossOptions { reduction: Reduction, ignore_index: IgnoreIndex } = self.loss;
        Invocation::new(name, kernel, &self.io).file("target", Holds::Indices, &self.target)
    }
}

/// A norm forward's own options, which the residual-add variant shares.
pub trait NormForward {
    fn invocation(&self, name: &'static str, residual: bool) -> Invocation<'_>;
}

impl NormForward for LayerNorm {
    fn invocation(&self, name: &'static str, residual: bool) -> Invocation<'_> {
        let kernel = Kernel::Norm { kind: NormKind::LayerNorm, residual, eps: self.eps };
        Invocation::norm(name, kernel, &self.common)
            .optional_file("bias", Holds::Param, &self.bias)
            .extra_output("output-mean", &self.output_mean)
            .extra_output("output-rstd", &self.rstd.output_rstd)
    }
}

impl NormForward for RmsNorm {
    fn invocation(&self, name: &'static str, residual: bool) -> Invocation<'_> {
        let kernel = Kernel::Norm { kind: NormKind::RmsNorm, residual, eps: self.eps };
        Invocation::norm(name, kernel, &self.common).extra_output("output-rstd", &self.rstd.output_rstd)
    }
}

impl<N: clap::Args + NormForward> AddNorm<N> {
    fn invocation(&self, name: &'static str) -> Invocation<'_> {
        self.norm
            .invocation(name, true)
            .file("residual", Holds::Float, &self.residual)
            .extra_output("output-sum", &self.output_sum)
    }
}

impl NormBackward {
    fn invocation(&self, name: &'static str, kind: NormKind) -> Invocation<'_> {
        Invocation::norm(name, Kernel::NormBackward(kind), &self.common)
            .file("grad-output", Holds::Float, &self.grad_output)
            .file("rstd", Holds::Float32, &self.rstd)
            .extra_output("grad-weight", &self.grad_weight)
    }
}

impl LayerNormBackward {
    fn invocation(&self) -> Invocation<'_> {
        self.backward
            .invocation("layer_norm_backward", NormKind::LayerNorm)
            .file("mean", Holds::Float32, &self.mean)
            .extra_output("grad-bias", &self.grad_bias)
    }
}

impl RmsNormBackward {
    fn invocation(&self) -> Invocation<'_> {
        self.backward.invocation("rms_norm_backward", NormKind::RmsNorm)
    }
}

/// An input file, read.
struct Input<'a> {
    flag: &'static str,
    holds: Holds,
    path: &'a Path,
    array: NpyArray,
}

/// What a run produced: the output array and how it was computed (for `--verbose`).
struct Ran {
    shape: Vec<usize>,
    data: NpyData,
    how: String,
    /// Further outputs (a norm's statistics, sum and parameter gradients): the flag naming
    /// the file, the shape and the data.
    extra: Vec<(&'static str, Vec<usize>, NpyData)>,
}

pub fn run(invocation: &Invocation, verbose: bool) -> Result<(), Failure> {
    let mut inputs = Vec::new();
    for &(flag, holds, path) in &invocation.files {
        inputs.push(Input { flag, holds, path, array: npy::read(path).map_err(Failure::Runtime)? });
    }
    let dtype = check_dtypes(invocation.name, &inputs)?;
    let shape = &inputs[0].array.shape;
    softmax::check_last_dim(invocation.dim, shape.len()).map_err(|err| match err {
        rill::Error::InvalidInput(message) => Failure::Usage(message),
        other => other.into(),
    })?;
    if let Some(normalized_shape) = invocation.normalized_shape {
        check_normalized_shape(invocation.name, normalized_shape, shape)?;
    }

    let gpu = Gpu::new(0).map_err(no_device)?;
    let ran = match dtype {
        Dtype::F32 => execute::<f32>(&gpu, invocation, &inputs)?,
        Dtype::F16 => execute::<f16>(&gpu, invocation, &inputs)?,
    };
    if verbose {
        eprintln!("{} on {}: {}", invocation.name, gpu.info().name, ran.how);
    }
    npy::write(invocation.output, &ran.shape, &ran.data).map_err(Failure::Runtime)?;
    for (flag, shape, data) in &ran.extra {
        if let Some((_, path)) = invocation.extra_outputs.iter().find(|(f, _)| f == flag) {
            npy::write(path, shape, data).map_err(Failure::Runtime)?;
        }
    }
    Ok(())
}

/// `--normalized-shape` must be the last dimension of `shape`: the norms normalize the last
/// axis only.
fn check_normalized_shape(op: &str, normalized_shape: &NormalizedShape, shape: &[usize]) -> Result<(), Failure> {
    match (normalized_shape.dims.as_slice(), shape.last()) {
        ([n], Some(last)) if n == last => Ok(()),
        (_, Some(last)) => Err(Failure::Usage(format!(
            "--normalized-shape {} does not fit --input of shape {shape:?}: rill normalizes the last axis only, \
             so it must be [{last}]",
            normalized_shape.text
        ))),
        (_, None) => Err(Failure::Usage(format!("{op} needs an --input of at least one dimension"))),
    }
}

/// The element type of the float inputs, which must all share it, after checking that every
/// other input holds what it must; errors name the file.
fn check_dtypes(op: &str, inputs: &[Input]) -> Result<Dtype, Failure> {
    let describe = |input: &Input| format!("--{} {}", input.flag, input.path.display());
    let wrong = |input: &Input, want: &str| {
        Failure::Runtime(format!("{} is {}; {want}", describe(input), input.array.data.dtype_name()))
    };
    let mut floats = Vec::new();
    for input in inputs {
        match (input.holds, &input.array.data) {
            (Holds::Float, NpyData::F32(_)) => floats.push((input, Dtype::F32)),
            (Holds::Float, NpyData::F16(_)) => floats.push((input, Dtype::F16)),
            (Holds::Float, _) => return Err(wrong(input, "rill ops take float32 or float16 arrays")),
            (Holds::Indices, NpyData::I64(_))
            | (Holds::Float32, NpyData::F32(_))
            | (Holds::Param, NpyData::F32(_) | NpyData::F16(_)) => {}
            (Holds::Indices, _) => {
                let want = format!("{op}'s --{} must hold int64 class indices ('<i8' .npy)", input.flag);
                return Err(wrong(input, &want));
            }
            (Holds::Float32, _) => {
                let want = format!("{op}'s --{} must be float32, whatever the dtype of --input", input.flag);
                return Err(wrong(input, &want));
            }
            (Holds::Param, _) => {
                return Err(wrong(input, &format!("{op}'s --{} must be float32 or --input's dtype", input.flag)));
            }
        }
    }
    let Some(&(first, dtype)) = floats.first() else {
        return Err(Failure::Usage("no input files".into()));
    };
    let dtype_of = |input: &Input| input.array.data.dtype_name();
    for &(input, other) in &floats[1..] {
        if other != dtype {
            return Err(Failure::Runtime(format!(
                "{} is {} but {} is {}; convert one with `rill run to --dtype ...`",
                describe(input),
                dtype_of(input),
                describe(first),
                dtype_of(first)
            )));
        }
    }
    // A norm's weight and bias: float32 or the element type, both the same.
    let params: Vec<&Input> = inputs.iter().filter(|input| input.holds == Holds::Param).collect();
    for input in &params {
        if matches!(input.array.data, NpyData::F16(_)) && dtype != Dtype::F16 {
            return Err(Failure::Runtime(format!(
                "{} is float16 but {} is {}; {op}'s weight and bias must be float32 or --input's dtype",
                describe(input),
                describe(first),
                dtype_of(first)
            )));
        }
    }
    if let [weight, bias] = params.as_slice()
        && dtype_of(weight) != dtype_of(bias)
    {
        return Err(Failure::Runtime(format!(
            "{} is {} but {} is {}; give the weight and bias the same dtype",
            describe(bias),
            dtype_of(bias),
            describe(weight),
            dtype_of(weight)
        )));
    }
    Ok(dtype)
}

/// An element type that has a `.npy` dtype.
trait NpyElement: Element {
    const ONE: Self;
    fn slice(data: &NpyData) -> Option<&[Self]>;
    fn wrap(values: Vec<Self>) -> NpyData;
}

macro_rules! npy_element {
    ($($t:ty: $variant:ident, $one:expr;)+) => {$(
        impl NpyElement for $t {
            const ONE: Self = $one;
            fn slice(data: &NpyData) -> Option<&[Self]> {
                if let NpyData::$variant(values) = data { Some(values) } else { None }
            }
            fn wrap(values: Vec<Self>) -> NpyData {
                NpyData::$variant(values)
            }
        }
    )+};
}

npy_element! {
    f32: F32, 1.0;
    f16: F16, f16::ONE;
    i64: I64, 1;
}

/// The inputs that hold `holds`, in order, copied to the device as tensors of `U`.
fn upload<U: NpyElement>(gpu: &Gpu, inputs: &[Input], holds: Holds) -> rill::Result<Vec<Tensor<U>>> {
    inputs.iter().filter(|input| input.holds == holds).map(|input| upload_input(gpu, input)).collect()
}

/// The input given with `--flag`, if any, copied to the device as a tensor of `U`.
fn upload_flag<U: NpyElement>(gpu: &Gpu, inputs: &[Input], flag: &str) -> rill::Result<Option<Tensor<U>>> {
    inputs.iter().find(|input| input.flag == flag).map(|input| upload_input(gpu, input)).transpose()
}

fn upload_input<U: NpyElement>(gpu: &Gpu, input: &Input) -> rill::Result<Tensor<U>> {
    match U::slice(&input.array.data) {
        Some(values) => Tensor::<U>::from_slice(gpu, values, &input.array.shape),
        None => Err(rill::Error::InvalidInput(format!(
            "--{} {} is not {}",
            input.flag,
            input.path.display(),
            U::DTYPE.name()
        ))),
    }
}

/// Runs the invocation's kernel on `inputs` (float ones of element type `T`) and returns the
/// output.
fn execute<T: NpyElement>(gpu: &Gpu, invocation: &Invocation, inputs: &[Input]) -> rill::Result<Ran> {
    let kernel = invocation.kernel;
    if matches!(kernel, Kernel::Norm { .. } | Kernel::NormBackward(_)) {
        // The weight and bias are float32 or T (checked), so f16 ones mean T is f16.
        let f16_params =
            inputs.iter().any(|input| input.holds == Holds::Param && matches!(input.array.data, NpyData::F16(_)));
        return if f16_params {
            execute_norm::<T, f16>(gpu, invocation, inputs)
        } else {
            execute_norm::<T, f32>(gpu, invocation, inputs)
        };
    }
    let x = upload::<T>(gpu, inputs, Holds::Float)?;
    let targets = upload::<i64>(gpu, inputs, Holds::Indices)?;
    let grads = upload::<f32>(gpu, inputs, Holds::Float32)?;
    let Some(first) = x.first() else {
        return Err(rill::Error::InvalidInput("no float input".into()));
    };
    let stream = gpu.stream()?;
    match (kernel, x.as_slice(), targets.as_slice()) {
        (Kernel::To(Dtype::F32), [a], []) => return convert::<T, f32>(gpu, &stream, a),
        (Kernel::To(Dtype::F16), [a], []) => return convert::<T, f16>(gpu, &stream, a),
        (Kernel::CrossEntropy, [logits], [target]) => {
            // One loss per row: all but the last dimension (a scalar is rejected by the op).
            let rows = logits.shape()[..logits.shape().len().saturating_sub(1)].iter().product();
            let mut loss = Tensor::<f32>::zeros(gpu, &[rows])?;
            let plan = softmax::cross_entropy(&stream, logits, target, &mut loss)?;
            return finish(&stream, &loss, plan.describe());
        }
        _ => {}
    }
    let mut out = Tensor::<T>::zeros(gpu, first.shape())?;
    let plan = match (kernel, x.as_slice(), targets.as_slice(), grads.as_slice()) {
        (Kernel::Softmax { log: false }, [a], [], []) => softmax::softmax(&stream, a, &mut out)?,
        (Kernel::Softmax { log: true }, [a], [], []) => softmax::log_softmax(&stream, a, &mut out)?,
        (Kernel::SoftmaxBackward { log: false }, [y, dy], [], []) => {
            softmax::softmax_backward(&stream, y, dy, &mut out)?
        }
        (Kernel::SoftmaxBackward { log: true }, [y, dy], [], []) => {
            softmax::log_softmax_backward(&stream, y, dy, &mut out)?
        }
        (Kernel::ScaledMaskedSoftmax(scale), [a, mask], [], []) => {
            softmax::scaled_masked_softmax(&stream, a, mask, scale, &mut out)?
        }
        (Kernel::ScaledCausalSoftmax(scale), [a], [], []) => {
            softmax::scaled_causal_softmax(&stream, a, scale, &mut out)?
        }
        (Kernel::CrossEntropyBackward, [logits], [target], [dloss]) => {
            softmax::cross_entropy_backward(&stream, logits, target, dloss, &mut out)?
        }
        (kernel, x, [], []) => {
            elementwise_op(&stream, kernel, x, &mut out)?;
            return finish(&stream, &out, "elementwise kernel (no dispatch choice)".into());
        }
        _ => return Err(rill::Error::InvalidInput(format!("wrong inputs ({} files)", inputs.len()))),
    };
    finish(&stream, &out, plan.describe())
}

/// Runs an elementwise `kernel` on `x`, writing `y` (of `x[0]`'s shape).
fn elementwise_op<T: Element>(stream: &Stream, kernel: Kernel, x: &[Tensor<T>], y: &mut Tensor<T>) -> rill::Result<()> {
    match (kernel, x) {
        (Kernel::Relu, [a]) => elementwise::relu(stream, a, y),
        (Kernel::Gelu, [a]) => elementwise::gelu(stream, a, y),
        (Kernel::GeluTanh, [a]) => elementwise::gelu_tanh(stream, a, y),
        (Kernel::Silu, [a]) => elementwise::silu(stream, a, y),
        (Kernel::Sigmoid, [a]) => elementwise::sigmoid(stream, a, y),
        (Kernel::Add, [a, b]) => elementwise::add(stream, a, b, y),
        (Kernel::Sub, [a, b]) => elementwise::sub(stream, a, b, y),
        (Kernel::Mul, [a, b]) => elementwise::mul(stream, a, b, y),
        (Kernel::Div, [a, b]) => elementwise::div(stream, a, b, y),
        // addcmul(input, tensor1, tensor2) = tensor1 * tensor2 + input.
        (Kernel::Addcmul, [c, a, b]) => elementwise::fma(stream, a, b, c, y),
        (Kernel::BiasAddGelu, [a, bias]) => elementwise::bias_add_gelu(stream, a, bias, y),
        _ => Err(rill::Error::InvalidInput(format!("wrong number of inputs ({})", x.len()))),
    }
}

/// Waits for `stream`'s work and copies `out` back.
fn finish<U: NpyElement>(stream: &Stream, out: &Tensor<U>, how: String) -> rill::Result<Ran> {
    stream.synchronize()?;
    Ok(Ran { shape: out.shape().to_vec(), data: U::wrap(out.to_vec()?), how, extra: Vec::new() })
}

/// `(flag, shape, data)` of a further output, if it was computed (the stream synchronized).
fn extra_output<U: NpyElement>(
    flag: &'static str,
    tensor: Option<Tensor<U>>,
) -> rill::Result<Option<(&'static str, Vec<usize>, NpyData)>> {
    tensor.map(|t| Ok((flag, t.shape().to_vec(), U::wrap(t.to_vec()?)))).transpose()
}

/// A norm, forward or backward, of input `T` with weight and bias `G` (float32 or `T`; the
/// weight's gradients are `G` too, float32 without a weight).
fn execute_norm<T: NpyElement, G: NpyElement>(
    gpu: &Gpu,
    invocation: &Invocation,
    inputs: &[Input],
) -> rill::Result<Ran> {
    let wants = |flag: &str| invocation.wants(flag);
    let required = |flag: &str| {
        upload_flag::<T>(gpu, inputs, flag)?.ok_or_else(|| rill::Error::InvalidInput(format!("--{flag} is missing")))
    };
    let x = required("input")?;
    let shape = x.shape().to_vec();
    // One statistic per row, shaped as PyTorch's native_layer_norm writes them: [..., 1].
    let stats_shape = [shape.split_last().map_or(&[][..], |(_, outer)| outer), &[1]].concat();
    let cols = shape.last().copied().unwrap_or(1);
    let weight = upload_flag::<G>(gpu, inputs, "weight")?;
    let stream = gpu.stream()?;
    let norm = Norm::new();
    let weight_note = if weight.is_some() { format!("; weight {}", G::DTYPE.name()) } else { String::new() };
    let mut outputs = Vec::new();
    let (plan, y): (Plan, Tensor<T>) = match invocation.kernel {
        Kernel::Norm { kind, residual, eps } => {
            let bias = upload_flag::<G>(gpu, inputs, "bias")?;
            // PyTorch takes a bias without a weight; the library's bias follows a weight.
            let weight = match (weight, &bias) {
                (None, Some(_)) => Some(Tensor::from_slice(gpu, &vec![G::ONE; cols], &[cols])?),
                (weight, _) => weight,
            };
            let residual = if residual { Some(required("residual")?) } else { None };
            let mut sum = residual.as_ref().map(|_| Tensor::<T>::zeros(gpu, &shape)).transpose()?;
            let stats = |flag| wants(flag).then(|| Tensor::<f32>::zeros(gpu, &stats_shape)).transpose();
            let (mut mean, mut rstd) = (stats("output-mean")?, stats("output-rstd")?);
            let mut y = Tensor::<T>::zeros(gpu, &shape)?;
            let mut call = Forward::new(&x, &mut y);
            if let (Some(residual), Some(sum)) = (&residual, &mut sum) {
                call = call.residual(residual, sum);
            }
            if let Some(mean) = &mut mean {
                call = call.save_mean(mean);
            }
            if let Some(rstd) = &mut rstd {
                call = call.save_rstd(rstd);
            }
            let plan = match (&weight, &bias) {
                (Some(weight), Some(bias)) => norm.forward(&stream, kind, eps, call.weight(weight).bias(bias))?,
                (Some(weight), None) => norm.forward(&stream, kind, eps, call.weight(weight))?,
                (None, _) => norm.forward(&stream, kind, eps, call)?,
            };
            stream.synchronize()?;
            outputs.push(extra_output("output-sum", sum.filter(|_| wants("output-sum")))?);
            outputs.push(extra_output("output-mean", mean)?);
            outputs.push(extra_output("output-rstd", rstd)?);
            (plan, y)
        }
        Kernel::NormBackward(kind) => {
            let dy = required("grad-output")?;
            let mean = upload_flag::<f32>(gpu, inputs, "mean")?;
            let Some(rstd) = upload_flag::<f32>(gpu, inputs, "rstd")? else {
                return Err(rill::Error::InvalidInput("--rstd is missing".into()));
            };
            let mut dx = Tensor::<T>::zeros(gpu, &shape)?;
            let mut call = Backward::new(&x, &dy, &rstd, &mut dx);
            if let Some(mean) = &mean {
                call = call.mean(mean);
            }
            // The weight's gradient is computed whenever the bias's is: the library's
            // dbias-only call faults on the GPU (its column-sum kernel writes dweight
            // unconditionally), so dweight is kept in scratch when not asked for.
            let with_dweight = wants("grad-weight") || wants("grad-bias");
            let plan = match &weight {
                Some(weight) => {
                    let grad = |wanted: bool| wanted.then(|| Tensor::<G>::zeros(gpu, &[cols])).transpose();
                    let (mut dweight, mut dbias) = (grad(with_dweight)?, grad(wants("grad-bias"))?);
                    let mut call = call.weight(weight);
                    if let Some(dweight) = &mut dweight {
                        call = call.dweight(dweight);
                    }
                    if let Some(dbias) = &mut dbias {
                        call = call.dbias(dbias);
                    }
                    let plan = norm.backward(&stream, kind, call)?;
                    stream.synchronize()?;
                    outputs.push(extra_output("grad-weight", dweight.filter(|_| wants("grad-weight")))?);
                    outputs.push(extra_output("grad-bias", dbias)?);
                    plan
                }
                None => {
                    // No weight: clap refused its gradient (the scratch one aside); dbias is
                    // float32.
                    let grad = |wanted: bool| wanted.then(|| Tensor::<f32>::zeros(gpu, &[cols])).transpose();
                    let (mut dweight, mut dbias) = (grad(with_dweight)?, grad(wants("grad-bias"))?);
                    let plan = match (&mut dweight, &mut dbias) {
                        (Some(dweight), Some(dbias)) => {
                            norm.backward(&stream, kind, call.dweight(dweight).dbias(dbias))?
                        }
                        (Some(dweight), None) => norm.backward(&stream, kind, call.dweight(dweight))?,
                        (None, Some(dbias)) => norm.backward(&stream, kind, call.dbias(dbias))?,
                        (None, None) => norm.backward(&stream, kind, call)?,
                    };
                    stream.synchronize()?;
                    outputs.push(extra_output("grad-bias", dbias)?);
                    plan
                }
            };
            (plan, dx)
        }
        _ => return Err(rill::Error::InvalidInput("not a norm".into())),
    };
    let params = if invocation.extra_outputs.iter().any(|(flag, _)| flag.starts_with("grad-")) {
        "; then the weight/bias gradients: two-stage column sums"
    } else {
        ""
    };
    Ok(Ran {
        shape,
        data: T::wrap(y.to_vec()?),
        how: format!("{}{weight_note}{params}", plan.describe()),
        extra: outputs.into_iter().flatten().collect(),
    })
}

/// `x` converted to `O`; like PyTorch's `Tensor.to`, converting to its own dtype is a no-op.
fn convert<I: NpyElement, O: NpyElement>(gpu: &Gpu, stream: &Stream, x: &Tensor<I>) -> rill::Result<Ran> {
    if I::DTYPE == O::DTYPE {
        let how = format!("no kernel: the input is already {}", I::DTYPE.name());
        return Ok(Ran { shape: x.shape().to_vec(), data: I::wrap(x.to_vec()?), how, extra: Vec::new() });
    }
    let mut y = Tensor::<O>::zeros(gpu, x.shape())?;
    elementwise::cast::<I, O>(stream, x, &mut y)?;
    finish(stream, &y, "elementwise cast kernel (no dispatch choice)".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command};
    use clap::{CommandFactory, Parser};

    #[test]
    fn every_op_is_invoked_under_its_own_name() {
        let cli = Cli::command();
        let run = cli.find_subcommand("run").expect("a run command");
        let ops: Vec<&clap::Command> = run.get_subcommands().filter(|op| op.get_name() != "help").collect();
        assert_eq!(ops.len(), 25);
        for op in ops {
            let mut args = vec!["rill".to_string(), "run".into(), op.get_name().into()];
            for arg in op.get_arguments().filter(|arg| arg.is_required_set()) {
                let value = match arg.get_id().as_str() {
                    "scale" => "0.5",
                    "dtype" => "float16",
                    _ => "file.npy",
                };
                args.extend([format!("--{}", arg.get_long().unwrap_or_default()), value.into()]);
            }
            let parsed = Cli::try_parse_from(&args).unwrap_or_else(|err| panic!("{args:?}: {err}"));
            let Command::Run { op: parsed } = parsed.command else { panic!("{args:?}: not run") };
            let invocation = parsed.invocation();
            assert_eq!(invocation.name, op.get_name());
            assert_eq!(invocation.files[0].0, "input");
        }
    }

    /// The kernel, input files and further outputs that `args` (after `rill run`) select.
    fn selected(args: &str) -> (Kernel, Vec<&'static str>, Vec<&'static str>) {
        let cli = Cli::try_parse_from(format!("rill run {args} --output y").split_whitespace()).unwrap();
        let Command::Run { op } = cli.command else { panic!("{args}: not run") };
        let invocation = op.invocation();
        let files = invocation.files.iter().map(|(flag, ..)| *flag).collect();
        (invocation.kernel, files, invocation.extra_outputs.iter().map(|(flag, _)| *flag).collect())
    }

    #[test]
    fn options_select_the_kernel_and_files() {
        assert_eq!(selected("gelu --input x").0, Kernel::Gelu);
        assert_eq!(selected("gelu --input x --approximate tanh").0, Kernel::GeluTanh);
        assert_eq!(selected("to --input x --dtype half").0, Kernel::To(Dtype::F16));
        assert_eq!(
            selected("log_softmax_backward --input y --grad-output dy").0,
            Kernel::SoftmaxBackward { log: true }
        );
        assert_eq!(selected("scaled_causal_softmax --input x --scale 0.5").0, Kernel::ScaledCausalSoftmax(0.5));
        assert_eq!(selected("addcmul --input c --tensor1 a --tensor2 b").1, ["input", "tensor1", "tensor2"]);
        let (kernel, files, extra) = selected("cross_entropy_backward --input x --target t --grad-output g");
        assert_eq!(
            (kernel, files, extra),
            (Kernel::CrossEntropyBackward, vec!["input", "target", "grad-output"], vec![])
        );
        let (kernel, files, extra) =
            selected("add_layer_norm --input x --residual h --bias b --output-sum s --output-rstd r");
        let norm = Kernel::Norm { kind: NormKind::LayerNorm, residual: true, eps: 1e-5 };
        assert_eq!(
            (kernel, files, extra),
            (norm, vec!["input", "bias", "residual"], vec!["output-rstd", "output-sum"])
        );
        let (kernel, _, extra) = selected("rms_norm --input x --eps 1e-3 --output-rstd r");
        assert_eq!(
            (kernel, extra),
            (Kernel::Norm { kind: NormKind::RmsNorm, residual: false, eps: 1e-3 }, vec!["output-rstd"])
        );
        let (kernel, files, extra) =
            selected("layer_norm_backward --input x --grad-output g --mean m --rstd r --weight w --grad-bias db");
        assert_eq!(kernel, Kernel::NormBackward(NormKind::LayerNorm));
        assert_eq!((files, extra), (vec!["input", "weight", "grad-output", "rstd", "mean"], vec!["grad-bias"]));
    }

    /// A folder of `.npy` files for one test, removed when dropped.
    struct Files(PathBuf);

    impl Files {
        fn new(test: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("rill-cli-run-{}-{test}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Files(dir)
        }

        fn write(&self, name: &str, shape: &[usize], data: NpyData) -> String {
            let path = self.0.join(name);
            npy::write(&path, shape, &data).unwrap();
            path.to_string_lossy().into_owned()
        }

        fn f32(&self, name: &str, shape: &[usize]) -> String {
            self.write(name, shape, NpyData::F32(vec![0.5; shape.iter().product()]))
        }

        fn f16(&self, name: &str, shape: &[usize]) -> String {
            self.write(name, shape, NpyData::F16(vec![f16::ONE; shape.iter().product()]))
        }

        /// What running `args` (after `rill run`, with `--output` added) fails with before it
        /// needs a GPU.
        fn failure(&self, args: &str) -> Failure {
            let output = self.0.join("out.npy");
            let args = format!("rill run {args} --output {}", output.display());
            let Command::Run { op } = Cli::try_parse_from(args.split_whitespace()).unwrap().command else {
                panic!("{args}: not run")
            };
            run(&op.invocation(), false).expect_err(&args)
        }
    }

    impl Drop for Files {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn usage(failure: Failure) -> String {
        match failure {
            Failure::Usage(message) => message,
            other => panic!("expected a usage failure, got {other:?}"),
        }
    }

    fn runtime(failure: Failure) -> String {
        match failure {
            Failure::Runtime(message) => message,
            other => panic!("expected a runtime failure, got {other:?}"),
        }
    }

    #[test]
    fn the_axis_must_be_the_last_one() {
        let files = Files::new("axis");
        let x = files.f32("x.npy", &[2, 4]);
        assert!(usage(files.failure(&format!("softmax --input {x} --dim 0"))).contains("dim 0"));
        let message = usage(files.failure(&format!("layer_norm --input {x} --normalized-shape [3]")));
        assert!(message.contains("[3]") && message.contains("must be [4]"), "{message}");
        let message = usage(files.failure(&format!("rms_norm --input {x} --normalized-shape 2,4")));
        assert!(message.contains("must be [4]"), "{message}");
    }

    #[test]
    fn float_inputs_share_one_dtype() {
        let files = Files::new("dtypes");
        let (x, x16) = (files.f32("x.npy", &[2, 4]), files.f16("x16.npy", &[2, 4]));
        let message = runtime(files.failure(&format!("add --input {x} --other {x16}")));
        assert!(message.contains("--other") && message.contains("float16") && message.contains("convert"), "{message}");
        let targets = files.write("t.npy", &[2], NpyData::I64(vec![0, -100]));
        let message = runtime(files.failure(&format!("cross_entropy --input {x} --target {x}")));
        assert!(message.contains("--target") && message.contains("int64"), "{message}");
        let dloss = files.f16("dloss.npy", &[2]);
        let message = runtime(
            files.failure(&format!("cross_entropy_backward --input {x} --target {targets} --grad-output {dloss}")),
        );
        assert!(message.contains("--grad-output") && message.contains("must be float32"), "{message}");
        let message = runtime(files.failure(&format!("relu --input {targets}")));
        assert!(message.contains("int64") && message.contains("float32 or float16"), "{message}");
    }

    #[test]
    fn norm_parameters_are_float32_or_the_input_dtype() {
        let files = Files::new("params");
        let (x, x16) = (files.f32("x.npy", &[2, 4]), files.f16("x16.npy", &[2, 4]));
        let (w, w16) = (files.f32("w.npy", &[4]), files.f16("w16.npy", &[4]));
        let message = runtime(files.failure(&format!("layer_norm --input {x} --weight {w16}")));
        assert!(message.contains("--weight") && message.contains("float32 or --input's dtype"), "{message}");
        let message = runtime(files.failure(&format!("layer_norm --input {x16} --weight {w} --bias {w16}")));
        assert!(message.contains("same dtype"), "{message}");
    }

    #[test]
    fn unreadable_files_are_named() {
        let files = Files::new("missing");
        let missing = files.0.join("missing.npy");
        let message = runtime(files.failure(&format!("sigmoid --input {}", missing.display())));
        assert!(message.contains("missing.npy"), "{message}");
    }
}
