#!/usr/bin/env bash
# The test command: formatting, lints, every test (GPU suites skip in one line without a
# device), and a PTX build through `cargo xtask build-ptx`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
cargo xtask build-ptx
