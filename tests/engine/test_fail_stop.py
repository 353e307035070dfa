"""Fail-stop: a public call interrupted at any line either changed nothing (a refusal before its
first change) or stops the engine, which then refuses every later call in one line naming the
cause and ``reset()``; ``reset()`` gives a working engine.

The interrupt is a ``KeyboardInterrupt`` (a ``BaseException``, as Ctrl-C is) raised by a
``sys.settrace`` tracer at the k-th 'line' event in ``mamba_edu`` code. The public wrapper's claim
and release of the engine (``_public``, ``FailStop.enter``/``leave``) are left out: they are the
call's entry and exit, not a step of it (interrupted on their own at the end of this file); so are the probes' context managers
(``mamba_edu.probes``), process-wide instruments that an interrupt between their lines would leave
switched on for the tests after this one. Every public call is covered; k runs densely over the
first lines (the checks and the first changes) and the last ones (the commit), with a stride in
between (a forward is thousands of lines).
"""

import sys
from pathlib import Path

import pytest
import torch

import mamba_edu
import mamba_edu.probes
from mamba_edu.engine import Bucket, Engine, EngineStopped, Request
from mamba_edu.engine.engine import _public
from mamba_edu.engine.fail_stop import FailStop
from mamba_edu.model import build_model

PACKAGE = str(Path(mamba_edu.__file__).parent)
ENTRY = {_public(lambda self: None).__code__, FailStop.enter.__code__, FailStop.leave.__code__}
PROBES = mamba_edu.probes.__file__
P = torch.randint(0, 128, (400,), generator=torch.Generator().manual_seed(3)).tolist()
MODEL = build_model("tiny", device="cpu")


class Interrupt:
    """A tracer raising ``KeyboardInterrupt`` at the k-th line event in mamba_edu code (None:
    only count them, in ``seen``)."""

    def __init__(self, k=None):
        self.k, self.seen = k, 0

    def __call__(self, frame, event, arg):
        code = frame.f_code
        inside = code.co_filename.startswith(PACKAGE) and code.co_filename != PROBES and code not in ENTRY
        return self.line if inside else None

    def line(self, frame, event, arg):
        if event == "line":
            self.seen += 1
            if self.seen == self.k:
                raise KeyboardInterrupt(f"line {self.k}")
        return self.line


def traced(call, tracer):
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)


def busy_engine():
    """A cached prefix (128 tokens of P), a running request one token short of a decode snapshot
    (track_interval 64) and a captured bucket; a replay or a prefill there hits the prefix."""
    engine = Engine(MODEL, strategy="sync_free", max_requests=3, cache_slots=2, track_interval=64)
    engine.prefill([Request("seed", P[:130])])
    engine.release(["seed"])
    engine.prefill([Request("run", P[200:327])])
    return engine, engine.capture_prefill(Bucket(256, 2, max_prefix_tokens=256), "graph", graphs=False)


def _prepared(e, c):
    return e.prepare_prefill([Request("x", P[:200])])


def _forwarded(e, c):
    batch = _prepared(e, c)
    e.forward_prefill(batch)
    return batch


# name -> (setup(engine, captured) -> argument, call(engine, captured, argument))
CALLS = {
    "prefill": (None, lambda e, c, _: e.prefill([Request("x", P[:200])])),
    "prepare_prefill": (None, lambda e, c, _: e.prepare_prefill([Request("x", P[:200])])),
    "forward_prefill": (_prepared, lambda e, c, b: e.forward_prefill(b)),
    "replay": (_prepared, lambda e, c, b: c.replay(b)),
    "finish_prefill": (_forwarded, lambda e, c, b: e.finish_prefill(b)),
    "abort_prefill": (_forwarded, lambda e, c, b: e.abort_prefill(b)),
    "decode": (None, lambda e, c, _: e.decode(2)),
    "release": (None, lambda e, c, _: e.release(["run"])),
    "capture_prefill": (None, lambda e, c, _: e.capture_prefill(Bucket(128, 1), "breakable", graphs=False)),
}


def state(engine):
    """What a refused call leaves as it was."""
    pool, cache, stack = engine.pool, [], [(engine.cache.root, ())]
    while stack:
        node, path = stack.pop()
        path = path + node.tokens
        cache.append((path, node.slot, node.refcount))
        stack.extend((child, path) for child in node.children.values())
    return dict(conv=pool.conv.clone(), ssm=pool.ssm.clone(), free=sorted(pool._free), used=pool.used_slots(),
                cache=sorted(cache, key=lambda x: (x[0], x[1] or -1)), pending=dict(engine.pending),
                running={rid: (r.working_slot, list(r.track_slots), list(r.tokens))
                         for rid, r in engine.running.items()},
                live=[(id(b), b.status) for b in engine._live])


