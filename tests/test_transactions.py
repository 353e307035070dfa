"""Transactions: random operation sequences with exceptions injected at random points.

An injected exception (a ``BaseException``, as Ctrl-C is) may hit the model's forward, the
backend's metadata or decode tracking, or the engine's commits: the pool's allocations and
snapshot copies, the cache's inserts, evictions, locks and unlocks. After every call:

* a call that raised leaves the engine, its pool, its cache and its requests exactly as before
  (``prefill``, which is ``prepare → forward → finish``, included);
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

from _helpers import assert_same_state, call_during_decode, full_state  # noqa: E402
from test_misuse import MODEL, P, assert_unchanged, cache_state, state  # noqa: E402

import mamba_edu.engine as engine_module  # noqa: E402
from mamba_edu.engine import Engine, Request  # noqa: E402
from mamba_edu.serving import SCRATCH_SLOT, STRATEGIES  # noqa: E402


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


def patched_engine(strategy, injector, commits=False, **kw) -> Engine:
    engine = Engine(MODEL, strategy=strategy, max_requests=3, cache_slots=2, track_interval=64, **kw)
    engine._run_model = injector.wrap(engine._run_model)
    engine.backend.init_forward_metadata = injector.wrap(engine.backend.init_forward_metadata)
    engine.backend.track_decode = injector.wrap(engine.backend.track_decode)
    if commits:  # the commit helpers: every change a call makes after its checks
        for owner, names in ((engine.pool, ("alloc", "copy_slot", "free")),
                             (engine.cache, ("insert", "evict", "lock", "unlock", "touch"))):
            for name in names:
                setattr(owner, name, injector.wrap(getattr(owner, name)))
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


def assert_same_states_but_scratch(got, want, name):
    """Two engines' pools hold the same states in every slot but the scratch slot.

    The scratch slot is not compared across engines: every untracked row of a forward writes
    it (``track_decode``'s ``pool[:, dst] = pool[:, src]`` with ``dst`` repeating the scratch
    slot, and the sync_free/naive/precomputed tracking copies of a prefill), and which of the
    repeated writes lands last is not defined (torch's ``index_put_`` with duplicate indices;
    on the CPU it varies from run to run, about 1 in 700 for two rows). Nothing reads the slot
    (docs/architecture.md, "Who owns a slot"). A failed call's undo is still compared whole,
    scratch slot included (``assert_unchanged``): it puts back the exact saved states."""
    keep = [s for s in range(got.shape[1]) if s != SCRATCH_SLOT]
    assert torch.equal(got[:, keep], want[:, keep]), f"{name} states differ outside the scratch slot"


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
    engine = patched_engine(strategy, injector, commits=data.draw(st.booleans(), "commits"), ping_pong=ping_pong)
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
    assert_same_states_but_scratch(a.pop("conv"), b.pop("conv"), "conv")
    assert_same_states_but_scratch(a.pop("ssm"), b.pop("ssm"), "ssm")
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
    engine = Engine(MODEL, strategy="sync_free", max_requests=3)
    engine.prefill([Request("a", P[:20])])
    with pytest.raises(RuntimeError, match="single-threaded"):
        call_during_decode(engine, lambda: engine.release(["a"]))
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


# ---- failures inside the commits: evictions and cache inserts are undone ----------------------
def failing_once(real, at=1):
    """``real``, except that its ``at``-th call raises :class:`Injected` (once)."""
    count = [0]

    def call(*args, **kwargs):
        count[0] += 1
        if count[0] == at:
            raise Injected()
        return real(*args, **kwargs)
    return call


def full_pool_engine(strategy="sync_free"):
    """Capacity 5: snapshots A (128 tokens of P) and B (128 of P[200:]) cached, one running
    request: one slot free, so a prepare of a hit on A must evict B."""
    engine = Engine(MODEL, strategy=strategy, max_requests=2, cache_slots=1, track_interval=64)
    for rid, prompt in (("A", P[:130]), ("B", P[200:330])):
        engine.prefill([Request(rid, prompt)])
        engine.release([rid])
    engine.prefill([Request("run", P[340:350])])
    assert engine.pool.n_free == 1 and len(engine.cache.snapshot_slots()) == 2
    engine.cache.match(P[:129])  # A is the more recently used: B is the eviction victim
    return engine


def test_prepare_whose_snapshot_copy_fails_gets_its_evictions_back(monkeypatch):
    engine = full_pool_engine()
    before = full_state(engine)
    monkeypatch.setattr(engine.pool, "copy_slot", failing_once(engine.pool.copy_slot))
    with pytest.raises(Injected):
        engine.prepare_prefill([Request("x", P[:140])])  # hit on A at 128; evicts B first
    assert_same_state(before, engine)
    assert engine.cache.match(P[200:329] + [0]).length == 128, "B's snapshot is back"
    monkeypatch.undo()
    batch = engine.prepare_prefill([Request("x", P[:140])])  # the retry works, and evicts B
    assert engine.cache.match(P[200:329] + [0]).length == 0
    logits = engine.forward_prefill(batch)
    engine.finish_prefill(batch)
    fresh = full_pool_engine()
    torch.testing.assert_close(logits, fresh.prefill([Request("x", P[:140])]).logits, rtol=0, atol=0)
    assert cache_state(engine.cache) == cache_state(fresh.cache)


@pytest.mark.parametrize("where", ["alloc", "evict", "lock", "touch"])
def test_prepare_failing_anywhere_in_its_commit_changes_nothing(monkeypatch, where):
    engine = full_pool_engine()
    owner = engine.cache if where in ("evict", "lock", "touch") else engine.pool
    before = full_state(engine)
    monkeypatch.setattr(owner, where, failing_once(getattr(owner, where)))
    with pytest.raises(Injected):
        engine.prepare_prefill([Request("x", P[:140])])
    assert_same_state(before, engine)


def test_prefill_that_fails_leaves_no_trace_not_even_its_evictions(monkeypatch):
    """``prefill`` is one call: a failure in its forward or its finish undoes its prepare too
    (the eviction of B, the slots, the lock on A) and the scratch slot's states."""
    for target in ("_run_model", "finish"):
        engine = full_pool_engine()
        if target == "_run_model":  # the prepare evicts B, then the forward fails
            monkeypatch.setattr(engine, "_run_model", failing_once(engine._run_model))
        else:  # room for x's snapshot; after the forward, its cache insert fails
            engine.release(["run"])
            monkeypatch.setattr(engine.cache, "insert", failing_once(engine.cache.insert))
        before = full_state(engine)
        with pytest.raises(Injected):
            engine.prefill([Request("x", P[:140] + P[200:260])])  # hit on A, tracked at 192
        assert_same_state(before, engine)
        monkeypatch.undo()


