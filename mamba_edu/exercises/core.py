"""Exercise bookkeeping: the registry of checks, one verdict per exercise, one printed line.

A check is a function that takes the learner's function(s), runs them on fresh inputs and
returns a short pass message, or raises ``AssertionError`` saying what differs. The learner's
stub raises ``NotImplementedError``; :func:`run` turns that into "not done yet" instead of a
traceback, so a notebook with unfinished exercises still runs top to bottom.

Checks live here, in the package; the answers do not (they are in ``notebooks/solutions/``).
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from torch.utils._python_dispatch import TorchDispatchMode

from mamba_edu.exercises.absent import metering

PASS, FAIL, NOT_DONE = "pass", "fail", "not done"


@dataclass(frozen=True)
class Exercise:
    """One exercise of one notebook.

    notebook: the notebook's file stem, e.g. ``"01_gated_deltanet_recurrence"``.
    number:   its number inside that notebook (1, 2, …).
    title:    a few words, shown by the grader.
    names:    the names of the learner's functions in the notebook, passed to ``check`` in order.
    check:    ``check(*functions) -> str`` (the pass message) or raises ``AssertionError``.
    forbidden: dotted names (functions, classes, modules) the answer must not call; the grader
              refuses an answer that calls one (the checks' own modules are always forbidden).
    points:   what a pass is worth in the grade book.
    """

    notebook: str
    number: int
    title: str
    names: tuple[str, ...]
    check: Callable[..., str]
    forbidden: tuple[str, ...] = ()
    points: int = 1


#: Set by the grader to a fresh number per grading run, so that no answer can be computed for the
#: checks' inputs in advance; unset (a notebook, the tests), every check draws the same inputs.
SEED_VARIABLE = "MAMBA_EDU_GRADING_SEED"


def check_seed(base: int) -> int:
    """The seed a check draws its inputs from: ``base``, moved by the grading run's own number."""
    salt = os.environ.get(SEED_VARIABLE, "")
    return base if not salt.isdigit() else (base * 1_000_003 + int(salt)) % 2**31


@dataclass(frozen=True)
class Verdict:
    """The outcome of one exercise: ``status`` is ``pass``, ``fail`` or ``not done``."""

    exercise: Exercise
    status: str
    message: str = ""

    def line(self) -> str:
        """What the notebook prints: ``exercise N: PASS — …``, ``… FAIL — …`` or ``… not done yet``."""
        head = f"exercise {self.exercise.number}"
        if self.status == NOT_DONE:
            return f"{head}: not done yet"
        return f"{head}: {'PASS' if self.status == PASS else 'FAIL'} — {self.message}"


@dataclass
class ExerciseResult:
    """One exercise as the grader reports it."""

    number: int
    title: str
    status: str  # pass, fail, not done
    message: str = ""
    review: str = ""  # why an instructor should read the answer (mamba_edu.grading.review), or ""
    points: int = 1   # what a pass is worth


@dataclass
class NotebookResult:
    """One notebook's grade. ``status``: ``graded``, ``zero`` (it ran, but something stopped
    grading it: the reason says what) or ``refused`` (not run: a symbolic link, not a file, not
    JSON); :mod:`~mamba_edu.grading.classroom` adds ``missing`` (not submitted) and
    ``misnamed`` (a notebook whose name is not the course's: not run, no exercises)."""

    file: str
    status: str
    reason: str = ""
    exercises: list[ExerciseResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> int:
        return sum(e.status == "pass" for e in self.exercises) if self.status == "graded" else 0

    @property
    def total(self) -> int:
        return len(self.exercises)


REGISTRY: dict[str, dict[int, Exercise]] = {}


#: What no answer may call: the checks and their private oracles.
ALWAYS_FORBIDDEN = ("mamba_edu.exercises.core",) + tuple(
    f"mamba_edu.exercises.nb{n:02d}" for n in (*range(10), 12))


def exercise(notebook: str, number: int, title: str, *names: str, forbidden: tuple[str, ...] = (),
             points: int = 1):
    """Decorator: register ``check`` as exercise ``number`` of ``notebook``, worth ``points``;
    ``forbidden`` lists the package functions the statement asks the learner not to call."""
    def register(check: Callable[..., str]) -> Callable[..., str]:
        REGISTRY.setdefault(notebook, {})[number] = Exercise(notebook, number, title, names, check,
                                                             tuple(forbidden) + ALWAYS_FORBIDDEN, points)
        return check
    return register


def _not_done(err: BaseException) -> bool:
    """True if the learner's stub raised, also when a compiler wrapped that (a Triton kernel on
    a GPU cannot raise, so compiling one whose body is the stub fails and names it)."""
    while err is not None:
        if isinstance(err, NotImplementedError) or "NotImplementedError" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def judge(ex: Exercise, *functions) -> Verdict:
    """Run ``ex.check`` on the learner's ``functions`` and classify the outcome; only a
    ``BaseException`` that is not an ``Exception`` (``exit()``, ``KeyboardInterrupt``) passes."""
    try:
        message = ex.check(*functions)
    except AssertionError as err:
        # testing.check words its errors "FAIL name: ..."; the verdict line says FAIL already
        return Verdict(ex, FAIL, str(err).removeprefix("FAIL ") or "the check failed")
    except Exception as err:  # the learner's code crashed: say where, without a long traceback
        if _not_done(err):
            return Verdict(ex, NOT_DONE)
        where = traceback.extract_tb(err.__traceback__)[-1]
        return Verdict(ex, FAIL, f"{type(err).__name__}: {err} (line {where.lineno} of {where.name})")
    return Verdict(ex, PASS, message)


def lookup(notebook: str, number: int) -> Exercise:
    """The registered exercise, or a ``KeyError`` that lists what exists."""
    try:
        return REGISTRY[notebook][number]
    except KeyError:
        known = sorted(REGISTRY.get(notebook, {}))
        raise KeyError(f"notebook {notebook!r} has no exercise {number}; registered: {known}") from None


def checker(notebook: str) -> Callable[..., None]:
    """``check(number, *functions)`` for one notebook: judge the exercise and print its line."""
    def check(number: int, *functions) -> None:
        print(judge(lookup(notebook, number), *functions).line())
    check.__doc__ = f"Check exercise ``number`` of notebook {notebook} and print one line."
    return check


@dataclass
class Observed:
    """One call of a learner's function under the instruments: its ``result``, the would-be
    syncs (``sync_ops``, one op name each), the aten ``ops`` it ran, ``rebound``: the
    positions of tensor arguments that came out on other memory than they went in with, and
    ``metered_rows``: per call of a metered package function (``observe(metered=…)``), the rows
    of its first argument (the tokens it scanned, for a packed ``[T, …]`` input)."""

    result: object
    sync_ops: list
    ops: set
    rebound: list = field(default_factory=list)
    metered_rows: list = field(default_factory=list)

    @property
    def sync_count(self) -> int:
        return len(self.sync_ops)

    @property
    def by_op(self) -> Counter:
        return Counter(self.sync_ops)


def observe(fn, *args, fake: bool = False, may_sync: bool = False, writes: tuple[int, ...] = (),
            metered: tuple[str, ...] = ()) -> Observed:
    """Call ``fn(*args)`` under the sync sniffer (strict: a ``host_only`` block the answer opens
    does not hide its syncs) and the op recorder. With ``fake``, ``fn`` first runs, in a forked
    child, on copies of its tensor arguments on a fake ``cuda`` device with no data (a
    ``torch.device`` argument becomes that device;
    :func:`mamba_edu.profiling.fake_device.would_be_sync`): a read or a host copy of device data
    there is a sync by construction, whatever op, thread or mode did it, and a crash there is a
    verdict too; it joins ``sync_ops``. With ``may_sync`` (an exercise that allows syncs) the
    data-less run (:class:`mamba_edu.profiling.fake_device.DataLess`, forked before the real run)
    is answered with the values the real run read (:mod:`mamba_edu.profiling.replay`): a refusal
    there (a read the real run did not make, a host tensor mixed with device data, a result left
    on the host) fails the check, and ``sync_ops`` are the calls whose values it took, counted by
    construction (a ``.to("cpu")`` too, a read of a tensor made on the host not). The tensors of
    every argument not in ``writes`` (positions the exercise asks to write in place) must come
    back unchanged: an answer that overwrites its inputs fails, since the engine passes its own
    tensors. Every call of the package functions
    ``metered`` names (dotted), from any thread, is counted in ``metered_rows`` (the first run
    only, not the data-less one)."""
    kept = {i: _tensors_of(a) for i, a in enumerate(args) if i not in writes}
    copies = {i: [t.clone() for t in ts] for i, ts in kept.items()}
    seen = _observe_here(fn, args, fake, may_sync, metered)
    for i, ts in kept.items():
        if any(not _same(t, c) for t, c in zip(ts, copies[i])):
            raise AssertionError(f"the answer changed its argument {i + 1} in place; the checks pass "
                                 "copies, but a serving engine passes its own tensors: compute into new ones")
    return seen


def _tensors_of(arg) -> list:
    """The tensors of an argument: itself, or the fields of a batch-like object (one level)."""
    import torch
    if isinstance(arg, torch.Tensor):
        return [arg]
    fields = getattr(arg, "__dataclass_fields__", None) or {}
    return [v for v in (getattr(arg, name, None) for name in fields) if isinstance(v, torch.Tensor)]


def _same(a, b) -> bool:
    """Bit-equal tensors, NaN where NaN was."""
    import torch
    return a.shape == b.shape and a.dtype == b.dtype and (
        torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)))


