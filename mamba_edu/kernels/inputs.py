"""Random GDN batches with realistic gates, for the tests, the notebooks and the benchmark."""

from __future__ import annotations

import torch

from mamba_edu.gdn import gdn_gating


def random_gates(T: int, HV: int, *, generator: torch.Generator, device="cpu"):
    """Qwen3-Next-style ``(g, beta)`` ``[T, HV]`` fp32: decays from ≈0 down to ≈ −50 per token."""
    A_log = torch.empty(HV).uniform_(0.0, 2.77, generator=generator)  # e^A_log in [1, 16]
    dt_bias = torch.randn(HV, generator=generator)
    a, b = (torch.randn(T, HV, generator=generator) for _ in range(2))
    g, beta = gdn_gating(A_log, a, b, dt_bias)
    return g.to(device), beta.to(device)


def random_prefill_inputs(lengths: list[int], H: int, HV: int, K: int, V: int, *,
                          dtype=torch.float32, device="cpu", seed: int = 0) -> dict:
    """``q, k [T, H, K]``, ``v [T, HV, V]`` in ``dtype`` and fp32 ``g, beta [T, HV]``."""
    gen = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    q, k = (torch.randn(T, H, K, generator=gen).to(device, dtype) for _ in range(2))
    v = torch.randn(T, HV, V, generator=gen).to(device, dtype)
    g, beta = random_gates(T, HV, generator=gen, device=device)
    return dict(q=q, k=k, v=v, g=g, beta=beta)


def random_pool(slots: int, HV: int, K: int, V: int, *, device="cpu", seed: int = 1):
    """A pool ``[slots, HV, K, V]`` fp32 of random states (so that every slot is distinguishable)."""
    gen = torch.Generator().manual_seed(seed)
    return (0.1 * torch.randn(slots, HV, K, V, generator=gen)).to(device)
