"""The layers of the hybrid model: norms, MLP, full attention, and the Gated DeltaNet mixer.

Activations are packed varlen ``[T, hidden]`` (all tokens of the batch, sequence after
sequence) exactly as a serving engine runs them. A layer never looks at slots or tracking:
the GDN mixer hands its projections to the *backend* (``mamba_edu.serving``), which owns the
state pool, the kernels and the tracking strategy.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mamba_edu.kernels.attention import causal_attention
from mamba_edu.kernels.fused_ops import add_rms_norm, rms_norm, rope, silu_mul
from mamba_edu.model.config import ModelConfig

KV = tuple[torch.Tensor, torch.Tensor]  # (k, v) of one sequence in one attention layer


def init_param(gen: torch.Generator, shape, std: float, device, dtype) -> nn.Parameter:
    """A seeded N(0, std²) parameter, drawn in fp32 on ``device`` then cast."""
    t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std
    return nn.Parameter(t.to(dtype), requires_grad=False)


class RMSNorm(nn.Module):
    """``x / rms(x) · weight`` over the last dim (``F.rms_norm`` on CPU, one Triton kernel on a
    GPU: :mod:`mamba_edu.kernels.fused_ops`, like every small op of the forward)."""

    def __init__(self, dim: int, eps: float, device, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype), requires_grad=False)
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)

    def fused_add_norm(self, x: torch.Tensor, delta: torch.Tensor | None):
        """A residual add and this norm after it, fused: ``(x + delta, norm(x + delta))``, both
        ``[T, D]``, in one pass over the rows (one kernel on a GPU, where the add alone would be a
        second one). ``delta = None``: nothing to add, ``(x, norm(x))``."""
        if delta is None:
            return x, rms_norm(x, self.weight, self.eps)
        return add_rms_norm(x, delta, self.weight, self.eps)


class MLP(nn.Module):
    """SwiGLU MLP. A dense stand-in for the model's mixture of experts, as wide as the active
    experts (routed top-k + shared), so FLOPs per token match; routing is not simulated."""

    def __init__(self, cfg: ModelConfig, gen, device, dtype, out_std: float):
        super().__init__()
        self.gate_up = init_param(gen, (2 * cfg.mlp_width, cfg.hidden), cfg.hidden ** -0.5, device, dtype)
        self.down = init_param(gen, (cfg.hidden, cfg.mlp_width), out_std * cfg.mlp_width ** -0.5,
                               device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, hidden]`` → gate/up projection ``[T, 2·mlp_width]`` → ``silu(gate) · up`` →
        down projection ``[T, hidden]``."""
        return F.linear(silu_mul(F.linear(x, self.gate_up)), self.down)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float):
    """``cos, sin [T, 1, head_dim/2]`` fp32 of the rotary embedding at ``positions [T]``; built once
    per forward and shared by every attention layer."""
    D = head_dim
    inv_freq = theta ** (-torch.arange(0, D, 2, device=positions.device, dtype=torch.float32) / D)
    angles = positions.float()[:, None] * inv_freq  # [T, D/2]
    return angles.cos()[:, None, :], angles.sin()[:, None, :]