def two_tracked_forwarded(strategy):
    """An engine with a forwarded batch of two requests that both track (at 128 and at 64)."""
    engine = Engine(MODEL, strategy=strategy, max_requests=3, cache_slots=2, track_interval=64)
    batch = engine.prepare_prefill([Request("a", P[:140]), Request("b", P[200:270])])
    engine.forward_prefill(batch)
    return engine, batch


@pytest.mark.parametrize("strategy", ["sync_free", "fused"])
def test_finish_whose_second_insert_fails_takes_the_first_back(monkeypatch, strategy):
    engine, batch = two_tracked_forwarded(strategy)
    before = full_state(engine)
    monkeypatch.setattr(engine.cache, "insert", failing_once(engine.cache.insert, at=2))
    with pytest.raises(Injected):
        engine.finish_prefill(batch)
    assert_same_state(before, engine)
    assert engine.cache.snapshot_slots() == set() and batch.status == "forwarded"
    monkeypatch.undo()
    engine.finish_prefill(batch)  # the retry caches both snapshots, as a finish that never failed
    fresh, fresh_batch = two_tracked_forwarded(strategy)
    fresh.finish_prefill(fresh_batch)
    a, b = full_state(engine), full_state(fresh)
    for name in ("conv", "ssm"):
        assert torch.equal(a.pop(name), b.pop(name))
    assert cache_state(engine.cache) == cache_state(fresh.cache)
    assert {r: x.track_slots for r, x in engine.running.items()} == \
        {r: x.track_slots for r, x in fresh.running.items()}


@pytest.mark.parametrize("where", ["alloc", "transfer", "unlock"])
def test_finish_failing_in_its_allocations_transfers_or_unlocks_changes_nothing(monkeypatch, where):
    engine = Engine(MODEL, strategy="sync_free", max_requests=3, cache_slots=2, track_interval=64)
    engine.prefill([Request("seed", P[:130])])
    batch = engine.prepare_prefill([Request("a", P[:140] + P[200:260])])  # hit at 128, tracked at 192
    engine.forward_prefill(batch)
    owner = engine.cache if where == "unlock" else engine.pool
    before = full_state(engine)
    monkeypatch.setattr(owner, where, failing_once(getattr(owner, where)))
    with pytest.raises(Injected):
        engine.finish_prefill(batch)
    assert_same_state(before, engine)


def decoding_to_a_track_point(strategy):
    """Two running requests at 62 and 60 tokens: a decode of 4 steps tracks both at 64."""
    engine = Engine(MODEL, strategy=strategy, max_requests=3, cache_slots=2, track_interval=64)
    engine.prefill([Request("a", P[:62]), Request("b", P[200:260])])
    return engine


@pytest.mark.parametrize("strategy", ["sync_free", "fused"])
def test_decode_whose_second_insert_fails_takes_the_first_back(monkeypatch, strategy):
    """Before: the first snapshot stayed cached, and the undo of the states then wrote the old
    contents into that slot, which the cache owned now (a wrong snapshot for the next hit)."""
    engine = decoding_to_a_track_point(strategy)
    before = full_state(engine)
    monkeypatch.setattr(engine.cache, "insert", failing_once(engine.cache.insert, at=2))
    with pytest.raises(Injected):
        engine.decode(4)
    assert_same_state(before, engine)
    monkeypatch.undo()
    out = engine.decode(4)
    fresh = decoding_to_a_track_point(strategy)
    assert fresh.decode(4).tokens == out.tokens
    assert cache_state(engine.cache) == cache_state(fresh.cache)
    for slot, twin in zip(sorted(engine.cache.snapshot_slots()), sorted(fresh.cache.snapshot_slots())):
        assert torch.equal(engine.pool.ssm[:, slot], fresh.pool.ssm[:, twin])
        assert torch.equal(engine.pool.conv[:, slot], fresh.pool.conv[:, twin])


