//! Puts the device crate's PTX (one file per module) and its machine code for the shipped
//! archs into OUT_DIR, where `module.rs` embeds them: unpacked from the shipped, compressed
//! files in `kernels/` (any toolchain, no CUDA toolkit), or, where `RILL_BUILD_KERNELS` asks
//! (this workspace's `.cargo/config.toml` does), the PTX built from the device crate's source
//! with the pinned nightly, and the shipped machine code where the shipped PTX is that PTX
//! (else none: an empty file, and the driver compiles the PTX). `RILL_STALE_SHIPPED_KERNELS`
//! names, for the crate's tests, the modules whose shipped PTX a build from source for the
//! shipped arch found to differ.

use rill_builder::{
    BUILD_KERNELS_ENV, DEFAULT_ARCH, Module, cubin_archs, cubin_file, ptx_file, shipped_cubin, shipped_file,
};
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
    let from_source = std::env::var(BUILD_KERNELS_ENV).is_ok_and(|value| !value.is_empty() && value != "0");
    let shipped = manifest_dir.join("kernels");
    let result = if from_source {
        let arch = std::env::var("RILL_PTX_ARCH").unwrap_or_else(|_| DEFAULT_ARCH.to_string());
        build(&manifest_dir.join("..").join("kernels-gpu"), out_dir.clone(), &arch, &modules)
            .and_then(|()| unpack_cubins_of_shipped_ptx(&shipped, &out_dir, &modules))
            // Only a build for the shipped arch can build the shipped PTX.
            .map(|stale| if arch == DEFAULT_ARCH { stale } else { Vec::new() })
    } else {
        unpack_all(&shipped, &out_dir, &modules).map(|()| Vec::new())
    };
    match result {
        Ok(stale) => println!("cargo::rustc-env=RILL_STALE_SHIPPED_KERNELS={}", stale.join(" ")),
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(1);
        }
    }
}

fn build(crate_dir: &Path, out_dir: PathBuf, arch: &str, modules: &[Module]) -> Result<(), String> {
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
        arch: arch.to_string(),
        modules: modules.to_vec(),
    };
    build.run().map(drop).map_err(|error| error.to_string())
}

/// Decompresses each module's shipped PTX and machine code into `out_dir`.
fn unpack_all(shipped: &Path, out_dir: &Path, modules: &[Module]) -> Result<(), String> {
    for &module in modules {
        write(&out_dir.join(ptx_file(module)), &unpack(&shipped.join(shipped_file(module)))?)?;
        unpack_cubins(shipped, out_dir, module, true)?;
    }
    Ok(())
}

/// Decompresses the shipped machine code of each module whose shipped PTX is the one built
/// in `out_dir`; for the others writes empty files (none), and says so. Returns the others.
fn unpack_cubins_of_shipped_ptx(
    shipped: &Path,
    out_dir: &Path,
    modules: &[Module],
) -> Result<Vec<&'static str>, String> {
    let mut stale = Vec::new();
    for &module in modules {
        let built = std::fs::read(out_dir.join(ptx_file(module))).map_err(|e| e.to_string())?;
        let current = unpack(&shipped.join(shipped_file(module))).is_ok_and(|ptx| ptx == built);
        if !current {
            println!(
                "cargo::warning=the shipped {} kernels are not this source's: the driver compiles its PTX on first \
                 use (`cargo xtask ship-kernels` ships them anew)",
                module.name()
            );
            stale.push(module.name());
        }
        unpack_cubins(shipped, out_dir, module, current)?;
    }
    Ok(stale)
}

/// Writes `module`'s machine code for each arch it ships for into `out_dir`: the shipped
/// cubins where `current`, else empty files (none).
fn unpack_cubins(shipped: &Path, out_dir: &Path, module: Module, current: bool) -> Result<(), String> {
    for arch in cubin_archs(module) {
        let cubin = match current {
            true => unpack(&shipped.join(shipped_cubin(module, arch)))?,
            false => Vec::new(),
        };
        write(&out_dir.join(cubin_file(module, arch)), &cubin)?;
    }
    Ok(())
}

/// The bytes of zstd-compressed `file`.
fn unpack(file: &Path) -> Result<Vec<u8>, String> {
    println!("cargo::rerun-if-changed={}", file.display());
    let compressed = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut bytes = Vec::new();
    ruzstd::decoding::StreamingDecoder::new(compressed.as_slice())
        .map_err(|e| e.to_string())
        .and_then(|mut decoder| decoder.read_to_end(&mut bytes).map_err(|e| e.to_string()))
        .map_err(|e| format!("{}: not a zstd stream: {e}", file.display()))?;
    Ok(bytes)
}

fn write(file: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(file, bytes).map_err(|e| format!("{}: {e}", file.display()))
}
