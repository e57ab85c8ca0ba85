#!/usr/bin/env bash
# One-time set-up on a fresh Debian 12 machine with rustup:
#   1. the pinned nightly toolchain from rust-toolchain.toml (NVPTX backend, bitcode linker),
#      and stable, on which the test command builds the host crate as a user would;
#   2. `.cuda/nvcc/bin/ptxas` from NVIDIA's CUDA compiler wheel, at the version the shipped
#      machine code (host/kernels/) was made with, for `cargo xtask ship-kernels [--check]`.
# Nothing of CUDA's is needed to build or test: rill opens the driver's library at run time,
# and without one (or without a GPU) the GPU tests skip.
set -euo pipefail
cd "$(dirname "$0")/.."

rustup toolchain install
rustup toolchain install stable --profile minimal --no-self-update

ptxas_wheel="nvidia-cuda-nvcc-cu12==12.9.86"
if ! .cuda/nvcc/bin/ptxas --version 2>/dev/null | grep -q "V${ptxas_wheel##*==}"; then
    wheel_dir=$(mktemp -d)
    python3 -m pip download --quiet --no-deps "$ptxas_wheel" -d "$wheel_dir"
    python3 -m zipfile -e "$wheel_dir"/*.whl "$wheel_dir/unpacked"
    mkdir -p .cuda/nvcc/bin
    install -m 755 "$wheel_dir/unpacked/nvidia/cuda_nvcc/bin/ptxas" .cuda/nvcc/bin/ptxas
    rm -rf "$wheel_dir"
fi

echo "setup: toolchain $(rustc --version), ptxas $(.cuda/nvcc/bin/ptxas --version | tail -1)"
