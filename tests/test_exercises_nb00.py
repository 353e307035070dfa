"""Notebook 00's checks reject plausible wrong answers and report a stub as not done."""

import pytest
import torch

from mamba_edu.exercises import nb00
from mamba_edu.exercises.core import FAIL, NOT_DONE, judge, lookup

NB = nb00.NOTEBOOK


def stub(*args):
    raise NotImplementedError("hint: …")


@pytest.mark.parametrize("number", [1, 2])
def test_stub_is_not_done(number):
    assert judge(lookup(NB, number), stub).status == NOT_DONE


def test_sync_quiz_rejects_any_as_a_sync():
    """A common mistake: thinking ``mask.any()`` itself syncs (only reading its value does)."""
    def every_mask_reduction_syncs(expression):
        return "mask" in expression or ".item()" in expression or "tolist" in expression
    verdict = judge(lookup(NB, 1), every_mask_reduction_syncs)
    assert verdict.status == FAIL and "mask.any()" in verdict.message


def test_sync_quiz_rejects_missing_repeat_interleave():
    """Everything right except ``repeat_interleave`` without ``output_size`` (its output size is
    data-dependent)."""
    syncing = {"x[mask]", "bool(mask.any())", "mask.nonzero()", "torch.where(mask)", "x.max().item()",
               "x.tolist()"}
    verdict = judge(lookup(NB, 1), lambda expression: expression in syncing)
    assert verdict.status == FAIL and "x.repeat_interleave(counts) (1 would-be sync" in verdict.message


def test_tracked_rows_rejects_nonzero_padding():
    """``nonzero`` then padding gives the right rows, but its size depends on the data."""
    def padded_nonzero(mask, size):
        rows = mask.nonzero().squeeze(1)[:size]
        return torch.cat([rows, rows.new_full((size - len(rows),), -1)])
    verdict = judge(lookup(NB, 2), padded_nonzero)
    assert verdict.status == FAIL and "nonzero" in verdict.message


def test_tracked_rows_rejects_a_syncing_cumsum():
    """Right rows from a cumulative sum, but it reads the count on the host."""
    def count_on_host(mask, size):
        out = torch.full((size,), -1, dtype=torch.long)
        n = min(int(mask.sum()), size)          # a sync
        order = torch.argsort(~mask, stable=True)
        out[:n] = order[:n]
        return out
    verdict = judge(lookup(NB, 2), count_on_host)
    assert verdict.status == FAIL and "would-be sync" in verdict.message


def test_tracked_rows_rejects_zero_padding():
    """Padding with 0 instead of -1 names row 0, which may be a real row."""
    def zero_padded(mask, size):
        pos = mask.long().cumsum(0) - 1
        dest = torch.where(mask & (pos < size), pos, size)
        out = torch.zeros(size + 1, dtype=torch.long)
        return out.scatter(0, dest, torch.arange(len(mask)))[:size]
    verdict = judge(lookup(NB, 2), zero_padded)
    assert verdict.status == FAIL and "expected" in verdict.message
