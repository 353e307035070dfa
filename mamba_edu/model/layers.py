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

from mamba_edu.model.config import ModelConfig


def init_param(gen: torch.Generator, shape, std: float, device, dtype) -> nn.Parameter:
    """A seeded N(0, std²) parameter, drawn in fp32 on ``device`` then cast."""
    t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std
    return nn.Parameter(t.to(dtype), requires_grad=False)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) · weight`` over the last dim, computed in fp32."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype), requires_grad=False)
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class MLP(nn.Module):
    """SwiGLU MLP. A dense stand-in for the model's mixture of experts, as wide as the active
    experts (routed top-k + shared), so FLOPs per token match; routing is not simulated."""

    def __init__(self, cfg: ModelConfig, gen, device, dtype, out_std: float):
        super().__init__()
        self.gate_up = init_param(gen, (2 * cfg.mlp_width, cfg.hidden), cfg.hidden ** -0.5, device, dtype)
        self.down = init_param(gen, (cfg.hidden, cfg.mlp_width), out_std * cfg.mlp_width ** -0.5,
                               device, dtype)

    def forward(self, x):
        gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding (rotate-half form). ``x: [T, heads, D]``, ``positions: [T]``."""
    D = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)
    angles = positions.float()[:, None] * inv_freq  # [T, D/2]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Attention(nn.Module):
    """Full causal attention with grouped KV heads (GQA) through SDPA.

    Each sequence attends to its cached prefix KV (``batch.prefix_kv``) and its own new tokens;
    the concatenated KV of every sequence is left in ``batch.kv_out`` for the engine (and the
    prefix cache) to keep.
    """

    def __init__(self, cfg: ModelConfig, attn_index: int, gen, device, dtype, out_std: float):
        super().__init__()
        self.attn_index = attn_index  # which attention layer this is (0-based among attention layers)
        self.heads, self.kv_heads, self.head_dim = cfg.attn_heads, cfg.attn_kv_heads, cfg.attn_head_dim
        self.theta = cfg.rope_theta
        qkv_out = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.qkv = init_param(gen, (qkv_out, cfg.hidden), cfg.hidden ** -0.5, device, dtype)
        self.out = init_param(gen, (cfg.hidden, self.heads * self.head_dim),
                              out_std * (self.heads * self.head_dim) ** -0.5, device, dtype)

    def forward(self, x: torch.Tensor, batch) -> torch.Tensor:
        T = x.shape[0]
        q, k, v = F.linear(x, self.qkv).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], -1)
        q = rope(q.view(T, self.heads, self.head_dim), batch.positions, self.theta)
        k = rope(k.view(T, self.kv_heads, self.head_dim), batch.positions, self.theta)
        v = v.view(T, self.kv_heads, self.head_dim)
        outs = []
        for i, (start, stop) in enumerate(batch.token_ranges):
            prefix = batch.prefix_kv[i]
            k_i, v_i = k[start:stop], v[start:stop]
            if prefix is not None:
                k_i = torch.cat([prefix[self.attn_index][0], k_i])
                v_i = torch.cat([prefix[self.attn_index][1], v_i])
            batch.kv_out[i][self.attn_index] = (k_i, v_i)
            # SDPA wants [heads, tokens, D]; the mask lets new token t see prefix + tokens <= t.
            o = F.scaled_dot_product_attention(
                q[start:stop].transpose(0, 1), k_i.transpose(0, 1), v_i.transpose(0, 1),
                attn_mask=batch.attn_masks[i], enable_gqa=True)
            outs.append(o.transpose(0, 1))
        return F.linear(torch.cat(outs).flatten(1), self.out)


class GDNMixer(nn.Module):
    """A Gated DeltaNet layer, with Qwen3-Next's layout.

    ``x [T, hidden]`` → in-projections → ``mixed_qkv [T, D]`` (``D = 2·H·K + HV·V``), the output
    gate ``z [T, HV·V]`` and the gate inputs ``a, b [T, HV]`` → **backend** (causal conv1d on
    ``mixed_qkv`` with the pooled conv state, split into q/k/v, gating with ``A_log``/``dt_bias``,
    the GDN core with the pooled SSM state, state tracking) → ``o [T, HV, V]`` → gated RMSNorm
    ``rms(o)·w·silu(z)`` per head → out-projection.

    The backend reads the layer's parameters from this module: ``conv_weight [D, W]``,
    ``conv_bias [D]``, ``A_log, dt_bias [HV]`` and the head counts.
    """

    def __init__(self, cfg: ModelConfig, gdn_index: int, gen, device, dtype, out_std: float):
        super().__init__()
        self.gdn_index = gdn_index  # this layer's index in the state pool
        H, HV, K, V = cfg.gdn_key_heads, cfg.gdn_value_heads, cfg.gdn_key_dim, cfg.gdn_value_dim
        self.key_heads, self.value_heads, self.key_dim, self.value_dim = H, HV, K, V
        self.conv_dim = cfg.conv_dim
        self.eps = cfg.norm_eps
        self.in_qkvz = init_param(gen, (self.conv_dim + HV * V, cfg.hidden), cfg.hidden ** -0.5,
                                  device, dtype)
        self.in_ba = init_param(gen, (2 * HV, cfg.hidden), cfg.hidden ** -0.5, device, dtype)
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
        """``y [T, D]`` (after the conv) → contiguous ``q, k [T, H, K]``, ``v [T, HV, V]``."""
        T = y.shape[0]
        hk = self.key_heads * self.key_dim
        q, k, v = y.split([hk, hk, self.value_heads * self.value_dim], dim=-1)
        return (q.reshape(T, self.key_heads, self.key_dim).contiguous(),
                k.reshape(T, self.key_heads, self.key_dim).contiguous(),
                v.reshape(T, self.value_heads, self.value_dim).contiguous())

    def forward(self, x: torch.Tensor, batch, backend) -> torch.Tensor:
        T = x.shape[0]
        mixed_qkv, z = F.linear(x, self.in_qkvz).split([self.conv_dim, self.value_heads * self.value_dim], -1)
        b, a = F.linear(x, self.in_ba).chunk(2, dim=-1)
        # The kernels take contiguous inputs; these are column slices of one projection.
        o = backend.forward(self, mixed_qkv.contiguous(), a.contiguous(), b.contiguous(), batch)
        z = z.reshape(T, self.value_heads, self.value_dim)
        o = rms_norm(o, self.norm_weight, self.eps) * F.silu(z.float()).to(o.dtype)
        return F.linear(o.reshape(T, -1).to(x.dtype), self.out)
