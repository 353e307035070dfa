"""Notebook 07 (indices precomputed once per forward): reference answers and their checks.

Exercise 1: ``precomputed_indices`` — every index the two track copies need, from the batch's
device tensors and the tracked rows (gathers and arithmetic only: no sync).
Exercise 2: ``checkpoint_row`` — which row of the packed checkpoint tensor ``h`` holds the state
after A tokens of request i.
"""

from __future__ import annotations

import random

import torch

from mamba_edu.exercises.nb06 import toy_batch
from mamba_edu.gdn import chunk_gated_delta_rule, recurrent_gated_delta_rule
from mamba_edu.profiling import count_syncs
from mamba_edu.serving.tracking import sglang_track_metadata


def precomputed_indices(batch, rows: torch.Tensor, conv_width: int):
    """``(dst, conv_positions, working, checkpoint, from_final)`` for the tracked ``rows [n]``.

    With ``E = cu[1:] − cu[:-1]``, ``A = track_lens − prefix_lens`` and
    ``first = exclusive cumsum of ⌈E/64⌉``: ``dst = track_slots[rows]``,
    ``conv_positions = (cu[rows] + A)[:, None] + [−(W−1) … −1]``, ``working = working_slots[rows]``,
    ``checkpoint = min(first[rows] + A // 64, Σ⌈E/64⌉ − 1)`` (clamped: a final-state row has no
    checkpoint of its own, any valid row will do), ``from_final = (A == E[rows])``.
    """
    cu = batch.cu_seqlens
    extend = cu[1:] - cu[:-1]
    chunks = (extend + 63) // 64
    first = chunks.cumsum(0) - chunks
    aligned = batch.track_lens_t[rows] - batch.prefix_lens_t[rows]
    window = torch.arange(-(conv_width - 1), 0, device=cu.device)
    checkpoint = torch.minimum(first[rows] + aligned // 64, chunks.sum() - 1)
    return (batch.track_slots_t[rows], (cu[rows] + aligned)[:, None] + window,
            batch.working_slots_t[rows], checkpoint, aligned == extend[rows])


def check_precomputed_indices(fn) -> None:
    """Compare ``fn`` with :func:`track_indices_on_device` on random batches; it must not sync."""
    rng = random.Random(7)
    n = 0
    for trial in range(25):
        size = rng.randint(1, 5)
        extend = [rng.choice([5, 63, 64, 65, 128, 150, 192]) for _ in range(size)]
        prefix = [rng.choice([0, 64]) for _ in range(size)]
        batch = toy_batch(prefix, extend, seed=trial)
        rows = batch.track_mask_t.nonzero()[:, 0]
        if rows.numel() == 0:
            continue
        ref = sglang_track_metadata(batch, 4)
        with count_syncs() as syncs:
            got = fn(batch, rows, 4)
        if syncs.count:
            raise AssertionError(f"FAIL exercise 1 precomputed_indices made {syncs.count} would-be syncs:\n"
                                 f"{syncs.summary()}")
        names = ("dst", "conv_positions", "working", "checkpoint", "from_final")
        for name, g, w in zip(names, got, (ref.dst, ref.conv_positions, ref.working, ref.checkpoint,
                                           ref.from_final)):
            if g.shape != w.shape or not torch.equal(g.to(w.dtype), w):
                raise AssertionError(f"FAIL exercise 1 precomputed_indices: {name} = {g.tolist()}; expected "
                                     f"{w.tolist()} (extend_lens {extend}, prefix_lens {prefix})")
        n += 1
    print(f"PASS exercise 1 precomputed_indices: {n} random batches match the package, 0 syncs")


def checkpoint_row(extend_lens: list[int], i: int, aligned: int) -> int:
    """Row of ``h`` with the state after ``aligned`` (a multiple of 64, < E) tokens of request i:
    the rows of earlier requests (``Σ_{j<i} ⌈E_j/64⌉``) plus ``aligned // 64``."""
    return sum((e + 63) // 64 for e in extend_lens[:i]) + aligned // 64


def check_checkpoint_row(fn) -> None:
    """Run the chunked GDN with checkpoints on a random packed batch and compare the row ``fn``
    names with the token-by-token state after ``aligned`` tokens of that request."""
    gen = torch.Generator().manual_seed(8)
    lengths = [70, 200, 64, 129]
    T, H, HV, K, V = sum(lengths), 1, 2, 8, 8
    q, k = torch.randn(2, T, H, K, generator=gen)
    v = torch.randn(T, HV, V, generator=gen)
    g, beta = -torch.rand(T, HV, generator=gen) * 0.1, torch.rand(T, HV, generator=gen)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())
    h = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm=True,
                               output_checkpoints=True).checkpoints
    n = 0
    for i, length in enumerate(lengths):
        for aligned in range(64, length, 64):
            s = int(cu[i])
            want = recurrent_gated_delta_rule(q[s:s + aligned], k[s:s + aligned], v[s:s + aligned],
                                              g[s:s + aligned], beta[s:s + aligned],
                                              use_qk_l2norm=True).final_state[0]
            row = fn(lengths, i, aligned)
            if not (isinstance(row, int) and 0 <= row < h.shape[0]) or not torch.allclose(h[row], want, atol=1e-4):
                raise AssertionError(f"FAIL exercise 2 checkpoint_row({lengths}, i={i}, aligned={aligned}) = "
                                     f"{row!r}: that row is not the state after {aligned} tokens of request {i}")
            n += 1
    print(f"PASS exercise 2 checkpoint_row: {n} rows of h hold the recurrence's state after A tokens")
