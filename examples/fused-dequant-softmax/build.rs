//! Builds the kernel crate (`kernels/`) to PTX into OUT_DIR, with rill's builder.

use std::path::PathBuf;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let kernels = manifest_dir.join("kernels");
    println!("cargo::rerun-if-changed={}", kernels.display());
    // The device crate it instantiates: a change there changes the PTX.
    println!("cargo::rerun-if-changed={}", manifest_dir.join("../../kernels-gpu/src").display());
    let build = rill_builder::FusedPtxBuild {
        crate_dir: kernels,
        target_dir: out_dir.join("ptx-target"),
        out_file: out_dir.join("dequant.ptx"),
        arch: rill_builder::DEFAULT_ARCH.to_string(),
    };
    if let Err(error) = build.run() {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}