class Attention(nn.Module):
    """Full causal attention with grouped KV heads (GQA).

    Each sequence attends to its cached prefix KV (``batch.prefix_kv``) and its own new tokens:
    :func:`~mamba_edu.kernels.attention.causal_attention` (one Triton launch on a GPU where it is
    faster than SDPA, SDPA otherwise and on the CPU). ``forward`` returns
    ``(out [T, hidden], kv)``: ``kv[i] = (k, v)``, each ``[P_i + E_i, kv_heads, head_dim]``, the
    full KV of sequence i (its prefix and its new tokens), for the engine (and the prefix cache)
    to keep. ``rotary``: the forward's ``(cos, sin)`` from :func:`rope_tables`.
    """

    def __init__(self, cfg: ModelConfig, attn_index: int, gen, device, dtype, out_std: float):
        super().__init__()
        self.attn_index = attn_index  # which attention layer this is (0-based among attention layers)
        self.heads, self.kv_heads, self.head_dim = cfg.attn_heads, cfg.attn_kv_heads, cfg.attn_head_dim
        qkv_out = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.qkv = init_param(gen, (qkv_out, cfg.hidden), cfg.hidden ** -0.5, device, dtype)
        self.out = init_param(gen, (cfg.hidden, self.heads * self.head_dim),
                              out_std * (self.heads * self.head_dim) ** -0.5, device, dtype)

    def forward(self, x: torch.Tensor, batch, rotary, backend) -> tuple[torch.Tensor, list[KV]]:
        """``x [T, hidden]`` → ``qkv [T, (heads + 2·kv_heads)·head_dim]`` → ``(out [T, hidden], kv)``.
        The attention core goes through ``backend.attend`` (which runs :meth:`attend`), so that a
        breakable CUDA graph can cut the forward there (:mod:`mamba_edu.serving.breakable`)."""
        T = x.shape[0]
        qkv = F.linear(x, self.qkv)
        qk, v = qkv.split(
            [(self.heads + self.kv_heads) * self.head_dim, self.kv_heads * self.head_dim], -1)
        # q and k are neighbours in the projection: one rotation covers both.
        q, k = rope(qk.view(T, self.heads + self.kv_heads, self.head_dim), *rotary).split(
            [self.heads, self.kv_heads], dim=1)
        v = v.view(T, self.kv_heads, self.head_dim)
        o, kv = backend.attend(self, q, k, v, batch)
        return F.linear(o.flatten(1), self.out), kv

    def attend(self, q, k, v, batch) -> tuple[torch.Tensor, list[KV]]:
        """The attention core: ``q [T, heads, D]``, ``k, v [T, kv_heads, D]`` → ``(o [T, heads, D],
        kv)``. A bucket's batch (fixed shapes, :mod:`mamba_edu.engine.bucket`) runs one call over
        the whole bucket and returns the bucket's ``(k, v)``; otherwise ``kv[i]`` is sequence i's."""
        if batch.bucket is not None:
            return batch.bucket.attend(self, q, k, v), (k, v)
        fresh_equal = (batch.mode == "extend" and batch.size > 1 and not any(batch.prefix_lens)
                       and len(set(batch.extend_lens)) == 1)
        attend = self._attend_fresh_equal if fresh_equal else self.attend_each
        return attend(q, k, v, batch)

    def _attend_fresh_equal(self, q, k, v, batch) -> tuple[torch.Tensor, list[KV]]:
        """N > 1 fresh prompts of one length (a benchmark batch): one call over all of them.
        (One prompt takes :meth:`attend_each`, like a prefix hit does.)"""
        kv = [(k[start:stop], v[start:stop]) for start, stop in batch.token_ranges]
        return causal_attention(q, k, v, batch.size), kv

    def attend_each(self, q, k, v, batch) -> tuple[torch.Tensor, list[KV]]:
        """One call per sequence, over its cached prefix KV and its new tokens (bottom-right
        causal: new token t sees the prefix and the new tokens up to t; a decode token sees all).
        Rows of no tokens (a bucket's padding) are skipped."""
        outs, kv = [], []
        for i, (start, stop) in enumerate(batch.token_ranges):
            if start == stop:  # a bucket's zero-length padding row
                kv.append((k[start:stop], v[start:stop]))
                continue
            prefix = batch.prefix_kv[i]
            k_i, v_i = k[start:stop], v[start:stop]
            if prefix is not None:
                k_i = torch.cat([prefix[self.attn_index][0], k_i])
                v_i = torch.cat([prefix[self.attn_index][1], v_i])
            kv.append((k_i, v_i))
            outs.append(causal_attention(q[start:stop], k_i, v_i))
        # One sequence: no cat, which would copy the whole output once more (a device-to-device
        # copy per attention layer in the GPU traces).
        return (outs[0] if len(outs) == 1 else torch.cat(outs)), kv


