//! `rill`: runs one rill op on the GPU on NumPy `.npy` files.
//!
//! ```text
//! rill run <op> --input x.npy [--other b.npy] [...] --output y.npy [--verbose]
//! rill devices
//! rill help
//! ```
//!
//! Flags are named after the op's arguments in PyTorch (`torch.add(input, other)`,
//! `torch.addcmul(input, tensor1, tensor2)`, `gelu(input, approximate=...)`,
//! `Tensor.to(dtype)`, `softmax(input, dim)`, `cross_entropy(input, target, reduction,
//! ignore_index)`, `grad_output` for backward ops); `--flag value` and `--flag=value` both
//! work, and `--output` always names the file written. The element type comes from the float
//! input files, which must all be `float32` or all `float16`; the output has the shape of
//! `--input` and is written in its dtype (`to` writes `--dtype`; `cross_entropy` writes
//! float32 per-row losses). `--target` holds int64 class indices; `cross_entropy_backward`'s
//! `--grad-output` is float32. `--verbose`, anywhere, prints the implementation chosen.
//!
//! Exit status: 0 on success, 1 when the op or the device fails, 2 for bad arguments.

use half::f16;
use rill::npy::{self, NpyArray, NpyData};
use rill::{Element, Gpu, Stream, Tensor, elementwise, softmax};
use std::path::PathBuf;
use std::process::ExitCode;

/// What an input file must hold.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Holds {
    /// float32 or float16, the same for every such file of a call: the op's element type.
    Float,
    /// int64 class indices (`int32` files are widened when read).
    Indices,
    /// float32 whatever the op's element type (per-row loss gradients).
    Float32,
}

const fn float(flag: &'static str) -> (&'static str, Holds) {
    (flag, Holds::Float)
}

/// An op as the command line knows it.
struct Op {
    name: &'static str,
    /// Flags naming input files, `input` first, with what each holds.
    files: &'static [(&'static str, Holds)],
    /// Flags taking some other value, each with how the help shows it.
    options: &'static [(&'static str, &'static str)],
    summary: &'static str,
}

const DIM: (&str, &str) = ("dim", "[--dim -1]");
const SCALE: (&str, &str) = ("scale", "--scale S");
const REDUCTION: (&str, &str) = ("reduction", "[--reduction none]");
const IGNORE_INDEX: (&str, &str) = ("ignore-index", "[--ignore-index -100]");
const TARGET: (&str, Holds) = ("target", Holds::Indices);

const OPS: &[Op] = &[
    Op { name: "relu", files: &[float("input")], options: &[], summary: "max(input, 0)" },
    Op {
        name: "gelu",
        files: &[float("input")],
        options: &[("approximate", "[--approximate none|tanh]")],
        summary: "GELU, exact (erf) or with the tanh approximation",
    },
    Op { name: "silu", files: &[float("input")], options: &[], summary: "input * sigmoid(input)" },
    Op { name: "sigmoid", files: &[float("input")], options: &[], summary: "1 / (1 + exp(-input))" },
    Op { name: "add", files: &[float("input"), float("other")], options: &[], summary: "input + other" },
    Op { name: "sub", files: &[float("input"), float("other")], options: &[], summary: "input - other" },
    Op { name: "mul", files: &[float("input"), float("other")], options: &[], summary: "input * other" },
    Op { name: "div", files: &[float("input"), float("other")], options: &[], summary: "input / other" },
    Op {
        name: "addcmul",
        files: &[float("input"), float("tensor1"), float("tensor2")],
        options: &[],
        summary: "input + tensor1 * tensor2, rounded once (fused multiply-add)",
    },
    Op {
        name: "bias_add_gelu",
        files: &[float("input"), float("bias")],
        options: &[],
        summary: "gelu(input + bias), bias of shape [last dimension of input]",
    },
    Op {
        name: "to",
        files: &[float("input")],
        options: &[("dtype", "--dtype float32|float16")],
        summary: "input converted to --dtype, rounding to nearest even (PyTorch's Tensor.to)",
    },
    Op { name: "softmax", files: &[float("input")], options: &[DIM], summary: "softmax over the last axis" },
    Op { name: "log_softmax", files: &[float("input")], options: &[DIM], summary: "log-softmax over the last axis" },
    Op {
        name: "softmax_backward",
        files: &[float("input"), float("grad-output")],
        options: &[DIM],
        summary: "gradient of softmax from its output (--input) and that output's gradient",
    },
    Op {
        name: "log_softmax_backward",
        files: &[float("input"), float("grad-output")],
        options: &[DIM],
        summary: "gradient of log_softmax from its output (--input) and that output's gradient",
    },
    Op {
        name: "scaled_masked_softmax",
        files: &[float("input"), float("mask")],
        options: &[SCALE, DIM],
        summary: "softmax(input * scale + mask), mask [m, last dim], m dividing input's rows",
    },
    Op {
        name: "scaled_causal_softmax",
        files: &[float("input")],
        options: &[SCALE, DIM],
        summary: "softmax(input * scale), query i (second-to-last axis) seeing keys 0..=i",
    },
    Op {
        name: "cross_entropy",
        files: &[float("input"), TARGET],
        options: &[REDUCTION, IGNORE_INDEX],
        summary: "per-row loss -log_softmax(input)[target], float32 of shape [rows]",
    },
    Op {
        name: "cross_entropy_backward",
        files: &[float("input"), TARGET, ("grad-output", Holds::Float32)],
        options: &[REDUCTION, IGNORE_INDEX],
        summary: "gradient of cross_entropy wrt input, from the loss gradient",
    },
];

