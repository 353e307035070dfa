"""Programmatic dependent launch with work before the wait: the GDN layer and the prefill, off vs on.

    OUT=/some/dir python scripts/pdl_overlap.py        # on the H200, repository root

With PDL (:mod:`mamba_edu.kernels.launch`) a kernel may start while the one before it still runs,
and waits at ``griddepcontrol.wait`` for its results. Until commit ``d558b18`` every kernel waited
at its first statement. Now two prefill kernels do work first that only needs what was final
before their predecessor began:

- the output kernel loads q, k̂ and Γ and computes its scores ``Q̂ K̂ᵀ ⊙ decay`` and ``Q̂ e^Γ``
  while the scan runs (:func:`mamba_edu.kernels.prefill.output_chunk`);
- the scan reads its initial state from the pool while the prepare kernel runs.

This script times, graph-replayed (medians of ``triton.testing.do_bench_cudagraph``, µs, bf16),
the GDN layer (conv + prefill, tracking in the kernels) and the prefill alone, with PDL off and
on, arms alternating over two rounds, and checks that both give bit-equal outputs and states.
Writes ``$OUT/pdl_overlap.json`` after every row.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import triton
import triton.testing

from mamba_edu.benchmarks.kernels import PRESETS, _layer_call, _layer_inputs
from mamba_edu.kernels import build_chunk_meta, gdn_prefill
from mamba_edu.kernels.inputs import random_prefill_inputs
from mamba_edu.kernels.launch import programmatic_launch

LAYERS = [("qwen3.5-tp8", [512]), ("qwen3.5-tp8", [256] * 16)]
PREFILLS = LAYERS + [("qwen3-next", [2048]), ("qwen3-next", [8192])]
OUT = Path(os.environ.get("OUT", "out/pdl_overlap"))


def bench_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3


def _layer(preset, lengths, pdl: bool) -> dict:
    c = _layer_inputs(preset, lengths)
    with programmatic_launch(pdl):
        us = bench_us(lambda: _layer_call(c))
        c["pool"].zero_()
        c["conv_pool"].zero_()
        o = _layer_call(c)
    return dict(us=us, result=(o, c["pool"].clone()))


def _prefill(preset, lengths, pdl: bool) -> dict:
    H, HV = PRESETS[preset]
    x = random_prefill_inputs(lengths, H, HV, 128, 128, dtype=torch.bfloat16, device="cuda",
                              seed=0)
    meta = build_chunk_meta(lengths, "cuda", state_indices=list(range(len(lengths))))
    pool = torch.zeros(len(lengths), HV, 128, 128, device="cuda")
    with programmatic_launch(pdl):
        us = bench_us(lambda: gdn_prefill(**x, state_pool=pool, meta=meta))
        pool.zero_()
        o, _ = gdn_prefill(**x, state_pool=pool, meta=meta)
    return dict(us=us, result=(o, pool))


def main() -> int:
    res = dict(meta=dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                         triton=triton.__version__, unit="µs, graph-replay median"), rows=[])
    OUT.mkdir(parents=True, exist_ok=True)
    for rnd in range(2):
        for what, shapes, run in (("layer", LAYERS, _layer), ("prefill", PREFILLS, _prefill)):
            for preset, lengths in shapes:
                off, on = run(preset, lengths, False), run(preset, lengths, True)
                equal = all(torch.equal(a, b) for a, b in zip(off["result"], on["result"]))
                row = dict(round=rnd, what=what, shape=f"{preset} {len(lengths)}x{lengths[0]}",
                           pdl_off=off["us"], pdl_on=on["us"], bit_equal=equal)
                res["rows"].append(row)
                print(row, flush=True)
                # After every row: a run stopped by its time limit keeps what it measured.
                (OUT / "pdl_overlap.json").write_text(
                    json.dumps(res, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
