"""Checks of notebook 01 (the Gated DeltaNet recurrence).

1. ``my_l2norm`` — normalise q/k rows, eps inside the square root, fp32 out.
2. ``my_gating`` — the decay ``g`` and write strength ``beta`` from the projections.
3. ``my_head_recurrence`` — the gated delta rule of one value head over a prompt, from scratch,
   reading its key head under grouped heads (GQA).
4. ``my_readback`` — predict-then-measure: write the same unit key and value ``n`` times into an
   empty memory with write strength ``beta`` and log-decay ``g``; what multiple of ``v`` does reading
   the key return? The check measures it with the package's recurrence (tolerance 1e-4).

Exercises 1 to 3 require every input they passed to come back unchanged.
"""

from __future__ import annotations

import math
import random

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
    """Rows of all sizes, including tiny ones where the place of eps decides the result, and
    bf16 and fp16 inputs (the result is fp32 whatever the input)."""
    gen = torch.Generator().manual_seed(check_seed(11))
    x = torch.randn(7, 3, 16, generator=gen)
    x[0, 0] = 1e-4 * x[0, 0]  # Σx² ≈ 1e-7 < eps: eps outside the root would give a different row
    y = observe(fn, x.clone()).result  # observe: the input must come back unchanged
    _fp32(y, "the result")
    compare(y, l2norm(x), tol=1e-6, name="exercise 1 l2norm", quiet=True)
    for dtype in (torch.bfloat16, torch.float16):
        xh = torch.randn(5, 12, generator=gen).to(dtype)
        yh = observe(fn, xh.clone()).result
        kind = str(dtype).removeprefix("torch.")
        _fp32(yh, f"the result for a {kind} input")
        compare(yh, l2norm(xh), tol=1e-6, name=f"exercise 1 l2norm of a {kind} input", quiet=True)
    return "rows match mamba_edu.gdn.l2norm, tiny rows and bf16 and fp16 inputs included"


@exercise(NOTEBOOK, 2, "Qwen3-Next gating", "my_gating", forbidden=("mamba_edu.gdn.gating", "mamba_edu.kernels"))
def check_gating(fn) -> str:
    """Compare with :func:`gdn_gating`, with ``a + dt_bias`` far above the softplus threshold
    (where log(1 + eˣ) overflows) and far below it, fp32 and bf16 inputs (the results are fp32
    either way); torch's softplus is refused."""
    gen = torch.Generator().manual_seed(check_seed(1))
    HV = 4
    for dtype in (torch.float32, torch.bfloat16):
        A_log = torch.tensor([-2.0, 0.0, 1.0, 3.0])[torch.randperm(HV, generator=gen)]
        dt_bias = torch.randn(HV, generator=gen)
        a = torch.cat([3 * torch.randn(8, HV, generator=gen), torch.tensor([[100.0, -100.0, 20.5, 19.5]])])
        b = 4 * torch.randn(9, HV, generator=gen)
        inputs = [t.to(dtype) for t in (A_log, a, b, dt_bias)]
        seen = observe(fn, *(t.clone() for t in inputs))
        if "softplus" in seen.ops:
            raise AssertionError("the answer calls torch's softplus: write it yourself")
        if not (isinstance(seen.result, tuple | list) and len(seen.result) == 2):
            raise AssertionError(f"my_gating returned {type(seen.result).__name__}; expected a tuple (g, beta)")
        g, beta = seen.result
        kind = str(dtype).removeprefix("torch.")
        g_ref, beta_ref = gdn_gating(*inputs)
        _fp32(g, f"g ({kind} inputs)")
        _fp32(beta, f"beta ({kind} inputs)")
        compare(g, g_ref, tol=1e-6, name=f"exercise 2 gating: g ({kind} inputs)", quiet=True)
        compare(beta, beta_ref, tol=1e-6, name=f"exercise 2 gating: beta ({kind} inputs)", quiet=True)
    return "g and beta match the package, softplus threshold and bf16 inputs included"


