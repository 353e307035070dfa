"""Checks of notebook 00 (start here).

1. ``my_would_sync`` — predict which torch expressions make the host wait for the GPU, and why:
   a verdict and a reason code (:data:`REASONS`) per expression.
2. ``my_tracked_rows`` — the rows a mask selects, padded to a fixed size, without a sync.
"""

from __future__ import annotations

import torch

from mamba_edu.exercises.core import check_seed, checker, exercise, observe
from mamba_edu.profiling import count_syncs

NOTEBOOK = "00_start_here"
check = checker(NOTEBOOK)

#: The expressions of exercise 1, evaluated with the tensors of :func:`quiz_tensors`.
SYNC_QUIZ = (
    "x.sum()",
    "x[idx]",
    "x[mask]",
    "mask.any()",
    "bool(mask.any())",
    "mask.nonzero()",
    "torch.where(mask, x, 0.0)",
    "torch.where(mask)",
    "x.max().item()",
    "x.clamp(max=x.max())",
    "x.tolist()",
    "x.repeat_interleave(counts)",
    "x.repeat_interleave(counts, output_size=12)",
    "mask.cumsum(0) - 1",
)


def quiz_tensors() -> dict:
    """The names the quiz expressions use: ``x`` (6 floats), ``mask`` (6 bools), ``idx`` (3
    int64 indices), ``counts`` (6 repeat counts summing to 12), and ``torch``."""
    return dict(torch=torch, x=torch.arange(6.0), mask=torch.tensor([True, False, True, True, False, False]),
                idx=torch.tensor([2, 0, 5]), counts=torch.tensor([1, 2, 3, 1, 2, 3]))


#: The reason codes of exercise 1: what the host must know before Python can go on.
REASONS = {
    "value": "a value of the data, as a Python object (bool, int, float, list): it syncs",
    "size": "the output's size, which depends on the data: it syncs",
    "shapes": "nothing: the output's shape follows from the inputs' shapes, values stay on the device",
    "argument": "nothing: the output's size is a Python number passed in the call",
}

#: The reason behind each quiz expression's verdict (the verdict itself comes from the sniffer).
_REASON = {
    "x.sum()": "shapes",
    "x[idx]": "shapes",
    "x[mask]": "size",
    "mask.any()": "shapes",
    "bool(mask.any())": "value",
    "mask.nonzero()": "size",
    "torch.where(mask, x, 0.0)": "shapes",
    "torch.where(mask)": "size",
    "x.max().item()": "value",
    "x.clamp(max=x.max())": "shapes",
    "x.tolist()": "value",
    "x.repeat_interleave(counts)": "size",
    "x.repeat_interleave(counts, output_size=12)": "argument",
    "mask.cumsum(0) - 1": "shapes",
}


def _sniffed(expression: str) -> int:
    """How many would-be syncs :func:`mamba_edu.profiling.count_syncs` records for ``expression``."""
    with count_syncs() as syncs:
        eval(expression, quiz_tensors())  # noqa: S307 - the expressions are this module's constants
    return syncs.count


@exercise(NOTEBOOK, 1, "which expressions sync", "my_would_sync",
          forbidden=("mamba_edu.profiling.syncs",))
def check_would_sync(fn) -> str:
    """Ask ``fn`` about every quiz expression: ``(verdict, reason)``. The sniffer decides the
    verdict; the reason must be the one code of :data:`REASONS` that explains it."""
    wrong = []
    for expression in SYNC_QUIZ:
        said = fn(expression)
        if not (isinstance(said, (tuple, list)) and len(said) == 2):
            raise AssertionError(f"my_would_sync({expression!r}) returned {said!r}; expected a pair "
                                 f"(True or False, a reason code: one of {', '.join(map(repr, REASONS))})")
        verdict, reason = said
        if not isinstance(verdict, bool):
            raise AssertionError(f"my_would_sync({expression!r}) returned the verdict {verdict!r}; "
                                 "expected True or False")
        if reason not in REASONS:
            raise AssertionError(f"my_would_sync({expression!r}) gave the reason {reason!r}; expected one "
                                 f"of {', '.join(map(repr, REASONS))}")
        syncs = _sniffed(expression)
        if verdict != (syncs > 0):
            wrong.append(f"{expression} ({syncs} would-be sync{'s' * (syncs != 1)}, you said {verdict})")
        elif reason != _REASON[expression]:
            wrong.append(f"{expression} (right verdict, but not because the host needs "
                         f"{REASONS[reason].split(':')[0]})")
    if wrong:
        raise AssertionError(f"{len(wrong)} of {len(SYNC_QUIZ)} wrong: " + "; ".join(wrong))
    return (f"all {len(SYNC_QUIZ)} expressions classified as mamba_edu.profiling.count_syncs counts "
            "them, each for the right reason")


@exercise(NOTEBOOK, 2, "tracked rows without a sync", "my_tracked_rows")
def check_tracked_rows(fn) -> str:
    """Masks with no, some, all and more than ``size`` rows set, a ``size`` larger than the mask,
    and a long mask with more than 2048 rows set (a place counted in bf16 or fp16 is wrong past
    256 or 2048); the answer must equal ``nonzero_static``'s, be built without it (or
    ``nonzero``), and make no would-be sync. Masks and sizes are drawn per grading run."""
    gen = torch.Generator().manual_seed(check_seed(0))

    def draw(n: int, p: float, size: int) -> tuple[torch.Tensor, int]:
        return torch.rand(n, generator=gen) < p, size

    def between(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    short = between(3, 9)
    cases = [(torch.zeros(5, dtype=torch.bool), 4), (torch.ones(5, dtype=torch.bool), 5),
             (torch.ones(8, dtype=torch.bool), 3),
             draw(between(4, 9), 0.6, between(1, 3)), draw(short, 0.5, short + between(1, 6)),
             draw(between(20, 60), 0.3, between(5, 20)), draw(between(2600, 3000), 0.9, between(2100, 2600))]
    for mask, size in cases:
        seen = observe(fn, mask.clone(), size, fake=True)
        rows = seen.result
        used = seen.ops & {"nonzero", "nonzero_static", "argwhere"}
        if used:
            raise AssertionError(f"the answer calls {', '.join(sorted(used))}: build the rows without it")
        if seen.sync_count:
            raise AssertionError(f"{seen.sync_count} would-be sync(s) for mask {mask.int().tolist()!s:.300}: "
                                 + ", ".join(seen.by_op))
        expected = torch.nonzero_static(mask, size=size, fill_value=-1).squeeze(1)
        if isinstance(rows, torch.Tensor) and rows.dtype != torch.int64:
            raise AssertionError(f"the rows have dtype {rows.dtype}; expected torch.int64 (index tensors "
                                 "are int64, as nonzero_static's)")
        if not isinstance(rows, torch.Tensor) or rows.shape != expected.shape or not torch.equal(rows, expected):
            got = rows.tolist() if isinstance(rows, torch.Tensor) else rows
            raise AssertionError(f"mask {mask.int().tolist()!s:.300}, size {size}: got {got!s:.300}; "
                                 f"expected {expected.tolist()!s:.300}")
    return "same rows as nonzero_static (padding and truncation included), no would-be syncs"
