//! `rill`: runs one rill op on the GPU on NumPy `.npy` files.
//!
//! ```text
//! rill run <op> --input x.npy [--other b.npy] [...] --output y.npy [--verbose]
//! rill devices
//! rill help
//! ```
//!
//! Exit status: 0 on success, 1 when the op or the device fails, 2 for bad arguments.

mod args;
mod npy;
mod ops;
mod run;
#[cfg(test)]
mod testing;

use args::{Cli, Command};
use clap::Parser;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use run::Failure;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::try_parse().unwrap_or_else(|err| with_hint(err).exit());
    let (result, usage) = match &cli.command {
        Command::Run { op } => (run::run(op, cli.verbose), format!("rill run {} --help", op.invocation().name)),
        Command::Devices => (run::devices(), "rill help".to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("error: {message}");
            eprintln!("run `{usage}` for usage");
            ExitCode::from(2)
        }
        Err(Failure::Runtime(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}

/// `err` with a tip, in place of clap's guess at a similar name, when the unknown subcommand is
/// another framework's name for an op.
fn with_hint(mut err: clap::Error) -> clap::Error {
    let Some(ContextValue::String(name)) = err.get(ContextKind::InvalidSubcommand) else { return err };
    let Some(hint) = op_hint(name).filter(|_| err.kind() == ErrorKind::InvalidSubcommand) else { return err };
    let mut tips = match err.get(ContextKind::Suggested) {
        Some(ContextValue::StyledStrs(tips)) => tips.clone(),
        _ => Vec::new(),
    };
    tips.push(hint.into());
    err.remove(ContextKind::SuggestedSubcommand);
    err.insert(ContextKind::Suggested, ContextValue::StyledStrs(tips));
    err
}

/// Where to find an op that PyTorch or another library names `name`.
fn op_hint(name: &str) -> Option<&'static str> {
    Some(match name {
        "fma" => "for a * b + c use `addcmul --input c --tensor1 a --tensor2 b`",
        "gelu_tanh" => "use `gelu --approximate tanh`",
        "cast" => "use `to --dtype float32|float16`",
        "_softmax_backward_data" => "use `softmax_backward --input y --grad-output dy`",
        "masked_softmax" => "use `scaled_masked_softmax --scale 1`",
        "causal_softmax" => "use `scaled_causal_softmax --scale 1`",
        "nll_loss" | "cross_entropy_loss" => "use `cross_entropy --input logits --target t`",
        "native_layer_norm" => "use `layer_norm --output-mean m.npy --output-rstd r.npy`",
        "native_layer_norm_backward" => "use `layer_norm_backward --mean m.npy --rstd r.npy`",
        "native_batch_norm" => "use `batch_norm --training --output-mean m.npy --output-invstd s.npy`",
        "native_batch_norm_backward" => "use `batch_norm_backward --save-mean m.npy --save-invstd s.npy`",
        "layernorm" | "rmsnorm" | "fused_add_rms_norm" => {
            "the norms are layer_norm, rms_norm, add_layer_norm and add_rms_norm"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(args: &[&str]) -> String {
        let err = Cli::try_parse_from(args).map(|_| ()).unwrap_err();
        with_hint(err).render().to_string()
    }

    #[test]
    fn other_names_for_ops_get_a_tip() {
        let message = error(&["rill", "run", "fma", "--input", "x"]);
        assert!(message.contains("addcmul --input c --tensor1 a --tensor2 b"), "{message}");
        assert!(!message.contains("similar"), "{message}");
        let message = error(&["rill", "run", "gelu_tanh"]);
        assert!(message.contains("gelu --approximate tanh"), "{message}");
        let message = error(&["rill", "run", "sofmax"]);
        assert!(message.contains("softmax") && !message.contains("tip: use"), "{message}");
    }
}
