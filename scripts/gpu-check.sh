#!/usr/bin/env bash
# What a kernel change must pass on a GPU machine that has the CUDA toolkit but no Rust
# toolchain, from the executables `cargo xtask gpu-bundle` gathered (and, optionally, the
# PTX `cargo xtask build-ptx --out DIR/ptx` wrote, with a reference build's in DIR/ptx-base):
#   bash scripts/gpu-check.sh DIR STEP...
# Steps, run in the order given, each logging to $OUT (default /tmp/gpu-check):
#   ptxas           registers, stack and spills of every kernel (sm_90), and the kernels
#                   whose registers differ from the reference build's
#   suite[=FILTER]  the GPU suite (optionally only cases whose name contains FILTER)
#   memcheck=FILTER compute-sanitizer memcheck over the suite's FILTER cases, --quick
#   racecheck=FILTER compute-sanitizer racecheck over them, --quick
#   sanitize        all four compute-sanitizer tools over the subset that reaches every kernel
#                   (`xtask sanitize`), its logs in $OUT/sanitize
#   bench=ARGS      rill-bench with comma-separated ARGS (e.g. bench=--filter,softmax), its
#                   table and records in bench-N.log and bench-N.json, N counting the runs
set -uo pipefail
dir=$1
shift
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
status=0

registers() { # PTX file -> "kernel registers stack spills" lines
    ptxas -arch=sm_90 -v -o /dev/null "$1" 2>&1 | awk '
        /Compiling entry function/ { match($0, /function \x27[^\x27]+\x27/); name = substr($0, RSTART + 10, RLENGTH - 11) }
        /bytes stack frame/ { stack = $1; spills = $5 + $9 }
        /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) if ($i == "Used") print name, $(i + 1), stack, spills }'
}

for step in "$@"; do
    case $step in
    ptxas)
        for ptx in "$dir"/ptx/*.ptx; do
            name=$(basename "$ptx" .ptx)
            registers "$ptx" | sort >"$out/registers-$name.txt" &
            [ -f "$dir/ptx-base/$name.ptx" ] && registers "$dir/ptx-base/$name.ptx" | sort >"$out/registers-base-$name.txt" &
        done
        wait
        for list in "$out"/registers-[!b]*.txt; do
            name=${list#"$out"/registers-}
            awk '$4 > 0 { print "SPILLS:", $0 }' "$list"
            base="$out/registers-base-$name"
            [ -f "$base" ] && join "$base" "$list" | awk -v m="${name%.txt}" '
                $2 != $5 { printf "%s: %s registers %s -> %s\n", m, $1, $2, $5; moved++ }
                END { printf "%s: %d kernels compared, %d changed registers\n", m, NR, moved }'
        done | tee "$out/registers-diff.txt"
        ;;
    suite | suite=*)
        filter=${step#suite}
        # An empty filter runs every case.
        # shellcheck disable=SC2086
        "$dir/gpu" ${filter#=} >"$out/suite.log" 2>&1 || status=1
        tail -3 "$out/suite.log"
        ;;
    memcheck=* | racecheck=*)
        tool=${step%%=*}
        compute-sanitizer --tool "$tool" --error-exitcode 9 "$dir/gpu" "${step#*=}" --quick >"$out/$tool.log" 2>&1 ||
            status=1
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$out/$tool.log" | tail -3
        ;;
    sanitize)
        "$dir/xtask" sanitize --gpu "$dir/gpu" --out "$out/sanitize" || status=1
        ;;
    bench=*)
        IFS=, read -r -a args <<<"${step#bench=}"
        benches=$((${benches:-0} + 1))
        "$dir/rill-bench" "${args[@]}" --json "$out/bench-$benches.json" >"$out/bench-$benches.log" 2>&1 || status=1
        tail -3 "$out/bench-$benches.log"
        ;;
    *)
        echo "unknown step: $step" >&2
        status=2
        ;;
    esac
done
exit $status
