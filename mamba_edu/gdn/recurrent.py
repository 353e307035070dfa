"""The token-by-token recurrence: the definition of Gated DeltaNet (docs/conventions.md).

Per token and value head, with state ``S ∈ R^{K×V}`` (decay first, read after write)::

    S ← exp(g_t)·S;   ṽ = beta_t·(v_t − Sᵀk_t);   S ← S + k_t ṽᵀ;   o_t = scale·Sᵀq_t
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mamba_edu.gdn.gating import l2norm
from mamba_edu.gdn.varlen import (CHUNK, check_flag, check_scale, checkpoint_offsets,
                                  validate_gdn_inputs)


class GDNOutput(NamedTuple):
    """What a GDN prefill returns.

    o:                  ``[T, HV, V]`` in q's dtype.
    final_state:        ``[N, HV, K, V]`` fp32, the state after each sequence's last token.
    checkpoints:        ``[Σ⌈L_n/64⌉, HV, K, V]`` fp32 or ``None``: row ``offsets[n] + c`` is the
                        state of sequence n after exactly ``64·c`` of its tokens (c = 0 is the
                        initial state). The final state is *not* among them.
    checkpoint_offsets: ``[N+1]`` int64 (CPU) or ``None``: where each sequence's checkpoints start.
    """

    o: torch.Tensor
    final_state: torch.Tensor
    checkpoints: torch.Tensor | None = None
    checkpoint_offsets: torch.Tensor | None = None


def _prepare(q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm, output_checkpoints=False):
    """Validate, upcast to fp32, normalise q/k and expand key heads to value heads."""
    lengths = validate_gdn_inputs(q, k, v, g, beta, cu_seqlens, initial_state)
    T, H, K = q.shape
    HV, V = v.shape[1:]
    scale = check_scale(scale, K)
    check_flag("use_qk_l2norm", use_qk_l2norm)
    check_flag("output_checkpoints", output_checkpoints)
    qf, kf = (l2norm(q), l2norm(k)) if use_qk_l2norm else (q.float(), k.float())
    group = HV // H  # value head i reads key head i // group
    qf = qf.repeat_interleave(group, dim=1)
    kf = kf.repeat_interleave(group, dim=1)
    h0 = (torch.zeros(len(lengths), HV, K, V, device=q.device) if initial_state is None
          else initial_state.float())
    return lengths, scale, qf, kf, v.float(), g.float(), beta.float(), h0


def recurrent_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None,
                               use_qk_l2norm=False, output_checkpoints=False) -> GDNOutput:
    """Reference GDN over a packed batch, one token at a time (slow, exact, fp32).

    Args:
        q, k: ``[T, H, K]``;  v: ``[T, HV, V]``;  g, beta: ``[T, HV]`` (g is the log-decay).
        scale: output scale, default ``K**-0.5``.
        initial_state: ``[N, HV, K, V]`` or ``None`` (zeros).
        cu_seqlens: ``[N+1]`` int, 0 … T, strictly increasing; ``None`` = one sequence.
        use_qk_l2norm: L2-normalise q and k first (eps 1e-6 inside the sqrt).
        output_checkpoints: also return the state at the start of every 64-token chunk.
    """
    out_dtype = q.dtype
    lengths, scale, q, k, v, g, beta, h0 = _prepare(q, k, v, g, beta, scale, initial_state,
                                                    cu_seqlens, use_qk_l2norm, output_checkpoints)
    o = torch.empty_like(v)
    finals, ckpts = [], []
    start = 0
    for n, length in enumerate(lengths):
        S = h0[n].clone()  # [HV, K, V]
        for t in range(start, start + length):
            if (t - start) % CHUNK == 0:
                ckpts.append(S.clone())
            S = S * g[t].exp()[:, None, None]
            pred = torch.einsum("hkv,hk->hv", S, k[t])
            v_new = beta[t][:, None] * (v[t] - pred)
            S = S + k[t][:, :, None] * v_new[:, None, :]
            o[t] = scale * torch.einsum("hkv,hk->hv", S, q[t])
        finals.append(S)
        start += length
    if not output_checkpoints:
        return GDNOutput(o.to(out_dtype), torch.stack(finals))
    return GDNOutput(o.to(out_dtype), torch.stack(finals), torch.stack(ckpts),
                     torch.tensor(checkpoint_offsets(lengths), dtype=torch.int64))
