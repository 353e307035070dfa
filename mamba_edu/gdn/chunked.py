"""The chunked (WY) form: the same function as the recurrence, computed 64 tokens at a time.

Inside a chunk with start state ``S₀`` and inclusive cumsum ``Γ`` of g (docs/conventions.md)::

    L = strict_lower(beta_s (k_s·k_j) exp(Γ_s − Γ_j)),   T = (I + L)⁻¹
    U = T(beta·V),   W = T(beta·exp(Γ)·K)                    # independent of S₀: all chunks at once
    Ṽ = U − W S₀
    O = scale·[(Q·exp(Γ)) S₀ + (QKᵀ ⊙ exp(Γ_r − Γ_s) ⊙ [s ≤ r]) Ṽ]
    S ← exp(Γ_C) S₀ + (K·exp(Γ_C − Γ))ᵀ Ṽ                    # the only loop: chunk to chunk

Every sequence is padded to whole chunks with ``g = beta = k = 0``; a padded token neither
decays nor writes the state, so padding is exact. This is also the fast CPU path of the package.
"""

from __future__ import annotations

import torch

from mamba_edu.gdn.recurrent import GDNOutput, _prepare
from mamba_edu.gdn.varlen import CHUNK, checkpoint_offsets, chunk_counts

# Floor of a single token's log-decay in the chunked form. exp(g) of any g below about −104 is 0
# in fp32 (and below −745 in fp64), so flooring changes no decay factor, but it keeps Γ finite:
# with g = −inf (A_log large under raw gating) Γ_s − Γ_j would be (−inf) − (−inf) = NaN.
# 64 tokens at the floor give Γ ≥ −64000, still exact to ~1e-11 in fp64.
G_FLOOR = -1000.0


def pad_to_chunks(x: torch.Tensor, lengths: list[int], chunk: int = CHUNK) -> torch.Tensor:
    """Scatter packed ``[T, ...]`` into ``[N, NC, chunk, ...]`` with zeros after each sequence.

    ``NC`` is the chunk count of the longest sequence.
    """
    n_chunks = max(chunk_counts(lengths, chunk))
    out = x.new_zeros(len(lengths), n_chunks * chunk, *x.shape[1:])
    start = 0
    for n, length in enumerate(lengths):
        out[n, :length] = x[start:start + length]
        start += length
    return out.view(len(lengths), n_chunks, chunk, *x.shape[1:])


def unpad_from_chunks(x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Inverse of :func:`pad_to_chunks`: ``[N, NC, chunk, ...]`` back to packed ``[T, ...]``."""
    flat = x.flatten(1, 2)
    return torch.cat([flat[n, :length] for n, length in enumerate(lengths)])


def intra_chunk(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor):
    """Everything that does not depend on the incoming state, for all chunks at once.

    Args (head-major, fp32): ``k: [..., C, K]``, ``v: [..., C, V]``, ``g, beta: [..., C]``.
    Returns ``(gamma, U, W)``: ``gamma`` = inclusive cumsum of g floored at ``G_FLOOR`` ``[..., C]`` (fp64),
    ``U = T(beta·V)`` ``[..., C, V]``, ``W = T(beta·exp(Γ)·K)`` ``[..., C, K]``.
    """
    C = g.shape[-1]
    # Γ in fp64: with strong gates it reaches the −1000s inside one chunk, where an fp32
    # Γ_s − Γ_j is off by ~1e-4 and so is every decay factor. The factors themselves are fp32.
    gamma = g.double().clamp(min=G_FLOOR).cumsum(-1)  # finite even for g = −inf (see G_FLOOR)
    strict = torch.ones(C, C, dtype=torch.bool, device=g.device).tril(-1)
    # Mask before exp: the upper triangle of Γ_s − Γ_j is positive and would overflow.
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~strict, float("-inf")).exp().float()
    L = beta[..., :, None] * (k @ k.transpose(-1, -2)) * decay
    eye = torch.eye(C, dtype=k.dtype, device=k.device)
    T = torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False, unitriangular=True)
    U = T @ (beta[..., None] * v)
    W = T @ ((beta * gamma.exp().float())[..., None] * k)
    return gamma, U, W


def chunk_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None,
                           use_qk_l2norm=False, output_checkpoints=False) -> GDNOutput:
    """GDN over a packed batch in the chunked WY form; same arguments and results as
    :func:`mamba_edu.gdn.recurrent_gated_delta_rule` (fp32 arithmetic, Γ in fp64).

    Vectorised over sequences, chunks and heads; only the chunk-to-chunk state pass loops
    (``max ⌈L_n/64⌉`` steps).
    """
    out_dtype = q.dtype
    lengths, scale, q, k, v, g, beta, S = _prepare(q, k, v, g, beta, scale, initial_state,
                                                   cu_seqlens, use_qk_l2norm, output_checkpoints)
    # [N, NC, C, HV, D] -> head-major [N, HV, NC, C, D] so chunk math is batched matmuls.
    qc, kc, vc = (pad_to_chunks(x, lengths).permute(0, 3, 1, 2, 4) for x in (q, k, v))
    gc, bc = (pad_to_chunks(x, lengths).permute(0, 3, 1, 2) for x in (g, beta))
    gamma, U, W = intra_chunk(kc, vc, gc, bc)
    C = gc.shape[-1]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    attn = (qc @ kc.transpose(-1, -2)) * (
        (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~causal, float("-inf")).exp().float())
    q_decayed = qc * gamma.exp().float()[..., None]
    k_to_end = kc * (gamma[..., -1:] - gamma).exp().float()[..., None]
    decay_end = gamma[..., -1].exp().float()[..., None, None]  # [N, HV, NC, 1, 1]

    o = torch.empty_like(vc)
    ckpts = []
    for c in range(gc.shape[2]):
        ckpts.append(S)
        v_new = U[:, :, c] - W[:, :, c] @ S
        o[:, :, c] = scale * (q_decayed[:, :, c] @ S + attn[:, :, c] @ v_new)
        S = decay_end[:, :, c] * S + k_to_end[:, :, c].transpose(-1, -2) @ v_new

    o = unpad_from_chunks(o.permute(0, 2, 3, 1, 4), lengths).to(out_dtype)
    if not output_checkpoints:
        return GDNOutput(o, S)
    # ckpts[c] is [N, HV, K, V]; keep chunk c of sequence n only where c < ⌈L_n/64⌉.
    stacked = torch.stack(ckpts, dim=1)
    kept = torch.cat([stacked[n, :nc] for n, nc in enumerate(chunk_counts(lengths))])
    return GDNOutput(o, S, kept, torch.tensor(checkpoint_offsets(lengths), dtype=torch.int64))
