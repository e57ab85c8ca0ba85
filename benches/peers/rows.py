"""The peers of rill-bench's ops, timed on the shapes rill-bench measured, in the same
invocation (`rill-bench --peers` runs this script and merges its figures).

    python3 rows.py --requests REQUESTS.json --json TIMES.json

REQUESTS.json lists {"op", "dtype", "shape"} objects, as rill-bench names them. For each,
every implementation that has the op is timed: PyTorch eager and torch.compile always,
Liger (Triton) and QuACK (CuTe-DSL) where they import. TIMES.json gets one object per
(request, implementation): {"implementation", "op", "dtype", "shape", "micros"}, or "error"
in place of "micros" where that implementation failed or rejected the shape. rill-bench
computes GB/s from its own byte count of the same op and shape, so every implementation is
charged the same bytes. versions.json, beside TIMES.json, gets each peer's version by name
("torch", "triton", "Liger", "QuACK", "CuTe DSL"), which rill-bench writes into its run's
header.

Timing is triton's do_bench: CUDA events, L2 flushed between runs, the median.

Without torch, triton or a CUDA device it prints one line saying so and exits 3.
"""

import argparse
import importlib
import importlib.metadata
import json
import math
import os
import sys

NO_PEERS = 3


def unavailable(why):
    print(f"peers not measured: {why}")
    sys.exit(NO_PEERS)


try:
    import torch
    import torch.nn.functional as F
    import triton
    from triton.testing import do_bench
except ImportError as error:
    unavailable(f"python3 has no {error.name}")

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
SCALE = 0.125
# rill-bench's bias_add_gelu runs on a [n / 4096, 4096] view with a bias of 4096.
BIAS_COLS = 4096


def optional(module):
    try:
        return importlib.import_module(module)
    except Exception:  # an optional peer that does not import is absent, whatever the cause
        return None


# QuACK's package rebinds its submodules' names to functions: import the submodules.
LIGER = {name: optional(f"liger_kernel.ops.{name}") for name in ("softmax", "layer_norm", "rms_norm")}
QUACK = {name: optional(f"quack.{name}") for name in ("softmax", "rmsnorm", "cross_entropy")}


def causal_queries(rows, cols):
    """Queries per batch of rill-bench's causal view [rows / q, q, cols]."""
    q = 1
    while rows % (2 * q) == 0 and 2 * q <= cols:
        q *= 2
    return q


class Inputs:
    """The tensors an op of `shape` and `dtype` reads, made once per request."""

    def __init__(self, shape, dtype):
        self.dtype = DTYPES[dtype]
        self.shape = shape
        make = lambda: torch.empty(shape, device="cuda", dtype=self.dtype).uniform_(-4, 4)
        self.x, self.second, self.dy = make(), make(), make()
        if len(shape) == 2:
            rows, cols = shape
            self.rows, self.cols = rows, cols
            self.mask = torch.empty(1, cols, device="cuda", dtype=self.dtype).uniform_(-4, 4)
            self.target = (torch.arange(rows, device="cuda") * 7919) % cols
            self.dloss = torch.ones(rows, device="cuda")
            self.weight = torch.empty(cols, device="cuda", dtype=self.dtype).uniform_(0.5, 1.5)
            self.bias = self.weight.clone()
            self.weight32, self.bias32 = self.weight.float(), self.bias.float()
            self.x32 = self.x.float()
            self.mean = self.x32.mean(-1)
            self.rstd = torch.rsqrt(self.x32.var(-1, unbiased=False) + 1e-5)
            self.rms_rstd = torch.rsqrt(self.x32.square().mean(-1) + 1e-6)
            self.y = torch.softmax(self.x, -1)
            self.log_y = torch.log_softmax(self.x, -1)
            q = causal_queries(rows, cols)
            self.causal = torch.ones(q, cols, device="cuda", dtype=torch.bool).triu(1)
            self.q = q


def rms_norm_backward(dy, x, w, rstd, params):
    """RMSNorm's dx (and dw) as PyTorch's autograd computes them, in f32."""
    xhat = x.float() * rstd[:, None]
    g = dy.float() * w.float()
    dx = (rstd[:, None] * (g - xhat * (g * xhat).mean(-1, keepdim=True))).to(x.dtype)
    return (dx, (dy.float() * xhat).sum(0).to(w.dtype)) if params else dx


