//! Builds the device crate (`kernels-gpu`) to PTX: our replacement for `cuda_builder`.
//!
//! One nested `cargo rustc` per PTX module (a cargo feature of the device crate), for the
//! `nvptx64-nvidia-cuda` target with `-Zbuild-std=core`, in its own target directory and with
//! a cleared environment, so nothing the outer build set (RUSTFLAGS, target, profile
//! overrides, jobserver) leaks in. Both `cargo xtask build-ptx` and host's build script call
//! [`PtxBuild::run`].

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use rill_kernels_gpu::table::KernelKey;
pub use rill_kernels_gpu::table::Module;

/// PTX ISA of the other modules: 7.8 (CUDA 11.8), for the L1 eviction hints of the
/// streaming loads.
const DEFAULT_PTX_ISA: &str = "ptx78";

/// The GPU architecture the PTX targets; the driver JIT-compiles it for newer GPUs.
pub const DEFAULT_ARCH: &str = "sm_80";

const TARGET: &str = "nvptx64-nvidia-cuda";

/// Environment variables the nested cargo keeps: what it needs to find the toolchain.
const KEPT_ENV: &[&str] = &["PATH", "HOME", "RUSTUP_HOME", "CARGO_HOME", "RUSTUP_TOOLCHAIN", "TMPDIR"];

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The arch is not of the form `sm_XY` with XY >= 80.
    #[error("unsupported arch `{0}`: give sm_80 or newer (e.g. sm_80, sm_90)")]
    UnsupportedArch(String),
    /// A toolchain component is missing; the message names it and how to install it.
    #[error(
        "the toolchain lacks `{component}` (looked at {looked_at}): run `rustup toolchain install` in the \
         repository root, which installs the components rust-toolchain.toml lists"
    )]
    MissingComponent { component: &'static str, looked_at: PathBuf },
    /// The toolchain that would build the kernels is not a nightly (they need its features).
    #[error(
        "building the kernels needs the nightly toolchain that rust-toolchain.toml pins, found `{0}`: run \
         `rustup toolchain install` in the repository root, or build from the shipped kernels (unset \
         RILL_BUILD_KERNELS)"
    )]
    NotNightly(String),
    /// `cargo` or `rustc` could not be started.
    #[error("could not run `{program}`: {error}")]
    Spawn { program: &'static str, error: std::io::Error },
    /// The nested build failed; its output was passed through.
    #[error("building PTX module `{module}` failed ({status}); the compiler output is above")]
    CargoFailed { module: String, status: std::process::ExitStatus },
    /// The table caps the registers of a kernel the module's PTX does not export.
    #[error("the PTX has no entry `{0}`, which the kernel table gives a register cap")]
    NoEntry(&'static str),
    /// The build succeeded but left no PTX where expected.
    #[error("the build finished but wrote no PTX at {0}")]
    NoPtx(PathBuf),
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
}

/// The name of `module`'s PTX file, as a build writes it.
pub fn ptx_file(module: Module) -> String {
    format!("{}.ptx", module.name())
}

/// The name of `module`'s machine code for sm_`arch`.
pub fn cubin_file(module: Module, arch: u32) -> String {
    format!("{}.sm_{arch}.cubin", module.name())
}

/// The file under the host crate's `kernels/` that ships `module`'s PTX (zstd-compressed), which
/// the host crate builds from unless `RILL_BUILD_KERNELS` asks for a build from source.
pub fn shipped_file(module: Module) -> String {
    format!("{}.zst", ptx_file(module))
}

/// The archs whose machine code (cubins, compiled from the shipped PTX by `ptxas`) ships
/// beside the PTX, so that those GPUs load a module without the driver's JIT compiling its
/// PTX first; a cubin runs on GPUs of its major arch from its minor up (sm_80's on sm_86 and
/// sm_89 too), and newer GPUs JIT-compile the PTX.
pub const SHIPPED_CUBIN_ARCHS: [u32; 2] = [80, 90];

/// The archs of [`SHIPPED_CUBIN_ARCHS`] `module` ships machine code for: those it builds for.
pub fn cubin_archs(module: Module) -> impl Iterator<Item = u32> {
    let oldest = module.needs().map_or(0, |(arch, _)| arch);
    SHIPPED_CUBIN_ARCHS.into_iter().filter(move |&arch| arch >= oldest)
}

/// The file under the host crate's `kernels/` that ships `module`'s machine code for sm_`arch`
/// (zstd-compressed).
pub fn shipped_cubin(module: Module, arch: u32) -> String {
    format!("{}.zst", cubin_file(module, arch))
}

/// The environment variable that asks the host crate to build its kernels from source (any
/// value but empty or `0`), instead of unpacking the shipped ones.
pub const BUILD_KERNELS_ENV: &str = "RILL_BUILD_KERNELS";

/// One PTX build of the device crate.
#[derive(Clone, Debug)]
pub struct PtxBuild {
    /// The device crate's directory (holding its Cargo.toml).
    pub crate_dir: PathBuf,
    /// The nested builds' own target directory (a subdirectory per module).
    pub target_dir: PathBuf,
    /// Where `<module>.ptx` files are written.
    pub out_dir: PathBuf,
    /// `sm_XY`.
    pub arch: String,
    /// The modules to build (usually [`Module::ALL`]).
    pub modules: Vec<Module>,
}

impl PtxBuild {
    /// Builds every module of `modules`; returns the written PTX paths.
    pub fn run(&self) -> Result<Vec<PathBuf>, BuildError> {
        let absolute = |path: &Path| std::path::absolute(path).map_err(|e| BuildError::Io(path.to_path_buf(), e));
        let build = PtxBuild {
            crate_dir: absolute(&self.crate_dir)?,
            target_dir: absolute(&self.target_dir)?,
            out_dir: absolute(&self.out_dir)?,
            arch: self.arch.clone(),
            modules: self.modules.clone(),
        };
        build.run_absolute()
    }

    fn run_absolute(&self) -> Result<Vec<PathBuf>, BuildError> {
        check_arch(&self.arch)?;
        check_toolchain(&self.crate_dir)?;
        std::fs::create_dir_all(&self.out_dir).map_err(|e| BuildError::Io(self.out_dir.clone(), e))?;
        // Modules build in parallel, each in its own target directory (cargo would serialize
        // builds sharing one).
        std::thread::scope(|scope| {
            let builds: Vec<_> =
                self.modules.iter().map(|&module| scope.spawn(move || self.build_module(module))).collect();
            builds.into_iter().map(|build| build.join().expect("a module build thread panicked")).collect()
        })
    }

    fn build_module(&self, module: Module) -> Result<PathBuf, BuildError> {
        let target_dir = self.target_dir.join(module.name());
        let arch = module_arch(&self.arch, module);
        let isa = module.needs().map_or(DEFAULT_PTX_ISA, |(_, isa)| isa);
        let built =
            nested_build(&self.crate_dir, Some(module.name()), &target_dir, &arch, isa)?.join("rill_kernels_gpu.ptx");
        if !built.is_file() {
            return Err(BuildError::NoPtx(built));
        }
        let ptx = std::fs::read_to_string(&built).map_err(|e| BuildError::Io(built.clone(), e))?;
        let ptx = cap_registers(ptx, &KernelKey::register_caps(module))?;
        let dest = self.out_dir.join(ptx_file(module));
        std::fs::write(&dest, ptx).map_err(|e| BuildError::Io(dest.clone(), e))?;
        Ok(dest)
    }
}

/// `ptx` with `.maxnreg CAP` on each kernel of `caps` ([`KernelKey::register_cap`]): the
/// directive goes between the entry's parameter list and its body, where the NVPTX backend
/// writes none (rustc has no attribute for it).
fn cap_registers(mut ptx: String, caps: &[(&'static str, u32)]) -> Result<String, BuildError> {
    for &(symbol, cap) in caps {
        let entry = ptx.find(&format!(".entry {symbol}(")).ok_or(BuildError::NoEntry(symbol))?;
        let params_end = ptx[entry..].find("\n)").ok_or(BuildError::NoEntry(symbol))? + entry + 2;
        let line_end = ptx[params_end..].find('\n').map_or(ptx.len(), |n| params_end + n);
        ptx.insert_str(line_end, &format!("\n.maxnreg {cap}"));
    }
    Ok(ptx)
}

/// The PTX build of a user's kernel crate: a `no_std` crate that depends on the device
/// crate with its `fuse` feature and instantiates rill's bodies for its own functors
/// (`fused_softmax!`). Its build script runs this; the host crate loads the file with
/// `rill::fuse::FusedModule`.
#[derive(Clone, Debug)]
pub struct FusedPtxBuild {
    /// The user's kernel crate (holding its Cargo.toml).
    pub crate_dir: PathBuf,
    /// The nested build's own target directory.
    pub target_dir: PathBuf,
    /// The PTX file to write.
    pub out_file: PathBuf,
    /// `sm_XY` ([`DEFAULT_ARCH`] unless the kernels need newer).
    pub arch: String,
}

impl FusedPtxBuild {
    /// Builds the crate; returns the written PTX path.
    pub fn run(&self) -> Result<PathBuf, BuildError> {
        let absolute = |path: &Path| std::path::absolute(path).map_err(|e| BuildError::Io(path.to_path_buf(), e));
        let crate_dir = absolute(&self.crate_dir)?;
        check_arch(&self.arch)?;
        check_toolchain(&crate_dir)?;
        let release = nested_build(&crate_dir, None, &absolute(&self.target_dir)?, &self.arch, DEFAULT_PTX_ISA)?;
        // The crate's one cdylib, whatever its name.
        let ptx: Vec<PathBuf> = std::fs::read_dir(&release)
            .map_err(|e| BuildError::Io(release.clone(), e))?
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "ptx"))
            .collect();
        let [built] = ptx.as_slice() else {
            return Err(BuildError::NoPtx(release.join("<crate>.ptx")));
        };
        if let Some(parent) = self.out_file.parent() {
            std::fs::create_dir_all(parent).map_err(|e| BuildError::Io(parent.to_path_buf(), e))?;
        }
        std::fs::copy(built, &self.out_file).map_err(|e| BuildError::Io(self.out_file.clone(), e))?;
        Ok(self.out_file.clone())
    }
}

/// `cargo rustc` of `crate_dir` for the NVPTX target (with `feature` where given); returns
/// the directory its PTX lands in.
fn nested_build(
    crate_dir: &Path,
    feature: Option<&str>,
    target_dir: &Path,
    arch: &str,
    isa: &str,
) -> Result<PathBuf, BuildError> {
    let mut cargo = clean_command("cargo");
    cargo
        .current_dir(crate_dir)
        .args(["rustc", "--release", "--lib", "--crate-type", "cdylib", "-Zbuild-std=core"])
        .args(["--target", TARGET, "--target-dir"])
        .arg(target_dir)
        .args(["--config", "profile.release.panic=\"abort\""])
        // Kernels are built from small generic pieces and closures that must all inline
        // (an outlined piece turns register arrays into local memory).
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("-Ctarget-cpu={arch}\x1f-Ctarget-feature=+{isa}\x1f-Cllvm-args=-inline-threshold=5000"),
        );
    if let Some(feature) = feature {
        cargo.args(["--features", feature]);
    }
    let status = cargo.status().map_err(|error| BuildError::Spawn { program: "cargo", error })?;
    if !status.success() {
        let what = feature.map_or_else(|| crate_dir.display().to_string(), str::to_string);
        return Err(BuildError::CargoFailed { module: what, status });
    }
    Ok(target_dir.join(TARGET).join("release"))
}

