//! Compiles the build's commit into `rill-bench` as `RILL_COMMIT` (the environment's where the
//! build sets it, else `git describe --always --dirty` of this checkout, else empty), so a
//! run names the build it measured wherever the executable is copied to run.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=RILL_COMMIT");
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(&manifest)
            .args(args)
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
    };
    // A new commit moves HEAD or its ref; staging a change rewrites the index.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        for path in ["HEAD", "index", "refs"] {
            println!("cargo:rerun-if-changed={dir}/{path}");
        }
    }
    let commit = std::env::var("RILL_COMMIT")
        .ok()
        .filter(|commit| !commit.trim().is_empty())
        .or_else(|| git(&["describe", "--always", "--dirty"]))
        .unwrap_or_default();
    println!("cargo:rustc-env=RILL_COMMIT={commit}");
}
