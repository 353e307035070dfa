"""Ctrl-C at every line: a ``KeyboardInterrupt`` raised at each traced line of a public engine
call (in the engine and the serving bookkeeping it runs: pool, cache, requests, batches) leaves
the engine as before the call, or as after it when the interrupt came once the call had
committed (all or nothing), or marked broken with the reason; and never wedged: the next call
from the same thread runs, and afterwards another thread's call runs too.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _helpers import full_state  # noqa: E402
from test_misuse import MODEL, P  # noqa: E402

import mamba_edu  # noqa: E402
from mamba_edu.engine import Engine, Request  # noqa: E402

PACKAGE = Path(mamba_edu.__file__).parent
#: Files whose lines are interrupted: the engine's transaction and the state it keeps.
TRACED = {str(PACKAGE / "engine.py")} | {str(p) for p in (PACKAGE / "serving").glob("*.py")
                                          if p.name in ("pool.py", "prefix_cache.py", "requests.py",
                                                        "prepared.py", "batch.py", "planning.py")}


class Interrupt:
    """``sys.settrace`` that raises ``KeyboardInterrupt`` at the ``at``-th line event in
    :data:`TRACED` (then never again); ``lines`` counts them."""

    def __init__(self, at: int | None):
        self.at, self.lines, self.where = at, 0, None

    def __call__(self, frame, event, arg):
        if frame.f_code.co_filename not in TRACED:
            return None
        return self.local

    def local(self, frame, event, arg):
        if event == "line":
            self.lines += 1
            if self.lines == self.at:
                self.where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
                raise KeyboardInterrupt
        return self.local

    def run(self, call):
        sys.settrace(self)
        try:
            return call()
        finally:
            sys.settrace(None)


def setup_engine():
    """An engine with a cached prefix, a running request in decode and one prepared batch."""
    engine = Engine(MODEL, strategy="sync_free", max_requests=3, cache_slots=2, track_interval=64)
    engine.prefill([Request("a", P[:130])])
    engine.release(["a"])
    engine.prefill([Request("b", P[:70])])
    batch = engine.prepare_prefill([Request("c", P[:140])])
    return engine, batch


CALLS = {
    "prepare_prefill": lambda e, b: e.prepare_prefill([Request("d", P[:100])]),
    "forward_prefill": lambda e, b: e.forward_prefill(b),
    "prefill": lambda e, b: e.prefill([Request("d", P[:150])]),
    "decode": lambda e, b: e.decode(2),
    "release": lambda e, b: e.release(["b"]),
    "abort_prefill": lambda e, b: e.abort_prefill(b),
}


def plain_state(engine) -> dict:
    """:func:`full_state` without object ids, so that two engines' states compare."""
    state = full_state(engine)
    state["owners"] = {s: type(o).__name__ for s, o in engine.pool._owner.items()}
    state["cache"] = [(path, slot, len(holders), used) for path, slot, holders, used in state["cache"]]
    state["running"] = {rid: v[:4] + v[5:] for rid, v in state["running"].items()}
    state["live"] = [v[1:] for v in state["live"]]
    return state


def same_state(a: dict, b: dict) -> list[str]:
    """The keys whose values differ."""
    return [k for k in a if not (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k])]


def completed_state(name) -> dict:
    engine, batch = setup_engine()
    CALLS[name](engine, batch)
    return plain_state(engine)


def interrupted_everywhere(name, stride: int):
    """Yield (where, engine, batch, state before) for an interrupt at every ``stride``-th line
    of the call."""
    at = 1
    while True:
        engine, batch = setup_engine()
        before = plain_state(engine)
        tracer = Interrupt(at)
        try:
            tracer.run(lambda: CALLS[name](engine, batch))
        except KeyboardInterrupt:
            yield tracer.where, engine, batch, before
            at += stride
            continue
        assert tracer.lines < at, "the call ended before the interrupt without raising it"
        return


@pytest.mark.parametrize("name", list(CALLS))
def test_an_interrupt_at_every_seventh_line_changes_nothing_and_wedges_nothing(name):
    interrupt_everywhere(name, stride=7)


@pytest.mark.extra
@pytest.mark.parametrize("name", list(CALLS))
def test_an_interrupt_at_any_line_changes_nothing_and_wedges_nothing(name):
    interrupt_everywhere(name, stride=1)


def interrupt_everywhere(name, stride):
    lines, done = 0, completed_state(name)
    for at, engine, batch, before in interrupted_everywhere(name, stride):
        lines += 1
        if engine._broken is None:
            after = plain_state(engine)
            undone, committed = same_state(after, before), same_state(after, done)
            assert not undone or not committed, (
                f"{name}: interrupted at {at}, the engine is neither as before the call ({undone} "
                f"differ) nor as after it ({committed} differ)")
        else:
            assert "KeyboardInterrupt" in engine._broken
            continue
        # Not wedged: this thread's next call runs, and then another thread's does too.
        engine.release([])
        errors = []
        worker = threading.Thread(target=lambda: errors.append(None) if engine.release([]) is None else None)
        worker.start()
        worker.join(10)
        assert not worker.is_alive() and errors == [None], f"{name}: wedged after an interrupt at line {at}"
    assert lines > 0


def test_a_forward_hook_cannot_re_enter_the_engine():
    engine, batch = setup_engine()
    before = full_state(engine)
    seen = []

    def hook(module, inputs, output):
        try:
            engine.abort_prefill(batch)
        except RuntimeError as err:
            seen.append(str(err))
    handle = MODEL.register_forward_hook(hook)
    try:
        logits = engine.forward_prefill(batch)
    finally:
        handle.remove()
    assert seen and "cannot re-enter" in seen[0]
    assert full_state(engine)["pending"] == before["pending"]  # the batch was not aborted under it
    engine.finish_prefill(batch, logits)
