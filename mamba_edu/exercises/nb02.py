"""Notebook 02 (chunked prefill): reference answers and their checks.

Exercise 1: ``unit_lower_inverse`` — ``T = (I + L)⁻¹`` by forward substitution, as a GPU
kernel can do it without a library solver.
Exercise 2: ``checkpoint_row`` — where the state after a given number of tokens lives in the
checkpoint tensor, if anywhere.
"""

from __future__ import annotations

import torch

from mamba_edu.gdn import CHUNK, checkpoint_offsets, chunk_gated_delta_rule, recurrent_gated_delta_rule
from mamba_edu.testing import check


def unit_lower_inverse(L):
    """``T = (I + L)⁻¹`` for a strictly lower ``L: [C, C]``, by forward substitution.

    Row s of ``(I + L)·T = I`` reads ``T[s] + Σ_{j<s} L[s, j]·T[j] = e_s``: each row needs only
    the rows above it.
    """
    T = torch.eye(L.shape[0], dtype=L.dtype)
    for s in range(1, L.shape[0]):
        T[s] -= L[s, :s] @ T[:s]
    return T


def check_unit_lower_inverse(fn) -> None:
    """Invert chunk-like matrices ``L`` (unit keys, decays, write strengths; C = 1, 7 and 64)
    with ``fn`` and compare with a triangular solve; ``(I + L)·T`` must be the identity."""
    gen = torch.Generator().manual_seed(3)
    for C in (1, 7, 64):
        k = torch.nn.functional.normalize(torch.randn(C, 16, generator=gen), dim=-1)
        gamma = (-0.1 * torch.rand(C, generator=gen)).cumsum(0)
        beta = torch.rand(C, generator=gen)
        L = (beta[:, None] * (k @ k.T) * (gamma[:, None] - gamma[None, :]).exp()).tril(-1)
        eye = torch.eye(C)
        T = fn(L.clone())
        expected = torch.linalg.solve_triangular(eye + L, eye, upper=False, unitriangular=True)
        check(T, expected, name=f"exercise 1 T for C={C}", quiet=True)
        check((eye + L) @ T, eye, name=f"exercise 1 (I + L)·T for C={C}", quiet=True)
    print("PASS exercise 1 unit_lower_inverse: (I + L)·T = I for chunk sizes 1, 7 and 64")


def checkpoint_row(lengths: list[int], n: int, tokens: int) -> int | None:
    """Row of the checkpoint tensor holding sequence ``n``'s state after ``tokens`` tokens, or
    ``None`` when no checkpoint holds it (not a multiple of 64, or the final state)."""
    if tokens % CHUNK or tokens >= lengths[n]:
        return None
    return checkpoint_offsets(lengths)[n] + tokens // CHUNK


def check_checkpoint_row(fn) -> None:
    """Ask ``fn`` for every (sequence, token count) of a packed batch; every row it names must hold
    the state the recurrence reaches after that many tokens, and it must say ``None`` otherwise."""
    lengths = [70, 5, 130, 64]
    gen = torch.Generator().manual_seed(4)
    T, H, K, V = sum(lengths), 1, 4, 4
    q, k = torch.randn(2, T, H, K, generator=gen)
    v = torch.randn(T, H, V, generator=gen)
    g, beta = -torch.rand(T, H, generator=gen) * 0.1, torch.rand(T, H, generator=gen)
    cu = torch.tensor([0] + lengths).cumsum(0)
    ckpts = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm=True,
                                   output_checkpoints=True).checkpoints
    for n, length in enumerate(lengths):
        start = int(cu[n])
        for tokens in range(length + 1):
            row, expected = fn(lengths, n, tokens), checkpoint_row(lengths, n, tokens)
            if row != expected:
                raise AssertionError(f"FAIL exercise 2 checkpoint_row(lengths={lengths}, n={n}, "
                                     f"tokens={tokens}) = {row!r}; expected {expected!r}")
            if row is not None and tokens > 0:
                sl = slice(start, start + tokens)
                state = recurrent_gated_delta_rule(q[sl], k[sl], v[sl], g[sl], beta[sl],
                                                   use_qk_l2norm=True).final_state[0]
                check(ckpts[row], state, name=f"exercise 2 row {row}", quiet=True)
    print(f"PASS exercise 2 checkpoint_row: right row (or None) for every prefix of lengths {lengths}")
