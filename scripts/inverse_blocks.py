"""The prepare kernel with the triangular inverse's doubling on the whole tile or on its blocks.

    OUT=/some/dir python scripts/inverse_blocks.py        # on the H200, repository root

:func:`mamba_edu.kernels.prefill.invert_unit_lower` runs the doubling steps 2, 4 and 8 on the
four 16×16 diagonal blocks of the 64×64 tile, as one batch of 16×16 products, and only the steps
16 and 32 on the whole tile. This script times the prepare kernel, the whole prefill and (at
``qwen3.5-tp8`` 1 × 512) the GDN layer with that inverse and with three alternatives:

- ``whole tile``: all five steps as products of the whole 64×64 tile (the package before);
- ``32-blocks``: the steps 2 to 16 on the two 32×32 diagonal blocks, the last on the tile;
- ``16-blocks, then 32-blocks``: as the package, with step 16 on the two 32×32 blocks.

Each variant is the package's ``prefill`` module with its one call of ``invert_unit_lower``
swapped for the variant (:func:`_variant_module`), so everything else is the same code. Times are
medians of ``triton.testing.do_bench_cudagraph`` in µs, bf16, K = V = 128, two rounds; W and U
are compared with the package's. Writes ``$OUT/inverse_blocks.json``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import types
from pathlib import Path

import torch
import triton
import triton.language as tl
import triton.testing

from mamba_edu.kernels import api, build_chunk_meta
from mamba_edu.kernels import prefill as P
from mamba_edu.kernels.inputs import random_prefill_inputs
from mamba_edu.kernels.prefill import (_block_diagonal, _diagonal_blocks, _doubling_to_16,
                                       _merge_blocks)
from mamba_edu.testing import rel_err

SHAPES = [("qwen3.5-tp8 1x512", 2, 8, [512]), ("qwen3.5-tp8 16x256", 2, 8, [256] * 16),
          ("qwen3-next 1x2048", 16, 32, [2048]), ("qwen3-next 1x8192", 16, 32, [8192]),
          ("qwen3-next 1x32768", 16, 32, [32768])]
OUT = Path(os.environ.get("OUT", "out/inverse_blocks"))


@triton.jit
def _first_steps(L, C: tl.constexpr, D: tl.constexpr, FP16: tl.constexpr):
    """The doubling from 1 to D on the D×D diagonal blocks of L: ``[C/D, D, D]``."""
    Ld = _diagonal_blocks(L, C, D)
    r = tl.arange(0, D)
    X = _doubling_to_16(Ld, r, FP16)
    if D > 16:
        X = _merge_blocks(X, Ld, r, 16, FP16)
    return X


@triton.jit
def invert_whole_tile(L, C: tl.constexpr, FP16: tl.constexpr):
    """All doubling steps as products of the whole ``[C, C]`` tile."""
    r = tl.arange(0, C)
    X = _merge_blocks(_doubling_to_16(L, r, FP16), L, r, 16, FP16)
    return _merge_blocks(X, L, r, 32, FP16)


@triton.jit
def invert_32_blocks(L, C: tl.constexpr, FP16: tl.constexpr):
    """Steps 2 to 16 on the 32×32 diagonal blocks, step 32 on the tile."""
    X = _block_diagonal(_first_steps(L, C, 32, FP16), C, 32)
    return _merge_blocks(X, L, tl.arange(0, C), 32, FP16)


@triton.jit
def invert_16_then_32_blocks(L, C: tl.constexpr, FP16: tl.constexpr):
    """Steps 2 to 8 on the 16×16 blocks, step 16 on the 32×32 blocks, step 32 on the tile."""
    X = _diagonal_blocks(_block_diagonal(_first_steps(L, C, 16, FP16), C, 16), C, 32)
    X = _merge_blocks(X, _diagonal_blocks(L, C, 32), tl.arange(0, 32), 16, FP16)
    return _merge_blocks(_block_diagonal(X, C, 32), L, tl.arange(0, C), 32, FP16)


VARIANTS = {"16-blocks (package)": None, "whole tile": "invert_whole_tile",
            "32-blocks": "invert_32_blocks", "16-blocks, then 32-blocks": "invert_16_then_32_blocks"}


def _variant_module(inverse: str) -> types.ModuleType:
    """The package's prefill module, its kernels compiled anew, with ``invert_unit_lower(L, CHUNK,
    FP16_INVERSE)`` replaced by ``inverse(L, CHUNK, FP16_INVERSE)`` from this script. Imported
    from a file of its own: Triton reads a kernel's source from its file when it is defined."""
    source = Path(P.__file__).read_text()
    call = "T = invert_unit_lower(L, CHUNK, FP16_INVERSE)"
    assert source.count(call) == 1, "the prepare kernel's inverse call moved"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"prefill_{inverse}.py"
        path.write_text(source.replace(call, f"T = {inverse}(L, CHUNK, FP16_INVERSE)"))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        module.__dict__[inverse] = globals()[inverse]
        spec.loader.exec_module(module)
    return module


def bench_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3


def main() -> int:
    from mamba_edu.benchmarks.kernels import _layer_call, _layer_inputs
    modules = {name: P if fn is None else _variant_module(fn) for name, fn in VARIANTS.items()}
    res = dict(meta=dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                         triton=triton.__version__, unit="µs, graph-replay median",
                         commit=os.popen("git rev-parse --short HEAD").read().strip()), rows=[])
    package_prefill = api.prefill_triton
    OUT.mkdir(parents=True, exist_ok=True)
    for rnd in range(2):
        for shape, H, HV, lengths in SHAPES:
            x = random_prefill_inputs(lengths, H, HV, 128, 128, dtype=torch.bfloat16,
                                      device="cuda", seed=0)
            meta = build_chunk_meta(lengths, "cuda", state_indices=list(range(len(lengths))))
            q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
            pool = torch.zeros(len(lengths), HV, 128, 128, device="cuda")
            ref = P.launch_prepare(k, v, g, beta, meta, True)
            for name, M in modules.items():
                _, _, w, u = M.launch_prepare(k, v, g, beta, meta, True)
                row = dict(round=rnd, shape=shape, inverse=name,
                           prepare=bench_us(lambda: M.launch_prepare(k, v, g, beta, meta, True)),
                           w_rel_diff=rel_err(w, ref[2]), u_rel_diff=rel_err(u, ref[3]))
                api.prefill_triton = M.prefill_triton
                try:
                    row["prefill"] = bench_us(lambda: api.gdn_prefill(
                        q, k, v, g, beta, state_pool=pool, meta=meta))
                    if shape == "qwen3.5-tp8 1x512":
                        layer = _layer_inputs("qwen3.5-tp8", lengths)
                        row["layer"] = bench_us(lambda: _layer_call(layer))
                finally:
                    api.prefill_triton = package_prefill
                res["rows"].append(row)
                print(row, flush=True)
                # After every row: a run stopped by its time limit keeps what it measured.
                (OUT / "inverse_blocks.json").write_text(
                    json.dumps(res, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