@exercise(NOTEBOOK, 3, "one value head's recurrence (GQA)", "my_head_recurrence",
          forbidden=("mamba_edu.gdn", "mamba_edu.kernels"))
def check_head_recurrence(fn) -> str:
    """Every value head of GQA layers (1, 2 or 4 key heads; 1 to 9 tokens; K ≠ V; a scale that is
    not K^-½) from a random state, against the package's recurrence (run after the answers, on
    the inputs as they were); every input, ``S0`` included, must come back as it was."""
    gen = torch.Generator().manual_seed(check_seed(2))
    for H, HV, T in ((1, 3, 5), (2, 4, 1), (2, 6, 9), (4, 4, 7)):
        K, V, scale = 8, 4, 0.7
        q, k = l2norm(torch.randn(2, T, H, K, generator=gen))
        v = torch.randn(T, HV, V, generator=gen)
        g, beta = -torch.rand(T, HV, generator=gen), torch.rand(T, HV, generator=gen)
        h0 = torch.randn(1, HV, K, V, generator=gen)
        answers = []
        for i in range(HV):
            where = f"value head {i} of H={H}, HV={HV}, T={T}"
            given = dict(q=q.clone(), k=k.clone(), v=v.clone(), g=g.clone(), beta=beta.clone(), S0=h0[0, i].clone())
            result = fn(*given.values(), i, scale)
            for name, kept in dict(q=q, k=k, v=v, g=g, beta=beta, S0=h0[0, i]).items():
                if not torch.equal(given[name], kept):
                    raise AssertionError(f"{where}: the answer changed {name} in place; leave every input "
                                         "as it was given (an engine's tensors are read again)")
            if not (isinstance(result, tuple | list) and len(result) == 2):
                raise AssertionError(f"my_head_recurrence returned {type(result).__name__}; expected a "
                                     "tuple (o, S_T)")
            answers.append((where, *result))
        ref = recurrent_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0)
        for i, (where, o, S_T) in enumerate(answers):
            _fp32(o, f"o ({where})")
            _fp32(S_T, f"S_T ({where})")
            compare(o, ref.o[:, i], name=f"outputs o, {where}", quiet=True)
            compare(S_T, ref.final_state[0, i], name=f"final state, {where}", quiet=True)
    return "outputs and final state of every value head match recurrent_gated_delta_rule"


# ---------------------------------------------------------------------------------------------
# Exercise 4: predict, then measure
# ---------------------------------------------------------------------------------------------

def readback_cases() -> list[tuple[int, float, float]]:
    """The ten (n, beta, g) of exercise 4's check, drawn per grading run: one write, beta = 1,
    no decay, both at once, and six drawn at random (n up to 200, beta in (0.05, 1), g in (-3, 0))."""
    rng = random.Random(check_seed(13))

    def beta() -> float:
        return round(rng.uniform(0.05, 1.0), 3)

    def g() -> float:
        return round(rng.uniform(-3.0, 0.0), 3)

    fixed = [(1, beta(), g()), (rng.randint(2, 9), 1.0, g()), (rng.randint(2, 30), beta(), 0.0),
             (rng.randint(2, 9), 1.0, 0.0)]
    return fixed + [(rng.randint(2, 200), beta(), g()) for _ in range(6)]


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
    :func:`readback_cases`."""
    cases = readback_cases()
    for n, beta, g in cases:
        said = fn(n, beta, g)
        if isinstance(said, bool) or not isinstance(said, int | float):
            raise AssertionError(f"the prediction for n = {n}, beta = {beta}, g = {g} is {said!r:.60}; "
                                 "expected a plain number (an int or a float, not a tensor)")
        got = measured_readback(n, beta, g)
        if not math.isfinite(said) or abs(said - got) > 1e-4:
            raise AssertionError(f"n = {n} writes, beta = {beta}, g = {g}: you predicted that reading k returns "
                                 f"{said:.6g} · v, the recurrence measures {got:.6g} · v (tolerance 1e-4)")
    return (f"your prediction equals the measured read-back for {len(cases)} (n, beta, g), "
            "within 1e-4")