def same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) if k in ("conv", "ssm") else a[k] == b[k] for k in a)


def ks(n: int) -> list[int]:
    """The k to interrupt at, for a call of ``n`` line events: the first 30 and the last 30
    densely, about 30 more evenly in between."""
    return sorted({*range(1, min(n, 30) + 1), *range(max(n - 30, 1), n + 1), *range(1, n + 1, max(n // 30, 1))})


@pytest.mark.parametrize("name", list(CALLS))
def test_an_interrupt_at_any_line_changes_nothing_or_stops_the_engine(name):
    setup, call = CALLS[name]
    engine, captured = busy_engine()
    arg = setup(engine, captured) if setup else None
    counter = Interrupt()
    traced(lambda: call(engine, captured, arg), counter)
    outcomes = set()
    for k in ks(counter.seen):
        engine, captured = busy_engine()
        arg = setup(engine, captured) if setup else None
        before = state(engine)
        with pytest.raises(KeyboardInterrupt):
            traced(lambda: call(engine, captured, arg), Interrupt(k))
        if engine.stopped is None:
            assert same(before, state(engine)), f"{name}: interrupted at line {k}, changed but not stopped"
            outcomes.add("unchanged")
            continue
        outcomes.add("stopped")
        for later in (lambda: engine.decode(1), lambda: captured.replay(arg), lambda: engine.release(["run"])):
            with pytest.raises(EngineStopped) as refused:
                later()
            message = str(refused.value)
            assert "\n" not in message and f"Engine.{'forward_prefill' if name == 'replay' else name}" in message
            assert "KeyboardInterrupt" in message or "cut short" in message
            assert "engine.reset()" in message
        engine.reset()
        engine.prefill([Request("fresh", P[:130])])
        engine.decode(1)
    assert "stopped" in outcomes or name == "capture_prefill", outcomes  # graphs=False changes nothing


def test_reset_gives_back_every_slot_and_refuses_old_batches():
    engine, captured = busy_engine()
    batch = _prepared(engine, captured)
    capacity = engine.pool.n_free + len(engine.pool.used_slots())
    engine.reset()
    assert engine.pool.n_free == capacity and not engine.running and not engine.pending
    assert engine.cache.snapshot_slots() == set() and engine.stats.requests == 0
    with pytest.raises(ValueError, match="already aborted"):
        engine.forward_prefill(batch)
    batch = _prepared(engine, captured)
    engine.finish_prefill(batch, captured.replay(batch))  # a bucket captured before reset still replays


class InterruptIn(Interrupt):
    """``KeyboardInterrupt`` at the k-th line event of one code object (the claim's own lines)."""

    def __init__(self, code, k=None):
        super().__init__(k)
        self.code = code

    def __call__(self, frame, event, arg):
        return self.line if frame.f_code is self.code else None


@pytest.mark.parametrize("where", ["enter", "leave", "public wrapper"])
def test_an_interrupt_while_claiming_or_releasing_leaves_an_engine_that_works(where):
    """A Ctrl-C between taking the claim and the call's ``try`` (or its ``finally`` and the
    release) leaves a claim no call holds: the next call takes it over instead of refusing."""
    code = {"enter": FailStop.enter.__code__, "leave": FailStop.leave.__code__,
            "public wrapper": _public(lambda self: None).__code__}[where]
    engine, _ = busy_engine()
    counter = InterruptIn(code)
    traced(lambda: engine.decode(1), counter)
    assert counter.seen >= 1
    for k in range(1, counter.seen + 1):
        engine, _ = busy_engine()
        with pytest.raises(KeyboardInterrupt):
            traced(lambda: engine.decode(1), InterruptIn(code, k))
        if engine.stopped is not None:  # interrupted inside the call: refused until reset
            with pytest.raises(EngineStopped):
                engine.decode(1)
        engine.reset()
        engine.prefill([Request("fresh", P[:130])])
        engine.decode(1)


def test_a_claim_held_by_a_running_call_is_still_refused_from_another_thread():
    import threading

    engine, _ = busy_engine()
    inside, go_on, refusals = threading.Event(), threading.Event(), []

    def hook(module, args):
        inside.set()
        go_on.wait(30)

    handle = engine.model.layers[0].register_forward_pre_hook(hook)
    worker = threading.Thread(target=lambda: engine.prefill([Request("a", P[:70])]))
    worker.start()
    try:
        assert inside.wait(30)
        for call in (lambda: engine.decode(1), engine.reset):
            with pytest.raises(RuntimeError, match="another call of this Engine is running") as refused:
                call()
            refusals.append(refused.value)
    finally:
        go_on.set()
        worker.join(30)
        handle.remove()
    assert len(refusals) == 2 and engine.stopped is None and "a" in engine.running