class GDNMixer(nn.Module):
    """A Gated DeltaNet layer, with Qwen3-Next's layout.

    ``x [T, hidden]`` → one in-projection (``in_proj``) → ``mixed_qkv [T, D]``
    (``D = 2·H·K + HV·V``), the output gate ``z [T, HV·V]`` and the gate inputs ``a, b [T, HV]`` →
    **backend** (causal conv1d on ``mixed_qkv`` with the pooled conv state, split into q/k/v,
    gating with ``A_log``/``dt_bias``, the GDN core with the pooled SSM state, state tracking, and
    the gated RMSNorm ``rms(o)·norm_weight·silu(z)`` per head, inside the prefill's output kernel
    on a GPU) → ``o [T, HV, V]`` → out-projection.

    The backend reads the layer's parameters from this module: ``conv_weight [D, W]``,
    ``conv_bias [D]``, ``A_log, dt_bias [HV]``, ``norm_weight [V]``, ``norm_eps`` and the head
    counts (:class:`~mamba_edu.serving.GDNLayerParams`).
    """

    def __init__(self, cfg: ModelConfig, gdn_index: int, gen, device, dtype, out_std: float):
        super().__init__()
        self.gdn_index = gdn_index  # this layer's index in the state pool
        H, HV, K, V = cfg.gdn_key_heads, cfg.gdn_value_heads, cfg.gdn_key_dim, cfg.gdn_value_dim
        self.key_heads, self.value_heads, self.key_dim, self.value_dim = H, HV, K, V
        self.conv_dim = cfg.conv_dim
        self.norm_eps = cfg.norm_eps
        # One matmul for [mixed_qkv | z | b | a] (drawn as the two blocks q/k/v/z and b/a).
        std = cfg.hidden ** -0.5
        self.in_proj = nn.Parameter(torch.cat([
            init_param(gen, (self.conv_dim + HV * V, cfg.hidden), std, device, dtype),
            init_param(gen, (2 * HV, cfg.hidden), std, device, dtype)]), requires_grad=False)
        self.conv_weight = init_param(gen, (self.conv_dim, cfg.conv_width), cfg.conv_width ** -0.5,
                                      device, dtype)
        self.conv_bias = init_param(gen, (self.conv_dim,), 0.1, device, dtype)
        # Decay rates A ∈ [1, 16) and time steps dt ∈ [1e-3, 1e-1), as in Mamba-style inits.
        u = torch.rand(2, HV, generator=gen, device=device, dtype=torch.float32)
        self.A_log = nn.Parameter((1 + 15 * u[0]).log(), requires_grad=False)
        dt = (math.log(1e-3) + u[1] * (math.log(1e-1) - math.log(1e-3))).exp()
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)), requires_grad=False)
        self.norm_weight = nn.Parameter(torch.ones(V, device=device, dtype=dtype), requires_grad=False)
        self.out = init_param(gen, (cfg.hidden, HV * V), out_std * (HV * V) ** -0.5, device, dtype)

    def split_qkv(self, y: torch.Tensor):
        """``y [T, D]`` (after the conv) → ``q, k [T, H, K]``, ``v [T, HV, V]``: views of y's
        columns, no copy (the kernels read rows with y's row stride)."""
        T, H, HV, K, V = y.shape[0], self.key_heads, self.value_heads, self.key_dim, self.value_dim
        q, k, v = y.split([H * K, H * K, HV * V], dim=-1)
        return q.view(T, H, K), k.view(T, H, K), v.view(T, HV, V)

    def forward(self, x: torch.Tensor, batch, backend) -> torch.Tensor:
        """``x [T, hidden]`` → ``projected [T, D + HV·V + 2·HV]`` (``mixed_qkv | z | b | a``) →
        backend → ``[T, hidden]``."""
        T, HV, V = x.shape[0], self.value_heads, self.value_dim
        mixed_qkv, z, b, a = F.linear(x, self.in_proj).split([self.conv_dim, HV * V, HV, HV], -1)
        # mixed_qkv, z, a and b are column slices of the projection: the kernels read their rows
        # with its row stride, so nothing is copied out.
        o = backend.forward(self, mixed_qkv, a, b, batch, z=z)  # normed: rms(o)·w·silu(z)
        return F.linear(o.view(T, -1), self.out)
