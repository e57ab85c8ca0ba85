#!/usr/bin/env bash
# The optional peers of `rill-bench --peers` (Liger, and QuACK with its CuTe-DSL libraries),
# fetched on a machine with network access for a GPU machine without it:
#   bash scripts/peer-wheels.sh fetch PYTHON_VERSION DIR
#       downloads the wheels for that CPython (e.g. 3.12; the GPU machine's `python3 --version`)
#       and packs them as DIR/peers-compiler.tar.xz (CuTe-DSL's compiler library alone, about
#       50 MB) and DIR/peers-rest.tar.xz (everything else, about 25 MB), each small enough to
#       move alone where a transfer is capped at 64 MB;
#   bash scripts/peer-wheels.sh install DIR TARGET
#       on the GPU machine: unpacks both into TARGET and prints the PYTHONPATH that makes
#       them importable (CuTe-DSL's packages first: its `.pth` file is not read from TARGET).
# PyTorch and Triton are the GPU machine's own; these wheels are installed without their
# dependencies, which that machine's PyTorch already brings (cuda-bindings, einops, protobuf).
set -euo pipefail

LIGER=liger-kernel==0.8.5
QUACK=quack-kernels==0.6.5
CUTLASS_DSL=4.8.1
# The compiler library, over 190 MB unpacked: the one file of its own archive.
COMPILER_GLOB='nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.*.so'

usage() {
    sed -n '2,13p' "$0" >&2
    exit 2
}

fetch() {
    local version=$1 dir=$2
    wheels=$(mktemp -d)
    tree=$(mktemp -d)
    trap 'rm -rf "$wheels" "$tree"' EXIT
    # Pure-Python wheels, then the binary ones for the target's CPython and platform.
    pip download --quiet --no-deps --dest "$wheels" "$LIGER" "$QUACK" "nvidia-cutlass-dsl==$CUTLASS_DSL" \
        "nvidia-cutlass-dsl-libs-core==$CUTLASS_DSL"
    pip download --quiet --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
        --platform manylinux_2_28_x86_64 --dest "$wheels" "nvidia-cutlass-dsl-libs-base==$CUTLASS_DSL" \
        "nvidia-cutlass-dsl-libs-cu13==$CUTLASS_DSL" "apache-tvm-ffi>=0.1.6,<0.2" torch-c-dlpack-ext
    pip install --quiet --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
        --platform manylinux_2_28_x86_64 --target "$tree" "$wheels"/*.whl
    mkdir -p "$dir"
    (
        cd "$tree"
        # shellcheck disable=SC2086 # the glob names the one compiler library
        compiler=$(ls $COMPILER_GLOB)
        tar -cf - "$compiler" | xz -9 -T0 >"$dir/peers-compiler.tar.xz"
        tar -cf - --exclude="$compiler" . | xz -9 -T0 >"$dir/peers-rest.tar.xz"
    )
    ls -l "$dir"/peers-*.tar.xz
}

install() {
    local dir=$1 target=$2
    mkdir -p "$target"
    for archive in "$dir"/peers-compiler.tar.xz "$dir"/peers-rest.tar.xz; do
        [ -f "$archive" ] || { echo "missing $archive: run \`fetch\` first" >&2; exit 1; }
        tar -xJf "$archive" -C "$target"
    done
    local target_abs
    target_abs=$(cd "$target" && pwd)
    echo "export PYTHONPATH=$target_abs/nvidia_cutlass_dsl/dsl_packages:$target_abs\${PYTHONPATH:+:\$PYTHONPATH}"
}

case "${1:-}" in
    fetch) [ $# -eq 3 ] || usage; fetch "$2" "$(realpath -m "$3")" ;;
    install) [ $# -eq 3 ] || usage; install "$2" "$3" ;;
    *) usage ;;
esac
