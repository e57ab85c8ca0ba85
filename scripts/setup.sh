#!/usr/bin/env bash
# One-time set-up on a fresh Debian 12 machine with rustup:
#   1. the pinned nightly toolchain from rust-toolchain.toml (NVPTX backend, bitcode linker),
#      and stable, on which the test command checks that what the host shares with the
#      kernels compiles;
#   2. the CUDA driver library `libcuda.so.1`, which `cust` links against and loads at start-up
#      even on machines without a GPU (there `cuInit` fails cleanly and GPU tests skip);
#   3. `.cuda/lib64/libcuda.so`, the layout cust's build script looks for (see .cargo/config.toml);
#   4. `.cuda/nvcc/bin/ptxas` from NVIDIA's CUDA compiler wheel, at the version the shipped
#      machine code (host/kernels/) was made with, for `cargo xtask ship-kernels [--check]`.
set -euo pipefail
cd "$(dirname "$0")/.."

rustup toolchain install
rustup toolchain install stable --profile minimal --no-self-update

if ! ldconfig -p | grep -q 'libcuda\.so\.1 '; then
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    if ! apt-cache policy libcuda1 | grep -q 'Candidate: [0-9]'; then
        # libcuda1 lives in non-free; its nvidia-support dependency in contrib.
        $sudo_cmd tee /etc/apt/sources.list.d/non-free.sources >/dev/null <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
        $sudo_cmd apt-get update -qq
    fi
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends libcuda1
fi

libcuda=$(ldconfig -p | awk '/libcuda\.so\.1 / && /x86-64|x86_64/ {print $NF; exit}')
[ -n "$libcuda" ] || libcuda=$(ldconfig -p | awk '/libcuda\.so\.1 / {print $NF; exit}')
mkdir -p .cuda/lib64
ln -sf "$libcuda" .cuda/lib64/libcuda.so
ptxas_wheel="nvidia-cuda-nvcc-cu12==12.9.86"
if ! .cuda/nvcc/bin/ptxas --version 2>/dev/null | grep -q "V${ptxas_wheel##*==}"; then
    wheel_dir=$(mktemp -d)
    python3 -m pip download --quiet --no-deps "$ptxas_wheel" -d "$wheel_dir"
    python3 -m zipfile -e "$wheel_dir"/*.whl "$wheel_dir/unpacked"
    mkdir -p .cuda/nvcc/bin
    install -m 755 "$wheel_dir/unpacked/nvidia/cuda_nvcc/bin/ptxas" .cuda/nvcc/bin/ptxas
    rm -rf "$wheel_dir"
fi

echo "setup: toolchain $(rustc --version), libcuda at $libcuda, $(.cuda/nvcc/bin/ptxas --version | tail -1)"
