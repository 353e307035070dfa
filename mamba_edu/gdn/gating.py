"""Gating (Qwen3-Next) and the q/k L2 norm."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mamba_edu.gdn.varlen import check_floating


def gdn_gating(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor):
    """Per-token decay and write strength.

    Args:
        A_log, dt_bias: ``[HV]`` learned per value head.
        a, b: ``[T, HV]`` projections of the hidden state.
    Returns:
        ``g = −exp(A_log)·softplus(a + dt_bias)`` (log-decay, ≤ 0; −inf where it overflows, never
        NaN) and ``beta = sigmoid(b)``, both ``[T, HV]`` fp32.
    """
    for name, t in (("A_log", A_log), ("a", a), ("b", b), ("dt_bias", dt_bias)):
        check_floating(name, t)
    if len({t.device for t in (A_log, a, b, dt_bias)}) != 1:
        raise ValueError("A_log, a, b and dt_bias must be on one device")
    if a.shape != b.shape or a.dim() != 2:
        raise ValueError(f"a and b must both be [T, HV]; got a {tuple(a.shape)}, b {tuple(b.shape)}")
    hv = a.shape[1]
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        if t.shape != (hv,):
            raise ValueError(f"{name} must have shape [HV]=({hv},); got {tuple(t.shape)}")
    # exp(A_log) is capped at the largest fp32: an A_log of 100 would give inf, and inf · 0 (a
    # softplus that underflowed) is NaN; capped, g is −inf or finite, never NaN.
    rate = A_log.float().exp().clamp(max=torch.finfo(torch.float32).max)
    g = -rate * F.softplus(a.float() + dt_bias.float(), beta=1.0, threshold=20.0)
    return g, b.float().sigmoid()


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(Σx² + eps)`` over the last dim, in fp32 (eps inside the sqrt; a finite float >= 0)."""
    check_floating("x", x)
    if type(eps) not in (int, float) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a non-negative Python float (finite, not a bool); got {eps!r}")
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)
