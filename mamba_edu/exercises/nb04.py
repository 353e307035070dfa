"""Checks of notebook 04 (varlen batches and the causal conv).

1. ``my_chunk_meta`` — the chunk metadata of a packed batch (``cu_seqlens``, ``chunk_indices``,
   ``chunk_offsets``), built on the host from the scheduler's lengths: the same values as
   :func:`mamba_edu.kernels.build_chunk_meta`, and no would-be host sync.
2. ``my_conv_states`` — the conv state every sequence of a packed batch leaves behind (also the
   ones shorter than the conv window, which keep columns of their old state), without a sync.
"""

from __future__ import annotations

import random

import torch

from mamba_edu.exercises.core import check_seed, checker, exercise, observe
from mamba_edu.gdn import causal_conv1d
from mamba_edu.kernels import build_chunk_meta

NOTEBOOK = "04_varlen_batches_and_conv"
check = checker(NOTEBOOK)

def _batches() -> list[list[int]]:
    """Two fixed batches, then batches drawn per grading run whose lengths sit on both sides of
    chunk boundaries (64·m − 1, 64·m, 64·m + 1) or anywhere between them."""
    rng = random.Random(check_seed(4))
    drawn = [[max(1, 64 * rng.randint(0, 4) + rng.choice([-1, 0, 1, rng.randint(2, 62)]))
              for _ in range(rng.randint(1, 8))] for _ in range(4)]
    return [[1], [64, 65], *drawn]


def _values(t, name: str) -> list:
    """A returned table as a plain list (the check reads it after the sync count is taken)."""
    if isinstance(t, torch.Tensor):
        if t.dtype not in (torch.int32, torch.int64):
            raise AssertionError(f"{name} has dtype {t.dtype}; expected an int32 or int64 tensor (a "
                                 "narrower one overflows: a batch holds more than 32767 tokens)")
        return t.cpu().tolist()
    raise AssertionError(f"{name} is a {type(t).__name__}; expected a torch tensor")


@exercise(NOTEBOOK, 1, "chunk metadata built on the host", "my_chunk_meta",
          forbidden=("mamba_edu.kernels.metadata", "mamba_edu.gdn.varlen"))
def check_chunk_meta(fn) -> str:
    """``fn(lengths, device)`` -> ``(cu_seqlens [N+1], chunk_indices [NT, 2], chunk_offsets [N+1])``,
    integer tensors on ``device``; compared with :func:`build_chunk_meta`, syncs counted."""
    import mamba_edu

    device = mamba_edu.default_device()
    batches = _batches()
    for lengths in batches:
        seen = observe(fn, list(lengths), device, fake=True)
        out = seen.result
        if not (isinstance(out, tuple | list) and len(out) == 3):
            raise AssertionError("return a tuple (cu_seqlens, chunk_indices, chunk_offsets)")
        if seen.sync_count:
            raise AssertionError(f"lengths={lengths}: building the metadata made "
                                 f"{seen.sync_count} would-be host sync(s) ({', '.join(seen.by_op)}); "
                                 "build it from the Python list, then upload")
        for t, name in zip(out, ("cu_seqlens", "chunk_indices", "chunk_offsets")):
            if isinstance(t, torch.Tensor) and t.device.type != torch.device(device).type:
                raise AssertionError(f"{name} is on {t.device}; expected it on {device}")
        cu, table, offsets = (_values(t, name) for t, name in
                              zip(out, ("cu_seqlens", "chunk_indices", "chunk_offsets")))
        meta = build_chunk_meta(list(lengths), "cpu")
        want = {"cu_seqlens": meta.cu_seqlens.tolist(), "chunk_indices": meta.chunk_indices.tolist(),
                "chunk_offsets": meta.chunk_offsets.tolist()}
        got = {"cu_seqlens": cu, "chunk_indices": [list(r) for r in table] if table else [],
               "chunk_offsets": offsets}
        for name in ("cu_seqlens", "chunk_offsets", "chunk_indices"):
            if got[name] != want[name]:
                raise AssertionError(f"lengths={lengths}: {name} = {got[name]}; expected {want[name]}")
    return f"{len(batches)} batches match build_chunk_meta, 0 would-be syncs"


#: Exercise 2's batches: (W, lengths, rows of padding after the last sequence, dtype of prev, dtype
#: of x). A CUDA-graph bucket pads ``x`` past the batch's tokens; the states are copies, in
#: ``prev``'s dtype, also where ``x`` has another (bf16 values are exact in fp32).
_CONV_CASES = ((4, [1, 10, 2, 3, 4], 0, torch.float32, torch.float32), (3, [2, 1, 7], 5, torch.float32, torch.float32),
               (4, [1], 0, torch.float32, torch.float32), (4, [3, 1, 5], 3, torch.bfloat16, torch.bfloat16),
               (4, [2, 6], 2, torch.float32, torch.bfloat16), (3, [1, 4], 0, torch.bfloat16, torch.float32))


@exercise(NOTEBOOK, 2, "the conv states a packed batch leaves", "my_conv_states",
          forbidden=("mamba_edu.gdn.conv", "mamba_edu.kernels"))
def check_conv_states(fn) -> str:
    """``fn(prev [N, D, W−1], x [T + pad, D], lengths)`` -> ``[N, D, W−1]``: compared bit for bit
    with the reference conv's final states, for batches that mix sequences shorter and longer than
    W−1 (W = 4 and 3), padding rows after the last sequence (tokens of no sequence), a bf16
    batch and batches whose ``prev`` and ``x`` differ in dtype, with no would-be sync."""
    gen = torch.Generator().manual_seed(check_seed(6))
    D = 5
    for W, lengths, pad, dtype, x_dtype in _CONV_CASES:
        N, T = len(lengths), sum(lengths)
        prev = torch.randn(N, D, W - 1, generator=gen).to(dtype)
        x = torch.randn(T + pad, D, generator=gen).to(x_dtype)
        weight = torch.randn(D, W, generator=gen)
        seen = observe(fn, prev.clone(), x.clone(), list(lengths), fake=True)
        got = seen.result
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        # the states are copies: the float32 conv's are prev's and x's values exactly
        finals = causal_conv1d(x[:T].float(), weight, cu_seqlens=cu, initial_states=prev.float())[1].to(dtype)
        kinds = str(dtype)[6:] if dtype == x_dtype else f"{str(dtype)[6:]} prev, {str(x_dtype)[6:]} x"
        case = f"W={W}, lengths={lengths}, {pad} padding row(s) after them, {kinds}"
        if seen.sync_count:
            raise AssertionError(f"{case}: {seen.sync_count} would-be host sync(s) "
                                 f"({', '.join(seen.by_op)}); the lengths are a Python list already")
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (N, D, W - 1) or got.dtype != prev.dtype:
            what = f"shape {tuple(got.shape)}, {got.dtype}" if isinstance(got, torch.Tensor) else type(got).__name__
            raise AssertionError(f"{case}: got {what}; expected shape ({N}, {D}, {W - 1}), {prev.dtype}")
        wrong = [n for n in range(N) if not torch.equal(got[n], finals[n])]
        if wrong:
            n = wrong[0]
            raise AssertionError(f"{case}: the state of sequence {n} ({lengths[n]} new token(s)) differs "
                                 "from the reference conv's final state")
    return "every sequence's conv state, short ones included, W = 4 and 3, no would-be sync"
