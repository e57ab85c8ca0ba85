#!/usr/bin/env bash
# The test command: formatting, lints, every test (GPU suites skip in one line without a
# device), the host crate as a user builds it (stable Rust, the shipped kernels), and the
# shipped kernels rebuilt from source and compared (`cargo xtask ship-kernels --check`: PTX,
# then ptxas's machine code). Ends with one summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace 2>&1 | tee "$log"
RILL_BUILD_KERNELS=0 cargo +stable check -p rill-host --target-dir target/stable
cargo xtask ship-kernels --check
passed=$(grep -Eo '(ok|FAILED)\. [0-9]+ passed' "$log" | awk '{s += $2} END {print s + 0}')
failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s += $1} END {print s + 0}')
echo "tests: $passed passed, $failed failed"
