//! What the tests of the command line and of every op family share: parsing a command line,
//! and running one on `.npy` files up to where it would need a GPU.

use crate::args::{Cli, Command};
use crate::npy::{self, NpyData};
use crate::ops::Op;
use crate::run::{Failure, run};
use clap::error::ErrorKind;
use clap::{Parser, Subcommand};
use half::f16;
use std::path::PathBuf;

pub fn parse(args: &str) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("rill").chain(args.split_whitespace()))
}

pub fn op(args: &str) -> Op {
    match parse(args) {
        Ok(Cli { command: Command::Run { op }, .. }) => *op,
        other => panic!("`{args}` did not parse as an op: {other:?}"),
    }
}

/// The kind of error `args` gives, after checking that it exits 2 as bad arguments must.
pub fn rejected(args: &str) -> ErrorKind {
    let err = parse(args).expect_err(&format!("`{args}` was accepted"));
    assert_eq!(err.exit_code(), 2, "`{args}`: {err}");
    err.kind()
}

/// The names of a family's ops, in the order `rill run --help` lists them.
pub fn names<F: Subcommand>() -> Vec<String> {
    F::augment_subcommands(clap::Command::new("family")).get_subcommands().map(|op| op.get_name().into()).collect()
}

/// The input files and further outputs that `args` (after `rill run`, with `--output` added)
/// name.
pub fn selected(args: &str) -> (Vec<&'static str>, Vec<&'static str>) {
    let op = op(&format!("run {args} --output y"));
    let invocation = op.invocation();
    let files = invocation.files.iter().map(|(flag, ..)| *flag).collect();
    (files, invocation.extra_outputs.iter().map(|(flag, _)| *flag).collect())
}

/// A folder of `.npy` files for one test, removed when dropped.
pub struct Files(pub PathBuf);

impl Files {
    pub fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("rill-cli-run-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Files(dir)
    }

    pub fn write(&self, name: &str, shape: &[usize], data: NpyData) -> String {
        let path = self.0.join(name);
        npy::write(&path, shape, &data).unwrap();
        path.to_string_lossy().into_owned()
    }

    pub fn f32(&self, name: &str, shape: &[usize]) -> String {
        self.write(name, shape, NpyData::F32(vec![0.5; shape.iter().product()]))
    }

    pub fn f16(&self, name: &str, shape: &[usize]) -> String {
        self.write(name, shape, NpyData::F16(vec![f16::ONE; shape.iter().product()]))
    }

    /// What running `args` (after `rill run`, with `--output` added) fails with before it
    /// needs a GPU.
    pub fn failure(&self, args: &str) -> Failure {
        let output = self.0.join("out.npy");
        let args = format!("run {args} --output {}", output.display());
        run(&op(&args), false).expect_err(&args)
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn usage(failure: Failure) -> String {
    let Failure::Usage(message) = failure else { panic!("expected a usage failure, got {failure:?}") };
    message
}

pub fn runtime(failure: Failure) -> String {
    let Failure::Runtime(message) = failure else { panic!("expected a runtime failure, got {failure:?}") };
    message
}
