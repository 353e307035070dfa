"""Benchmark our GDN kernels against flash-linear-attention on one GPU, side by side.

``python -m mamba_edu bench-kernels [--out out/benchmarks/] [--quick]``. bf16 inputs, K=V=128,
the heads of two presets: ``qwen3-next`` (H=16, HV=32) at T = 2048, 8192, 32768 as one sequence
and as 8 equal ones, ``qwen3.5-tp8`` (H=2, HV=8, one GPU's slice at tensor-parallel 8) at 1×512
and 16×256. Rows of ``kernels.json``, by ``kind``:

- ``prefill``: our ``gdn_prefill`` and fla's ``chunk_gated_delta_rule`` (if importable; never a
  dependency), eager and CUDA-graph replay (medians of ``triton.testing.do_bench`` /
  ``do_bench_cudagraph``, inputs rotated over several copies so that L2 does not flatter us),
  ``ratio_graph`` = ours / fla, per-stage times of our kernels (graph replay), achieved
  bandwidth against the byte model of fla's unfused pipeline and against our own byte count, and
  the relative error of both against the fp32 torch reference;
- ``conv``: the causal conv1d prefill, its byte floor (x read once, y written once) and the
  fraction of HBM bandwidth that floor implies;
- ``gdn_layer``: the GDN path of one layer as the serving backend runs it (conv, then the prefill
  with the gating inside, on column views of the conv output), graph-replayed;
- ``host``: host µs per layer call (conv + prefill, no GPU wait) when the forward's metadata was
  already checked by an earlier layer, and with a fresh metadata object every call;
- ``decode``: 256 sequences, effective bandwidth on the state traffic.

Headline cases run first and a time budget skips the rest; ``kernels.json`` and ``kernels.csv``
are rewritten after every case.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import platform
import statistics
import time
from pathlib import Path

from mamba_edu.benchmarks.common import OUT, say_where

K, V, W = 128, 128, 4
PRESETS = {"qwen3-next": (16, 32), "qwen3.5-tp8": (2, 8)}  # (H, HV)
FLA_BYTES_PER_TOKEN_HEAD = 4640  # bytes per token and head that fla's unfused pipeline moves
HBM_BYTES_PER_S = 4.3e12         # H200 copy bandwidth used for the byte floors
ROTATE = 3                        # input copies cycled through by the timed calls
DEVICE = "cuda"


def _conv_dim(H: int, HV: int) -> int:
    """Channels of the conv input ``mixed_qkv``: q and k (H heads), v (HV heads)."""
    return 2 * H * K + HV * V


def _stage_bytes(T: int, N: int, H: int, HV: int, act: int = 2) -> dict[str, int]:
    """HBM bytes each of our kernels moves at minimum (each tensor read or written once)."""
    NT = T // 64 + N  # upper bound on the number of chunks
    k_or_q = T * H * K * act
    h = NT * HV * K * V * act
    prepare = (k_or_q + T * HV * V * act + 2 * T * HV * 4                 # k, v, g, β
               + T * HV * 4 + k_or_q + T * HV * (K + V) * act)            # Γ, k̂, W, U
    scan = k_or_q + T * HV * ((K + V) * act + 4) + 2 * N * HV * K * V * 4  # k̂, W, U, Γ, S
    scan += T * HV * V * act + h                                           # Ṽ, h
    output = 2 * k_or_q + T * HV * (V * act + 4) + h + T * HV * V * act    # q, k̂, Ṽ, Γ, h, o
    return {"prepare": prepare, "scan": scan, "output": output}


def _our_bytes(T: int, N: int, H: int, HV: int, act: int = 2) -> int:
    """HBM bytes our kernels move at minimum, all three together."""
    return sum(_stage_bytes(T, N, H, HV, act).values())


def _floor_bytes(T: int, N: int, H: int, HV: int, act: int = 2) -> int:
    """A fully fused kernel's floor: q, k, v, g, β in, o out, states read and written."""
    return 2 * T * H * K * act + 2 * T * HV * V * act + 2 * T * HV * 4 + 2 * N * HV * K * V * 4


def _case_name(preset: str, lengths: list[int]) -> str:
    return f"{preset} {len(lengths)}x{lengths[0]}"


