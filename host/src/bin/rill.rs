//! `rill`: runs one rill op on the GPU on NumPy `.npy` files.
//!
//! ```text
//! rill run <op> --input x.npy [--other b.npy] [...] --output y.npy
//! rill devices
//! rill help
//! ```
//!
//! Flags are named after the op's arguments in PyTorch (`torch.add(input, other)`,
//! `torch.addcmul(input, tensor1, tensor2)`, `gelu(input, approximate=...)`,
//! `Tensor.to(dtype)`); `--flag value` and `--flag=value` both work. The element type comes
//! from the input files, which must all be `float32` or all `float16`; the output has the
//! shape of `--input` and is written in its dtype (`to` writes `--dtype`).
//!
//! Exit status: 0 on success, 1 when the op or the device fails, 2 for bad arguments.

use half::f16;
use rill::npy::{self, NpyArray, NpyData};
use rill::{Element, Gpu, Tensor, elementwise};
use std::path::PathBuf;
use std::process::ExitCode;

/// An op as the command line knows it.
struct Op {
    name: &'static str,
    /// Flags naming input files, `input` first.
    files: &'static [&'static str],
    /// Flags taking some other value, each with how the help shows it.
    options: &'static [(&'static str, &'static str)],
    summary: &'static str,
}

const OPS: &[Op] = &[
    Op { name: "relu", files: &["input"], options: &[], summary: "max(input, 0)" },
    Op {
        name: "gelu",
        files: &["input"],
        options: &[("approximate", "[--approximate none|tanh]")],
        summary: "GELU, exact (erf) or with the tanh approximation",
    },
    Op { name: "silu", files: &["input"], options: &[], summary: "input * sigmoid(input)" },
    Op { name: "sigmoid", files: &["input"], options: &[], summary: "1 / (1 + exp(-input))" },
    Op { name: "add", files: &["input", "other"], options: &[], summary: "input + other" },
    Op { name: "sub", files: &["input", "other"], options: &[], summary: "input - other" },
    Op { name: "mul", files: &["input", "other"], options: &[], summary: "input * other" },
    Op { name: "div", files: &["input", "other"], options: &[], summary: "input / other" },
    Op {
        name: "addcmul",
        files: &["input", "tensor1", "tensor2"],
        options: &[],
        summary: "input + tensor1 * tensor2, rounded once (fused multiply-add)",
    },
    Op {
        name: "bias_add_gelu",
        files: &["input", "bias"],
        options: &[],
        summary: "gelu(input + bias), bias of shape [last dimension of input]",
    },
    Op {
        name: "to",
        files: &["input"],
        options: &[("dtype", "--dtype float32|float16")],
        summary: "input converted to --dtype, rounding to nearest even (PyTorch's Tensor.to)",
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
    match args.first().map(String::as_str) {
        Some("help") => {
            print!("{}", help());
            Ok(())
        }
        Some("devices") if args.len() == 1 => devices(),
        Some("devices") => Err(usage("`rill devices` takes no arguments")),
        Some("run") => run(&Invocation::parse(&args[1..])?),
        Some(other) => Err(usage(format!("unknown command {other:?}; the commands are run, devices and help"))),
        None => Err(usage("no command given")),
    }
}

fn help() -> String {
    let mut text = String::from(
        "rill: runs one rill op on the GPU on NumPy .npy files\n\n\
         usage:\n  \
         rill run <op> --input x.npy [other inputs] --output y.npy\n  \
         rill devices        print the GPU rill would use\n  \
         rill help           print this help\n\n\
         ops (flags named after PyTorch's arguments):\n",
    );
    for op in OPS {
        let mut flags: Vec<String> = op.files.iter().map(|f| format!("--{f} FILE")).collect();
        flags.extend(op.options.iter().map(|(_, shown)| shown.to_string()));
        text.push_str(&format!("  {:<14}{}\n  {:<14}{}\n", op.name, flags.join(" "), "", op.summary));
    }
    text.push_str(
        "\nEvery op also takes --output FILE. Inputs must all be float32 or all float16 ('<f4' or\n\
         '<f2' .npy files); the output has the shape and dtype of --input, except that `to`\n\
         writes --dtype. bfloat16 cannot be stored in a .npy file, so it is not offered.\n",
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
    /// Parses what follows `rill run`.
    fn parse(args: &[String]) -> Result<Invocation, Failure> {
        let Some((name, rest)) = args.split_first() else {
            return Err(usage(format!("`rill run` needs an op: {}", op_names())));
        };
        let Some(op) = OPS.iter().find(|op| op.name == name) else {
            let hint = match name.as_str() {
                "fma" => "; for a * b + c use `addcmul --input c --tensor1 a --tensor2 b`",
                "gelu_tanh" => "; use `gelu --approximate tanh`",
                "cast" => "; use `to --dtype float32|float16`",
                _ => "",
            };
            return Err(usage(format!("unknown op {name:?}{hint}; the ops are {}", op_names())));
        };
        let known = || op.files.iter().copied().chain(op.options.iter().map(|(flag, _)| *flag)).chain(["output"]);

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
                    Some(value) => (flag, value.clone()),
                    None => return Err(usage(format!("--{flag} needs a value"))),
                },
            };
            let Some(flag) = known().find(|known| *known == flag) else {
                let accepted: Vec<String> = known().map(|f| format!("--{f}")).collect();
                return Err(usage(format!("{} does not take --{flag}; it takes {}", op.name, accepted.join(", "))));
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
        for file in op.files {
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
            other => return Err(usage(format!("op {other:?} has no kernel"))),
        })
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
}

/// An input file, read.
struct Input {
    flag: &'static str,
    path: String,
    array: NpyArray,
}

fn run(invocation: &Invocation) -> Result<(), Failure> {
    let kernel = invocation.kernel()?;
    let mut inputs = Vec::new();
    for &flag in invocation.op.files {
        let path = invocation.get(flag).unwrap_or_default();
        let array = npy::read(path.as_ref())?;
        inputs.push(Input { flag, path: path.to_string(), array });
    }
    let dtype = check_dtypes(&inputs)?;
    let shape = inputs[0].array.shape.clone();

    let gpu = Gpu::new(0).map_err(|err| Failure::Runtime(format!("no CUDA device: {err}")))?;
    let output = match dtype {
        Dtype::F32 => execute::<f32>(&gpu, kernel, &inputs)?,
        Dtype::F16 => execute::<f16>(&gpu, kernel, &inputs)?,
    };
    npy::write(&invocation.output, &shape, output.as_ref())?;
    Ok(())
}

/// The dtype all inputs share, or an error naming the first that differs.
fn check_dtypes(inputs: &[Input]) -> Result<Dtype, Failure> {
    let dtype_of = |input: &Input| match &input.array.data {
        NpyData::F32(_) => Ok(Dtype::F32),
        NpyData::F16(_) => Ok(Dtype::F16),
        other => Err(Failure::Runtime(format!(
            "--{} {} is {}; rill ops take float32 or float16 arrays",
            input.flag,
            input.path,
            other.dtype_name()
        ))),
    };
    let Some(first) = inputs.first() else {
        return Err(usage("no input files"));
    };
    let dtype = dtype_of(first)?;
    for input in &inputs[1..] {
        if dtype_of(input)? != dtype {
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

/// Runs `kernel` on `inputs` (all of element type `T`) and returns the output's elements.
fn execute<T: NpyElement>(gpu: &Gpu, kernel: Kernel, inputs: &[Input]) -> rill::Result<NpyData> {
    let x = inputs
        .iter()
        .map(|input| match T::slice(&input.array.data) {
            Some(values) => Tensor::<T>::from_slice(gpu, values, &input.array.shape),
            None => {
                Err(rill::Error::InvalidInput(format!("--{} {} is not {}", input.flag, input.path, T::DTYPE.name())))
            }
        })
        .collect::<rill::Result<Vec<_>>>()?;
    match kernel {
        Kernel::To(Dtype::F32) => convert::<T, f32>(gpu, &x[0]),
        Kernel::To(Dtype::F16) => convert::<T, f16>(gpu, &x[0]),
        _ => {
            let stream = gpu.stream()?;
            let mut y = Tensor::<T>::zeros(gpu, x[0].shape())?;
            match (kernel, x.as_slice()) {
                (Kernel::Relu, [a]) => elementwise::relu(&stream, a, &mut y)?,
                (Kernel::Gelu, [a]) => elementwise::gelu(&stream, a, &mut y)?,
                (Kernel::GeluTanh, [a]) => elementwise::gelu_tanh(&stream, a, &mut y)?,
                (Kernel::Silu, [a]) => elementwise::silu(&stream, a, &mut y)?,
                (Kernel::Sigmoid, [a]) => elementwise::sigmoid(&stream, a, &mut y)?,
                (Kernel::Add, [a, b]) => elementwise::add(&stream, a, b, &mut y)?,
                (Kernel::Sub, [a, b]) => elementwise::sub(&stream, a, b, &mut y)?,
                (Kernel::Mul, [a, b]) => elementwise::mul(&stream, a, b, &mut y)?,
                (Kernel::Div, [a, b]) => elementwise::div(&stream, a, b, &mut y)?,
                // addcmul(input, tensor1, tensor2) = tensor1 * tensor2 + input.
                (Kernel::Addcmul, [c, a, b]) => elementwise::fma(&stream, a, b, c, &mut y)?,
                (Kernel::BiasAddGelu, [a, bias]) => elementwise::bias_add_gelu(&stream, a, bias, &mut y)?,
                _ => {
                    return Err(rill::Error::InvalidInput(format!("wrong number of inputs ({})", x.len())));
                }
            }
            stream.synchronize()?;
            Ok(T::wrap(y.to_vec()?))
        }
    }
}

/// `x` converted to `O`; like PyTorch's `Tensor.to`, converting to its own dtype is a no-op.
fn convert<I: NpyElement, O: NpyElement>(gpu: &Gpu, x: &Tensor<I>) -> rill::Result<NpyData> {
    if I::DTYPE == O::DTYPE {
        return Ok(I::wrap(x.to_vec()?));
    }
    let stream = gpu.stream()?;
    let mut y = Tensor::<O>::zeros(gpu, x.shape())?;
    elementwise::cast::<I, O>(&stream, x, &mut y)?;
    stream.synchronize()?;
    Ok(O::wrap(y.to_vec()?))
}
