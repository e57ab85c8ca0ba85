#!/usr/bin/env bash
# The test command: formatting, lints, every test (GPU suites skip in one line without a
# device), the shipped kernels rebuilt from source and compared (`cargo xtask ship-kernels
# --check`: PTX, then ptxas's machine code), and the crates as a user takes them
# (scripts/package.sh: publish dry runs, then a crate outside the workspace on stable Rust
# against the packages). Ends with one summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace 2>&1 | tee "$log"
cargo xtask ship-kernels --check
bash scripts/package.sh
passed=$(grep -Eo '(ok|FAILED)\. [0-9]+ passed' "$log" | awk '{s += $2} END {print s + 0}')
failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s += $1} END {print s + 0}')
echo "tests: $passed passed, $failed failed"
