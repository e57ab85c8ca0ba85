//! Puts the device crate's PTX (one file per module) into OUT_DIR, where `module.rs` embeds it:
//! unpacked from the shipped, compressed files in `kernels/` (any toolchain, no CUDA toolkit),
//! or, where `RILL_BUILD_KERNELS` asks (this workspace's `.cargo/config.toml` does), built from
//! the device crate's source with the pinned nightly. `RILL_KERNELS_BUILT_FOR` tells the crate's
//! tests which (the arch built from source, or empty for the shipped kernels) and
//! `RILL_KERNELS_SHIPPED_ARCH` the shipped kernels' arch.

use rill_builder::{BUILD_KERNELS_ENV, DEFAULT_ARCH, Module, shipped_file};
use std::io::Read;
use std::path::{Path, PathBuf};

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo::rerun-if-env-changed={BUILD_KERNELS_ENV}");
    println!("cargo::rerun-if-env-changed=RILL_PTX_ARCH");
    // The ladder's module only where the `norm-ladder` feature embeds it.
    let ladder = std::env::var_os("CARGO_FEATURE_NORM_LADDER").is_some();
    let modules: Vec<Module> =
        Module::ALL.into_iter().filter(|&module| ladder || module != Module::NormLadder).collect();
    println!("cargo::rustc-env=RILL_KERNELS_SHIPPED_ARCH={DEFAULT_ARCH}");
    let from_source = std::env::var(BUILD_KERNELS_ENV).is_ok_and(|value| !value.is_empty() && value != "0");
    let result = if from_source {
        let arch = std::env::var("RILL_PTX_ARCH").unwrap_or_else(|_| DEFAULT_ARCH.to_string());
        println!("cargo::rustc-env=RILL_KERNELS_BUILT_FOR={arch}");
        build(&manifest_dir.join("..").join("kernels-gpu"), out_dir, arch, modules)
    } else {
        println!("cargo::rustc-env=RILL_KERNELS_BUILT_FOR=");
        unpack(&manifest_dir.join("kernels"), &out_dir, &modules)
    };
    if let Err(error) = result {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}

fn build(crate_dir: &Path, out_dir: PathBuf, arch: String, modules: Vec<Module>) -> Result<(), String> {
    if !crate_dir.join("Cargo.toml").is_file() {
        return Err(format!(
            "{BUILD_KERNELS_ENV} asks to build the kernels from source, which needs rill's repository (no {} here); \
             unset it to use the shipped kernels",
            crate_dir.display()
        ));
    }
    println!("cargo::rerun-if-changed={}", crate_dir.join("src").display());
    println!("cargo::rerun-if-changed={}", crate_dir.join("Cargo.toml").display());
    let build = rill_builder::PtxBuild {
        crate_dir: crate_dir.to_path_buf(),
        target_dir: out_dir.join("ptx-target"),
        out_dir,
        arch,
        modules,
    };
    build.run().map(drop).map_err(|error| error.to_string())
}

/// Decompresses each module's shipped PTX into `out_dir`.
fn unpack(shipped: &Path, out_dir: &Path, modules: &[Module]) -> Result<(), String> {
    for &module in modules {
        let from = shipped.join(shipped_file(module));
        println!("cargo::rerun-if-changed={}", from.display());
        let compressed = std::fs::read(&from).map_err(|e| format!("{}: {e}", from.display()))?;
        let mut ptx = Vec::new();
        ruzstd::decoding::StreamingDecoder::new(compressed.as_slice())
            .map_err(|e| e.to_string())
            .and_then(|mut decoder| decoder.read_to_end(&mut ptx).map_err(|e| e.to_string()))
            .map_err(|e| format!("{}: not a zstd stream: {e}", from.display()))?;
        let to = out_dir.join(format!("{}.ptx", module.name()));
        std::fs::write(&to, ptx).map_err(|e| format!("{}: {e}", to.display()))?;
    }
    Ok(())
}
