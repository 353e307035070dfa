"""Checks of notebook 01 (the Gated DeltaNet recurrence).

1. ``my_l2norm`` — normalise q/k rows, eps inside the square root, fp32 out.
2. ``my_gating`` — the decay ``g`` and write strength ``beta`` from the projections.
3. ``my_head_recurrence`` — the gated delta rule of one value head over a prompt, from scratch,
   reading its key head under grouped heads (GQA).
4. ``my_readback`` — predict-then-measure: write the same unit key and value ``n`` times into an
   empty memory with write strength ``beta`` and log-decay ``g``; what multiple of ``v`` does reading
   the key return? The check measures it with the package's recurrence (tolerance 1e-4).

Exercises 1 and 2 require every input they passed to come back unchanged, exercise 3 its ``S0``.
"""

from __future__ import annotations

import math

import torch

from mamba_edu.exercises.core import check_seed, checker, exercise, observe
from mamba_edu.gdn import gdn_gating, l2norm, recurrent_gated_delta_rule
from mamba_edu.testing import check as compare

NOTEBOOK = "01_gated_deltanet_recurrence"
check = checker(NOTEBOOK)


def _fp32(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise AssertionError(f"{name} is a {type(t).__name__}; expected a torch tensor")
    if t.dtype != torch.float32:
        raise AssertionError(f"{name} has dtype {t.dtype}; expected torch.float32")


@exercise(NOTEBOOK, 1, "L2 norm, eps inside the root", "my_l2norm",
          forbidden=("mamba_edu.gdn.gating", "torch.nn.functional.normalize"))
def check_l2norm(fn) -> str:
    """Rows of all sizes, including tiny ones where the place of eps decides the result, and a
    bf16 input (the result is fp32 whatever the input)."""
    gen = torch.Generator().manual_seed(check_seed(11))
    x = torch.randn(7, 3, 16, generator=gen)
    x[0, 0] = 1e-4 * x[0, 0]  # Σx² ≈ 1e-7 < eps: eps outside the root would give a different row
    y = observe(fn, x.clone()).result  # observe: the input must come back unchanged
    _fp32(y, "the result")
    compare(y, l2norm(x), tol=1e-6, name="exercise 1 l2norm", quiet=True)
    xb = torch.randn(5, 12, generator=gen).bfloat16()
    yb = observe(fn, xb.clone()).result
    _fp32(yb, "the result for a bf16 input")
    compare(yb, l2norm(xb), tol=1e-6, name="exercise 1 l2norm of a bf16 input", quiet=True)
    return "rows match mamba_edu.gdn.l2norm, tiny rows and a bf16 input included"


@exercise(NOTEBOOK, 2, "Qwen3-Next gating", "my_gating", forbidden=("mamba_edu.gdn.gating", "mamba_edu.kernels"))
def check_gating(fn) -> str:
    """Compare with :func:`gdn_gating`, with ``a + dt_bias`` far above the softplus threshold
    (where log(1 + eˣ) overflows) and far below it; torch's softplus is refused."""
    gen = torch.Generator().manual_seed(check_seed(1))
    HV = 4
    A_log = torch.tensor([-2.0, 0.0, 1.0, 3.0])
    dt_bias = torch.randn(HV, generator=gen)
    a = torch.cat([3 * torch.randn(8, HV, generator=gen), torch.tensor([[100.0, -100.0, 20.5, 19.5]])])
    b = 4 * torch.randn(9, HV, generator=gen)
    seen = observe(fn, A_log.clone(), a.clone(), b.clone(), dt_bias.clone())
    if "softplus" in seen.ops:
        raise AssertionError("the answer calls torch's softplus: write it yourself")
    if not (isinstance(seen.result, tuple | list) and len(seen.result) == 2):
        raise AssertionError(f"my_gating returned {type(seen.result).__name__}; expected a tuple (g, beta)")
    g, beta = seen.result
    g_ref, beta_ref = gdn_gating(A_log, a, b, dt_bias)
    _fp32(g, "g")
    _fp32(beta, "beta")
    compare(g, g_ref, tol=1e-6, name="exercise 2 gating: g", quiet=True)
    compare(beta, beta_ref, tol=1e-6, name="exercise 2 gating: beta", quiet=True)
    return "g and beta match the package, softplus threshold included"


@exercise(NOTEBOOK, 3, "one value head's recurrence (GQA)", "my_head_recurrence",
          forbidden=("mamba_edu.gdn", "mamba_edu.kernels"))
def check_head_recurrence(fn) -> str:
    """Every value head of GQA layers (1, 2 or 4 key heads; 1 to 9 tokens; K ≠ V; a scale that is
    not K^-½) from a random state, against the package's recurrence; ``S0`` must come back as it
    was."""
    gen = torch.Generator().manual_seed(check_seed(2))
    for H, HV, T in ((1, 3, 5), (2, 4, 1), (2, 6, 9), (4, 4, 7)):
        K, V, scale = 8, 4, 0.7
        q, k = l2norm(torch.randn(2, T, H, K, generator=gen))
        v = torch.randn(T, HV, V, generator=gen)
        g, beta = -torch.rand(T, HV, generator=gen), torch.rand(T, HV, generator=gen)
        h0 = torch.randn(1, HV, K, V, generator=gen)
        ref = recurrent_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0)
        for i in range(HV):
            where = f"value head {i} of H={H}, HV={HV}, T={T}"
            S0 = h0[0, i].clone()
            result = fn(q.clone(), k.clone(), v.clone(), g.clone(), beta.clone(), S0, i, scale)
            if not (isinstance(result, tuple | list) and len(result) == 2):
                raise AssertionError(f"my_head_recurrence returned {type(result).__name__}; expected a "
                                     "tuple (o, S_T)")
            o, S_T = result
            _fp32(o, f"o ({where})")
            _fp32(S_T, f"S_T ({where})")
            compare(o, ref.o[:, i], name=f"outputs o, {where}", quiet=True)
            compare(S_T, ref.final_state[0, i], name=f"final state, {where}", quiet=True)
            if not torch.equal(S0, h0[0, i]):
                raise AssertionError(f"{where}: the answer changed S0 in place; leave the state it "
                                     "was given as it was")
    return "outputs and final state of every value head match recurrent_gated_delta_rule"


