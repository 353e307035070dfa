"""The output kernel against the output folded into the scan, on the H200.

    OUT=/some/dir python scripts/output_fold.py        # on the H200, repository root

A chunk's output is an affine function of its start state h: ``O = O_local + Q_h h``. The
prepare kernel can compute ``Q_h`` and ``O_local`` in parallel (``FOLD``,
:func:`mamba_edu.kernels.prefill._fold_output`), and the scan then adds one product beside its
chain instead of storing h and Ṽ for an output kernel. Two paths, each the package's code,
switched with :func:`mamba_edu.kernels.prefill.forced_output_path`:

- ``output kernel``: prepare → scan (stores h, Ṽ) → output kernel (the default);
- ``fold``: the fold in the prepare programs → scan with the output.

(At commit ``dd98d18`` the script also timed ``fold, split``: the fold in programs of their own,
two per chunk and head, both inverting; that variant is not in the package.)

For every shape of the kernel benchmark it times the whole prefill, each kernel alone and (for
the ``qwen3.5-tp8`` shapes) the GDN layer (conv + prefill), and compares the output and the
final states with the default path's. Medians of ``triton.testing.do_bench_cudagraph`` in µs,
bf16, K = V = 128, two rounds. Writes ``$OUT/output_fold.json`` after every row, and the
registers and spills of the compiled prepare and scan kernels.
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
from mamba_edu.kernels import prefill as P
from mamba_edu.kernels.inputs import random_prefill_inputs
from mamba_edu.testing import rel_err

SHAPES = [("qwen3.5-tp8", [512]), ("qwen3.5-tp8", [256] * 16), ("qwen3-next", [2048]),
          ("qwen3-next", [256] * 8), ("qwen3-next", [1024] * 8), ("qwen3-next", [8192]),
          ("qwen3-next", [4096] * 8), ("qwen3-next", [32768])]
PATHS = {"output kernel": False, "fold": True}
OUT = Path(os.environ.get("OUT", "out/output_fold"))


def bench_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3


def _stages(x, meta, pool, folded_path: bool) -> dict:
    """Each kernel of the prefill alone, µs."""
    q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
    queries = (q, 128 ** -0.5) if folded_path else None
    prepare = lambda: P.launch_prepare(k, v, g, beta, meta, True, queries=queries)  # noqa: E731
    gamma, k_hat, w, u, *folded = prepare()
    times = dict(prepare=bench_us(prepare))
    if folded_path:
        times["scan"] = bench_us(lambda: P.launch_scan(k_hat, w, u, gamma, pool,
                                                       meta.state_indices, meta, folded=folded))
        return times
    scan = lambda: P.launch_scan(k_hat, w, u, gamma, pool, meta.state_indices, meta)  # noqa: E731
    times["scan"] = bench_us(scan)
    v_new, h = scan()
    times["output"] = bench_us(lambda: P.launch_output(q, k_hat, v_new, h, gamma, meta,
                                                       128 ** -0.5, True))
    return times


def _compiled() -> dict:
    """(registers, spilled words) per thread of every compiled prepare and scan kernel."""
    return {name: [(kern.n_regs, kern.n_spills) for cache in fn.device_caches.values()
                   for kern in cache[0].values()]
            for name, fn in (("prepare", P.chunk_prepare_kernel), ("scan", P.chunk_scan_kernel))}


def main() -> int:
    res = dict(meta=dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                         triton=triton.__version__, unit="µs, graph-replay median",
                         commit=os.popen("git rev-parse --short HEAD").read().strip()), rows=[])
    OUT.mkdir(parents=True, exist_ok=True)
    for rnd in range(2):
        for preset, lengths in SHAPES:
            H, HV = PRESETS[preset]
            shape = f"{preset} {len(lengths)}x{lengths[0]}"
            x = random_prefill_inputs(lengths, H, HV, 128, 128, dtype=torch.bfloat16,
                                      device="cuda", seed=0)
            meta = build_chunk_meta(lengths, "cuda", state_indices=list(range(len(lengths))))
            pool0 = torch.randn(len(lengths), HV, 128, 128, device="cuda") * 0.1
            expected = None
            for path, in_scan in PATHS.items():
                with P.forced_output_path(in_scan):
                    pool = pool0.clone()
                    o, _ = gdn_prefill(**x, state_pool=pool, meta=meta)
                    if expected is None:
                        expected = (o, pool)
                    row = dict(round=rnd, shape=shape, path=path,
                               o_rel_diff=rel_err(o, expected[0]),
                               state_rel_diff=rel_err(pool, expected[1]))
                    row["prefill"] = bench_us(lambda: gdn_prefill(**x, state_pool=pool,
                                                                  meta=meta))
                    row.update(_stages(x, meta, pool, in_scan))
                    if preset == "qwen3.5-tp8":
                        layer = _layer_inputs(preset, lengths)
                        row["layer"] = bench_us(lambda: _layer_call(layer))
                res["rows"].append(row)
                print(row, flush=True)
                # After every row: a run stopped by its time limit keeps what it measured.
                (OUT / "output_fold.json").write_text(
                    json.dumps(res, indent=1, ensure_ascii=False) + "\n")
        if rnd == 0:
            res["compiled"] = _compiled()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
