//! Running an op: the files its invocation names are read and checked, the op's library call
//! runs on the GPU, and the results are written.

use crate::args::Io;
use crate::npy::{self, NpyArray, NpyData};
use crate::ops::Op;
use crate::ops::norm::NormalizedShape;
use half::f16;
use rill::{Element, Gpu, Stream, Tensor, softmax};
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

/// A float dtype a `.npy` file can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
}

/// What an input file must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holds {
    /// float32 or float16, the same for every such file of a call: the op's element type.
    Float,
    /// int64 class indices (`int32` files are widened when read).
    Indices,
    /// float32 whatever the op's element type (per-row loss gradients, a norm's statistics).
    Float32,
    /// float32 or the op's element type (a norm's weight and bias); does not set the
    /// element type.
    Param,
    /// int32: a 1-bit mask's words, as a forward's `--output-mask` wrote them.
    Mask,
}

/// An op's command line as the runner uses it: the files to read with what each must hold,
/// and the files to write. Flags are named without their leading `--`.
#[derive(Debug)]
pub struct Invocation<'a> {
    pub name: &'static str,
    /// `(flag, holds, path)` of every input file given, `input` first.
    pub files: Vec<(&'static str, Holds, &'a Path)>,
    output: &'a Path,
    /// `(flag, path)` of the further outputs asked for (a norm's statistics, sum and parameter
    /// gradients).
    pub extra_outputs: Vec<(&'static str, &'a Path)>,
    /// The axis the op works along, which must be the last.
    dim: i64,
    normalized_shape: Option<&'a NormalizedShape>,
    /// Why the flags given do not go together, saying what to change: a usage error before
    /// any file is read.
    misuse: Option<String>,
}

impl<'a> Invocation<'a> {
    pub fn new(name: &'static str, io: &'a Io) -> Self {
        Invocation {
            name,
            files: vec![("input", Holds::Float, &io.input)],
            output: &io.output,
            extra_outputs: Vec::new(),
            dim: -1,
            normalized_shape: None,
            misuse: None,
        }
    }

    pub fn file(mut self, flag: &'static str, holds: Holds, path: &'a Path) -> Self {
        self.files.push((flag, holds, path));
        self
    }

    pub fn optional_file(mut self, flag: &'static str, holds: Holds, path: &'a Option<PathBuf>) -> Self {
        self.files.extend(path.as_deref().map(|path| (flag, holds, path)));
        self
    }

    pub fn extra_output(mut self, flag: &'static str, path: &'a Option<PathBuf>) -> Self {
        self.extra_outputs.extend(path.as_deref().map(|path| (flag, path)));
        self
    }

    pub fn dim(self, dim: i64) -> Self {
        Invocation { dim, ..self }
    }

    pub fn normalized_shape(self, normalized_shape: Option<&'a NormalizedShape>) -> Self {
        Invocation { normalized_shape, ..self }
    }

    pub fn misuse(self, misuse: Option<String>) -> Self {
        Invocation { misuse, ..self }
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
pub struct Ran {
    pub shape: Vec<usize>,
    pub data: NpyData,
    pub how: String,
    /// Further outputs (a norm's statistics, sum and parameter gradients): the flag naming
    /// the file, the shape and the data.
    pub extra: Vec<(&'static str, Vec<usize>, NpyData)>,
}

/// What an op's library call runs with: the GPU, a stream on it and the input files read.
pub struct Context<'a> {
    pub gpu: &'a Gpu,
    pub stream: Stream,
    inputs: &'a [Input<'a>],
    invocation: &'a Invocation<'a>,
}

impl Context<'_> {
    /// The input given with `--flag`, if any, copied to the device as a tensor of `U`.
    pub fn optional<U: NpyElement>(&self, flag: &str) -> rill::Result<Option<Tensor<U>>> {
        self.inputs.iter().find(|input| input.flag == flag).map(|input| upload(self.gpu, input)).transpose()
    }

    /// The input given with `--flag`, copied to the device as a tensor of `U`.
    pub fn tensor<U: NpyElement>(&self, flag: &str) -> rill::Result<Tensor<U>> {
        self.optional(flag)?.ok_or_else(|| rill::Error::InvalidInput(format!("--{flag} is missing")))
    }

    /// The mask given with `--flag`, if any, copied to the device as its `u32` words.
    pub fn mask(&self, flag: &str) -> rill::Result<Option<Tensor<u32>>> {
        let Some(input) = self.inputs.iter().find(|input| input.flag == flag) else { return Ok(None) };
        let words = input.array.data.words();
        let words = words.ok_or_else(|| rill::Error::InvalidInput(format!("--{flag} is not int32")))?;
        Tensor::from_slice(self.gpu, &words, &input.array.shape).map(Some)
    }

    /// Whether the input given with `--flag` is float16.
    pub fn is_f16(&self, flag: &str) -> bool {
        self.inputs.iter().any(|input| input.flag == flag && matches!(input.array.data, NpyData::F16(_)))
    }

    /// Whether the further output `--flag` was asked for.
    pub fn wants(&self, flag: &str) -> bool {
        self.invocation.extra_outputs.iter().any(|(f, _)| *f == flag)
    }