def torch_ops(i):
    """op name -> a function of no arguments, for PyTorch (eager; compiled by the caller)."""
    if len(i.shape) == 1:
        x, b, c = i.x, i.second, i.dy
        bias = b[: min(BIAS_COLS, x.numel())]
        return {
            "relu": lambda: torch.relu(x),
            "gelu": lambda: F.gelu(x),
            "gelu_tanh": lambda: F.gelu(x, approximate="tanh"),
            "silu": lambda: F.silu(x),
            "sigmoid": lambda: torch.sigmoid(x),
            "add": lambda: x + b,
            "sub": lambda: x - b,
            "mul": lambda: x * b,
            "div": lambda: x / b,
            "fma": lambda: torch.addcmul(c, x, b),
            "bias_add_gelu": lambda: F.gelu(x.view(-1, bias.numel()) + bias),
        }
    x, dy, cols = i.x, i.dy, i.cols
    total_weight = torch.tensor(float(i.rows), device="cuda")
    shape3 = (i.rows // i.q, i.q, cols)

    def nll_then_log_softmax_backward():
        g = torch.ops.aten.nll_loss_backward(i.dloss.to(i.dtype), i.log_y, i.target, None, 0, -100, total_weight)
        return torch.ops.aten._log_softmax_backward_data(g, i.log_y, -1, i.dtype)

    def layer_norm_backward(mask):
        mean, rstd = i.mean[:, None], i.rstd[:, None]
        return lambda: torch.ops.aten.native_layer_norm_backward(dy, x, [cols], mean, rstd, i.weight, i.bias, mask)

    return {
        "softmax": lambda: torch.softmax(x, -1),
        "log_softmax": lambda: torch.log_softmax(x, -1),
        "softmax_backward": lambda: torch.ops.aten._softmax_backward_data(dy, i.y, -1, i.dtype),
        "log_softmax_backward": lambda: torch.ops.aten._log_softmax_backward_data(dy, i.log_y, -1, i.dtype),
        "scaled_masked_softmax": lambda: torch.softmax(x * SCALE + i.mask, -1),
        "scaled_causal_softmax": lambda: torch.softmax(
            (x.view(shape3) * SCALE).masked_fill(i.causal, -math.inf), -1
        ),
        "cross_entropy": lambda: F.cross_entropy(x, i.target, reduction="none"),
        "cross_entropy_backward": nll_then_log_softmax_backward,
        "logsumexp": lambda: torch.logsumexp(x, -1),
        "layer_norm": lambda: F.layer_norm(x, (cols,), i.weight, i.bias, 1e-5),
        "rms_norm": lambda: F.rms_norm(x, (cols,), i.weight, 1e-6),
        "add_layer_norm": lambda: (lambda s: (s, F.layer_norm(s, (cols,), i.weight, i.bias, 1e-5)))(x + i.second),
        "add_rms_norm": lambda: (lambda s: (s, F.rms_norm(s, (cols,), i.weight, 1e-6)))(x + i.second),
        "layer_norm_backward": layer_norm_backward([True, False, False]),
        "layer_norm_backward+params": layer_norm_backward([True, True, True]),
        "rms_norm_backward": lambda: rms_norm_backward(dy, x, i.weight, i.rms_rstd, False),
        "rms_norm_backward+params": lambda: rms_norm_backward(dy, x, i.weight, i.rms_rstd, True),
    }


def liger_ops(i, softmax, layer_norm, rms_norm):
    """op name -> function for Liger's modules that imported (`None` for the others)."""
    ops, x, dy = {}, i.x, i.dy
    if softmax:
        ops["softmax"] = lambda: softmax._softmax_forward(x)[0]
        _, block, warps, multi = softmax._softmax_forward(x)
        ops["softmax_backward"] = lambda: softmax._softmax_backward(dy, i.y, block, warps, multi)
    if layer_norm:
        ops["layer_norm"] = lambda: layer_norm.layer_norm_forward(x, i.weight, i.bias, 1e-5)[0]
        ops["layer_norm_backward+params"] = lambda: layer_norm.layer_norm_backward(
            dy, x, i.weight, i.bias, i.mean, i.rstd
        )
    if rms_norm:
        ops["rms_norm"] = lambda: rms_norm.rms_norm_forward(x, i.weight, 1e-6, 0.0, "llama", None)[0]
        _, _, rstd, block, warps, casting = rms_norm.rms_norm_forward(x, i.weight, 1e-6, 0.0, "llama", None)
        ops["rms_norm_backward+params"] = lambda: rms_norm.rms_norm_backward(
            dy, x, i.weight, rstd, 0.0, casting, block, warps, False, None
        )
    return ops


def quack_ops(i, softmax, rmsnorm, cross_entropy):
    """op name -> function for QuACK's modules that imported (`None` for the others)."""
    ops, x, dy = {}, i.x, i.dy
    if softmax:
        ops["softmax"] = lambda: softmax.softmax_fwd(x)
        ops["softmax_backward"] = lambda: softmax.softmax_bwd(dy, i.y)
    if rmsnorm:
        ops["rms_norm"] = lambda: rmsnorm.rmsnorm_fwd(x, i.weight, eps=1e-6)
        ops["add_rms_norm"] = lambda: rmsnorm.rmsnorm_fwd(x, i.weight, residual=i.second, eps=1e-6)
        ops["rms_norm_backward+params"] = lambda: rmsnorm.rmsnorm_bwd(x, i.weight, dy, i.rms_rstd)
        ops["layer_norm"] = lambda: rmsnorm.layernorm_fwd(x, i.weight32, i.bias32, eps=1e-5)
        ops["layer_norm_backward+params"] = lambda: rmsnorm.layernorm_bwd(x, i.weight32, dy, i.rstd, i.mean)
    if cross_entropy:
        ops["cross_entropy"] = lambda: cross_entropy.cross_entropy_fwd(x, i.target)
        _, lse = cross_entropy.cross_entropy_fwd(x, i.target, return_lse=True)
        ops["cross_entropy_backward"] = lambda: cross_entropy.cross_entropy_bwd(x, i.target, i.dloss, lse)
    return ops


def peers(i):
    """implementation -> {op: function}; a peer whose set-up fails is left out."""
    eager = torch_ops(i)
    # A fresh compile per request: past dynamo's recompile limit a function runs eager.
    torch._dynamo.reset()
    found = {"torch eager": eager, "torch.compile": {op: torch.compile(f, dynamic=False) for op, f in eager.items()}}
    # Liger and QuACK have row ops only.
    for name, ops, modules in (("Liger", liger_ops, LIGER), ("QuACK", quack_ops, QUACK)):
        if len(i.shape) != 2 or not any(modules.values()):
            continue
        try:
            found[name] = ops(i, **modules)
        except Exception as error:
            print(f"  {name}: set-up failed: {error}", file=sys.stderr)
    return found


def version(distribution, package):
    """The installed version of `distribution`, else the imported `package`'s `__version__`,
    else "unknown"."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return getattr(sys.modules.get(package), "__version__", "unknown")


def versions():
    """Each peer that runs here, by the name rill-bench records it under, and its version."""
    found = {"torch": torch.__version__, "triton": triton.__version__}
    if any(LIGER.values()):
        found["Liger"] = version("liger-kernel", "liger_kernel")
    if any(QUACK.values()):
        found["QuACK"] = version("quack-kernels", "quack")
        found["CuTe DSL"] = version("nvidia-cutlass-dsl", "cutlass")
    return found


def first_line(error):
    text = f"{type(error).__name__}: {error}".strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", required=True)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        unavailable("torch sees no CUDA device")
    with open(args.requests) as f:
        requests = json.load(f)
    present = ["torch eager", "torch.compile"] + [n for n, m in (("Liger", LIGER), ("QuACK", QUACK)) if any(m.values())]
    found = versions()
    print(f"peers: {', '.join(present)} ({', '.join(f'{k} {v}' for k, v in found.items())})", file=sys.stderr)
    with open(os.path.join(os.path.dirname(os.path.abspath(args.json)), "versions.json"), "w") as f:
        json.dump(found, f, indent=1)

    # Requests of one shape and dtype share their inputs.
    groups = {}
    for r in requests:
        groups.setdefault((r["dtype"], tuple(r["shape"])), []).append(r["op"])
    times = []
    for (dtype, shape), ops in groups.items():
        if len(shape) != 2:
            # Not rows x cols: another family's shape (BatchNorm's peers are batch_norm.py's).
            print(f"  {dtype} {list(shape)}: not a row shape, no peers here", file=sys.stderr)
            continue
        print(f"  {dtype} {list(shape)}: {', '.join(ops)}", file=sys.stderr)
        inputs = Inputs(list(shape), dtype)
        for implementation, table in peers(inputs).items():
            for op in ops:
                if op not in table:
                    continue
                record = {"implementation": implementation, "op": op, "dtype": dtype, "shape": list(shape)}
                try:
                    record["micros"] = 1e3 * do_bench(table[op], return_mode="median")
                except Exception as error:
                    record["error"] = first_line(error)
                times.append(record)
        del inputs
        torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump(times, f, indent=1)


if __name__ == "__main__":
    main()
