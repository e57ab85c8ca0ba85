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
//! ignore_index)`, `layer_norm(input, normalized_shape, weight, bias, eps)`, `grad_output`
//! for backward ops); `--flag value` and `--flag=value` both work, and `--output` always
//! names the file written (the norms write more with `--output-mean`, `--output-rstd`,
//! `--output-sum`, `--grad-weight` and `--grad-bias`). The element type comes from the float
//! input files, which must all be `float32` or all `float16`; the output has the shape of
//! `--input` and is written in its dtype (`to` writes `--dtype`; `cross_entropy` writes
//! float32 per-row losses). `--target` holds int64 class indices; `cross_entropy_backward`'s
//! `--grad-output` is float32, as are the norms' per-row `--mean` and `--rstd`; the norms'
//! `--weight` and `--bias` are float32 or the input's dtype. `--verbose`, anywhere, prints
//! the implementation chosen.
//!
//! Exit status: 0 on success, 1 when the op or the device fails, 2 for bad arguments.

use half::f16;
use rill::norm::{Backward, Forward, Norm, NormKind, Plan};
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
    /// float32 whatever the op's element type (per-row loss gradients, a norm's statistics).
    Float32,
    /// float32 or the op's element type (a norm's weight and bias); does not set the
    /// element type.
    Param,
}

const fn float(flag: &'static str) -> (&'static str, Holds) {
    (flag, Holds::Float)
}

/// An op as the command line knows it.
struct Op {
    name: &'static str,
    /// Flags naming input files, `input` first, with what each holds.
    files: &'static [(&'static str, Holds)],
    /// Flags taking some other value, each with how the help shows it: options, optional
    /// input files ([`OPTIONAL_FILES`]) and extra output files.
    options: &'static [(&'static str, &'static str)],
    summary: &'static str,
}

const DIM: (&str, &str) = ("dim", "[--dim -1]");
const SCALE: (&str, &str) = ("scale", "--scale S");
const REDUCTION: (&str, &str) = ("reduction", "[--reduction none]");
const IGNORE_INDEX: (&str, &str) = ("ignore-index", "[--ignore-index -100]");
const TARGET: (&str, Holds) = ("target", Holds::Indices);
const NORMALIZED_SHAPE: (&str, &str) = ("normalized-shape", "[--normalized-shape N]");
const WEIGHT: (&str, &str) = ("weight", "[--weight FILE]");
const BIAS: (&str, &str) = ("bias", "[--bias FILE]");
const OUTPUT_MEAN: (&str, &str) = ("output-mean", "[--output-mean FILE]");
const OUTPUT_RSTD: (&str, &str) = ("output-rstd", "[--output-rstd FILE]");
const OUTPUT_SUM: (&str, &str) = ("output-sum", "[--output-sum FILE]");
const GRAD_WEIGHT: (&str, &str) = ("grad-weight", "[--grad-weight FILE]");
const GRAD_BIAS: (&str, &str) = ("grad-bias", "[--grad-bias FILE]");
const RESIDUAL: (&str, Holds) = ("residual", Holds::Float);
const MEAN: (&str, Holds) = ("mean", Holds::Float32);
const RSTD: (&str, Holds) = ("rstd", Holds::Float32);