def _make_prefill_case(lengths, H, HV, seed):
    import torch

    from mamba_edu.kernels import build_chunk_meta_with_indices
    from mamba_edu.kernels.inputs import random_prefill_inputs
    N = len(lengths)
    sets = [random_prefill_inputs(lengths, H, HV, K, V, dtype=torch.bfloat16, device=DEVICE,
                                  seed=seed + i) for i in range(ROTATE)]
    pools = [torch.zeros(N + 1, HV, K, V, device=DEVICE) for _ in range(ROTATE)]
    meta, idx = build_chunk_meta_with_indices(lengths, DEVICE, state_indices=list(range(1, N + 1)))
    return sets, pools, meta, idx


def _rotating(fns):
    """One callable that runs the next of ``fns`` each time (also inside a graph capture)."""
    it = itertools.cycle(fns)
    return lambda: next(it)()


def _time(fn, graph: bool):
    import torch
    import triton.testing as tt
    fn()
    torch.cuda.synchronize()
    if graph:
        return tt.do_bench_cudagraph(fn, rep=100, return_mode="median")
    return tt.do_bench(fn, warmup=25, rep=100, return_mode="median")


def _check_prefill(sets, meta, HV, out_fn):
    """Relative error of ``out_fn(inputs, h0) -> (o, final)`` against the fp32 torch reference."""
    import torch

    from mamba_edu.gdn import chunk_gated_delta_rule
    from mamba_edu.testing import rel_err
    x = sets[0]
    h0 = 0.1 * torch.randn(meta.N, HV, K, V, device=DEVICE,
                           generator=torch.Generator(DEVICE).manual_seed(7))
    cu = [0]
    for n in meta.lengths:
        cu.append(cu[-1] + n)
    ref = chunk_gated_delta_rule(*(x[n].float() for n in ("q", "k", "v", "g", "beta")),
                                 initial_state=h0, cu_seqlens=cu, use_qk_l2norm=True)
    o, final = out_fn(x, h0.clone())
    return rel_err(o, ref.o), rel_err(final, ref.final_state)


def _fla_runner():
    # fla's pure Triton path, without its optional TileLang backends.
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
        from fla.ops.utils.index import prepare_chunk_indices
    except Exception as exc:  # fla is optional: any import failure just skips it
        return None, f"{type(exc).__name__}: {exc}"
    return (fla_chunk, prepare_chunk_indices), None


def _bench_fla(fla, sets, meta, HV, row):
    """fla's ``chunk_gated_delta_rule`` on the same inputs, with precomputed chunk indices (so
    that it can be captured in a graph), under ``torch.inference_mode`` (no autograd)."""
    import torch
    fla_chunk, prepare_chunk_indices = fla
    cu_cpu = torch.tensor(meta.cu_seqlens.cpu().tolist(), dtype=torch.int64)
    cu = cu_cpu.to(DEVICE)
    chunk_indices = prepare_chunk_indices(cu, 64, cu_seqlens_cpu=cu_cpu)

    def fla_call(x, h0):
        return fla_chunk(x["q"][None], x["k"][None], x["v"][None], x["g"][None], x["beta"][None],
                         initial_state=h0, output_final_state=True, cu_seqlens=cu,
                         chunk_indices=chunk_indices, use_qk_l2norm_in_kernel=True)

    def fla_out(x, h0):
        o, final = fla_call(x, h0)
        return o[0], final

    h0s = [torch.zeros(meta.N, HV, K, V, device=DEVICE) for _ in range(ROTATE)]
    fns = [lambda x=x, h=h: fla_call(x, h) for x, h in zip(sets, h0s)]
    with torch.inference_mode():
        row["fla_eager_ms"] = _time(_rotating(fns), graph=False)
        row["fla_graph_ms"] = _time(_rotating(fns), graph=True)
        row["fla_o_err"], row["fla_state_err"] = _check_prefill(sets, meta, HV, fla_out)
    row["ratio_graph"] = row["ours_graph_ms"] / row["fla_graph_ms"]
    row["ratio_eager"] = row["ours_eager_ms"] / row["fla_eager_ms"]


def _stage_times(x, pool, meta, idx, row):
    """Graph-replayed time of each of our three kernels alone."""
    from mamba_edu.kernels.prefill import launch_output, launch_prepare, launch_scan
    prepare = lambda: launch_prepare(x["k"], x["v"], x["g"], x["beta"], meta, True)  # noqa: E731
    row["ours_prepare_ms"] = _time(prepare, graph=True)
    gamma, k_hat, w, u = prepare()
    scan = lambda: launch_scan(k_hat, w, u, gamma, pool, idx["state_indices"], meta)  # noqa: E731
    row["ours_scan_ms"] = _time(scan, graph=True)
    v_new, h = scan()
    row["ours_output_ms"] = _time(lambda: launch_output(x["q"], k_hat, v_new, h, gamma, meta,
                                                        K ** -0.5, True), graph=True)


