"""Notebook 04 (varlen batches and conv): reference answers and their checks.

Exercise 1: ``chunk_table`` — the chunk metadata of a packed batch, in plain Python.
Exercise 2: ``conv_state_after`` — the conv state a sequence leaves behind.
"""

from __future__ import annotations

import torch

from mamba_edu.gdn import causal_conv1d
from mamba_edu.kernels import build_chunk_meta
from mamba_edu.profiling import count_syncs


def chunk_table(lengths: list[int]) -> tuple[list[int], list[tuple[int, int]], list[int]]:
    """``(cu_seqlens [N+1], chunk_indices [(seq, chunk)] × NT, chunk_offsets [N+1])``."""
    cu, table, offsets = [0], [], [0]
    for seq, n in enumerate(lengths):
        cu.append(cu[-1] + n)
        count = -(-n // 64)
        table += [(seq, c) for c in range(count)]
        offsets.append(offsets[-1] + count)
    return cu, table, offsets


def check_chunk_table(fn) -> None:
    """``fn`` must agree with :func:`mamba_edu.kernels.build_chunk_meta` and make no sync."""
    for lengths in ([1], [64, 65], [1, 63, 64, 65, 150, 300]):
        with count_syncs() as syncs:
            cu, table, offsets = fn(lengths)
        meta = build_chunk_meta(lengths, "cpu")
        got = (list(cu), [tuple(r) for r in table], list(offsets))
        want = (meta.cu_seqlens.tolist(), [tuple(r) for r in meta.chunk_indices.tolist()],
                meta.chunk_offsets.tolist())
        if got != want:
            raise AssertionError(f"FAIL exercise 1 for lengths={lengths}: got {got}, expected {want}")
        if syncs.count:
            raise AssertionError(f"FAIL exercise 1: {syncs.summary()}")
    print("PASS exercise 1 chunk_table: same tables as build_chunk_meta, 0 syncs")


def conv_state_after(prev_state: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The last ``W−1`` columns of ``[prev_state | xᵀ]``: ``prev_state [D, W−1]``, ``x [L, D]``."""
    return torch.cat([prev_state, x.T], dim=1)[:, -prev_state.shape[1]:]


def check_conv_state_after(fn) -> None:
    """Compare with the reference conv's final state, for sequences shorter and longer than W−1."""
    gen = torch.Generator().manual_seed(6)
    D, W = 5, 4
    weight = torch.randn(D, W, generator=gen)
    for L in (1, 2, 3, 10):
        prev = torch.randn(D, W - 1, generator=gen)
        x = torch.randn(L, D, generator=gen)
        _, finals = causal_conv1d(x, weight, initial_states=prev[None])
        got = fn(prev, x)
        if tuple(got.shape) != (D, W - 1) or not torch.equal(got, finals[0]):
            raise AssertionError(f"FAIL exercise 2 for a sequence of {L} tokens: got {got}, "
                                 f"expected {finals[0]}")
    print("PASS exercise 2 conv_state_after: right for 1, 2, 3 and 10 new tokens (W = 4)")
