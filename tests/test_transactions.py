"""Transactions: random operation sequences with exceptions injected at random points.

An injected exception (a ``BaseException``, as Ctrl-C is) may hit the model's forward, the
backend's metadata or decode tracking, or the batch builders. After every call:

* a call that raised leaves the engine, its pool and its cache exactly as before (``prefill``,
  which is ``prepare → forward → finish`` and aborts its batch on failure, leaves what a
  ``prepare`` and an ``abort`` leave: the history records it so);
* at the end, a fresh engine given the same successful history (the same calls, without
  the injections) returns the same outputs and ends in the same state.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_misuse import MODEL, P, assert_unchanged, cache_state, state  # noqa: E402

import mamba_edu.engine as engine_module  # noqa: E402
from mamba_edu.engine import Engine, Request  # noqa: E402
from mamba_edu.serving import STRATEGIES  # noqa: E402


class Injected(BaseException):
    """Stands for Ctrl-C or an out-of-memory error in the middle of a call."""


class Injector:
    """Raises :class:`Injected` at the ``at``-th call of any patched function (then never again)."""

    def __init__(self):
        self.count, self.at = 0, None

    def wrap(self, fn):
        def call(*args, **kwargs):
            self.count += 1
            if self.at is not None and self.count == self.at:
                self.at = None
                raise Injected()
            return fn(*args, **kwargs)
        return call


def patched_engine(strategy, injector, monkeypatch=None, **kw) -> Engine:
    engine = Engine(MODEL, strategy=strategy, max_requests=3, cache_slots=2, track_interval=64, **kw)
    engine._run_model = injector.wrap(engine._run_model)
    engine.backend.init_forward_metadata = injector.wrap(engine.backend.init_forward_metadata)
    engine.backend.track_decode = injector.wrap(engine.backend.track_decode)
    return engine


def outputs_equal(a, b):
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            outputs_equal(x, y)
    else:
        assert a == b


def run_op(engine, op, args, batches):
    """Run one recorded operation; returns its output (what a fresh engine must reproduce)."""
    if op == "prefill":
        out = engine.prefill([Request(rid, toks) for rid, toks in args])
        return [out.logits, out.next_tokens, out.prefix_lens, out.track_lens]
    if op == "prepare":
        batches[args[0]] = engine.prepare_prefill([Request(rid, toks) for rid, toks in args[1]])
        return None
    if op == "forward":
        return engine.forward_prefill(batches[args])
    if op == "finish":
        engine.finish_prefill(batches[args])
        del batches[args]  # finished: its requests run now
        return None
    if op == "abort":
        return engine.abort_prefill(batches.pop(args))
    if op == "decode":
        out = engine.decode(args)
        return [out.rids, out.tokens, out.logits]
    if op == "release":
        return engine.release(list(args))
    raise AssertionError(op)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@given(data=st.data())
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_injected_failures_change_nothing_and_history_replays(strategy, data):
    injector = Injector()
    ping_pong = data.draw(st.booleans(), "ping_pong")
    engine = patched_engine(strategy, injector, ping_pong=ping_pong)
    history, outputs, batches, n = [], [], {}, [0]

    def new_requests(k):
        out = []
        for _ in range(k):
            n[0] += 1
            start = data.draw(st.sampled_from([0, 0, 150]), "start")
            length = data.draw(st.integers(1, 140), "length")
            out.append((f"r{n[0]}", P[start:start + length] + [(5 * n[0]) % 128]))
        return out

    for _ in range(data.draw(st.integers(3, 8), "steps")):
        choices = ["prefill", "prepare", "decode", "release"] + (["forward", "abort"] if batches else [])
        op = data.draw(st.sampled_from(choices), "op")
        if op in ("decode", "release") and not engine.running:
            continue
        if op == "prefill" or op == "prepare":
            reqs = new_requests(data.draw(st.integers(1, 2), "k"))
            if len(engine.running) + len(engine.pending) + len(reqs) > engine.max_requests:
                continue
            args = reqs if op == "prefill" else (f"b{n[0]}", reqs)
        elif op == "decode":
            args = data.draw(st.integers(1, 3), "decode_steps")
        elif op == "release":
            args = tuple(data.draw(st.lists(st.sampled_from(sorted(engine.running)), min_size=1, max_size=2,
                                            unique=True), "rids"))
        else:
            args = data.draw(st.sampled_from(sorted(batches)), "batch")
            if op == "forward" and batches[args].status != "prepared":
                op = "finish"
        injector.count = 0
        injector.at = data.draw(st.one_of(st.none(), st.integers(1, 3), st.integers(1, 9)), "inject_at")
        before = state(engine)
        try:
            out = run_op(engine, op, args, batches)
        except Injected:
            if op == "prefill":  # its prepare happened and its batch was aborted
                history += [("prepare", ("x", args)), ("abort", "x")]
                outputs += [None, None]
                continue
            assert_unchanged(before, engine)
            continue
        finally:
            injector.at = None
        history.append((op, args))
        outputs.append(out)
    for name in list(batches):  # give back what is still prepared, on both engines
        engine.abort_prefill(batches.pop(name))
        history.append(("abort", name))
        outputs.append(None)

    fresh = Engine(MODEL, strategy=strategy, max_requests=3, cache_slots=2, track_interval=64,
                   ping_pong=ping_pong)
    fresh_batches = {}
    for (op, args), want in zip(history, outputs):
        got = run_op(fresh, op, args, fresh_batches)
        outputs_equal(got, want)
    a, b = state(engine), state(fresh)
    assert torch.equal(a.pop("conv"), b.pop("conv")) and torch.equal(a.pop("ssm"), b.pop("ssm"))
    assert a == b
    assert cache_state(engine.cache) == cache_state(fresh.cache)


def test_failed_decode_restores_slots_and_commits_nothing():
    injector = Injector()
    engine = patched_engine("sync_free", injector)
    engine.prefill([Request("a", P[:62]), Request("b", P[200:230])])
    before = state(engine)
    injector.count, injector.at = 0, 5  # the third step's forward, after a tracking step wrote
    with pytest.raises(Injected):
        engine.decode(4)
    assert_unchanged(before, engine)
    again = engine.decode(4)
    fresh = Engine(MODEL, strategy="sync_free", max_requests=3, cache_slots=2, track_interval=64)
    fresh.prefill([Request("a", P[:62]), Request("b", P[200:230])])
    assert fresh.decode(4).tokens == again.tokens


def test_failed_forward_restores_the_batch_and_can_be_retried():
    injector = Injector()
    engine = patched_engine("fused", injector)
    engine.prefill([Request("seed", P[:130])])
    batch = engine.prepare_prefill([Request("x", P[:200])])  # a prefix hit at 128
    before = state(engine)
    injector.count, injector.at = 0, 2  # inside the model, after the metadata
    with pytest.raises(Injected):
        engine.forward_prefill(batch)
    assert_unchanged(before, engine)
    logits = engine.forward_prefill(batch)
    fresh = Engine(MODEL, strategy="fused", max_requests=3, cache_slots=2, track_interval=64)
    fresh.prefill([Request("seed", P[:130])])
    torch.testing.assert_close(logits, fresh.forward_prefill(fresh.prepare_prefill([Request("x", P[:200])])),
                               rtol=0, atol=0)


def test_prompt_buffer_reused_after_prepare_changes_nothing():
    """The prompt is copied once, when the Request is made: reusing the caller's list before
    finish_prefill cannot poison the cache."""
    engine = Engine(MODEL, strategy="sync_free", max_requests=3)
    buffer = list(P[:130])
    batch = engine.prepare_prefill([Request("a", buffer)])
    buffer[:] = [0] * 130
    engine.forward_prefill(batch)
    engine.finish_prefill(batch)
    assert engine.running["a"].tokens == P[:130]
    assert engine.cache.match(P[:129] + [1]).length == 128


def test_engine_refuses_a_second_thread_clearly():
    import threading
    engine = Engine(MODEL, strategy="sync_free", max_requests=3)
    engine.prefill([Request("a", P[:20])])
    started, release = threading.Event(), threading.Event()
    real = engine._run_model

    def slow(batch):
        started.set()
        release.wait(10)
        return real(batch)
    engine._run_model = slow
    worker = threading.Thread(target=lambda: engine.decode(1))
    worker.start()
    started.wait(10)
    try:
        with pytest.raises(RuntimeError, match="single-threaded"):
            engine.release(["a"])
    finally:
        release.set()
        worker.join()
    assert "a" in engine.running and len(engine.running["a"].tokens) == 21


def test_engine_module_has_no_hidden_caches():
    """ChunkMeta is the layout only; nothing keyed by id() remembers a verdict."""
    from mamba_edu.kernels import build_chunk_meta
    meta = build_chunk_meta([3, 70], "cpu")
    assert not any(hasattr(meta, name) for name in ("verdicts", "state_indices", "track_slots", "workspace"))
    import re

    from mamba_edu.kernels import metadata, validation
    from mamba_edu.serving import prepared, requests
    for module in (engine_module, prepared, requests, metadata, validation):
        assert not re.search(r"\bid\(", Path(module.__file__).read_text()), module.__name__
