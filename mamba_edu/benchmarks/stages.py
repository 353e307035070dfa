"""Where our prefill spends its time, kernel by kernel: ``python -m mamba_edu.benchmarks.stages``
(a CUDA GPU).

For each shape, each of our three prefill kernels (prepare, scan, output) is graph-replayed alone
(``triton.testing.do_bench_cudagraph``, median; the rounds alternate the shapes' kernels and the
SM clock is read after each). Beside each time: the bytes the kernel must move (each tensor read
or written once, the byte model of :mod:`mamba_edu.benchmarks.kernels`), the FLOPs of its matrix
products, the fractions of the GPU's HBM bandwidth and bf16 tensor-core peak they reach, and its
programs against the SM count (fewer programs than SMs leaves SMs idle, whatever the kernel
does). Times are ms; rows go to ``--out`` (``stages.json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import datetime, timezone
from pathlib import Path

import torch

from mamba_edu.benchmarks.kernels import K, PRESETS, V, _make_prefill_case, _stage_bytes, _stage_times

C = 64  # chunk length
SHAPES = [("qwen3-next", [8192]), ("qwen3-next", [32768]), ("qwen3-next", [1024] * 8),
          ("qwen3-next", [4096] * 8), ("qwen3.5-tp8", [512])]
#: (HBM bytes/s, dense bf16 tensor FLOP/s, SMs) of the cards this may run on, by name prefix.
PEAKS = {"NVIDIA H200": (4.8e12, 989e12, 132), "NVIDIA H100 80GB HBM3": (3.35e12, 989e12, 132)}


def stage_flops(NT: int, HV: int) -> dict[str, float]:
    """FLOPs of each kernel's matrix products over ``NT`` chunks and ``HV`` value heads."""
    per = {"prepare": 2 * C * C * (2 * K + V) + 2 * C ** 3 / 3,  # k kᵀ, the solve, W and U
           "scan": 4 * C * K * V,                                  # U − W h, and h += k̂ᵀ Ṽ
           "output": 2 * C * C * (K + V) + 2 * C * K * V}          # q k̂ᵀ, its Ṽ product, q h
    return {name: f * NT * HV for name, f in per.items()}


def stage_programs(N: int, NT: int, HV: int) -> dict[str, int]:
    """Programs of each launch (their grids; see :mod:`mamba_edu.kernels.prefill`)."""
    from mamba_edu.kernels.prefill import output_block_v, scan_config
    bv_scan, _, _ = scan_config(N * HV, V)
    bv_out = output_block_v(NT * HV, V)
    return {"prepare": NT * HV, "scan": -(-V // bv_scan) * N * HV, "output": -(-V // bv_out) * NT * HV}


def breakdown(preset: str, lengths: list[int], rounds: int) -> dict:
    from mamba_edu.benchmarks.common import sm_clock_mhz
    H, HV = PRESETS[preset]
    sets, pools, meta, idx = _make_prefill_case(lengths, H, HV, seed=0)
    hbm, flops_peak, sms = PEAKS.get(torch.cuda.get_device_name(), (None, None, None))
    times, clocks = {"prepare": [], "scan": [], "output": []}, []
    for _ in range(rounds):
        row: dict = {}
        _stage_times(sets[0], pools[0], meta, idx, row)
        for name in times:
            times[name].append(row[f"ours_{name}_ms"])
        clocks.append(sm_clock_mhz())
    nbytes = _stage_bytes(meta.T, meta.N, H, HV)
    flops = stage_flops(meta.NT, HV)
    programs = stage_programs(meta.N, meta.NT, HV)
    kernels = []
    for name, ts in times.items():
        ms = statistics.median(ts)
        kernels.append(dict(kernel=name, ms=ms, spread_ms=max(ts) - min(ts), bytes=nbytes[name],
                            flops=flops[name], programs=programs[name],
                            hbm_fraction=nbytes[name] / (ms * 1e-3) / hbm if hbm else None,
                            tensor_fraction=flops[name] / (ms * 1e-3) / flops_peak if flops_peak else None,
                            programs_per_sm=programs[name] / sms if sms else None))
    return dict(preset=preset, shape=f"{len(lengths)}x{lengths[0]}", T=meta.T, N=meta.N, NT=meta.NT,
                H=H, HV=HV, sm_mhz=clocks, kernels=kernels)


def main(argv=None) -> int:
    from mamba_edu.benchmarks.common import OUT, commit_hash, package_versions, say_where
    parser = argparse.ArgumentParser(prog="python -m mamba_edu.benchmarks.stages",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT / "benchmarks")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    say_where(args.out)
    versions = package_versions()
    meta = dict(commit=commit_hash(), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                device=torch.cuda.get_device_name(), torch=versions["torch"], triton=versions["triton"],
                rounds=args.rounds, peaks=PEAKS.get(torch.cuda.get_device_name()),
                instrument="do_bench_cudagraph median per kernel, graph-replayed alone; median over rounds")
    rows = []
    for preset, lengths in SHAPES:
        rows.append(breakdown(preset, lengths, args.rounds))
        for k in rows[-1]["kernels"]:
            print(f"{preset:<12} {rows[-1]['shape']:<8} {k['kernel']:<8} {k['ms']:8.4f} ms "
                  f"HBM {100 * (k['hbm_fraction'] or 0):5.1f}%  tensor {100 * (k['tensor_fraction'] or 0):5.1f}%  "
                  f"programs/SM {k['programs_per_sm'] or 0:6.2f}", flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "stages.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
