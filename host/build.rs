//! Builds the device crate to PTX (one file per module) into OUT_DIR; `module.rs` embeds it.

use rill_builder::Module;
use std::path::PathBuf;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let crate_dir = manifest_dir.join("..").join("kernels-gpu");
    println!("cargo::rerun-if-changed={}", crate_dir.join("src").display());
    println!("cargo::rerun-if-changed={}", crate_dir.join("Cargo.toml").display());
    println!("cargo::rerun-if-env-changed=RILL_PTX_ARCH");

    // The ladder's module only where the `norm-ladder` feature embeds it.
    let ladder = std::env::var_os("CARGO_FEATURE_NORM_LADDER").is_some();
    let build = rill_builder::PtxBuild {
        crate_dir,
        target_dir: out_dir.join("ptx-target"),
        out_dir,
        arch: std::env::var("RILL_PTX_ARCH").unwrap_or_else(|_| rill_builder::DEFAULT_ARCH.to_string()),
        modules: Module::ALL.into_iter().filter(|&module| ladder || module != Module::NormLadder).collect(),
    };
    if let Err(error) = build.run() {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}
