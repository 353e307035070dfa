"""Notebook 01's checks: the right answers pass, plausible wrong ones fail (stubs: test_exercise_stubs.py).

Every answer is judged through the grader's own path (:func:`exercise_judge.judge_answer`).
"""

import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from exercise_judge import judge_answer

from mamba_edu.exercises.core import FAIL, PASS
from mamba_edu.gdn import gdn_gating, l2norm, recurrent_gated_delta_rule

NB = "01_gated_deltanet_recurrence"


def _judged(number, right, wrong):
    assert judge_answer(NB, number, right).status == PASS
    verdict = judge_answer(NB, number, wrong)
    assert verdict.status == FAIL, verdict
    return verdict


# --- exercise 1: the L2 norm ----------------------------------------------------------------------

def l2norm_right(x):
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def l2norm_in_place(x):
    """Right values, but an fp32 input is scaled in place (x.float() is x itself then)."""
    x = x.float()
    return x.mul_(torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6))


def l2norm_in_a_thread(x):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(torch.nn.functional.normalize, x.float(), dim=-1).result()


renamed_l2norm = l2norm  # the package's function under another name


def l2norm_bf16_only(x):
    """Converts a bf16 input, keeps any other as it is: an fp16 row stays fp16."""
    x = x.float() if x.dtype == torch.bfloat16 else x
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


WRONG_1 = {
    "converts bf16 only (fp16 stays fp16)": l2norm_bf16_only,
    "scales an fp32 input in place": l2norm_in_place,
    "computed in bf16, cast to fp32 at the end": lambda x: (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)).float(),
    "eps 1e-12 (F.normalize's), not 1e-6": lambda x: x.float() * torch.rsqrt((x.float() ** 2).sum(-1, keepdim=True) + 1e-12),
    "F.normalize in a worker thread (forbidden)": l2norm_in_a_thread,
    "the package's l2norm renamed (forbidden)": lambda x: renamed_l2norm(x),
    "eps outside the root": lambda x: x.float() / (x.float().norm(dim=-1, keepdim=True) + 1e-6),
    "no eps": lambda x: x.float() / x.float().norm(dim=-1, keepdim=True),
    "eps as a floor (max)": lambda x: x.float() / x.float().norm(dim=-1, keepdim=True).clamp(min=1e-6),
    "the wrong dim": lambda x: x.float() * torch.rsqrt((x.float() ** 2).sum(0, keepdim=True) + 1e-6),
    "the input's dtype (bf16 stays bf16)": lambda x: x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6),
    "F.normalize (forbidden)": lambda x: torch.nn.functional.normalize(x.float(), dim=-1, eps=1e-3),
    "the package's l2norm (forbidden)": lambda x: l2norm(x),
    "the package's function itself": l2norm,
}


@pytest.mark.parametrize("mistake", sorted(WRONG_1))
def test_l2norm_rejects(mistake):
    _judged(1, l2norm_right, WRONG_1[mistake])


# --- exercise 2: gating ---------------------------------------------------------------------------

def gating(A_log, a, b, dt_bias, threshold=20.0, sign=-1.0, exp_A=True, bias=True, beta_fn=torch.sigmoid,
           dtype=torch.float32):
    x = a.float() + (dt_bias.float() if bias else 0.0)
    softplus = torch.where(x > threshold, x, torch.log1p(x.clamp(max=threshold).exp()))
    A = A_log.float().exp() if exp_A else A_log.float()
    return (sign * A * softplus).to(dtype), beta_fn(b.float()).to(dtype)


def gating_right(A_log, a, b, dt_bias):
    return gating(A_log, a, b, dt_bias)


def softplus_without_threshold(A_log, a, b, dt_bias):       # inf above 88
    x = a.float() + dt_bias.float()
    return -A_log.float().exp() * torch.log1p(x.exp()), torch.sigmoid(b.float())


def gating_in_place(A_log, a, b, dt_bias):
    """Right values, but the projection a is overwritten with a + dt_bias."""
    x = a.add_(dt_bias)
    return gating(A_log, x, b, torch.zeros_like(dt_bias))


def gating_in_a_thread(A_log, a, b, dt_bias):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(gdn_gating, A_log, a, b, dt_bias).result()


def gating_in_input_dtype(A_log, a, b, dt_bias):
    """The arithmetic in the inputs' dtype (bf16 for bf16 projections), fp32 only at the end."""
    x = a + dt_bias
    softplus = torch.where(x > 20, x, torch.log1p(x.clamp(max=20).exp()))
    return (-A_log.exp() * softplus).float(), torch.sigmoid(b).float()