/// A command with only the toolchain-locating variables of this process's environment.
fn clean_command(program: &str) -> Command {
    let mut command = Command::new(program);
    command.env_clear();
    for key in KEPT_ENV {
        if let Some(value) = std::env::var_os(key) {
            command.env(key, value);
        }
    }
    command
}

/// The arch `module` builds for: `arch`, or the module's minimum where that is newer.
fn module_arch(arch: &str, module: Module) -> String {
    match (module.needs().map(|(min, _)| min), arch_number(arch)) {
        (Some(min), Some(number)) if number < min => format!("sm_{min}"),
        _ => arch.to_string(),
    }
}

/// `90` for `sm_90` (or `sm_90a`).
fn arch_number(arch: &str) -> Option<u32> {
    arch.strip_prefix("sm_").and_then(|n| n.trim_end_matches('a').parse::<u32>().ok())
}

fn check_arch(arch: &str) -> Result<(), BuildError> {
    match arch_number(arch) {
        Some(n) if n >= 80 => Ok(()),
        _ => Err(BuildError::UnsupportedArch(arch.to_string())),
    }
}

/// Checks the toolchain is a nightly with the components the NVPTX build needs, so a missing
/// one is named instead of surfacing as a feature, linker or `core` error.
fn check_toolchain(crate_dir: &Path) -> Result<(), BuildError> {
    let rustc = |args: &[&str]| -> Result<String, BuildError> {
        let output = clean_command("rustc")
            .current_dir(crate_dir)
            .args(args)
            .output()
            .map_err(|error| BuildError::Spawn { program: "rustc", error })?;
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    };
    let version = rustc(&["-vV"])?;
    let field = |name: &str| version.lines().find_map(|line| line.strip_prefix(name)).map(str::to_string);
    let release = field("release: ").unwrap_or_default();
    if !release.contains("nightly") {
        return Err(BuildError::NotNightly(version.lines().next().unwrap_or_default().to_string()));
    }
    let sysroot = PathBuf::from(OsString::from(rustc(&["--print", "sysroot"])?));
    let rustlib = sysroot.join("lib").join("rustlib");
    let host_bin = field("host: ").map(|triple| rustlib.join(triple).join("bin"));
    let required: [(&'static str, PathBuf); 2] = [
        ("rust-src", rustlib.join("src").join("rust").join("library").join("core")),
        (
            "llvm-bitcode-linker",
            host_bin.unwrap_or_else(|| rustlib.clone()).join("self-contained").join("llvm-bitcode-linker"),
        ),
    ];
    for (component, looked_at) in required {
        if !looked_at.exists() {
            return Err(BuildError::MissingComponent { component, looked_at });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_module_builds_for_hopper_at_least() {
        assert_eq!(module_arch("sm_80", Module::Cluster), "sm_90");
        assert_eq!(module_arch("sm_90a", Module::Cluster), "sm_90a");
        assert_eq!(module_arch("sm_80", Module::Softmax), "sm_80");
    }

    /// Each module is a cargo feature of the device crate (the builder asks for it by name).
    #[test]
    fn every_module_is_a_feature_of_the_device_crate() {
        let manifest = include_str!("../../kernels-gpu/Cargo.toml");
        let features = manifest.split("[features]").nth(1).expect("the device crate declares features");
        let declared: Vec<&str> = features
            .lines()
            .take_while(|line| !line.starts_with('['))
            .filter_map(|line| line.split_once('=').map(|(name, _)| name.trim()))
            // Not a module: what users' kernel crates build with.
            .filter(|&name| name != "fuse")
            .collect();
        let mut modules: Vec<&str> = Module::ALL.iter().map(|m| m.name()).collect();
        let mut declared_sorted = declared.clone();
        modules.sort();
        declared_sorted.sort();
        assert_eq!(declared_sorted, modules, "kernels-gpu/Cargo.toml [features] against Module::ALL");
    }

    #[test]
    fn register_caps_go_between_an_entrys_parameters_and_its_body() {
        let ptx = ".visible .entry a(\n\t.param .u64 a_param_0\n)\n{\n\tret;\n}\n\
                   .visible .entry b(\n\t.param .u64 b_param_0\n)  // @b\n{\n\tret;\n}\n";
        let capped = cap_registers(ptx.to_string(), &[("b", 80)]).expect("b is exported");
        assert_eq!(capped, ptx.replace(")  // @b\n", ")  // @b\n.maxnreg 80\n"));
        assert!(matches!(cap_registers(ptx.to_string(), &[("c", 64)]), Err(BuildError::NoEntry("c"))));
    }

    /// The caps the table gives are on kernels of the module that holds them.
    #[test]
    fn capped_kernels_are_in_the_cluster_module() {
        let caps = KernelKey::register_caps(Module::Cluster);
        assert!(!caps.is_empty());
        assert!(caps.iter().all(|(symbol, _)| symbol.starts_with("rill_norm_backward_params_cluster_phased_")));
        let others = Module::ALL.iter().filter(|&&m| m != Module::Cluster);
        assert!(others.flat_map(|&m| KernelKey::register_caps(m)).next().is_none());
    }

    #[test]
    fn arch_must_be_ampere_or_newer() {
        assert!(check_arch("sm_80").is_ok());
        assert!(check_arch("sm_90").is_ok());
        assert!(check_arch("sm_90a").is_ok());
        assert!(check_arch("sm_70").is_err());
        assert!(check_arch("compute_80").is_err());
        assert!(check_arch("sm_x").is_err());
    }
}
