#!/usr/bin/env bash
# The crates a user depends on, as crates.io would take them: `cargo publish --dry-run` of each
# (packaged, then built from its package alone), then tests/outside, a user's crate, copied
# out of this workspace and built on stable Rust against the packaged crates, and run (on a
# GPU it checks rill's results; without one it says so).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
crates=(rill-kernels-gpu rill-builder rill-host rill-cli)
# The shipped kernels, as a user's build uses them (this workspace builds its own).
RILL_BUILD_KERNELS=0 cargo publish --dry-run --allow-dirty --quiet $(printf -- '-p %s ' "${crates[@]}")
outside=$(mktemp -d)
trap 'rm -rf "$outside"' EXIT
cp -r tests/outside/. "$outside/"
echo '[patch.crates-io]' >>"$outside/Cargo.toml"
for crate in "${crates[@]}"; do
    packaged=$(find target/package -name "$crate-[0-9]*.crate" | head -n 1)
    tar -xzf "$packaged" -C "$outside"
    unpacked=$(basename "$packaged" .crate)
    echo "$crate = { path = \"$outside/$unpacked\" }" >>"$outside/Cargo.toml"
done
# As a user builds it: whatever asked this workspace to build its kernels from source (its
# .cargo/config.toml, seen by a caller run through cargo) does not reach the user's build.
(cd "$outside" && env -u RILL_BUILD_KERNELS cargo +stable run --quiet --release --target-dir "$root/target/outside")
