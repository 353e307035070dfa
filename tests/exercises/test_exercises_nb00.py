"""Notebook 00's checks: the right answers pass, plausible wrong ones fail (stubs: test_exercise_stubs.py).

Every answer is judged through the grader's own path (:func:`exercise_judge.judge_answer`: the
judge that makes forbidden functions absent, then the check).
"""

import pytest
import torch
from exercise_judge import judge_answer

from mamba_edu.exercises import nb00
from mamba_edu.exercises.core import FAIL, PASS
from mamba_edu.profiling import count_syncs

NB = nb00.NOTEBOOK


# --- exercise 1: which expressions sync ---------------------------------------------------------

SYNCING = {"x[mask]", "bool(mask.any())", "mask.nonzero()", "torch.where(mask)", "x.max().item()",
           "x.tolist()", "x.repeat_interleave(counts)"}
VALUE = {"bool(mask.any())", "x.max().item()", "x.tolist()"}          # the rest of SYNCING: "size"


def reason_of(expression):
    if expression in SYNCING:
        return "value" if expression in VALUE else "size"
    return "argument" if "output_size" in expression else "shapes"


def would_sync_right(expression):
    return expression in SYNCING, reason_of(expression)


def verdicts(syncing, reason=reason_of):
    """An answer with these syncing expressions and these reasons."""
    return lambda expression: (expression in syncing, reason(expression))


def every_mask_reduction_syncs(expression):     # mask.any() itself does not sync, reading it does
    said = "mask" in expression or ".item()" in expression or "tolist" in expression
    return said, reason_of(expression) if said == (expression in SYNCING) else ("size" if said else "shapes")


def asks_the_sniffer(expression):               # the forbidden call: let count_syncs answer
    with count_syncs() as syncs:
        eval(expression, nb00.quiz_tensors())  # noqa: S307
    return syncs.count > 0, reason_of(expression)


def asks_the_private_oracle(expression):        # the check's own oracle
    return nb00._sniffed(expression) > 0, reason_of(expression)


def answers_an_int(expression):                 # 1/0 instead of True/False
    return int(expression in SYNCING), reason_of(expression)


def bare_verdict(expression):                   # the old format: no reason
    return expression in SYNCING


def every_sync_is_a_value(expression):          # right verdicts; "size" never used
    return expression in SYNCING, "value" if expression in SYNCING else "shapes"


def every_sync_is_a_size(expression):           # right verdicts; "value" never used
    return expression in SYNCING, "size" if expression in SYNCING else "shapes"


def tolist_is_a_size(expression):               # x.tolist(): the size is known, the values are read
    return expression in SYNCING, "size" if expression == "x.tolist()" else reason_of(expression)


def boolean_index_is_a_value(expression):       # x[mask]: the host needs the count, not a value
    return expression in SYNCING, "value" if expression == "x[mask]" else reason_of(expression)


def output_size_is_shapes(expression):          # output_size=12 is a host number, not a shape
    return expression in SYNCING, "shapes" if "output_size" in expression else reason_of(expression)


def clamp_is_an_argument(expression):           # max=x.max() is a device tensor, not a host number
    return expression in SYNCING, "argument" if "clamp" in expression else reason_of(expression)


def free_text_reason(expression):               # a sentence instead of a code
    return expression in SYNCING, "the host needs the data" if expression in SYNCING else "no read"