def bench_prefill(preset, lengths, fla, results, seed=0):
    import torch

    from mamba_edu.kernels import gdn_prefill
    H, HV = PRESETS[preset]
    sets, pools, meta, idx = _make_prefill_case(lengths, H, HV, seed)
    T, N = meta.T, meta.N
    row = dict(kind="prefill", case=_case_name(preset, lengths), T=T, N=N, H=H, HV=HV, K=K, V=V,
               dtype="bf16")

    ours = [lambda x=x, p=p: gdn_prefill(**x, state_pool=p, meta=meta, **idx) for x, p in zip(sets, pools)]
    row["ours_eager_ms"] = _time(_rotating(ours), graph=False)
    row["ours_graph_ms"] = _time(_rotating(ours), graph=True)
    _stage_times(sets[0], pools[0], meta, idx, row)

    def ours_out(x, h0):
        pool = torch.cat([torch.zeros_like(h0[:1]), h0])
        o, _ = gdn_prefill(**x, state_pool=pool, meta=meta, **idx)
        return o, pool[1:]
    row["ours_o_err"], row["ours_state_err"] = _check_prefill(sets, meta, HV, ours_out)

    if fla is not None:
        try:  # a failure inside fla must not lose our numbers
            _bench_fla(fla, sets, meta, HV, row)
        except Exception as exc:
            row["fla_error"] = f"{type(exc).__name__}: {exc}"[:300]

    row["fla_model_bytes"] = FLA_BYTES_PER_TOKEN_HEAD * T * HV
    row["ours_bytes"] = _our_bytes(T, N, H, HV)
    row["floor_bytes"] = _floor_bytes(T, N, H, HV)
    row["fla_model_floor_ms"] = row["fla_model_bytes"] / HBM_BYTES_PER_S * 1e3
    row["floor_ms"] = row["floor_bytes"] / HBM_BYTES_PER_S * 1e3
    row["ours_TBps_vs_fla_model"] = row["fla_model_bytes"] / row["ours_graph_ms"] / 1e9
    row["ours_TBps_own_bytes"] = row["ours_bytes"] / row["ours_graph_ms"] / 1e9
    if "fla_graph_ms" in row:
        row["fla_TBps_vs_fla_model"] = row["fla_model_bytes"] / row["fla_graph_ms"] / 1e9
    results.append(row)


def _layer_inputs(preset, lengths, seed=0):
    """What one GDN layer of the serving path gets: the conv input ``x [T, D]`` and the gate
    projections ``a, b [T, HV]`` as column views of one projection, the layer's weights, the
    pools (fused-strategy tracking into a second slot per sequence) and the metadata."""
    import torch

    from mamba_edu.kernels import build_chunk_meta_with_indices
    H, HV = PRESETS[preset]
    N, T, D = len(lengths), sum(lengths), _conv_dim(H, HV)
    gen = torch.Generator().manual_seed(seed)
    proj = torch.randn(T, D + 2 * HV, generator=gen).to(DEVICE, torch.bfloat16)
    weight = torch.randn(D, W, generator=gen).to(DEVICE, torch.bfloat16)
    A_log = torch.empty(HV).uniform_(0.0, 2.77, generator=gen).to(DEVICE)
    dt_bias = torch.randn(HV, generator=gen).to(DEVICE)
    meta = build_chunk_meta_with_indices(lengths, DEVICE, state_indices=list(range(N)),
                                         track_slots=list(range(N, 2 * N)), track_chunks=[1] * N)
    return dict(x=proj[:, :D], a=proj[:, D:D + HV], b=proj[:, D + HV:], weight=weight,
                A_log=A_log, dt_bias=dt_bias, meta=meta[0], idx=meta[1], H=H, HV=HV,
                conv_pool=torch.zeros(2 * N, D, W - 1, device=DEVICE, dtype=torch.bfloat16),
                pool=torch.zeros(2 * N, HV, K, V, device=DEVICE))


