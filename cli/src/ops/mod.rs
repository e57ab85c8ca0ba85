//! The ops, one module per family, each declaring its ops' subcommands and how they run, so
//! that adding an op to a family touches its module alone.

mod batch_norm;
mod elementwise;
pub mod norm;
mod softmax;

use crate::run::{Context, Invocation, NpyElement, Ran};
use clap::Subcommand;
use rill::Tensor;

/// The ops, named as in PyTorch.
#[derive(Subcommand, Debug)]
pub enum Op {
    #[command(flatten)]
    Elementwise(elementwise::Op),
    #[command(flatten)]
    Softmax(softmax::Op),
    #[command(flatten)]
    Norm(norm::Op),
    #[command(flatten)]
    BatchNorm(batch_norm::Op),
}

impl Op {
    /// The invocation this op's arguments make.
    pub fn invocation(&self) -> Invocation<'_> {
        match self {
            Op::Elementwise(op) => op.invocation(),
            Op::Softmax(op) => op.invocation(),
            Op::Norm(op) => op.invocation(),
            Op::BatchNorm(op) => op.invocation(),
        }
    }

    /// Runs the op's library call on inputs whose float element type is `T`.
    pub fn execute<T: NpyElement>(&self, cx: &Context) -> rill::Result<Ran> {
        match self {
            Op::Elementwise(op) => op.execute::<T>(cx),
            Op::Softmax(op) => op.execute::<T>(cx),
            Op::Norm(op) => op.execute::<T>(cx),
            Op::BatchNorm(op) => op.execute::<T>(cx),
        }
    }
}

/// `--eps`, added to a norm's variance: a negative or infinite one would give NaN or zeros.
fn eps(value: &str) -> Result<f32, String> {
    match value.parse::<f32>() {
        Ok(eps) if eps.is_finite() && eps >= 0.0 => Ok(eps),
        _ => Err("must be a finite number >= 0".into()),
    }
}

/// A further output's `(flag, shape, data)`.
type Extra = (&'static str, Vec<usize>, crate::npy::NpyData);

/// `call` with `part` added by `add`, if there is a part: the builders' optional parts.
fn with<C, P>(call: C, part: Option<P>, add: impl FnOnce(C, P) -> C) -> C {
    match part {
        Some(part) => add(call, part),
        None => call,
    }
}

/// `(flag, shape, data)` of a further output, if it was computed (the stream synchronized).
fn extra_output<U: NpyElement>(flag: &'static str, tensor: Option<Tensor<U>>) -> rill::Result<Option<Extra>> {
    tensor.map(|t| Ok((flag, t.shape().to_vec(), U::wrap(t.to_vec()?)))).transpose()
}

#[cfg(test)]
mod tests {
    use crate::args::{Cli, Command};
    use clap::{CommandFactory, Parser};

    #[test]
    fn every_op_is_invoked_under_its_own_name() {
        let cli = Cli::command();
        let run = cli.find_subcommand("run").expect("a run command");
        let ops: Vec<&clap::Command> = run.get_subcommands().filter(|op| op.get_name() != "help").collect();
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
}