/// What ends the program early: bad arguments (exit 2) or a failure while running (exit 1).
enum Failure {
    Usage(String),
    Runtime(String),
}

impl From<rill::Error> for Failure {
    fn from(err: rill::Error) -> Self {
        Failure::Runtime(err.to_string())
    }
}

fn usage(message: impl Into<String>) -> Failure {
    Failure::Usage(message.into())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match cli(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("error: {message}");
            eprintln!("run `rill help` for usage");
            ExitCode::from(2)
        }
        Err(Failure::Runtime(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}

fn cli(args: &[String]) -> Result<(), Failure> {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{}", help());
        return Ok(());
    }
    // Global, so it may come anywhere; no flag takes a value starting with `--` unless
    // written `--flag=value`, so this never steals one.
    let verbose = args.iter().any(|a| a == "--verbose");
    let args: Vec<String> = args.iter().filter(|a| *a != "--verbose").cloned().collect();
    match args.first().map(String::as_str) {
        Some("help") => {
            print!("{}", help());
            Ok(())
        }
        Some("devices") if args.len() == 1 => devices(),
        Some("devices") => Err(usage("`rill devices` takes no arguments")),
        Some("run") => run(&Invocation::parse(&args[1..])?, verbose),
        Some(other) => Err(usage(format!("unknown command {other:?}; the commands are run, devices and help"))),
        None => Err(usage("no command given")),
    }
}

fn help() -> String {
    let mut text = String::from(
        "rill: runs one rill op on the GPU on NumPy .npy files\n\n\
         usage:\n  \
         rill run <op> --input x.npy [other inputs and options] --output y.npy [--verbose]\n  \
         rill devices        print the GPU rill would use\n  \
         rill help           print this help\n\n\
         ops (flags named after PyTorch's arguments):\n",
    );
    let width = OPS.iter().map(|op| op.name.len()).max().unwrap_or(0) + 2;
    for op in OPS {
        let mut flags: Vec<String> = op.files.iter().map(|(f, _)| format!("--{f} FILE")).collect();
        flags.extend(op.options.iter().map(|(_, shown)| shown.to_string()));
        text.push_str(&format!("  {:<width$}{}\n  {:<width$}{}\n", op.name, flags.join(" "), "", op.summary));
    }
    text.push_str(
        "\nEvery op also takes --output FILE, the file written, and --verbose, which prints the\n\
         implementation chosen (for the softmax family, the dispatcher's plan) to stderr.\n\n\
         Float inputs must all be float32 or all float16 ('<f4' or '<f2' .npy files); the output\n\
         has the shape and dtype of --input, except that `to` writes --dtype and `cross_entropy`\n\
         writes float32 losses of shape [rows], rows being the product of all but the last\n\
         dimension of --input. bfloat16 cannot be stored in a .npy file, so it is not offered.\n\n\
         The softmax family normalizes the last axis: --dim must name it (-1, the default, or\n\
         ndim - 1). --scale is a float (e.g. 0.125 = 1/sqrt(64)); scaled_causal_softmax needs at\n\
         least two dimensions. --target holds int64 class indices ('<i8', or '<i4' read as\n\
         int64) of shape [rows]; rows whose target is -100 are ignored (loss 0, gradient 0),\n\
         the only ignore index the kernels support. --reduction none is the only reduction\n\
         (PyTorch's reduction='none'). cross_entropy_backward's --grad-output is float32 of\n\
         shape [rows]; it writes a gradient of --input's shape and dtype.\n",
    );
    text
}

fn devices() -> Result<(), Failure> {
    let gpu = Gpu::new(0).map_err(|err| Failure::Runtime(format!("no CUDA device: {err}")))?;
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

/// A parsed `rill run` command line.
struct Invocation {
    op: &'static Op,
    /// `(flag, value)` for every flag but `--output`, in the order given.
    flags: Vec<(&'static str, String)>,
    output: PathBuf,
}

impl Invocation {
    /// Parses what follows `rill run` (with `--verbose` taken out).
    fn parse(args: &[String]) -> Result<Invocation, Failure> {
        let Some((name, rest)) = args.split_first() else {
            return Err(usage(format!("`rill run` needs an op: {}", op_names())));
        };
        let Some(op) = OPS.iter().find(|op| op.name == name) else {
            let hint = match name.as_str() {
                "fma" => "; for a * b + c use `addcmul --input c --tensor1 a --tensor2 b`",
                "gelu_tanh" => "; use `gelu --approximate tanh`",
                "cast" => "; use `to --dtype float32|float16`",
                "_softmax_backward_data" => "; use `softmax_backward --input y --grad-output dy`",
                "masked_softmax" => "; use `scaled_masked_softmax --scale 1`",
                "causal_softmax" => "; use `scaled_causal_softmax --scale 1`",
                "nll_loss" | "cross_entropy_loss" => "; use `cross_entropy --input logits --target t`",
                _ => "",
            };
            return Err(usage(format!("unknown op {name:?}{hint}; the ops are {}", op_names())));
        };
        let known =
            || op.files.iter().map(|(flag, _)| *flag).chain(op.options.iter().map(|(flag, _)| *flag)).chain(["output"]);

        let mut flags: Vec<(&'static str, String)> = Vec::new();
        let mut output = None;
        let mut rest = rest.iter();
        while let Some(arg) = rest.next() {
            let Some(flag) = arg.strip_prefix("--") else {
                return Err(usage(format!("unexpected argument {arg:?}; arguments are flags like --input FILE")));
            };
            let (flag, value) = match flag.split_once('=') {
                Some((flag, value)) => (flag, value.to_string()),
                None => match rest.next() {
                    Some(value) if value.starts_with("--") => {
                        return Err(usage(format!(
                            "--{flag} needs a value but is followed by {value}; write --{flag}={value} if that is the value"
                        )));
                    }
                    Some(value) => (flag, value.clone()),
                    None => return Err(usage(format!("--{flag} needs a value"))),
                },
            };
            let Some(flag) = known().find(|known| *known == flag) else {
                let accepted: Vec<String> = known().map(|f| format!("--{f}")).collect();
                return Err(usage(format!(
                    "{} does not take --{flag}; it takes {} (and --verbose)",
                    op.name,
                    accepted.join(", ")
                )));
            };
            if value.is_empty() {
                return Err(usage(format!("--{flag} needs a non-empty value")));
            }
            if flag == "output" && output.is_some() || flags.iter().any(|(f, _)| *f == flag) {
                return Err(usage(format!("--{flag} is given twice")));
            }
            if flag == "output" {
                output = Some(PathBuf::from(value));
            } else {
                flags.push((flag, value));
            }
        }
        for (file, _) in op.files {
            if !flags.iter().any(|(f, _)| f == file) {
                return Err(usage(format!("{} needs --{file} FILE", op.name)));
            }
        }
        let Some(output) = output else {
            return Err(usage(format!("{} needs --output FILE", op.name)));
        };
        Ok(Invocation { op, flags, output })
    }

    fn get(&self, flag: &str) -> Option<&str> {
        self.flags.iter().find(|(f, _)| *f == flag).map(|(_, value)| value.as_str())
    }

    /// Which library function the op and its options select.
    fn kernel(&self) -> Result<Kernel, Failure> {
        Ok(match self.op.name {
            "relu" => Kernel::Relu,
            "gelu" => match self.get("approximate") {
                None | Some("none") => Kernel::Gelu,
                Some("tanh") => Kernel::GeluTanh,
                Some(other) => {
                    return Err(usage(format!("--approximate must be none or tanh, not {other:?}")));
                }
            },
            "silu" => Kernel::Silu,
            "sigmoid" => Kernel::Sigmoid,
            "add" => Kernel::Add,
            "sub" => Kernel::Sub,
            "mul" => Kernel::Mul,
            "div" => Kernel::Div,
            "addcmul" => Kernel::Addcmul,
            "bias_add_gelu" => Kernel::BiasAddGelu,
            "to" => {
                let Some(dtype) = self.get("dtype") else {
                    return Err(usage("to needs --dtype float32|float16"));
                };
                match dtype.strip_prefix("torch.").unwrap_or(dtype) {
                    "float32" | "float" => Kernel::To(Dtype::F32),
                    "float16" | "half" => Kernel::To(Dtype::F16),
                    "bfloat16" => {
                        return Err(usage(
                            "bfloat16 has no .npy dtype, so `to` cannot write it; use float32 or float16",
                        ));
                    }
                    other => {
                        return Err(usage(format!("--dtype must be float32 or float16, not {other:?}")));
                    }
                }
            }
            "softmax" => Kernel::Softmax { log: false },
            "log_softmax" => Kernel::Softmax { log: true },
            "softmax_backward" => Kernel::SoftmaxBackward { log: false },
            "log_softmax_backward" => Kernel::SoftmaxBackward { log: true },
            "scaled_masked_softmax" => Kernel::ScaledMaskedSoftmax(self.scale()?),
            "scaled_causal_softmax" => Kernel::ScaledCausalSoftmax(self.scale()?),
            "cross_entropy" => {
                self.check_loss_options()?;
                Kernel::CrossEntropy
            }
            "cross_entropy_backward" => {
                self.check_loss_options()?;
                Kernel::CrossEntropyBackward
            }
            other => return Err(usage(format!("op {other:?} has no kernel"))),
        })
    }

    /// `--dim`, -1 when not given.
    fn dim(&self) -> Result<i64, Failure> {
        match self.get("dim") {
            None => Ok(-1),
            Some(value) => value.parse().map_err(|_| usage(format!("--dim must be an integer, not {value:?}"))),
        }
    }

    fn scale(&self) -> Result<f32, Failure> {
        let Some(value) = self.get("scale") else {
            return Err(usage(format!("{} needs --scale S (e.g. 0.125 = 1/sqrt(head size 64))", self.op.name)));
        };
        match value.parse::<f32>() {
            Ok(scale) if scale.is_finite() => Ok(scale),
            _ => Err(usage(format!("--scale must be a finite number, not {value:?}"))),
        }
    }

    /// `--reduction` and `--ignore-index` accept only what the kernels do.
    fn check_loss_options(&self) -> Result<(), Failure> {
        if let Some(reduction) = self.get("reduction")
            && reduction != "none"
        {
            return Err(usage(format!(
                "--reduction {reduction:?} is not supported; the only supported value is none (one loss per row); \
                 reduce the output yourself (PyTorch's mean averages over rows whose target is not -100)"
            )));
        }
        if let Some(value) = self.get("ignore-index") {
            match value.parse::<i64>() {
                Ok(-100) => {}
                Ok(other) => {
                    return Err(usage(format!(
                        "--ignore-index {other} is not supported: the kernels hard-code -100 (PyTorch's default), \
                         so only --ignore-index -100 is accepted; map ignored targets to -100"
                    )));
                }
                Err(_) => return Err(usage(format!("--ignore-index must be an integer (-100), not {value:?}"))),
            }
        }
        Ok(())
    }
}

fn op_names() -> String {
    OPS.iter().map(|op| op.name).collect::<Vec<_>>().join(", ")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dtype {
    F32,
    F16,
}

/// The library call an invocation makes.
#[derive(Clone, Copy)]
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
}

/// An input file, read.
struct Input {
    flag: &'static str,
    holds: Holds,
    path: String,
    array: NpyArray,
}

/// What a run produced: the output array and how it was computed (for `--verbose`).
struct Ran {
    shape: Vec<usize>,
    data: NpyData,
    how: String,
}

fn run(invocation: &Invocation, verbose: bool) -> Result<(), Failure> {
    let kernel = invocation.kernel()?;
    let dim = invocation.dim()?;
    let mut inputs = Vec::new();
    for &(flag, holds) in invocation.op.files {
        let path = invocation.get(flag).unwrap_or_default();
        let array = npy::read(path.as_ref())?;
        inputs.push(Input { flag, holds, path: path.to_string(), array });
    }
    let dtype = check_dtypes(invocation.op, &inputs)?;
    softmax::check_last_dim(dim, inputs[0].array.shape.len()).map_err(|err| match err {
        rill::Error::InvalidInput(message) => usage(message),
        other => other.into(),
    })?;

    let gpu = Gpu::new(0).map_err(|err| Failure::Runtime(format!("no CUDA device: {err}")))?;
    let ran = match dtype {
        Dtype::F32 => execute::<f32>(&gpu, kernel, &inputs)?,
        Dtype::F16 => execute::<f16>(&gpu, kernel, &inputs)?,
    };
    if verbose {
        eprintln!("{} on {}: {}", invocation.op.name, gpu.info().name, ran.how);
    }
    npy::write(&invocation.output, &ran.shape, ran.data.as_ref())?;
    Ok(())
}

/// The element type of the float inputs, which must all share it, after checking that every
/// other input holds what it must; errors name the file.
fn check_dtypes(op: &Op, inputs: &[Input]) -> Result<Dtype, Failure> {
    let wrong = |input: &Input, want: &str| {
        Failure::Runtime(format!("--{} {} is {}; {want}", input.flag, input.path, input.array.data.dtype_name()))
    };
    let mut floats = Vec::new();
    for input in inputs {
        match (input.holds, &input.array.data) {
            (Holds::Float, NpyData::F32(_)) => floats.push((input, Dtype::F32)),
            (Holds::Float, NpyData::F16(_)) => floats.push((input, Dtype::F16)),
            (Holds::Float, _) => return Err(wrong(input, "rill ops take float32 or float16 arrays")),
            (Holds::Indices, NpyData::I64(_)) | (Holds::Float32, NpyData::F32(_)) => {}
            (Holds::Indices, _) => {
                return Err(wrong(
                    input,
                    &format!("{}'s --{} must hold int64 class indices ('<i8' .npy)", op.name, input.flag),
                ));
            }
            (Holds::Float32, _) => {
                return Err(wrong(
                    input,
                    &format!("{}'s --{} must be float32, whatever the dtype of --input", op.name, input.flag),
                ));
            }
        }
    }
    let Some(&(first, dtype)) = floats.first() else {
        return Err(usage("no input files"));
    };
    for &(input, other) in &floats[1..] {
        if other != dtype {
            return Err(Failure::Runtime(format!(
                "--{} {} is {} but --{} {} is {}; convert one with `rill run to --dtype ...`",
                input.flag,
                input.path,
                input.array.data.dtype_name(),
                first.flag,
                first.path,
                first.array.data.dtype_name()
            )));
        }
    }
    Ok(dtype)
}

/// An element type that has a `.npy` dtype.
trait NpyElement: Element {
    fn slice(data: &NpyData) -> Option<&[Self]>;
    fn wrap(values: Vec<Self>) -> NpyData;
}

impl NpyElement for f32 {
    fn slice(data: &NpyData) -> Option<&[Self]> {
        if let NpyData::F32(values) = data { Some(values) } else { None }
    }
    fn wrap(values: Vec<Self>) -> NpyData {
        NpyData::F32(values)
    }
}

impl NpyElement for f16 {
    fn slice(data: &NpyData) -> Option<&[Self]> {
        if let NpyData::F16(values) = data { Some(values) } else { None }
    }
    fn wrap(values: Vec<Self>) -> NpyData {
        NpyData::F16(values)
    }
}

impl NpyElement for i64 {
    fn slice(data: &NpyData) -> Option<&[Self]> {
        if let NpyData::I64(values) = data { Some(values) } else { None }
    }
    fn wrap(values: Vec<Self>) -> NpyData {
        NpyData::I64(values)
    }
}

/// The inputs that hold `holds`, in order, copied to the device as tensors of `U`.
fn upload<U: NpyElement>(gpu: &Gpu, inputs: &[Input], holds: Holds) -> rill::Result<Vec<Tensor<U>>> {
    inputs
        .iter()
        .filter(|input| input.holds == holds)
        .map(|input| match U::slice(&input.array.data) {
            Some(values) => Tensor::<U>::from_slice(gpu, values, &input.array.shape),
            None => {
                Err(rill::Error::InvalidInput(format!("--{} {} is not {}", input.flag, input.path, U::DTYPE.name())))
            }
        })
        .collect()
}

/// Runs `kernel` on `inputs` (float ones of element type `T`) and returns the output.
fn execute<T: NpyElement>(gpu: &Gpu, kernel: Kernel, inputs: &[Input]) -> rill::Result<Ran> {
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
    Ok(Ran { shape: out.shape().to_vec(), data: U::wrap(out.to_vec()?), how })
}

/// `x` converted to `O`; like PyTorch's `Tensor.to`, converting to its own dtype is a no-op.
fn convert<I: NpyElement, O: NpyElement>(gpu: &Gpu, stream: &Stream, x: &Tensor<I>) -> rill::Result<Ran> {
    if I::DTYPE == O::DTYPE {
        let how = format!("no kernel: the input is already {}", I::DTYPE.name());
        return Ok(Ran { shape: x.shape().to_vec(), data: I::wrap(x.to_vec()?), how });
    }
    let mut y = Tensor::<O>::zeros(gpu, x.shape())?;
    elementwise::cast::<I, O>(stream, x, &mut y)?;
    finish(stream, &y, "elementwise cast kernel (no dispatch choice)".into())
}