/// Input files an op may take among its options, read when given.
const OPTIONAL_FILES: &[(&str, Holds)] = &[("weight", Holds::Param), ("bias", Holds::Param)];

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
    Op {
        name: "layer_norm",
        files: &[float("input")],
        options: &[NORMALIZED_SHAPE, WEIGHT, BIAS, ("eps", "[--eps 1e-5]"), OUTPUT_MEAN, OUTPUT_RSTD],
        summary: "(input - mean) * rstd * weight + bias over the last axis",
    },
    Op {
        name: "rms_norm",
        files: &[float("input")],
        options: &[NORMALIZED_SHAPE, WEIGHT, ("eps", "[--eps 1e-6]"), OUTPUT_RSTD],
        summary: "input * rstd * weight over the last axis, rstd = 1 / sqrt(mean(input^2) + eps)",
    },
    Op {
        name: "add_layer_norm",
        files: &[float("input"), RESIDUAL],
        options: &[NORMALIZED_SHAPE, WEIGHT, BIAS, ("eps", "[--eps 1e-5]"), OUTPUT_SUM, OUTPUT_MEAN, OUTPUT_RSTD],
        summary: "layer_norm(input + residual), also writing the sum (--output-sum)",
    },
    Op {
        name: "add_rms_norm",
        files: &[float("input"), RESIDUAL],
        options: &[NORMALIZED_SHAPE, WEIGHT, ("eps", "[--eps 1e-6]"), OUTPUT_SUM, OUTPUT_RSTD],
        summary: "rms_norm(input + residual), also writing the sum (--output-sum)",
    },
    Op {
        name: "layer_norm_backward",
        files: &[float("input"), float("grad-output"), MEAN, RSTD],
        options: &[NORMALIZED_SHAPE, WEIGHT, GRAD_WEIGHT, GRAD_BIAS],
        summary: "gradient of layer_norm wrt input (and weight, bias) from the forward's input and statistics",
    },
    Op {
        name: "rms_norm_backward",
        files: &[float("input"), float("grad-output"), RSTD],
        options: &[NORMALIZED_SHAPE, WEIGHT, GRAD_WEIGHT],
        summary: "gradient of rms_norm wrt input (and weight) from the forward's input and rstd",
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
         shape [rows]; it writes a gradient of --input's shape and dtype.\n\n\
         The norms normalize the last axis: --normalized-shape, if given, must be its length N\n\
         (N or [N]). --weight and --bias are [N], float32 or --input's dtype (the same for both).\n\
         --eps defaults to 1e-5 for the layer norms and 1e-6 for the RMS norms (PyTorch's\n\
         rms_norm defaults to the dtype's epsilon: pass --eps to match it). --output-mean and\n\
         --output-rstd write the per-row float32 statistics, of --input's shape with the last\n\
         dimension 1 (as torch.native_layer_norm); the backward ops read them as --mean and\n\
         --rstd (any shape holding one value per row), with the forward's --input and --weight.\n\
         add_layer_norm and add_rms_norm normalize input + residual and write that sum with\n\
         --output-sum. A backward's --output is the gradient of --input; --grad-weight (which\n\
         needs --weight) and --grad-bias write [N] gradients in the weight's dtype (float32\n\
         without --weight).\n",
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
                "native_layer_norm" => "; use `layer_norm --output-mean m.npy --output-rstd r.npy`",
                "native_layer_norm_backward" => "; use `layer_norm_backward --mean m.npy --rstd r.npy`",
                "layernorm" | "rmsnorm" | "fused_add_rms_norm" => {
                    "; the norms are layer_norm, rms_norm, add_layer_norm and add_rms_norm"
                }
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
            "layer_norm" => self.norm(NormKind::LayerNorm, false)?,
            "rms_norm" => self.norm(NormKind::RmsNorm, false)?,
            "add_layer_norm" => self.norm(NormKind::LayerNorm, true)?,
            "add_rms_norm" => self.norm(NormKind::RmsNorm, true)?,
            "layer_norm_backward" | "rms_norm_backward" => {
                if self.get("grad-weight").is_some() && self.get("weight").is_none() {
                    return Err(usage(format!(
                        "{}'s --grad-weight needs --weight, the forward's weight",
                        self.op.name
                    )));
                }
                let kind = if self.op.name == "layer_norm_backward" { NormKind::LayerNorm } else { NormKind::RmsNorm };
                Kernel::NormBackward(kind)
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

    /// A norm forward, with `--eps` (PyTorch's layer_norm default, 1e-5, or 1e-6 for RMSNorm).
    fn norm(&self, kind: NormKind, residual: bool) -> Result<Kernel, Failure> {
        let eps = match self.get("eps") {
            None if kind == NormKind::LayerNorm => 1e-5,
            None => 1e-6,
            Some(value) => match value.parse::<f32>() {
                Ok(eps) if eps.is_finite() && eps >= 0.0 => eps,
                _ => return Err(usage(format!("--eps must be a finite number >= 0, not {value:?}"))),
            },
        };
        Ok(Kernel::Norm { kind, residual, eps })
    }

    /// `--normalized-shape`, if given, must be the last dimension of `shape` (`N`, `[N]` or
    /// `(N,)`): the norms normalize the last axis only.
    fn check_normalized_shape(&self, shape: &[usize]) -> Result<(), Failure> {
        let Some(value) = self.get("normalized-shape") else {
            return Ok(());
        };
        let dims: Vec<&str> =
            value.trim_matches(|c| matches!(c, '[' | ']' | '(' | ')')).split(',').map(str::trim).collect();
        let dims: Vec<&str> = dims.into_iter().filter(|d| !d.is_empty()).collect();
        let Ok(dims) = dims.iter().map(|d| d.parse::<usize>()).collect::<Result<Vec<_>, _>>() else {
            return Err(usage(format!(
                "--normalized-shape must be a list of sizes like 4096 or [4096], not {value:?}"
            )));
        };
        match (dims.as_slice(), shape.last()) {
            ([n], Some(last)) if n == last => Ok(()),
            (_, Some(last)) => Err(usage(format!(
                "--normalized-shape {value} does not fit --input of shape {shape:?}: rill normalizes the last axis \
                 only, so it must be [{last}]"
            ))),
            (_, None) => Err(usage(format!("{} needs an --input of at least one dimension", self.op.name))),
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
    Norm { kind: NormKind, residual: bool, eps: f32 },
    NormBackward(NormKind),
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
    /// Further outputs (a norm's statistics, sum and parameter gradients): the flag naming
    /// the file, the shape and the data.
    extra: Vec<(&'static str, Vec<usize>, NpyData)>,
}

/// The flags naming further output files, written when given.
const EXTRA_OUTPUTS: &[&str] = &["output-mean", "output-rstd", "output-sum", "grad-weight", "grad-bias"];

fn run(invocation: &Invocation, verbose: bool) -> Result<(), Failure> {
    let kernel = invocation.kernel()?;
    let dim = invocation.dim()?;
    let mut inputs = Vec::new();
    let optional = OPTIONAL_FILES.iter().filter(|(flag, _)| invocation.get(flag).is_some());
    for &(flag, holds) in invocation.op.files.iter().chain(optional) {
        let path = invocation.get(flag).unwrap_or_default();
        let array = npy::read(path.as_ref())?;
        inputs.push(Input { flag, holds, path: path.to_string(), array });
    }
    let dtype = check_dtypes(invocation.op, &inputs)?;
    softmax::check_last_dim(dim, inputs[0].array.shape.len()).map_err(|err| match err {
        rill::Error::InvalidInput(message) => usage(message),
        other => other.into(),
    })?;
    invocation.check_normalized_shape(&inputs[0].array.shape)?;
    let extra: Vec<&'static str> =
        EXTRA_OUTPUTS.iter().copied().filter(|flag| invocation.get(flag).is_some()).collect();

    let gpu = Gpu::new(0).map_err(|err| Failure::Runtime(format!("no CUDA device: {err}")))?;
    let ran = match dtype {
        Dtype::F32 => execute::<f32>(&gpu, kernel, &inputs, &extra)?,
        Dtype::F16 => execute::<f16>(&gpu, kernel, &inputs, &extra)?,
    };
    if verbose {
        eprintln!("{} on {}: {}", invocation.op.name, gpu.info().name, ran.how);
    }
    npy::write(&invocation.output, &ran.shape, ran.data.as_ref())?;
    for (flag, shape, data) in &ran.extra {
        npy::write(invocation.get(flag).unwrap_or_default().as_ref(), shape, data.as_ref())?;
    }
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
            (Holds::Indices, NpyData::I64(_))
            | (Holds::Float32, NpyData::F32(_))
            | (Holds::Param, NpyData::F32(_) | NpyData::F16(_)) => {}
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
            (Holds::Param, _) => {
                return Err(wrong(
                    input,
                    &format!("{}'s --{} must be float32 or --input's dtype", op.name, input.flag),
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
    // A norm's weight and bias: float32 or the element type, both the same.
    let params: Vec<&Input> = inputs.iter().filter(|input| input.holds == Holds::Param).collect();
    for input in &params {
        if matches!(input.array.data, NpyData::F16(_)) && dtype != Dtype::F16 {
            return Err(Failure::Runtime(format!(
                "--{} {} is float16 but --{} {} is {}; {}'s weight and bias must be float32 or --input's dtype",
                input.flag,
                input.path,
                first.flag,
                first.path,
                first.array.data.dtype_name(),
                op.name
            )));
        }
    }
    if let [weight, bias] = params.as_slice()
        && weight.array.data.dtype_name() != bias.array.data.dtype_name()
    {
        return Err(Failure::Runtime(format!(
            "--{} {} is {} but --{} {} is {}; give the weight and bias the same dtype",
            bias.flag,
            bias.path,
            bias.array.data.dtype_name(),
            weight.flag,
            weight.path,
            weight.array.data.dtype_name()
        )));
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
    inputs.iter().filter(|input| input.holds == holds).map(|input| upload_input(gpu, input)).collect()
}

/// The input given with `--flag`, if any, copied to the device as a tensor of `U`.
fn upload_flag<U: NpyElement>(gpu: &Gpu, inputs: &[Input], flag: &str) -> rill::Result<Option<Tensor<U>>> {
    inputs.iter().find(|input| input.flag == flag).map(|input| upload_input(gpu, input)).transpose()
}

fn upload_input<U: NpyElement>(gpu: &Gpu, input: &Input) -> rill::Result<Tensor<U>> {
    match U::slice(&input.array.data) {
        Some(values) => Tensor::<U>::from_slice(gpu, values, &input.array.shape),
        None => Err(rill::Error::InvalidInput(format!("--{} {} is not {}", input.flag, input.path, U::DTYPE.name()))),
    }
}

/// Runs `kernel` on `inputs` (float ones of element type `T`) and returns the output; `extra`
/// names the further outputs asked for.
fn execute<T: NpyElement>(gpu: &Gpu, kernel: Kernel, inputs: &[Input], extra: &[&str]) -> rill::Result<Ran> {
    if matches!(kernel, Kernel::Norm { .. } | Kernel::NormBackward(_)) {
        // The weight and bias are float32 or T (checked), so f16 ones mean T is f16.
        let f16_params =
            inputs.iter().any(|input| input.holds == Holds::Param && input.array.data.dtype_name() == "float16");
        return if f16_params {
            execute_norm::<T, f16>(gpu, kernel, inputs, extra)
        } else {
            execute_norm::<T, f32>(gpu, kernel, inputs, extra)
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
    kernel: Kernel,
    inputs: &[Input],
    extra: &[&str],
) -> rill::Result<Ran> {
    let wants = |flag: &str| extra.contains(&flag);
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
    let (plan, y): (Plan, Tensor<T>) = match kernel {
        Kernel::Norm { kind, residual, eps } => {
            let bias = upload_flag::<G>(gpu, inputs, "bias")?;
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
                (None, Some(bias)) => norm.forward(&stream, kind, eps, call.bias(bias))?,
                (None, None) => norm.forward(&stream, kind, eps, call)?,
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
                    // No weight: its gradient was refused when parsing (the scratch one aside);
                    // dbias is float32.
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
    let params = if extra.iter().any(|flag| flag.starts_with("grad-")) {
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
