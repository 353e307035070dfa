"""Notebook 01 (the Gated DeltaNet recurrence): reference answers and their checks.

Exercise 1: ``gating`` — the decay ``g`` and write strength ``beta`` from the projections.
Exercise 2: ``key_head`` — which key head a value head reads under grouped heads (GQA).
The checks compare your function with the package.
"""

from __future__ import annotations

import torch

from mamba_edu.gdn import gdn_gating, recurrent_gated_delta_rule
from mamba_edu.testing import check


def gating(A_log, a, b, dt_bias):
    """Qwen3-Next gating: ``g = −exp(A_log)·softplus(a + dt_bias)``, ``beta = sigmoid(b)``.

    Args: ``A_log, dt_bias: [HV]``; ``a, b: [T, HV]``.  Returns ``(g, beta)``, fp32 ``[T, HV]``.
    """
    x = a.float() + dt_bias.float()
    # softplus(x) = log(1 + eˣ) is x itself to fp32 precision above 20, and eˣ overflows past 88.
    softplus = torch.where(x > 20, x, torch.log1p(x.exp()))
    return -A_log.float().exp() * softplus, torch.sigmoid(b.float())


def check_gating(fn) -> None:
    """Compare ``fn`` with the package's :func:`gdn_gating`, including ``a + dt_bias`` far above
    the softplus threshold (where log(1 + eˣ) overflows) and far below it."""
    gen = torch.Generator().manual_seed(1)
    HV = 4
    A_log = torch.tensor([-2.0, 0.0, 1.0, 3.0])
    dt_bias = torch.randn(HV, generator=gen)
    a = torch.cat([3 * torch.randn(8, HV, generator=gen), torch.tensor([[100.0, -100.0, 20.5, 19.5]])])
    b = 4 * torch.randn(9, HV, generator=gen)
    g, beta = fn(A_log, a, b, dt_bias)
    g_ref, beta_ref = gdn_gating(A_log, a, b, dt_bias)
    check(g, g_ref, tol=1e-6, name="exercise 1 gating: g", quiet=True)
    check(beta, beta_ref, tol=1e-6, name="exercise 1 gating: beta", quiet=True)
    print("PASS exercise 1 gating: g and beta match the package, softplus threshold included")


def key_head(value_head: int, H: int, HV: int) -> int:
    """The key head read by ``value_head`` when ``HV = G·H`` (contiguous groups of G)."""
    return value_head // (HV // H)


def check_key_head(fn) -> None:
    """Rebuild a GQA run one value head at a time with ``fn``'s key heads; compare with the package."""
    gen = torch.Generator().manual_seed(2)
    for H, HV in ((1, 3), (2, 4), (2, 6), (4, 4)):
        T, K, V = 6, 4, 4
        q, k = torch.randn(2, T, H, K, generator=gen)
        v = torch.randn(T, HV, V, generator=gen)
        g, beta = -torch.rand(T, HV, generator=gen), torch.rand(T, HV, generator=gen)
        full = recurrent_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True).o
        for i in range(HV):
            kh = fn(i, H, HV)
            if not (isinstance(kh, int) and 0 <= kh < H):
                raise AssertionError(f"FAIL exercise 2 key_head({i}, H={H}, HV={HV}) = {kh!r}; "
                                     f"expected an int in [0, {H})")
            one = recurrent_gated_delta_rule(q[:, [kh]], k[:, [kh]], v[:, [i]], g[:, [i]],
                                             beta[:, [i]], use_qk_l2norm=True).o
            check(one, full[:, [i]], name=f"exercise 2 value head {i} (H={H}, HV={HV})", quiet=True)
    print("PASS exercise 2 key_head: every value head reads the key head the package uses")
