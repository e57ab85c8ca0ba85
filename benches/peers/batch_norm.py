"""PyTorch's relu(bn(x)) and relu(bn(x) + addend) in training, eager and under torch.compile,
at rill-bench's BatchNorm shapes, forward and forward + backward.

Timed as rows.py times the row ops' peers: triton's do_bench (CUDA events, L2 flushed
between runs, median). Run it on the GPU machine in the same session as rill-bench:

    python3 benches/peers/batch_norm.py --json peers.json [--rill target/bench/bench.json [--run RUN.json]]

With --rill (a rill-bench record file), prints the Markdown table of rill's times against
the peers' (the ratios are peer time over rill time: above 1 means rill is faster), and with
--run writes rill's BatchNorm records and the peers' as one run that `rill-bench --from-json`
reports: each peer charged rill's bytes for the same op, dtype and shape, the peers'
versions in the run's header.
"""

import argparse
import json

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

# (shape as stored, dtype, channels_last): the shape is (N, C, L...) channels-first and
# (N, L..., C) channels-last, as rill-bench records it.
SHAPES = [
    ([16, 32, 112, 112], "f32", False),
    ([256, 56, 56, 64], "f16", True),
    ([256, 56, 56, 256], "bf16", True),
    ([256, 7, 7, 2048], "f16", True),
    ([256, 64, 56, 56], "f32", False),
    ([65536, 512], "bf16", True),
]
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def relu_bn(x, mean, var, weight, bias):
    return F.relu(F.batch_norm(x, mean, var, weight, bias, training=True, momentum=0.1, eps=1e-5))


def add_relu_bn(x, addend, mean, var, weight, bias):
    return F.relu(F.batch_norm(x, mean, var, weight, bias, training=True, momentum=0.1, eps=1e-5) + addend)


def logical(stored, channels_last):
    """A tensor of PyTorch's logical (N, C, L...) shape whose memory is `stored`'s order."""
    if not channels_last or stored.dim() == 2:
        return stored
    return stored.movedim(-1, 1)


def measure():
    records = []
    for shape, dtype, channels_last in SHAPES:
        # A fresh compile per shape: past dynamo's recompile limit (8) a function runs eager.
        torch._dynamo.reset()
        compiled = {f: torch.compile(f, dynamic=False) for f in (relu_bn, add_relu_bn)}
        make = lambda: logical(torch.randn(shape, device="cuda", dtype=DTYPES[dtype]), channels_last)
        x, addend, dy = make(), make(), make()
        channels = x.shape[1]
        mean, var = torch.zeros(channels, device="cuda"), torch.ones(channels, device="cuda")
        weight = torch.rand(channels, device="cuda") + 0.5
        bias = torch.rand(channels, device="cuda")
        for peer, table in (("torch eager", {f: f for f in compiled}), ("torch.compile", compiled)):
            for fusion, f in (("relu", relu_bn), ("add_relu", add_relu_bn)):
                inputs = (x,) if fusion == "relu" else (x, addend)
                run = lambda: table[f](*inputs, mean, var, weight, bias)
                records.append(record(f"batch_norm_{fusion}", dtype, shape, peer, do_bench(run, return_mode="median")))
                leaves = [t.detach().requires_grad_() for t in (*inputs, weight, bias)]
                both = lambda: torch.autograd.grad(
                    table[f](*leaves[:-2], mean, var, *leaves[-2:]), leaves, dy
                )
                records.append(record(f"batch_norm_{fusion}_fwd+bwd", dtype, shape, peer, do_bench(both, return_mode="median")))
    return records


def record(op, dtype, shape, peer, millis):
    print(f"{op:<28} {dtype:<5} {str(shape):<20} {peer:<14} {1e3 * millis:9.1f} us", flush=True)
    return {"op": op, "dtype": dtype, "shape": str(shape), "path": peer, "micros": 1e3 * millis}


def rill_run(path):
    """The header and records of the newest run in a rill-bench record file: one run
    ({"run", "records"}), several ({"runs": [...]}), or a bare array of records."""
    with open(path) as f:
        doc = json.load(f)
    if isinstance(doc, list):
        return {}, doc
    run = doc["runs"][-1] if "runs" in doc else doc
    return run.get("run", {}), run["records"]


def as_run(header, rill, peers):
    """rill's records that a peer measured (with their copies) and the peers' records, charged
    rill's bytes and its copy: one run with the peers' versions in its header."""
    key = lambda r: (r["op"], r["dtype"], r["shape"])
    mine = {key(r): r for r in rill if r["op"] != "copy" and r.get("implementation", "rill") == "rill"}
    records = []
    for p in peers:
        r = mine.get(key(p))
        if r is None:
            continue
        scale = r["micros"] / p["micros"]
        records.append({
            "op": p["op"], "dtype": p["dtype"], "shape": p["shape"], "path": "-", "micros": round(p["micros"], 3),
            "gbps": round(r["gbps"] * scale, 1), "of_copy": round(r["of_copy"] * scale, 4), "implementation": p["path"],
        })
    measured = {key(p) for p in records}
    shapes = {(d, s) for (_, d, s) in measured}
    kept = [r for r in rill if key(r) in measured or (r["op"] == "copy" and (r["dtype"], r["shape"]) in shapes)]
    header = dict(header, peers={"torch": torch.__version__, "triton": triton.__version__})
    return {"run": header, "records": kept + records}


def table(rill, peers):
    """Markdown: per rill BatchNorm record with peers, the times and ratios."""
    key = lambda r: (r["op"], r["dtype"], r["shape"])
    by_peer = {(key(r), r["path"]): r["micros"] for r in peers}
    lines = [
        "| op | shape | dtype | rill µs | rill GB/s (of copy) | eager µs | compile µs | × eager | × compile |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rill:
        eager, compiled = by_peer.get((key(r), "torch eager")), by_peer.get((key(r), "torch.compile"))
        if eager is None:
            continue
        lines.append(
            f"| {r['op']} | {r['shape']} | {r['dtype']} | {r['micros']:.1f} | {r['gbps']:.0f} ({100 * r['of_copy']:.1f}%) "
            f"| {eager:.1f} | {compiled:.1f} | {eager / r['micros']:.2f} | {compiled / r['micros']:.2f} |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="where the peers' records are written")
    parser.add_argument("--rill", help="rill-bench's record file of the same session, to compare with")
    parser.add_argument("--run", help="with --rill, where rill's records and the peers' are written as one run")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured")
        return
    records = measure()
    if args.json:
        with open(args.json, "w") as out:
            json.dump(records, out, indent=1)
    if args.rill:
        header, rill = rill_run(args.rill)
        print(table(rill, records))
        if args.run:
            with open(args.run, "w") as out:
                json.dump(as_run(header, rill, records), out, indent=1)


if __name__ == "__main__":
    main()