WRONG_2 = {
    "computed in the inputs' dtype, cast to fp32 at the end": gating_in_input_dtype,
    "returned in the inputs' dtype": lambda A_log, a, b, dt_bias: gating(A_log, a, b, dt_bias, dtype=a.dtype),
    "a + dt_bias written into a in place": gating_in_place,
    "computed in bf16, returned as fp32": lambda A_log, a, b, dt_bias: tuple(
        t.float() for t in gating(A_log.bfloat16(), a.bfloat16(), b.bfloat16(), dt_bias.bfloat16(), dtype=torch.bfloat16)),
    "beta as sigmoid(-b)": lambda A_log, a, b, dt_bias: gating(A_log, a, b, dt_bias, beta_fn=lambda x: torch.sigmoid(-x)),
    "the package's gdn_gating in a worker thread (forbidden)": gating_in_a_thread,
    "softplus without threshold": softplus_without_threshold,
    "threshold at 0": lambda A_log, a, b, dt_bias: gating(A_log, a, b, dt_bias, threshold=0.0),
    "g positive": lambda A_log, a, b, dt_bias: gating(A_log, a, b, dt_bias, sign=1.0),
    "A_log not exponentiated": lambda A_log, a, b, dt_bias: gating(A_log, a, b, dt_bias, exp_A=False),
    "dt_bias forgotten": lambda A_log, a, b, dt_bias: gating(A_log, a, b, dt_bias, bias=False),
    "beta as softplus": lambda A_log, a, b, dt_bias: gating(A_log, a, b, dt_bias,
                                                           beta_fn=torch.nn.functional.softplus),
    "float64 results": lambda A_log, a, b, dt_bias: gating(A_log, a, b, dt_bias, dtype=torch.float64),
    "torch's softplus (forbidden)": lambda A_log, a, b, dt_bias: (
        -A_log.exp() * torch.nn.functional.softplus(a + dt_bias), torch.sigmoid(b)),
    "the package's gdn_gating (forbidden)": lambda A_log, a, b, dt_bias: gdn_gating(A_log, a, b, dt_bias),
}


@pytest.mark.parametrize("mistake", sorted(WRONG_2))
def test_gating_rejects(mistake):
    _judged(2, gating_right, WRONG_2[mistake])


def test_gating_says_why():
    assert "softplus" in judge_answer(NB, 2, WRONG_2["torch's softplus (forbidden)"]).message
    assert "mamba_edu.gdn.gating" in judge_answer(NB, 2, WRONG_2["the package's gdn_gating (forbidden)"]).message


# --- exercise 3: one value head's recurrence --------------------------------------------------

def head_recurrence(q, k, v, g, beta, S0, value_head, scale, key_head=lambda i, H, HV: i // (HV // H),
                    order="decay, correct, write, read", own_scale=None, start=None, in_place=False,
                    beta_on_v_only=False, shape=None, dtype=torch.float32):
    """A right answer, with switches for the mistakes the check must catch."""
    H, HV, K = q.shape[1], v.shape[1], q.shape[2]
    hk = key_head(value_head, H, HV)
    scale = own_scale(K) if own_scale else scale
    S = S0 if in_place else (S0.clone() if start is None else start(S0))
    o = []
    for t in range(q.shape[0]):
        kt, qt, vt = k[t, hk], q[t, hk], v[t, value_head]
        decay, b = g[t, value_head].exp(), beta[t, value_head]
        steps = order.split(", ")
        read_before = None
        for step in steps:
            if step == "decay":
                S.mul_(decay) if in_place else None
                S = S if in_place else decay * S
            elif step == "correct":
                v_new = (b * vt - S.T @ kt) if beta_on_v_only else b * (vt - S.T @ kt)
            elif step == "write":
                S = S + torch.outer(kt, v_new)
                if in_place:
                    S0.copy_(S)
                    S = S0
            elif step == "read":
                read_before = scale * (S.T @ qt)
        o.append(read_before)
    o = torch.stack(o)
    if shape == "o [T, 1, V]":
        o = o[:, None]
    return o.to(dtype), S.to(dtype)


def recurrence_right(q, k, v, g, beta, S0, value_head, scale):
    return head_recurrence(q, k, v, g, beta, S0, value_head, scale)


def recurrence_package(q, k, v, g, beta, S0, value_head, scale):
    """The forbidden call: the package's reference on one value head."""
    H, HV = q.shape[1], v.shape[1]
    hk = value_head // (HV // H)
    out = recurrent_gated_delta_rule(q[:, [hk]], k[:, [hk]], v[:, [value_head]], g[:, [value_head]],
                                     beta[:, [value_head]], scale=scale, initial_state=S0[None, None])
    return out.o[:, 0], out.final_state[0, 0]


def _wrong(**switch):
    return lambda q, k, v, g, beta, S0, value_head, scale: head_recurrence(
        q, k, v, g, beta, S0, value_head, scale, **switch)


def recurrence_in_a_thread(q, k, v, g, beta, S0, value_head, scale):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(recurrence_package, q, k, v, g, beta, S0, value_head, scale).result()


def recurrence_scales_q_in_place(q, k, v, g, beta, S0, value_head, scale):
    """Right outputs, but q is scaled in place (the caller's q changes)."""
    return head_recurrence(q.mul_(scale), k, v, g, beta, S0, value_head, 1.0)


def recurrence_decays_g_in_place(q, k, v, g, beta, S0, value_head, scale):
    """Right outputs, but g is exponentiated in place (and taken back with a log)."""
    return head_recurrence(q, k, v, g.exp_().log(), beta, S0, value_head, scale)