    /// Runs `kernel`, which writes a zeroed output of `shape` and says how it ran, waits for it
    /// and copies the output back.
    pub fn compute<U: NpyElement>(
        &self,
        shape: &[usize],
        kernel: impl FnOnce(&Stream, &mut Tensor<U>) -> rill::Result<String>,
    ) -> rill::Result<Ran> {
        let mut out = Tensor::<U>::zeros(self.gpu, shape)?;
        let how = kernel(&self.stream, &mut out)?;
        self.stream.synchronize()?;
        Ok(Ran { shape: shape.to_vec(), data: U::wrap(out.to_vec()?), how, extra: Vec::new() })
    }
}

pub fn run(op: &Op, verbose: bool) -> Result<(), Failure> {
    let invocation = op.invocation();
    if let Some(misuse) = &invocation.misuse {
        return Err(Failure::Usage(misuse.clone()));
    }
    let mut inputs = Vec::new();
    for &(flag, holds, path) in &invocation.files {
        let mut array = npy::read(path).map_err(Failure::Runtime)?;
        if holds == Holds::Indices {
            array.data = array.data.widened();
        }
        inputs.push(Input { flag, holds, path, array });
    }
    let dtype = check_dtypes(invocation.name, &inputs)?;
    let shape = &inputs[0].array.shape;
    softmax::check_last_dim(invocation.dim, shape.len()).map_err(|err| match err {
        rill::Error::InvalidInput(message) => Failure::Usage(message),
        other => other.into(),
    })?;
    if let Some(normalized_shape) = invocation.normalized_shape {
        normalized_shape.check(invocation.name, shape)?;
    }

    let gpu = Gpu::new(0).map_err(no_device)?;
    let cx = Context { gpu: &gpu, stream: gpu.stream()?, inputs: &inputs, invocation: &invocation };
    let ran = match dtype {
        Dtype::F32 => op.execute::<f32>(&cx)?,
        Dtype::F16 => op.execute::<f16>(&cx)?,
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

/// The element type of the float inputs, which must all share it, after checking that every
/// other input holds what it must; errors name the file.
fn check_dtypes(op: &str, inputs: &[Input]) -> Result<Dtype, Failure> {
    let dtype_of = |input: &Input| input.array.data.dtype_name();
    let is_f16 = |input: &Input| matches!(input.array.data, NpyData::F16(_));
    let describe = |input: &Input| format!("--{} {} is {}", input.flag, input.path.display(), dtype_of(input));
    let mismatch = |input: &Input, other: &Input, advice: &str| {
        Failure::Runtime(format!("{} but {}; {advice}", describe(input), describe(other)))
    };
    for input in inputs {
        let flag = input.flag;
        let want = match (input.holds, &input.array.data) {
            (Holds::Float | Holds::Param, NpyData::F32(_) | NpyData::F16(_))
            | (Holds::Indices, NpyData::I64(_))
            | (Holds::Float32, NpyData::F32(_))
            | (Holds::Mask, NpyData::I32(_)) => continue,
            (Holds::Float, _) => "rill ops take float32 or float16 arrays".to_string(),
            (Holds::Indices, _) => format!("{op}'s --{flag} must hold int64 class indices ('<i8' .npy)"),
            (Holds::Float32, _) => format!("{op}'s --{flag} must be float32, whatever the dtype of --input"),
            (Holds::Param, _) => format!("{op}'s --{flag} must be float32 or --input's dtype"),
            (Holds::Mask, _) => format!("{op}'s --{flag} must hold the int32 words that --output-mask wrote"),
        };
        return Err(Failure::Runtime(format!("{}; {want}", describe(input))));
    }
    let mut floats = inputs.iter().filter(|input| input.holds == Holds::Float);
    let first = floats.next().ok_or(Failure::Usage("no input files".into()))?;
    if let Some(other) = floats.find(|input| dtype_of(input) != dtype_of(first)) {
        return Err(mismatch(other, first, "convert one with `rill run to --dtype ...`"));
    }
    // A norm's weight and bias: float32 or the element type, both the same.
    let params: Vec<&Input> = inputs.iter().filter(|input| input.holds == Holds::Param).collect();
    if let Some(param) = params.iter().find(|param| is_f16(param) && !is_f16(first)) {
        return Err(mismatch(param, first, &format!("{op}'s weight and bias must be float32 or --input's dtype")));
    }
    if let [weight, bias] = params.as_slice()
        && dtype_of(weight) != dtype_of(bias)
    {
        return Err(mismatch(bias, weight, "give the weight and bias the same dtype"));
    }
    Ok(if is_f16(first) { Dtype::F16 } else { Dtype::F32 })
}

/// An element type that has a `.npy` dtype.
pub trait NpyElement: Element {
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

/// `input` copied to the device as a tensor of `U`.
fn upload<U: NpyElement>(gpu: &Gpu, input: &Input) -> rill::Result<Tensor<U>> {
    let path = input.path.display();
    let wrong = || rill::Error::InvalidInput(format!("--{} {path} is not {}", input.flag, U::DTYPE.name()));
    Tensor::from_slice(gpu, U::slice(&input.array.data).ok_or_else(wrong)?, &input.array.shape)
}

#[cfg(test)]
mod tests {
    use crate::npy::NpyData;
    use crate::testing::{Files, runtime};

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
    fn unreadable_files_are_named() {
        let files = Files::new("missing");
        let missing = files.0.join("missing.npy");
        let message = runtime(files.failure(&format!("sigmoid --input {}", missing.display())));
        assert!(message.contains("missing.npy"), "{message}");
    }
}