def _layer_call(c, layout=None):
    """The serving backend's extend path of one layer: conv, split into views, prefill.
    ``layout``: ``(meta, indices)`` (default: the case's)."""
    from mamba_edu.kernels import conv1d_prefill, gdn_prefill
    meta, idx = layout or (c["meta"], c["idx"])
    H, HV, T = c["H"], c["HV"], meta.T
    y = conv1d_prefill(c["x"], c["weight"], None, conv_pool=c["conv_pool"],
                       state_indices=idx["state_indices"], meta=meta)
    q, k, v = y.split([H * K, H * K, HV * V], dim=-1)
    o, _ = gdn_prefill(q.view(T, H, K), k.view(T, H, K), v.view(T, HV, V), a=c["a"], b=c["b"],
                       A_log=c["A_log"], dt_bias=c["dt_bias"], state_pool=c["pool"], meta=meta, **idx)
    return o


def bench_conv(preset, lengths, results):
    import torch

    from mamba_edu.kernels import build_chunk_meta_with_indices, conv1d_prefill
    from mamba_edu.kernels.conv import conv_launch
    from mamba_edu.testing import rel_err
    H, HV = PRESETS[preset]
    N, T, D = len(lengths), sum(lengths), _conv_dim(H, HV)
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(T, D, generator=gen).to(DEVICE, torch.bfloat16) for _ in range(ROTATE)]
    weight = torch.randn(D, W, generator=gen).to(DEVICE, torch.bfloat16)
    pools = [torch.randn(N, D, W - 1, generator=gen).to(DEVICE, torch.bfloat16)
             for _ in range(ROTATE)]
    meta, idx = build_chunk_meta_with_indices(lengths, DEVICE, state_indices=list(range(N)))
    fns = [lambda x=x, p=p: conv1d_prefill(x, weight, conv_pool=p, meta=meta, **idx)
           for x, p in zip(xs, pools)]
    row = dict(kind="conv", case=_case_name(preset, lengths), T=T, N=N, D=D, W=W, dtype="bf16")
    row["ours_eager_ms"] = _time(_rotating(fns), graph=False)
    row["ours_graph_ms"] = _time(_rotating(fns), graph=True)
    row["floor_bytes"] = 2 * T * D * 2 + D * W * 2 + 2 * N * D * (W - 1) * 2
    row["floor_ms"] = row["floor_bytes"] / HBM_BYTES_PER_S * 1e3
    row["pct_hbm_bandwidth"] = 100 * row["floor_ms"] / row["ours_graph_ms"]
    row["launch_config"] = dict(zip(("num_warps", "BD", "CHANNELS_FIRST"),
                                    conv_launch(meta.NT, D)))
    pool, pool_ref = pools[0].clone(), pools[0].float()
    y = conv1d_prefill(xs[0], weight, conv_pool=pool, meta=meta, **idx)
    y_ref = conv1d_prefill(xs[0].float(), weight.float(), conv_pool=pool_ref, meta=meta, **idx,
                           impl="torch")
    row["ours_o_err"], row["ours_state_err"] = rel_err(y, y_ref), rel_err(pool, pool_ref)
    results.append(row)


def bench_layer(preset, lengths, results):
    """The GDN path of one layer (conv + prefill kernels), graph-replayed, and its parts."""
    from mamba_edu.kernels import conv1d_prefill
    c = _layer_inputs(preset, lengths)
    row = dict(kind="gdn_layer", case=_case_name(preset, lengths), T=c["meta"].T, N=c["meta"].N,
               H=c["H"], HV=c["HV"], K=K, V=V, dtype="bf16", tracking="fused (in-kernel)")
    row["ours_graph_ms"] = _time(lambda: _layer_call(c), graph=True)
    row["ours_eager_ms"] = _time(lambda: _layer_call(c), graph=False)
    row["conv_graph_ms"] = _time(lambda: conv1d_prefill(c["x"], c["weight"],
                                                        conv_pool=c["conv_pool"], meta=c["meta"], **c["idx"]),
                                 graph=True)
    row["prefill_graph_ms"] = row["ours_graph_ms"] - row["conv_graph_ms"]
    results.append(row)