def recurrence_error_in_v(q, k, v, g, beta, S0, value_head, scale):
    """Right outputs, but the prediction error v - Sᵀk is computed in v's own memory."""
    hk = value_head // (v.shape[1] // q.shape[1])
    S, o = S0.clone(), []
    for t in range(q.shape[0]):
        S = g[t, value_head].exp() * S
        error = v[t, value_head].sub_(S.T @ k[t, hk])
        S = S + torch.outer(k[t, hk], beta[t, value_head] * error)
        o.append(scale * (S.T @ q[t, hk]))
    return torch.stack(o), S


WRONG_3 = {
    "scales q in place": recurrence_scales_q_in_place,
    "exponentiates g in place": recurrence_decays_g_in_place,
    "the prediction error computed in v's memory": recurrence_error_in_v,
    "a head group of 2 hard-coded (i // 2)": _wrong(key_head=lambda i, H, HV: i // 2),
    "the package's recurrence in a worker thread (forbidden)": recurrence_in_a_thread,
    "the state kept in bf16": lambda q, k, v, g, beta, S0, value_head, scale: head_recurrence(
        q.bfloat16(), k.bfloat16(), v.bfloat16(), g.bfloat16(), beta.bfloat16(), S0.bfloat16(), value_head, scale),
    "interleaved key heads (i % H)": _wrong(key_head=lambda i, H, HV: i % H),
    "key head i // H": _wrong(key_head=lambda i, H, HV: i // H),
    "read S before the decay": _wrong(order="correct, decay, write, read"),
    "output read before the write (one token late)": _wrong(order="decay, correct, read, write"),
    "decay after the write": _wrong(order="correct, write, decay, read"),
    "beta on v only": _wrong(beta_on_v_only=True),
    "scale K^-1/2 instead of the given one": _wrong(own_scale=lambda K: K ** -0.5),
    "no scale": _wrong(own_scale=lambda K: 1.0),
    "starts from zeros, not S0": _wrong(start=torch.zeros_like),
    "changes S0 in place": _wrong(in_place=True),
    "o of shape [T, 1, V]": _wrong(shape="o [T, 1, V]"),
    "float64 results": _wrong(dtype=torch.float64),
    "the package's recurrence (forbidden)": recurrence_package,
}


@pytest.mark.parametrize("mistake", sorted(WRONG_3))
def test_head_recurrence_rejects(mistake):
    _judged(3, recurrence_right, WRONG_3[mistake])


def test_head_recurrence_says_why():
    assert "changed S0 in place" in judge_answer(NB, 3, WRONG_3["changes S0 in place"]).message
    assert "changed q in place" in judge_answer(NB, 3, recurrence_scales_q_in_place).message
    assert "changed v in place" in judge_answer(NB, 3, recurrence_error_in_v).message
    assert "mamba_edu.gdn" in judge_answer(NB, 3, recurrence_package).message
    assert "float64" in judge_answer(NB, 3, WRONG_3["float64 results"]).message


# --- exercise 4: predict the read-back after n writes ------------------------------------------------

def readback_right(n, beta, g):
    c = math.exp(g) * (1 - beta)          # what one token keeps of the old read-back
    return beta * (1 - c ** n) / (1 - c) if c != 1 else beta * n


def readback_simulated(n, beta, g):
    """A scalar simulation of the read-back: as good as the closed form."""
    r = 0.0
    for _ in range(n):
        r = math.exp(g) * r
        r = r + beta * (1 - r)
    return r


def readback_decay_last(n, beta, g):
    """The four steps in another order: correct and write first, decay after."""
    r = 0.0
    for _ in range(n):
        r = math.exp(g) * (r + beta * (1 - r))
    return r


WRONG_4 = {
    "decay ignored: 1 - (1 - beta)^n": lambda n, beta, g: 1 - (1 - beta) ** n,
    "linear attention: n writes add up to n·beta": lambda n, beta, g: n * beta,
    "the error, not the read-back: (1 - beta)^n": lambda n, beta, g: (1 - beta) ** n,
    "always v (the delta rule corrects fully)": lambda n, beta, g: 1.0,
    "one write too many (n + 1)": lambda n, beta, g: readback_right(n + 1, beta, g),
    "decay after the write, not before": readback_decay_last,
    "decay without the (1 - beta) factor: c = e^g": lambda n, beta, g: beta * (1 - math.exp(g) ** n) / (1 - math.exp(g))
    if g else beta * n,
    "the limit beta / (1 - e^g (1 - beta)), as if n were infinite": lambda n, beta, g: beta / (1 - math.exp(g) * (1 - beta)),
    "a tensor, not a number": lambda n, beta, g: torch.tensor(readback_right(n, beta, g)),
    "e^g read as g": lambda n, beta, g: beta * (1 - (g * (1 - beta)) ** n) / (1 - g * (1 - beta)),
}


@pytest.mark.parametrize("mistake", sorted(WRONG_4))
def test_readback_rejects(mistake):
    _judged(4, readback_right, WRONG_4[mistake])


def test_readback_accepts_a_simulation():
    assert judge_answer(NB, 4, readback_simulated).status == PASS
