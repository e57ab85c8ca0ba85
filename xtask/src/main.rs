//! Developer tasks: `cargo xtask <task>` (`cargo xtask help` lists them). `gpu-bundle`
//! bundles this executable too, as `xtask`, so that `./xtask sanitize --gpu ./gpu` runs on
//! a GPU machine without a Rust toolchain.

mod sanitize;

use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::{Command, exit};

#[derive(Parser)]
#[command(about = "rill's developer tasks")]
enum Task {
    /// Builds every PTX module (into `target/ptx/<arch>/` unless `--out` says otherwise).
    BuildPtx {
        #[arg(long, default_value = rill_builder::DEFAULT_ARCH)]
        arch: String,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Builds every PTX module for the default arch, compiles each to machine code for the
    /// shipped archs with `ptxas`, and writes them all, zstd-compressed, into `host/kernels/`:
    /// the kernels the host crate ships, which a build outside this workspace unpacks instead
    /// of building them. `--check` writes nothing and fails where a shipped file differs.
    ShipKernels {
        #[arg(long)]
        check: bool,
        /// The `ptxas` to compile with (default: `.cuda/nvcc/bin/ptxas`, which scripts/setup.sh
        /// installs at the version the shipped files were made with, else the one on PATH).
        #[arg(long)]
        ptxas: Option<PathBuf>,
    },
    /// Builds the release GPU test suites, benchmark, runner, this executable and a user's
    /// crate built against the packaged crates (`outside`), and copies them into one folder
    /// (default `.gpu/`) to run on a GPU machine.
    GpuBundle {
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Builds and runs the benchmark (`rill-bench`) with ARGS; without a GPU it says "no CUDA
    /// device" and succeeds.
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Tunes the GPU at hand: times every plan the row planner's knobs give each bucket of
    /// row calls (`rill-bench --tune`) and writes its tuning table to OUT, e.g.
    /// `host/tuning/h100-sxm.table` to check in (then list it in `host/src/ops/rows/tuning.rs`).
    /// From a GPU bundle: `./xtask tune --bench ./rill-bench --out h100.table`.
    #[command(disable_help_flag = true)]
    Tune {
        #[arg(long)]
        out: PathBuf,
        /// A built `rill-bench` to run, instead of building it here.
        #[arg(long)]
        bench: Option<PathBuf>,
        /// More `rill-bench` arguments (`--filter CLASS,..`, `--dtype f32|bf16`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Runs compute-sanitizer's memcheck, racecheck, synccheck and initcheck over a subset of
    /// the GPU suite that launches every kernel; fails on any error or unreached kernel.
    Sanitize(sanitize::Options),
}

fn main() {
    let result = match Task::parse() {
        Task::BuildPtx { arch, out } => build_ptx(arch, out).map(drop),
        Task::ShipKernels { check, ptxas } => ship_kernels(check, ptxas),
        Task::GpuBundle { out } => gpu_bundle(out),
        Task::Bench { args } => bench(&args),
        Task::Tune { out, bench: built, args } => {
            let args = [vec!["--tune".to_string(), out.display().to_string()], args].concat();
            match built {
                Some(built) => run_built(&built, &args),
                None => bench(&args),
            }
        }
        Task::Sanitize(options) => sanitize::run(options),
    };
    if let Err(message) = result {
        eprintln!("error: {message}");
        exit(1);
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// Builds every module for `arch` into `out` (default `target/ptx/<arch>/`); returns the files.
fn build_ptx(arch: String, out: Option<PathBuf>) -> Result<Vec<PathBuf>, String> {
    let root = workspace_root();
    let build = rill_builder::PtxBuild {
        crate_dir: root.join("kernels-gpu"),
        target_dir: root.join("target").join("ptx-build"),
        out_dir: out.unwrap_or_else(|| root.join("target").join("ptx").join(&arch)),
        arch,
        modules: rill_builder::Module::ALL.to_vec(),
    };
    let written = build.run().map_err(|e| e.to_string())?;
    for path in &written {
        println!("wrote {}", path.display());
    }
    Ok(written)
}

/// zstd's level for the shipped kernels: near its best ratio, still seconds to compress.
const SHIPPED_LEVEL: i32 = 19;

/// Writes the shipped kernels (`check`: compares them) from the PTX this source builds and
/// the machine code `ptxas` makes of it.
fn ship_kernels(check: bool, ptxas: Option<PathBuf>) -> Result<(), String> {
    use rill_builder::{Module, cubin_archs, cubin_file, shipped_cubin, shipped_file};
    let root = workspace_root();
    let local_ptxas = root.join(".cuda").join("nvcc").join("bin").join("ptxas");
    let ptxas = ptxas.unwrap_or_else(|| if local_ptxas.is_file() { local_ptxas } else { PathBuf::from("ptxas") });
    let built = build_ptx(rill_builder::DEFAULT_ARCH.to_string(), None)?;
    let cubin_dir = root.join("target").join("ptx").join("cubin");
    std::fs::create_dir_all(&cubin_dir).map_err(|e| format!("{}: {e}", cubin_dir.display()))?;
    // The builder returns one file a module, in the order of the modules it was given.
    let ptx_files: Vec<(Module, PathBuf)> = Module::ALL.into_iter().zip(built).collect();
    let cubins: Vec<(String, PathBuf)> = std::thread::scope(|scope| {
        let jobs: Vec<_> = ptx_files
            .iter()
            .flat_map(|(module, ptx)| cubin_archs(*module).map(move |arch| (*module, ptx, arch)))
            .map(|(module, ptx, arch)| {
                let cubin = cubin_dir.join(cubin_file(module, arch));
                let ptxas = &ptxas;
                scope.spawn(move || {
                    compile_cubin(ptxas, ptx, arch, &cubin).map(|()| (shipped_cubin(module, arch), cubin))
                })
            })
            .collect();
        jobs.into_iter().map(|job| job.join().expect("a ptxas thread panicked")).collect::<Result<_, _>>()
    })?;
    let files = ptx_files.iter().map(|(module, ptx)| (shipped_file(*module), ptx.clone())).chain(cubins);
    let shipped = root.join("host").join("kernels");
    std::fs::create_dir_all(&shipped).map_err(|e| format!("{}: {e}", shipped.display()))?;
    let mut differing = Vec::new();
    let mut names = Vec::new();
    for (name, from) in files {
        let bytes = std::fs::read(&from).map_err(|e| format!("{}: {e}", from.display()))?;
        let to = shipped.join(&name);
        if check {
            let current = std::fs::read(&to).ok().and_then(|compressed| zstd::decode_all(compressed.as_slice()).ok());
            if current.as_ref() != Some(&bytes) {
                differing.push(name.clone());
            }
        } else {
            let compressed = zstd::encode_all(bytes.as_slice(), SHIPPED_LEVEL).map_err(|e| format!("zstd: {e}"))?;
            std::fs::write(&to, &compressed).map_err(|e| format!("{}: {e}", to.display()))?;
            println!("shipped {} ({} bytes in {})", to.display(), bytes.len(), compressed.len());
        }
        names.push(name);
    }
    // Files of modules or archs no longer shipped.
    let entries = std::fs::read_dir(&shipped).map_err(|e| format!("{}: {e}", shipped.display()))?;
    for entry in entries.filter_map(|entry| entry.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !names.contains(&name) {
            if check {
                differing.push(name);
            } else {
                std::fs::remove_file(entry.path()).map_err(|e| format!("{name}: {e}"))?;
            }
        }
    }
    if !differing.is_empty() {
        return Err(format!(
            "host/kernels/ differs from what this source builds ({}): run `cargo xtask ship-kernels`",
            differing.join(", ")
        ));
    }
    if check {
        println!("the shipped kernels are what this source builds");
    }
    Ok(())
}

/// `ptxas` of `ptx` for sm_`arch` into `cubin`.
fn compile_cubin(ptxas: &Path, ptx: &Path, arch: u32, cubin: &Path) -> Result<(), String> {
    let status = Command::new(ptxas)
        .arg(format!("-arch=sm_{arch}"))
        .arg(ptx)
        .arg("-o")
        .arg(cubin)
        .status()
        .map_err(|e| format!("could not run {} ({e}): run scripts/setup.sh, or give --ptxas", ptxas.display()))?;
    match status.success() {
        true => Ok(()),
        false => Err(format!("{} -arch=sm_{arch} {} failed ({status})", ptxas.display(), ptx.display())),
    }
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

/// Builds rill-tests' release test executables (`selection`: e.g. `--test gpu`, or none for
/// all of them) and returns their paths, which cargo names in its JSON messages.
fn release_tests(root: &Path, selection: &[&str]) -> Result<Vec<PathBuf>, String> {
    let mut args = vec!["test", "--release", "--no-run", "-p", "rill-tests", "--message-format=json"];
    args.extend(selection);
    let messages = cargo(root, &args)?;
    Ok(messages
        .lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\"") && l.contains("\"kind\":[\"test\"]"))
        .filter_map(|l| l.split("\"executable\":\"").nth(1)?.split('"').next().map(PathBuf::from))
        .collect())
}

fn gpu_bundle(out: Option<PathBuf>) -> Result<(), String> {
    let root = workspace_root();
    let out = out.unwrap_or_else(|| root.join(".gpu"));
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut executables: Vec<(PathBuf, String)> = Vec::new();
    for exe in release_tests(&root, &[])? {
        let name = exe.file_name().and_then(|n| n.to_str()).ok_or("odd executable name")?;
        // Test binaries carry a hash suffix: `gpu-0123abcd` -> `gpu`.
        let short = name.rsplit_once('-').filter(|(_, h)| h.len() == 16).map_or(name, |(n, _)| n).to_string();
        executables.push((exe, short));
    }
    cargo(&root, &["build", "--release", "-p", "rill-benches", "-p", "rill-cli", "-p", "rill-xtask"])?;
    for (built, short) in [("rill-bench", "rill-bench"), ("rill", "rill"), ("rill-xtask", "xtask")] {
        executables.push((root.join("target/release").join(built), short.to_string()));
    }
    // A user's crate built against the packaged crates, on stable Rust (scripts/package.sh).
    let packaged = Command::new("bash").arg(root.join("scripts/package.sh")).status();
    if !packaged.is_ok_and(|status| status.success()) {
        return Err("scripts/package.sh failed".into());
    }
    executables.push((root.join("target/outside/release/rill-outside"), "outside".to_string()));
    for (exe, short) in executables {
        std::fs::copy(&exe, out.join(&short)).map_err(|e| format!("{}: {e}", exe.display()))?;
        println!("bundled {short}");
    }
    Ok(())
}

/// Runs the built executable `exe` with `args`.
fn run_built(exe: &Path, args: &[String]) -> Result<(), String> {
    let status = Command::new(exe).args(args.iter()).status().map_err(|e| format!("{}: {e}", exe.display()))?;
    if status.success() { Ok(()) } else { Err(format!("{} failed ({status})", exe.display())) }
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