def _host_us(call, metas) -> float:
    """Median host time of ``call(meta)`` over ``metas`` (a sync every 50 calls only, so the
    GPU never holds the host back)."""
    import torch
    times = []
    for i, meta in enumerate(metas):
        start = time.perf_counter()
        call(meta)
        times.append(time.perf_counter() - start)
        if i % 50 == 49:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def bench_host(preset, lengths, results, calls=300):
    """Host µs per layer call (every call checks all its arguments): with the forward's
    metadata and indices reused by every layer (``checked_once``, the key kept from when the
    first layer's verdict was remembered), and with fresh ones every call."""
    from mamba_edu.kernels import build_chunk_meta_with_indices
    c = _layer_inputs(preset, lengths)
    N = len(lengths)
    fresh = [build_chunk_meta_with_indices(lengths, DEVICE, state_indices=list(range(N)),
                                           track_slots=list(range(N, 2 * N)), track_chunks=[1] * N)
             for _ in range(calls)]
    _layer_call(c)
    row = dict(kind="host", case=_case_name(preset, lengths), calls=calls,
               what="conv1d_prefill + gdn_prefill per layer, no GPU wait")
    row["host_us_per_layer_checked_once"] = _host_us(lambda m: _layer_call(c, m),
                                                     [(c["meta"], c["idx"])] * calls)
    row["host_us_per_layer_fresh_meta"] = _host_us(lambda m: _layer_call(c, m), fresh)
    results.append(row)


def bench_decode(results, N=256, seed=0):
    import torch

    from mamba_edu.kernels import gdn_decode, upload_indices
    from mamba_edu.testing import rel_err
    H, HV = PRESETS["qwen3-next"]
    gen = torch.Generator().manual_seed(seed)

    def inputs():
        q, k = (torch.randn(N, H, K, generator=gen).to(DEVICE, torch.bfloat16) for _ in range(2))
        v = torch.randn(N, HV, V, generator=gen).to(DEVICE, torch.bfloat16)
        a, b = (torch.randn(N, HV, generator=gen).to(DEVICE) for _ in range(2))
        return q, k, v, a, b
    A_log = torch.rand(HV, generator=gen).to(DEVICE)
    dt_bias = torch.randn(HV, generator=gen).to(DEVICE)
    sets = [inputs() for _ in range(ROTATE)]
    pools = [0.1 * torch.randn(N, HV, K, V, device=DEVICE) for _ in range(ROTATE)]
    idx = upload_indices(list(range(N)), DEVICE)
    fns = [lambda s=s, p=p: gdn_decode(*s, A_log, dt_bias, state_pool=p, state_indices=idx)
           for s, p in zip(sets, pools)]
    row = dict(kind="decode", case=f"qwen3-next decode {N}", N=N, H=H, HV=HV, K=K, V=V,
               dtype="bf16")
    row["ours_eager_ms"] = _time(_rotating(fns), graph=False)
    row["ours_graph_ms"] = _time(_rotating(fns), graph=True)
    state_bytes = 2 * N * HV * K * V * 4
    io_bytes = N * (2 * H * K + 2 * HV * V) * 2 + N * HV * 8
    row["floor_bytes"] = state_bytes + io_bytes
    row["floor_ms"] = row["floor_bytes"] / HBM_BYTES_PER_S * 1e3
    row["ours_TBps"] = state_bytes / row["ours_graph_ms"] / 1e9  # effective, on the state traffic
    pool = pools[0].clone()
    o = gdn_decode(*sets[0], A_log, dt_bias, state_pool=pool, state_indices=idx)
    pool_ref = pools[0].clone()
    ref = gdn_decode(*(t.float() for t in sets[0]), A_log, dt_bias, state_pool=pool_ref,
                     state_indices=idx, impl="torch")
    row["ours_o_err"] = rel_err(o, ref)
    row["ours_state_err"] = rel_err(pool, pool_ref)
    results.append(row)