def test_decode_whose_fresh_slot_needs_an_eviction_undoes_it(monkeypatch):
    """The fresh track slot of a donation comes from evicting a cached snapshot; the
    allocation after the eviction fails: the evicted snapshot is back."""
    engine = Engine(MODEL, strategy="sync_free", max_requests=2, cache_slots=1, track_interval=64)
    engine.prefill([Request("A", P[:130])])
    engine.release(["A"])
    engine.prefill([Request("a", P[200:262]), Request("b", P[300:310])])
    assert engine.pool.n_free == 0 and len(engine.cache.snapshot_slots()) == 1
    before = full_state(engine)
    monkeypatch.setattr(engine.pool, "alloc", failing_once(engine.pool.alloc))
    with pytest.raises(Injected):
        engine.decode(3)  # "a" reaches 64 tokens: its donation evicts A, then alloc fails
    assert_same_state(before, engine)
    assert engine.cache.match(P[:129] + [0]).length == 128


@pytest.mark.parametrize("call", ["abort", "reset"])
def test_abort_and_reset_failing_half_way_change_nothing(monkeypatch, call):
    engine = Engine(MODEL, strategy="fused", max_requests=3, cache_slots=2, track_interval=64)
    engine.prefill([Request("seed", P[:130])])
    batch = engine.prepare_prefill([Request("x", P[:200])])  # a prefix hit: locked, copied
    engine.forward_prefill(batch)
    before = full_state(engine)
    if call == "abort":
        monkeypatch.setattr(engine.cache, "unlock", failing_once(engine.cache.unlock))
        with pytest.raises(Injected):
            engine.abort_prefill(batch)
    else:
        monkeypatch.setattr(engine.pool, "copy_slot", failing_once(engine.pool.copy_slot))
        with pytest.raises(Injected):
            engine.reset_prefill(batch)
    assert_same_state(before, engine)
    assert batch.status == "forwarded"
    monkeypatch.undo()
    engine.finish_prefill(batch)  # still a good forwarded batch
    assert "x" in engine.running


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_the_scratch_slot_contents_reach_no_output_and_no_other_slot(strategy):
    """Why the replay does not compare the scratch slot: what it holds (here NaN, written before
    every call) changes no output and no other slot's states."""
    def run(garbage):
        engine = Engine(MODEL, strategy=strategy, max_requests=3, cache_slots=2, track_interval=64)
        outputs = []
        for call in (lambda: engine.prefill([Request("a", P[:140]), Request("b", P[200:230])]),
                     lambda: engine.decode(3), lambda: engine.prefill([Request("c", P[:150])]),
                     lambda: engine.decode(32)):  # b reaches 64: a decode snapshot
            if garbage:
                engine.pool.conv[:, SCRATCH_SLOT] = float("nan")
                engine.pool.ssm[:, SCRATCH_SLOT] = float("nan")
            outputs.append(call().logits)
        return engine, outputs
    clean, want = run(False)
    dirty, got = run(True)
    outputs_equal(got, want)
    assert_same_states_but_scratch(dirty.pool.conv, clean.pool.conv, "conv")
    assert_same_states_but_scratch(dirty.pool.ssm, clean.pool.ssm, "ssm")
    assert cache_state(dirty.cache) == cache_state(clean.cache)


def test_an_undo_that_fails_too_marks_the_engine_broken(monkeypatch):
    """The forward fails, then putting the pool's bookkeeping back fails as well: nothing can
    vouch for the engine's state, so every later call (of any kind) is refused with why."""
    engine = full_pool_engine()
    monkeypatch.setattr(engine, "_run_model", failing_once(engine._run_model))
    monkeypatch.setattr(engine.pool, "_restore_bookkeeping", failing_once(engine.pool._restore_bookkeeping))
    with pytest.raises(Injected):
        engine.prefill([Request("x", P[:140] + P[200:260])])
    monkeypatch.undo()
    for call in (lambda: engine.prefill([Request("y", P[:70])]), lambda: engine.decode(1),
                 lambda: engine.release(["run"]), lambda: engine.prepare_prefill([Request("z", P[:70])])):
        with pytest.raises(RuntimeError, match="this Engine is broken: undoing an earlier failed call failed too"):
            call()


def test_a_successful_undo_does_not_mark_the_engine_broken(monkeypatch):
    engine = full_pool_engine()
    monkeypatch.setattr(engine, "_run_model", failing_once(engine._run_model))
    with pytest.raises(Injected):
        engine.prefill([Request("x", P[:140] + P[200:260])])
    monkeypatch.undo()
    engine.prefill([Request("x", P[:140] + P[200:260])])  # accepted: the undo put everything back