WRONG_1 = {
    "every mask expression syncs": every_mask_reduction_syncs,
    "repeat_interleave is free": verdicts(SYNCING - {"x.repeat_interleave(counts)"}),
    "indexing syncs": verdicts(SYNCING | {"x[idx]"}, lambda e: "size" if e == "x[idx]" else reason_of(e)),
    "clamp to a tensor syncs": verdicts(SYNCING | {"x.clamp(max=x.max())"},
                                        lambda e: "value" if "clamp" in e else reason_of(e)),
    "cumsum syncs": verdicts(SYNCING | {"mask.cumsum(0) - 1"}, lambda e: "size" if "cumsum" in e else reason_of(e)),
    "asks the sniffer (forbidden)": asks_the_sniffer,
    "asks the private oracle (forbidden)": asks_the_private_oracle,
    "an int verdict": answers_an_int,
    "a bare verdict, no reason": bare_verdict,
    "every sync is a value": every_sync_is_a_value,
    "every sync is a size": every_sync_is_a_size,
    "x.tolist() is a size": tolist_is_a_size,
    "x[mask] is a value": boolean_index_is_a_value,
    "output_size is shapes": output_size_is_shapes,
    "the clamp's bound is an argument": clamp_is_an_argument,
    "free-text reasons": free_text_reason,
    "always True": lambda expression: (True, "value"),
    "always False": lambda expression: (False, "shapes"),
}


def test_sync_quiz_accepts_the_right_answer():
    assert judge_answer(NB, 1, would_sync_right).status == PASS


@pytest.mark.parametrize("mistake", sorted(WRONG_1))
def test_sync_quiz_rejects(mistake):
    verdict = judge_answer(NB, 1, WRONG_1[mistake])
    assert verdict.status == FAIL, verdict


def test_sync_quiz_says_why():
    assert "mask.any()" in judge_answer(NB, 1, every_mask_reduction_syncs).message
    assert "x.repeat_interleave(counts) (1 would-be sync" in judge_answer(NB, 1, WRONG_1["repeat_interleave is free"]).message
    assert "mamba_edu.profiling.syncs" in judge_answer(NB, 1, asks_the_sniffer).message
    assert "mamba_edu.exercises.nb00" in judge_answer(NB, 1, asks_the_private_oracle).message
    assert "expected True or False" in judge_answer(NB, 1, answers_an_int).message
    assert "expected a pair" in judge_answer(NB, 1, bare_verdict).message
    assert "x.tolist() (right verdict, but not because" in judge_answer(NB, 1, tolist_is_a_size).message
    assert "expected one of" in judge_answer(NB, 1, free_text_reason).message


# --- exercise 2: the tracked rows without a sync ------------------------------------------------

def tracked_rows(mask, size, shift=1, fill=-1, truncate=True, dtype=torch.long, count=torch.long):
    """A right answer, with switches for the mistakes the check must catch."""
    place = mask.to(count).cumsum(0).long() - shift
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


def rows_by_sort_unpadded(mask, size):         # the sort cut to size: too short when size > the mask
    order = torch.argsort((~mask).to(torch.uint8), stable=True)[:size]
    return torch.where(torch.arange(size, device=mask.device) < mask.long().sum(), order, -1)


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
    "places counted in bf16 (exact to 256)": lambda mask, size: tracked_rows(mask, size, count=torch.bfloat16),
    "places counted in fp16 (exact to 2048)": lambda mask, size: tracked_rows(mask, size, count=torch.float16),
    "the sort not padded past the mask": rows_by_sort_unpadded,
    "shape [size, 1]": lambda mask, size: tracked_rows(mask, size)[:, None],
    "nonzero then padding": padded_nonzero,
    "nonzero_static itself": nonzero_static_itself,
    "count read on the host": count_on_host,
    "a Python loop over tolist()": python_loop,
}


@pytest.mark.parametrize("right", [tracked_rows_right, rows_by_sort])
def test_tracked_rows_accepts(right):
    verdict = judge_answer(NB, 2, right)
    assert verdict.status == PASS, verdict


@pytest.mark.parametrize("mistake", sorted(WRONG_2))
def test_tracked_rows_rejects(mistake):
    verdict = judge_answer(NB, 2, WRONG_2[mistake])
    assert verdict.status == FAIL, verdict


def test_tracked_rows_says_why():
    assert "nonzero" in judge_answer(NB, 2, padded_nonzero).message
    assert "would-be sync" in judge_answer(NB, 2, count_on_host).message
    assert "int64" in judge_answer(NB, 2, WRONG_2["int32 rows"]).message
