"""Notebook 01's checks reject plausible wrong answers and report stubs as not done."""

import pytest
import torch

from mamba_edu.exercises.core import FAIL, NOT_DONE, judge, lookup

NOTEBOOK = "01_gated_deltanet_recurrence"


def eps_outside_the_root(x):
    x = x.float()
    return x / (x.norm(dim=-1, keepdim=True) + 1e-6)


def softplus_without_threshold(A_log, a, b, dt_bias):
    x = a.float() + dt_bias.float()
    return -A_log.float().exp() * torch.log1p(x.exp()), torch.sigmoid(b.float())  # inf above 88


def beta_as_softplus(A_log, a, b, dt_bias):
    x = a.float() + dt_bias.float()
    return -A_log.float().exp() * torch.nn.functional.softplus(x), torch.nn.functional.softplus(b.float())


WRONG = [
    (1, eps_outside_the_root),
    (1, lambda x: x.float() / x.float().norm(dim=-1, keepdim=True)),           # no eps at all
    (2, softplus_without_threshold),
    (2, beta_as_softplus),
    (3, lambda value_head, H, HV: value_head % H),                              # interleaved heads
    (3, lambda value_head, H, HV: float(value_head // (HV // H))),              # not an int
]


@pytest.mark.parametrize("number,wrong", WRONG, ids=[f"ex{n}-{i}" for i, (n, _) in enumerate(WRONG)])
def test_check_rejects_wrong_answer(number, wrong):
    assert judge(lookup(NOTEBOOK, number), wrong).status == FAIL


@pytest.mark.parametrize("number", [1, 2, 3])
def test_stub_is_not_done(number):
    def stub(*args):
        raise NotImplementedError("hint")
    assert judge(lookup(NOTEBOOK, number), stub).status == NOT_DONE