def _write(results, meta, out: Path):
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.json").write_text(json.dumps(dict(meta=meta, results=results), indent=2))
    keys = sorted({k for r in results for k in r})
    with open(out / "kernels.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(results)


def _summary(results) -> str:
    """A fixed-width table of the headline numbers (``-`` where a value is missing)."""
    columns = [("ours graph", "ours_graph_ms", ".4f"),
               ("fla graph", "fla_graph_ms", ".4f"),
               ("ratio", "ratio_graph", ".2f"), ("ours eager", "ours_eager_ms", ".3f"),
               ("fla eager", "fla_eager_ms", ".3f"), ("prepare", "ours_prepare_ms", ".4f"),
               ("scan", "ours_scan_ms", ".4f"), ("output", "ours_output_ms", ".4f"),
               ("floor", "floor_ms", ".4f"), ("% HBM", "pct_hbm_bandwidth", ".0f"),
               ("o err", "ours_o_err", ".1e")]
    lines = ["case".ljust(30) + "".join(name.rjust(11) for name, _, _ in columns)]
    for r in results:
        if r["kind"] == "host":
            lines.append(f"{r['case']}: host µs per layer call {r['host_us_per_layer_checked_once']:.1f}"
                         f" (checked once per forward), {r['host_us_per_layer_fresh_meta']:.1f}"
                         " (fresh metadata)")
            continue
        cells = [format(r[key], spec) if r.get(key) is not None else "-" for _, key, spec in columns]
        lines.append(f"{r['kind']} {r['case']}"[:30].ljust(30) + "".join(c.rjust(11) for c in cells))
    return "\n".join(lines)


def _cases(quick: bool) -> list[tuple]:
    """``(kind, preset, lengths)``: the quick rows without fla first, then the prefill cases, the
    decode row last, so that a tight budget still measures every prefill target."""
    cases = [("conv", "qwen3-next", [1024] * 8), ("gdn_layer", "qwen3.5-tp8", [512]),
             ("host", "qwen3.5-tp8", [512]), ("prefill", "qwen3.5-tp8", [512]),
             ("prefill", "qwen3-next", [8192]), ("prefill", "qwen3-next", [1024] * 8),
             ("conv", "qwen3.5-tp8", [512]), ("prefill", "qwen3-next", [2048]),
             ("prefill", "qwen3-next", [256] * 8), ("prefill", "qwen3.5-tp8", [256] * 16)]
    if not quick:
        cases += [("prefill", "qwen3-next", [32768]), ("prefill", "qwen3-next", [4096] * 8)]
    return cases + [("decode", "qwen3-next", [])]


def _run_case(kind, preset, lengths, fla, results):
    if kind == "prefill":
        bench_prefill(preset, lengths, fla, results)
    elif kind == "conv":
        bench_conv(preset, lengths, results)
    elif kind == "gdn_layer":
        bench_layer(preset, lengths, results)
    elif kind == "host":
        bench_host(preset, lengths, results)
    else:
        bench_decode(results)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="mamba_edu bench-kernels", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT / "benchmarks", help="output folder")
    parser.add_argument("--quick", action="store_true", help="skip the 32768-token cases")
    parser.add_argument("--no-fla", action="store_true", help="skip flash-linear-attention")
    parser.add_argument("--budget-s", type=float, default=220.0,
                        help="skip the remaining cases after this many seconds")
    args = parser.parse_args(argv)  # before torch: --help and usage errors answer at once
    import torch

    if not torch.cuda.is_available():
        print("bench-kernels needs a CUDA GPU; nothing to do on this machine")
        return 0
    say_where(args.out)
    from tqdm import tqdm
    fla, why = (None, "disabled by --no-fla") if args.no_fla else _fla_runner()
    if fla is None:
        print(f"flash-linear-attention not used ({why})")
    import triton
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), fla=None if fla is None else _fla_version(),
                hbm_bytes_per_s=HBM_BYTES_PER_S, rotate=ROTATE,
                fla_backend_dispatch_disabled=os.environ.get("FLA_DISABLE_BACKEND_DISPATCH") == "1",
                note="median ms; graph = do_bench_cudagraph; fla bytes = its unfused pipeline's "
                     "traffic; conv floor = x read once + y written once")
    results = []
    start = time.monotonic()
    for kind, preset, lengths in tqdm(_cases(args.quick), desc="bench-kernels"):
        name = f"{kind} {_case_name(preset, lengths) if lengths else preset}"
        if time.monotonic() - start > args.budget_s:
            results.append(dict(kind="skipped", case=name, error="time budget"))
            continue
        try:
            _run_case(kind, preset, lengths, fla, results)
        except Exception as exc:  # keep going: one failing case must not lose the others
            results.append(dict(kind="error", case=name, error=f"{type(exc).__name__}: {exc}"))
            print(f"case {name} failed: {exc}")
        _write(results, meta, args.out)  # after every case: a kill keeps what was measured
    print(_summary([r for r in results if r["kind"] not in ("skipped", "error")]))
    print(f"wrote {args.out / 'kernels.json'} and kernels.csv")
    return 0


def _fla_version():
    try:
        from importlib.metadata import version
        return version("fla-core")
    except Exception:
        return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