# ---------------------------------------------------------------------------------------------
# Exercise 4: predict, then measure
# ---------------------------------------------------------------------------------------------

#: The (n, beta, g) of exercise 4's check: one write and many, beta = 1 and not, with and without decay.
READBACK_CASES = ((1, 0.5, 0.0), (3, 0.5, 0.0), (10, 0.9, 0.0), (2, 1.0, -1.0), (1, 0.8, -2.0),
                  (4, 0.5, -0.5), (64, 0.3, -0.1), (200, 0.25, -0.05), (5, 1.0, 0.0), (6, 0.1, -3.0))


def measured_readback(n: int, beta: float, g: float, K: int = 8, V: int = 4) -> float:
    """Write the same unit key ``k`` and value ``v`` ``n`` times into an empty memory with the
    package's recurrence (write strength ``beta``, log-decay ``g``), read ``S^T k``: the multiple
    of ``v`` it returns (its projection on ``v`` over ``|v|²``)."""
    gen = torch.Generator().manual_seed(7)
    k = l2norm(torch.randn(K, generator=gen))
    v = torch.randn(V, generator=gen)
    out = recurrent_gated_delta_rule(k.expand(n, 1, K), k.expand(n, 1, K), v.expand(n, 1, V),
                                     torch.full((n, 1), float(g)), torch.full((n, 1), float(beta)),
                                     scale=1.0, initial_state=torch.zeros(1, 1, K, V))
    read = out.final_state[0, 0].T @ k
    return float(read @ v / (v @ v))


@exercise(NOTEBOOK, 4, "predict the read-back after n writes", "my_readback",
          forbidden=("mamba_edu.gdn", "mamba_edu.kernels"))
def check_readback(fn) -> str:
    """``fn(n, beta, g)`` must equal the measured read-back within 1e-4 for every case of
    :data:`READBACK_CASES`."""
    for n, beta, g in READBACK_CASES:
        said = fn(n, beta, g)
        if isinstance(said, bool) or not isinstance(said, int | float):
            raise AssertionError(f"the prediction for n = {n}, beta = {beta}, g = {g} is {said!r:.60}; "
                                 "expected a plain number (an int or a float, not a tensor)")
        got = measured_readback(n, beta, g)
        if not math.isfinite(said) or abs(said - got) > 1e-4:
            raise AssertionError(f"n = {n} writes, beta = {beta}, g = {g}: you predicted that reading k returns "
                                 f"{said:.6g} · v, the recurrence measures {got:.6g} · v (tolerance 1e-4)")
    return (f"your prediction equals the measured read-back for {len(READBACK_CASES)} (n, beta, g), "
            "within 1e-4")
