"""Notebook 00's checks: the right answers pass, plausible wrong ones fail (stubs: test_exercise_stubs.py).

Every answer is judged through the grader's own path (:func:`exercise_judge.remote_judge`: the
harness that refuses forbidden calls and counts syncs, then the check).
"""

import pytest
import torch
from exercise_judge import remote_judge

from mamba_edu.exercises import nb00
from mamba_edu.exercises.core import FAIL, PASS
from mamba_edu.profiling import count_syncs

NB = nb00.NOTEBOOK


# --- exercise 1: which expressions sync ---------------------------------------------------------

SYNCING = {"x[mask]", "bool(mask.any())", "mask.nonzero()", "torch.where(mask)", "x.max().item()",
           "x.tolist()", "x.repeat_interleave(counts)"}


def would_sync_right(expression):
    return expression in SYNCING


def every_mask_reduction_syncs(expression):     # mask.any() itself does not sync, reading it does
    return "mask" in expression or ".item()" in expression or "tolist" in expression


def repeat_interleave_is_free(expression):      # its output size is counts.sum(): data-dependent
    return expression in SYNCING - {"x.repeat_interleave(counts)"}


def indexing_syncs(expression):                 # x[idx] has the size of idx: no sync
    return expression in SYNCING | {"x[idx]"}


def clamp_to_a_tensor_syncs(expression):        # x.clamp(max=x.max()) keeps the max on the device
    return expression in SYNCING | {"x.clamp(max=x.max())"}


def cumsum_syncs(expression):                   # a cumulative sum has the input's size
    return expression in SYNCING | {"mask.cumsum(0) - 1"}


def asks_the_sniffer(expression):               # the forbidden call: let count_syncs answer
    with count_syncs() as syncs:
        eval(expression, nb00.quiz_tensors())  # noqa: S307
    return syncs.count > 0


def asks_the_private_oracle(expression):        # the check's own oracle
    return nb00._sniffed(expression) > 0


def answers_an_int(expression):                 # 1/0 instead of True/False
    return int(expression in SYNCING)


WRONG_1 = [every_mask_reduction_syncs, repeat_interleave_is_free, indexing_syncs, clamp_to_a_tensor_syncs,
           cumsum_syncs, asks_the_sniffer, asks_the_private_oracle, answers_an_int,
           lambda expression: True, lambda expression: False]


def test_sync_quiz_accepts_the_right_answer():
    assert remote_judge(NB, 1, would_sync_right).status == PASS


@pytest.mark.parametrize("wrong", WRONG_1, ids=range(len(WRONG_1)))
def test_sync_quiz_rejects(wrong):
    verdict = remote_judge(NB, 1, wrong)
    assert verdict.status == FAIL, verdict


def test_sync_quiz_says_why():
    assert "mask.any()" in remote_judge(NB, 1, every_mask_reduction_syncs).message
    assert "x.repeat_interleave(counts) (1 would-be sync" in remote_judge(NB, 1, repeat_interleave_is_free).message
    assert "mamba_edu.profiling.syncs" in remote_judge(NB, 1, asks_the_sniffer).message
    assert "mamba_edu.exercises.nb00" in remote_judge(NB, 1, asks_the_private_oracle).message
    assert "expected True or False" in remote_judge(NB, 1, answers_an_int).message


# --- exercise 2: the tracked rows without a sync ------------------------------------------------

def tracked_rows(mask, size, shift=1, fill=-1, truncate=True, dtype=torch.long):
    """A right answer, with switches for the mistakes the check must catch."""
    place = mask.long().cumsum(0) - shift
    keep = mask & (place < size) if truncate else mask
    place = torch.where(keep, place, size)
    out = torch.full((size + 1,), fill, dtype=torch.long, device=mask.device)
    out.scatter_(0, place, torch.arange(mask.shape[0], device=mask.device))  # past size + 1: an error
    return out[:size].to(dtype)


def tracked_rows_right(mask, size):
    return tracked_rows(mask, size)


def rows_by_sort(mask, size):                   # another right answer: a stable sort, no count
    order = torch.argsort((~mask).to(torch.uint8), stable=True)
    rows = torch.cat([order, order.new_full((size,), -1)])[:size]
    n_set = mask.long().sum()
    return torch.where(torch.arange(size, device=mask.device) < n_set, rows, -1)


def padded_nonzero(mask, size):                 # nonzero: its size depends on the data
    rows = mask.nonzero().squeeze(1)[:size]
    return torch.cat([rows, rows.new_full((size - len(rows),), -1)])


def nonzero_static_itself(mask, size):          # the function the statement forbids
    return torch.nonzero_static(mask, size=size, fill_value=-1).squeeze(1)


def count_on_host(mask, size):                  # right rows, but the count is read on the host
    out = torch.full((size,), -1, dtype=torch.long)
    n = min(int(mask.sum()), size)
    out[:n] = torch.argsort(~mask, stable=True)[:n]
    return out


def python_loop(mask, size):                    # .tolist(): a copy to the host
    rows = [i for i, m in enumerate(mask.tolist()) if m][:size]
    return torch.tensor(rows + [-1] * (size - len(rows)), dtype=torch.long)


WRONG_2 = {
    "off by one place (cumsum without -1)": lambda mask, size: tracked_rows(mask, size, shift=0),
    "padding with 0": lambda mask, size: tracked_rows(mask, size, fill=0),
    "no truncation past size (scatters out of bounds)": lambda mask, size: tracked_rows(mask, size, truncate=False),
    "int32 rows": lambda mask, size: tracked_rows(mask, size, dtype=torch.int32),
    "shape [size, 1]": lambda mask, size: tracked_rows(mask, size)[:, None],
    "nonzero then padding": padded_nonzero,
    "nonzero_static itself": nonzero_static_itself,
    "count read on the host": count_on_host,
    "a Python loop over tolist()": python_loop,
}


@pytest.mark.parametrize("right", [tracked_rows_right, rows_by_sort])
def test_tracked_rows_accepts(right):
    verdict = remote_judge(NB, 2, right)
    assert verdict.status == PASS, verdict


@pytest.mark.parametrize("mistake", sorted(WRONG_2))
def test_tracked_rows_rejects(mistake):
    verdict = remote_judge(NB, 2, WRONG_2[mistake])
    assert verdict.status == FAIL, verdict


def test_tracked_rows_says_why():
    assert "nonzero" in remote_judge(NB, 2, padded_nonzero).message
    assert "would-be sync" in remote_judge(NB, 2, count_on_host).message
    assert "int64" in remote_judge(NB, 2, WRONG_2["int32 rows"]).message
