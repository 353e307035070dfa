"""The output fold: a chunk's output as an affine function of its start state (torch, any dtype).

For one chunk with Γ (the cumulative log-decay), normalised keys and queries K̂, Q̂, the inverse
``T = (I + L)⁻¹`` of the prepare kernel and ``W = T(β e^Γ K̂)``, ``U = T(β V)``, the output kernel
computes ``O = scale·(Q̂ e^Γ) S + A (U − W S)`` with the causal, decayed scores
``A = scale·(Q̂ K̂ᵀ ⊙ e^{Γr−Γs} ⊙ [s ≤ r])``. Only one product needs the start state S:

    O = A U + (scale·Q̂ e^Γ − A W) S = O_local + Q_h S.

``O_local`` is what the chunk outputs from a zero state and the rows of ``Q_h`` are effective
queries that read the start state. Neither depends on S, so both can be computed for all chunks
in parallel, and the serial scan would emit the output with one product beside its chain.

As Triton kernels (``Q_h`` and ``O_local`` in the prepare kernel, the product in the scan) this
was slower than the separate output kernel at every shape measured on the H200
(``data/benchmarks/output_fold/``): the prepare kernel grew by more than half, and every V-tile
program of the scan read the chunk's whole ``Q_h``. The kernels were removed; the identity stays
here, where notebook 10 checks it.
"""

from __future__ import annotations

import torch


def chunk_operands(q, k, v, g, beta, scale):
    """What the prepare kernel computes for one chunk of ``C`` rows, in the inputs' dtype:
    ``q, k [C, K]`` (already L2-normalised), ``v [C, V]``, ``g, beta [C]``. Returns
    ``(A [C, C], W [C, K], U [C, V], decayed_q [C, K])`` with ``decayed_q = scale·Q̂ e^Γ``."""
    C = q.shape[0]
    gamma = g.cumsum(0)
    rows = torch.arange(C, device=q.device)
    decay = (gamma[:, None] - gamma[None, :]).exp()
    L = torch.where(rows[:, None] > rows[None, :], beta[:, None] * (k @ k.T) * decay, 0.0)
    T = torch.linalg.inv(torch.eye(C, dtype=q.dtype, device=q.device) + L)
    W = T @ (k * (beta * gamma.exp())[:, None])
    U = T @ (v * beta[:, None])
    A = torch.where(rows[:, None] >= rows[None, :], scale * (q @ k.T) * decay, 0.0)
    return A, W, U, scale * q * gamma.exp()[:, None]


def chunk_output(q, k, v, g, beta, scale, S):
    """The output kernel's form: ``scale·(Q̂ e^Γ) S + A (U − W S)`` for start state ``S [K, V]``."""
    A, W, U, decayed_q = chunk_operands(q, k, v, g, beta, scale)
    return decayed_q @ S + A @ (U - W @ S)


def fold_output(q, k, v, g, beta, scale):
    """The fold: ``(O_local [C, V], Q_h [C, K])`` with ``O = O_local + Q_h S`` for any S."""
    A, W, U, decayed_q = chunk_operands(q, k, v, g, beta, scale)
    return A @ U, decayed_q - A @ W