def _observe_here(fn, args, fake: bool, may_sync: bool, metered: tuple[str, ...]) -> Observed:
    from mamba_edu.profiling.fake_device import DataLess, would_be_sync
    from mamba_edu.profiling.replay import recording
    from mamba_edu.profiling.syncs import count_syncs

    read = would_be_sync(fn, args) if fake else None
    recorder = OpRecorder()
    before = memory_of(args)
    # with may_sync the data-less run is forked first (the real run's memos are not in it) and
    # answered with what the real run read: the calls it took values from are the syncs
    with DataLess(fn, args) if may_sync else contextlib.nullcontext() as data_less:
        with recording() if may_sync else contextlib.nullcontext() as reads, \
                metering(metered) as rows, count_syncs(strict=True) as syncs, recorder:
            result = fn(*args)
        refused, taken = data_less.verdict(reads) if may_sync else (None, [])
    if refused:
        raise AssertionError(f"on device tensors (a GPU's view of the same call): {refused}")
    sync_ops = taken if may_sync else [e.op for e in syncs.events] + ([read] if read else [])
    return Observed(result, sync_ops, recorder.ops, rebound(before, args), rows)


def memory_of(args) -> list:
    """Where each tensor argument's elements live: (storage address, offset, shape, strides); a
    CUDA graph records exactly this, so a buffer meant for replay must keep it."""
    import torch
    return [(a.untyped_storage().data_ptr(), a.storage_offset(), tuple(a.shape), a.stride())
            if isinstance(a, torch.Tensor) else None for a in args]


def rebound(before: list, args) -> list[int]:
    """Positions of the tensor arguments whose memory changed since ``before`` (``.data =``,
    ``set_``, ``resize_``…)."""
    return [i for i, (was, now) in enumerate(zip(before, memory_of(args))) if was != now]


class OpRecorder(TorchDispatchMode):
    """Record the name of every aten op that runs inside the block (``with OpRecorder() as r:``),
    so that a check can refuse an answer that calls the function it asks the learner to write."""

    def __init__(self):
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))
