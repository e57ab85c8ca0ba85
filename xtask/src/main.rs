//! Developer tasks: `cargo xtask <task>`.
//!
//! - `build-ptx [--arch sm_XY] [--out DIR]`: builds every PTX module (default sm_80,
//!   into `target/ptx/<arch>/`).
//! - `gpu-bundle [--out DIR]`: builds the release GPU test suite, benchmark and runner and
//!   copies the executables into one folder (default `.gpu/`) to run on a GPU machine.
//! - `bench [ARGS]`: builds and runs the benchmark (`rill-bench`, see its docs for ARGS);
//!   without a GPU it says "no CUDA device" and succeeds.

use std::path::{Path, PathBuf};
use std::process::{Command, exit};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("build-ptx") => build_ptx(&args[1..]),
        Some("gpu-bundle") => gpu_bundle(&args[1..]),
        Some("bench") => bench(&args[1..]),
        _ => Err("usage: cargo xtask build-ptx [--arch sm_XY] [--out DIR] | gpu-bundle [--out DIR] | bench [ARGS]"
            .to_string()),
    };
    if let Err(message) = result {
        eprintln!("error: {message}");
        exit(1);
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// The value after `flag` in `args`, if any.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Result<Option<&'a str>, String> {
    match args.iter().position(|a| a == flag) {
        Some(i) => args.get(i + 1).map(|v| Some(v.as_str())).ok_or(format!("{flag} needs a value")),
        None => Ok(None),
    }
}

fn build_ptx(args: &[String]) -> Result<(), String> {
    let root = workspace_root();
    let arch = flag_value(args, "--arch")?.unwrap_or(rill_builder::DEFAULT_ARCH).to_string();
    let out_dir = flag_value(args, "--out")?.map_or_else(|| root.join("target").join("ptx").join(&arch), PathBuf::from);
    let build = rill_builder::PtxBuild {
        crate_dir: root.join("kernels-gpu"),
        target_dir: root.join("target").join("ptx-build"),
        out_dir,
        arch,
        modules: rill_builder::Module::ALL.to_vec(),
    };
    for path in build.run().map_err(|e| e.to_string())? {
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn cargo(root: &Path, args: &[&str]) -> Result<String, String> {
    let output = Command::new(env!("CARGO"))
        .current_dir(root)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("could not run cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("`cargo {}` failed", args.join(" ")));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn gpu_bundle(args: &[String]) -> Result<(), String> {
    let root = workspace_root();
    let out = flag_value(args, "--out")?.map_or_else(|| root.join(".gpu"), PathBuf::from);
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;

    // Test executables: cargo names them in its JSON messages ("executable": "...").
    let messages = cargo(&root, &["test", "--release", "--no-run", "-p", "rill-tests", "--message-format=json"])?;
    let mut executables: Vec<PathBuf> = messages
        .lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\"") && l.contains("\"kind\":[\"test\"]"))
        .filter_map(|l| l.split("\"executable\":\"").nth(1)?.split('"').next().map(PathBuf::from))
        .collect();
    cargo(&root, &["build", "--release", "-p", "rill-benches", "-p", "rill-cli"])?;
    executables.extend(["rill-bench", "rill"].map(|name| root.join("target/release").join(name)));
    for exe in executables {
        let name = exe.file_name().and_then(|n| n.to_str()).ok_or("odd executable name")?;
        // Test binaries carry a hash suffix: `gpu-0123abcd` -> `gpu`.
        let short = name.rsplit_once('-').filter(|(_, h)| h.len() == 16).map_or(name, |(n, _)| n);
        std::fs::copy(&exe, out.join(short)).map_err(|e| format!("{}: {e}", exe.display()))?;
        println!("bundled {short}");
    }
    Ok(())
}

fn bench(args: &[String]) -> Result<(), String> {
    let status = Command::new(env!("CARGO"))
        .current_dir(workspace_root())
        .args(["run", "--release", "--quiet", "-p", "rill-benches", "--bin", "rill-bench", "--"])
        .args(args)
        .status()
        .map_err(|e| format!("could not run cargo: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("rill-bench failed ({status})")) }
}
