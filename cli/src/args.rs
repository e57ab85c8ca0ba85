//! The command line: `rill run <op>` with one subcommand per op (declared by its family in
//! `ops/`), whose flags are named after the op's arguments in PyTorch. Values are checked
//! here as far as they can be without reading the files.

use crate::ops::Op;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// What `rill run --help` adds after the ops, wrapped by hand (clap wraps only with a terminal
/// size crate). An op whose output differs from --input says so in its own help, so that
/// adding one touches only its family's module.
const RUN_NOTES: &str = "\
Float inputs must all be float32 or all float16 ('<f4' or '<f2' .npy files); the output has
the shape and dtype of --input unless the op's help (rill run <op> --help) says otherwise.
bfloat16 cannot be stored in a .npy file, so it is not offered.";

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

/// A file name: an empty one is a mistake (an unset shell variable), not a file.
pub fn file(value: &str) -> Result<PathBuf, String> {
    if value.is_empty() { Err("needs a non-empty file name".into()) } else { Ok(PathBuf::from(value)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{parse, rejected};
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    #[test]
    fn the_command_is_well_formed() {
        Cli::command().debug_assert();
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
        assert_eq!(rejected("run relu --input x --output y --dim -1"), ErrorKind::UnknownArgument);
        assert_eq!(rejected("run relu --input x --output y stray"), ErrorKind::UnknownArgument);
        assert_eq!(rejected("run relu --input x --input z --output y"), ErrorKind::ArgumentConflict);
        assert_eq!(rejected("run relu --input --output y"), ErrorKind::InvalidValue);
        assert_eq!(rejected("run relu --input= --output y"), ErrorKind::ValueValidation);
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
}
