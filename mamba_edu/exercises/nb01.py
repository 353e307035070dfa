"""Checks of notebook 01 (the Gated DeltaNet recurrence).

1. ``my_l2norm`` — normalise q/k rows, eps inside the square root.
2. ``my_gating`` — the decay ``g`` and write strength ``beta`` from the projections.
3. ``my_key_head`` — which key head a value head reads under grouped heads (GQA).
"""

from __future__ import annotations

import torch

from mamba_edu.exercises.core import checker, exercise
from mamba_edu.gdn import gdn_gating, l2norm, recurrent_gated_delta_rule
from mamba_edu.testing import check as compare

NOTEBOOK = "01_gated_deltanet_recurrence"
check = checker(NOTEBOOK)


@exercise(NOTEBOOK, 1, "L2 norm, eps inside the root", "my_l2norm",
          forbidden=("mamba_edu.gdn.gating", "torch.nn.functional.normalize"))
def check_l2norm(fn) -> str:
    """Rows of all sizes, including tiny ones where the place of eps decides the result."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(7, 3, 16, generator=gen)
    x[0, 0] = 1e-4 * x[0, 0]  # Σx² ≈ 1e-7 < eps: eps outside the root would give a different row
    compare(fn(x), l2norm(x), tol=1e-6, name="exercise 1 l2norm", quiet=True)
    return "rows match mamba_edu.gdn.l2norm, tiny rows included"


@exercise(NOTEBOOK, 2, "Qwen3-Next gating", "my_gating", forbidden=("mamba_edu.gdn.gating", "mamba_edu.kernels"))
def check_gating(fn) -> str:
    """Compare with :func:`gdn_gating`, with ``a + dt_bias`` far above the softplus threshold
    (where log(1 + eˣ) overflows) and far below it."""
    gen = torch.Generator().manual_seed(1)
    HV = 4
    A_log = torch.tensor([-2.0, 0.0, 1.0, 3.0])
    dt_bias = torch.randn(HV, generator=gen)
    a = torch.cat([3 * torch.randn(8, HV, generator=gen), torch.tensor([[100.0, -100.0, 20.5, 19.5]])])
    b = 4 * torch.randn(9, HV, generator=gen)
    g, beta = fn(A_log, a, b, dt_bias)
    g_ref, beta_ref = gdn_gating(A_log, a, b, dt_bias)
    compare(g, g_ref, tol=1e-6, name="exercise 2 gating: g", quiet=True)
    compare(beta, beta_ref, tol=1e-6, name="exercise 2 gating: beta", quiet=True)
    return "g and beta match the package, softplus threshold included"


@exercise(NOTEBOOK, 3, "key head of a value head (GQA)", "my_key_head", forbidden=("mamba_edu.gdn",))
def check_key_head(fn) -> str:
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
                raise AssertionError(f"key_head({i}, H={H}, HV={HV}) = {kh!r}; expected an int in [0, {H})")
            one = recurrent_gated_delta_rule(q[:, [kh]], k[:, [kh]], v[:, [i]], g[:, [i]],
                                             beta[:, [i]], use_qk_l2norm=True).o
            compare(one, full[:, [i]], name=f"value head {i} (H={H}, HV={HV}) reading key head {kh}", quiet=True)
    return "every value head reads the key head the package uses"
