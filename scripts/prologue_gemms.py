"""The projections with the norm (or SwiGLU) in the GEMM's prologue against the two launches the
model runs now, on the GPU (H200, one call):

    OUT=/some/dir python scripts/prologue_gemms.py

1. Every projection of the ``qwen3.5-tp8`` forward at 512 tokens (the LM head at one): the two
   launches (our norm or SwiGLU kernel, then cuBLAS), cuBLAS alone on the normed input, and
   :mod:`mamba_edu.kernels.prologue_linear` (autotuned). Each time is the median of
   ``triton.testing.do_bench_cudagraph`` over a pass through ``COPIES`` copies of the weights,
   divided by ``COPIES``, so that the weights come from HBM as they do in a forward. Errors are
   relative to the fp64 expression.
2. The 1 × 512 ``fused`` prefill replayed from a CUDA graph (``ttft.measure``), with the prologue
   GEMMs off and on, alternating over ``ROUNDS`` rounds: TTFT, GPU busy time, and from the
   profiled replay's trace the GPU events and the sum of the gaps between them. The last round's
   traces are kept.

Writes ``$OUT/prologue_gemms.json`` and ``$OUT/traces/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.testing as tt

from mamba_edu.benchmarks import ttft
from mamba_edu.kernels.fused_ops import add_rms_norm, gated_rms_norm, silu_mul
from mamba_edu.kernels.prologue_linear import (forced_prologue_gemms, gated_norm_linear, norm_linear,
                                               swiglu_linear)
from mamba_edu.model.config import get_config
from mamba_edu.profiling.bubbles import GPU_CATEGORIES, load_trace, merge_intervals, trace_events
from mamba_edu.testing import rel_err

OUT = Path(os.environ.get("OUT", "out/prologue_gemms"))
COPIES = 4
ROUNDS = 2
EPS = 1e-6


def projections(cfg, T: int) -> list[tuple[str, str, int, int, int]]:
    """``(role, prologue, rows, in features, out features)`` of each distinct projection that
    follows a norm or SwiGLU (attention's out-projection follows the attention kernel)."""
    HV, V = cfg.gdn_value_heads, cfg.gdn_value_dim
    qkv = (cfg.attn_heads + 2 * cfg.attn_kv_heads) * cfg.attn_head_dim
    return [("in_proj", "norm", T, cfg.hidden, cfg.conv_dim + HV * V + 2 * HV),
            ("qkv", "norm", T, cfg.hidden, qkv),
            ("gdn_out", "gated", T, HV * V, cfg.hidden),
            ("gate_up", "norm", T, cfg.hidden, 2 * cfg.mlp_width),
            ("down", "swiglu", T, cfg.mlp_width, cfg.hidden),
            ("lm_head", "norm", 1, cfg.hidden, cfg.vocab)]


def per_copy_us(fn, n: int) -> float:
    """Median µs of ``fn`` (a pass over ``n`` weight copies) per copy, graph-replayed."""
    return 1e3 * tt.do_bench_cudagraph(fn, rep=200, return_mode="median") / n


def time_projection(role, prologue, M, D, N, device="cuda", dtype=torch.bfloat16,
                    head: int = 128) -> dict:
    """One row of part 1 for a projection of :func:`projections` (``head``: V of a gated norm)."""
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    weights = [randn(N, D, scale=D ** -0.5) for _ in range(COPIES)]
    if prologue == "norm":
        x, delta, w_n = randn(M, D), randn(M, D), 1 + 0.1 * randn(D)

        def two(W):
            return norm_linear(x, delta, w_n, EPS, W)[1]

        def fused(W):
            return norm_linear(x, delta, w_n, EPS, W, backend="triton")[1]

        h = add_rms_norm(x, delta, w_n, EPS)[1]  # what cuBLAS alone multiplies
        h64 = F.rms_norm((x + delta).double(), (D,), w_n.double(), EPS)
    elif prologue == "gated":
        o, z, w_n = randn(M, D // head, head), randn(M, D), 1 + 0.1 * randn(head)

        def two(W):
            return gated_norm_linear(o, z, w_n, EPS, W)

        def fused(W):
            return gated_norm_linear(o, z, w_n, EPS, W, backend="triton")

        h = gated_rms_norm(o, z, w_n, EPS).view(M, D)
        gates = F.silu(z.double().view(M, D // head, head))
        h64 = (F.rms_norm(o.double(), (head,), w_n.double(), EPS) * gates).view(M, D)
    else:
        gate_up = randn(M, 2 * D)

        def two(W):
            return swiglu_linear(gate_up, W)

        def fused(W):
            return swiglu_linear(gate_up, W, backend="triton")

        h = silu_mul(gate_up)
        gate, up = gate_up.double().chunk(2, -1)
        h64 = F.silu(gate) * up
    expected = h64 @ weights[0].double().T
    row = dict(role=role, prologue=prologue, M=M, K=D, N=N,
               err_two_launches=rel_err(two(weights[0]), expected),
               err_fused=rel_err(fused(weights[0]), expected))
    row["two_launches_us"] = per_copy_us(lambda: [two(W) for W in weights], COPIES)
    row["cublas_only_us"] = per_copy_us(lambda: [F.linear(h, W) for W in weights], COPIES)
    row["fused_us"] = per_copy_us(lambda: [fused(W) for W in weights], COPIES)
    row["fused_over_two_launches"] = row["fused_us"] / row["two_launches_us"]
    row["fused_over_cublas"] = row["fused_us"] / row["cublas_only_us"]
    return row


def trace_counts(path: Path) -> dict:
    """GPU events of a recorded forward and the gaps between their merged busy stretches."""
    gpu = sorted((e.start, e.end) for e in trace_events(load_trace(path)) if e.cat in GPU_CATEGORIES)
    busy = merge_intervals(gpu)
    gaps = [b[0] - a[1] for a, b in zip(busy, busy[1:])]
    return dict(gpu_events=len(gpu), gaps_ms=sum(gaps) / 1e3, median_gap_us=statistics.median(gaps))


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    cfg = get_config("qwen3.5-tp8")
    gemms = []
    for spec in projections(cfg, 512):
        gemms.append(time_projection(*spec))
        print(json.dumps(gemms[-1]), flush=True)

    case = next(c for c in ttft.headline_cases() if c.name == "launch_bound_1x512")
    args = argparse.Namespace(repeats=20, warmup=3, seed=0, no_profile=False)
    bench = ttft.make_benches([case], torch.device("cuda"), torch.bfloat16)[case.preset]
    replays = []
    for rnd in range(ROUNDS):
        for fused in (False, True):
            with tempfile.TemporaryDirectory() as tmp, forced_prologue_gemms(fused):
                r = ttft.measure(bench, case, case.preset, "fused", "graph", args, Path(tmp))
                row = dict(round=rnd, prologue_gemms=fused, ttft_ms=r.ttft_ms, ttft_min_ms=r.ttft_min_ms,
                           gpu_busy_ms=r.gpu_busy_ms, error=r.error)
                trace = Path(tmp) / f"{ttft.trace_name(r)}.pt.trace.json.gz"
                if trace.exists():
                    row.update(trace_counts(trace))
                    if rnd == ROUNDS - 1:
                        (OUT / "traces").mkdir(parents=True, exist_ok=True)
                        name = "prologue_gemms" if fused else "two_launches"
                        (OUT / "traces" / f"fused_graph_{name}.pt.trace.json.gz").write_bytes(trace.read_bytes())
            replays.append(row)
            print(json.dumps(row), flush=True)

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "prologue_gemms.json").write_text(json.dumps(dict(
        gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
        preset="qwen3.5-tp8", copies=COPIES, gemms=gemms, replays=replays), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
