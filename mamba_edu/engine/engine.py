"""The engine: prefix match → slots → planning → forward with tracking → cache insert; decode.

::

    engine = Engine(build_model("tiny"), strategy="sync_free")
    out = engine.prefill([Request("a", prompt)])      # logits [N, vocab], greedy next tokens
    dec = engine.decode(8)                            # 8 greedy tokens for every running request
    engine.release(["a"])                             # give its slots back

``prefill`` is ``prepare_prefill`` (host work) + ``forward_prefill`` (the timed forward:
metadata, layers, tracking) + ``finish_prefill`` (cache insert, bookkeeping); benchmarks call
the three parts themselves (``abort_prefill`` gives back a batch they do not finish), and
``capture_prefill`` captures the forward of a token bucket for the replay of any batch that fits
(:mod:`mamba_edu.engine.graph`). What a caller hands in and gets back lives in
:mod:`mamba_edu.engine.requests`, a prepared batch's life in :mod:`mamba_edu.engine.batches`.

Contract (docs/architecture.md, "Contracts": "Fail-stop", "One call at a time"):

* **Checked once, at the boundary.** Every public call checks what it is given (requests,
  batches, buckets, room in the pool) before it changes anything: a refused call raises
  ``ValueError``, ``TypeError`` or :class:`~mamba_edu.serving.PoolExhausted` and changes nothing.
  Past its checks nothing in the forward is checked again; a prompt's tokens are checked once,
  into :class:`~mamba_edu.serving.Tokens`, which the cache and the batch builder take as they
  are; the pool's and cache's other checks (slots, owners) see a few slot numbers.
* **Fail-stop.** A call that fails after its first change (out of memory, Ctrl-C, a kernel error)
  is not undone: every later call, a bucket's replay included, refuses in one line naming the
  cause (:class:`~mamba_edu.engine.fail_stop.EngineStopped`) until :meth:`Engine.reset`, which
  gives a working engine with an empty cache.
* **One call at a time.** A call while another runs (from a second thread, or from a forward
  hook inside a call) is refused; the engine's methods never call its public methods.
* **Ownership.** Every slot the engine holds is allocated to it in the pool, and every prefix lock
  is taken in its name: ``engine.pool.free``, ``engine.cache.unlock`` or ``engine.cache.insert``
  called by anyone else refuse them.
* **One life per batch.** A :class:`PreparedPrefill` is used once: ``prepare → forward → finish``,
  or ``prepare [→ forward] → abort``; a copy, a second forward, a finished or aborted batch, or
  another engine's batch is refused.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable

import torch

from mamba_edu.engine.batches import ABORTED, FINISHED, FORWARDED, LiveBatches, PreparedPrefill
from mamba_edu.engine.bucket import Bucket
from mamba_edu.engine.fail_stop import FailStop
from mamba_edu.engine.graph import CapturedBucket, check_capture, check_replay
from mamba_edu.engine.plan import PrefillPlan, plan_prefill
from mamba_edu.engine.requests import (MAX_DECODE_STEPS, DecodeResult, EngineStats, PrefillResult, Request,
                                       RunningRequest, check_release, check_requests, check_steps)
from mamba_edu.model.config import ModelConfig
from mamba_edu.serving import SCRATCH_SLOT, LinearAttentionBackend, RadixCache, StatePool
from mamba_edu.serving.batch import build_decode_batch
from mamba_edu.serving.fla_prefill import check_prefill_kernel
from mamba_edu.serving.planning import check_cache_chunk, plan_decode
from mamba_edu.serving.tokens import Tokens

__all__ = ["MAX_DECODE_STEPS", "Engine"]


def _positive_int(name: str, value) -> int:
    if type(value) is not int or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")
    return value


def _check_model(model) -> None:
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig) or not callable(model) or not hasattr(model, "device"):
        raise TypeError(f"model must be a HybridModel (from mamba_edu.model.build_model); "
                        f"got {type(model).__name__}")


class _Owner:
    """The engine's name in the pool and the cache (slot owner, lock holder)."""

    def __repr__(self) -> str:
        return "an Engine (its running requests and prepared batches)"


def _public(method):
    """A public call: it holds the engine's claim while it runs (:meth:`FailStop.enter`)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        self._stop.enter(f"Engine.{method.__name__}", stopped_ok=method.__name__ == "reset")
        try:
            return method(self, *args, **kwargs)
        finally:
            self._stop.leave()
    return call


class Engine:
    """Prefill/decode loop over one model with a prefix cache and a tracking strategy.

    One call at a time, fail-stop (see the module docstring).

    Args:
        model: a :class:`mamba_edu.model.HybridModel`.
        strategy: ``naive``, ``precomputed``, ``sync_free`` or ``fused`` (docs/conventions.md).
        max_requests: most requests running at once.
        cache_chunk: ``Cc``, a multiple of 64: extends of at least Cc tokens are tracked.
        ping_pong: 2 track slots per request instead of 1 (for an overlapping scheduler).
        track_interval: decode tracks every this many tokens (seq_len % interval == 0).
        cache_slots: pool slots for cached snapshots (default ``2·max_requests``).
        prefill_kernel: the GDN prefill's kernel, chosen here once: ``triton`` (ours) or ``fla``
            (SGLang's fallback, :mod:`mamba_edu.serving.fla_prefill`: CUDA, not with ``fused``).
    """

    def __init__(self, model, strategy: str = "sync_free", max_requests: int = 8, cache_chunk: int = 64,
                 ping_pong: bool = False, track_interval: int = 256, cache_slots: int | None = None,
                 prefill_kernel: str = "triton"):
        _check_model(model)
        check_prefill_kernel(prefill_kernel, strategy, model.device)  # before the pool is allocated
        if type(ping_pong) is not bool:
            raise TypeError(f"ping_pong must be a bool (True: two track slots per request); got {ping_pong!r}")
        self.model, self.config = model, model.config
        self.max_requests = _positive_int("max_requests", max_requests)
        self.cache_chunk = check_cache_chunk(cache_chunk)
        self.track_interval = _positive_int("track_interval", track_interval)
        self.tracks_per_request = 2 if ping_pong else 1
        cache_slots = 2 * max_requests if cache_slots is None else _positive_int("cache_slots", cache_slots)
        capacity = max_requests * (1 + self.tracks_per_request) + cache_slots
        pool = StatePool.for_model(self.config, capacity, model.device, model.dtype)
        gdn_layers = [layer.mixer for layer in model.layers if layer.kind == "gdn"]
        self.backend = LinearAttentionBackend(pool, strategy, gdn_layers, prefill_kernel)
        self.pool = pool
        self.cache = self._new_cache()
        self._owner = _Owner()
        self._stop = FailStop()
        self.running: dict[Hashable, RunningRequest] = {}
        self.pending: dict[Hashable, int] = {}  # rid -> working slot, prepared and not finished/aborted
        self._live = LiveBatches(self)  # the prepared batches not finished or aborted
        self.stats = EngineStats()

    strategy = property(lambda self: self.backend.strategy_name, doc="The tracking strategy's name.")
    prefill_kernel = property(lambda self: self.backend.prefill_kernel, doc="The GDN prefill's kernel.")
    stopped = property(lambda self: self._stop.cause, doc="Why the engine stopped (a call that failed "
                                                           "half way), or None while it works.")

    def _new_cache(self) -> RadixCache:
        return RadixCache.for_model(self.pool, self.config, self.model.dtype, self.model.device, self._working_slots)

    def _working_slots(self) -> set[int]:
        """The slots forwards write now: running requests' and prepared batches' working slots."""
        return {r.working_slot for r in self.running.values()} | set(self.pending.values())

    @_public
    def reset(self) -> None:
        """A working engine with an empty cache, whatever came before (a failed call included): every
        slot freed and zeroed, no request, prefix or live batch, fresh stats; captured buckets stay."""
        with self._stop.changing("Engine.reset"):
            for batch in self._live:
                self._live.close(batch, ABORTED)
            self.running.clear()
            self.pending.clear()
            self.pool.clear()
            self.cache = self._new_cache()
            self.stats = EngineStats()

    # ---- prefill ------------------------------------------------------------------------
    def _plan_prefill(self, requests) -> PrefillPlan:
        """Check ``requests`` and plan their prefill, changing nothing."""
        requests = check_requests(requests, self.config.vocab, self.running.keys() | self.pending.keys(),
                                  self.max_requests)
        return plan_prefill(requests, self.cache, self.pool, self.tracks_per_request, self.cache_chunk,
                            self.model.device)

    def _open_prefill(self, plan: PrefillPlan) -> PreparedPrefill:
        """Carry out ``plan``: evict, take the planned slots, copy each prefix hit's snapshot into
        its working slot, lock the matches."""
        self.cache.evict(plan.evictions, protect=[m.node for m in plan.matches])
        taken = self.pool.alloc(len(plan.slots), self._owner)
        assert taken == plan.slots, f"planned slots {plan.slots}, allocated {taken}"  # peek is what alloc does
        working = plan.inputs.working_slots
        for m, slot in zip(plan.matches, working):
            if m.slot is not None:
                self.pool.copy_slot(m.slot, slot, self._owner)
        for m in plan.matches:
            self.cache.lock(m.node, self._owner)
            self.cache.touch(m)
        self.pending.update(zip(plan.inputs.rids, working))
        return self._live.open(plan.inputs, plan.requests, plan.matches,
                               plan.track_slot_lists(self.tracks_per_request))

    @_public
    def prepare_prefill(self, requests: list[Request]) -> PreparedPrefill:
        """Host work before the forward: prefix match, slots, snapshot restore, planning
        (:func:`~mamba_edu.engine.plan.plan_prefill`). Returns a :class:`PreparedPrefill` for
        :meth:`forward_prefill` and then :meth:`finish_prefill` (or :meth:`abort_prefill`)."""
        plan = self._plan_prefill(requests)
        with self._stop.changing("Engine.prepare_prefill"):
            return self._open_prefill(plan)

    @_public
    def forward_prefill(self, batch: PreparedPrefill, captured: CapturedBucket | None = None) -> torch.Tensor:
        """The timed forward, once per batch: ``init_forward_metadata`` + all layers (with
        tracking) → logits [N, vocab]; with ``captured`` (``captured.replay(batch)``), its replay."""
        self._live.check_unforwarded(batch, "forward_prefill")
        if captured is not None:
            check_replay(captured, self, batch.forward_batch)
        with self._stop.changing("Engine.forward_prefill"):
            return self._forward(batch, captured)

    def _forward(self, batch: PreparedPrefill, captured: CapturedBucket | None) -> torch.Tensor:
        fb = batch.forward_batch
        if captured is None:
            self.backend.init_forward_metadata(fb)
            logits, kv = self.model(fb, self.backend)
        else:
            logits, kv = captured._run(fb)
        batch.logits, batch.kv, batch._status = logits, kv, FORWARDED
        return logits

    def _donate(self, tokens, kv, track_slots: list[int], index: int, length: int) -> None:
        """Offer the snapshot in ``track_slots[index]`` (state after ``length`` tokens) to the
        cache; if taken, the list gets a fresh slot, taken first: with none free the snapshot is
        not cached, so the request never writes a slot the cache owns."""
        if self.pool.n_free == 0:
            self.cache.evict(1)
        if self.pool.n_free == 0:
            return
        fresh = self.pool.alloc(1, self._owner)[0]
        if self.cache.insert(Tokens.of(tokens).part(0, length), track_slots[index],
                             [(k[:length], v[:length]) for k, v in kv], self._owner):
            track_slots[index] = fresh
        else:
            self.pool.free([fresh], self._owner)

    @_public
    def finish_prefill(self, batch: PreparedPrefill, logits: torch.Tensor | None = None) -> None:
        """After the forward: insert tracked snapshots into the cache, then register the requests
        (``logits``: what the forward returned, or None)."""
        self._live.check_forwarded(batch, logits, self.config.vocab)
        with self._stop.changing("Engine.finish_prefill"):
            self._finish(batch)

    def _finish(self, batch: PreparedPrefill) -> None:
        next_tokens = batch.logits.argmax(-1)
        fb = batch.forward_batch
        for i, (r, plan) in enumerate(zip(batch._requests, fb.plans)):
            track = batch._track_slot_lists[i]
            if plan.tracked:
                self._donate(r.token_ids, batch.kv[i], track, 0, plan.track_len)
            self.running[r.rid] = RunningRequest(r.rid, list(r.token_ids), fb.working_slots[i], list(track),
                                                 int(plan.tracked) % self.tracks_per_request, batch.kv[i],
                                                 next_tokens[i:i + 1])
            self.stats.requests += 1
            self.stats.prefix_hits += plan.prefix_len > 0
            self.stats.cached_tokens += plan.prefix_len
            self.stats.computed_tokens += plan.extend_len
        self._close(batch, FINISHED)

    @_public
    def abort_prefill(self, batch: PreparedPrefill) -> None:
        """Give back a prepared batch that will not be finished (run or not): free its working
        and track slots and unlock its prefix matches. Nothing is cached and no request starts
        running. Call it at most once, instead of ``finish_prefill``."""
        self._live.check(batch, "abort_prefill")
        with self._stop.changing("Engine.abort_prefill"):
            self.pool.free(batch.owned_slots, self._owner)
            self._close(batch, ABORTED)

    def _close(self, batch: PreparedPrefill, status: str) -> None:
        """End a prepared batch (finished or aborted): not live nor pending, its matches unlocked."""
        self._live.close(batch, status)
        for rid in batch.forward_batch.rids:
            del self.pending[rid]
        for m in batch._matches:
            self.cache.unlock(m.node, self._owner)

    @_public
    def prefill(self, requests: list[Request]) -> PrefillResult:
        """Prefill new requests (prepare, forward and finish in one call); they keep running (for
        :meth:`decode`) until :meth:`release`."""
        plan = self._plan_prefill(requests)
        with self._stop.changing("Engine.prefill"):
            batch = self._open_prefill(plan)
            logits = self._forward(batch, None)
            self._finish(batch)
            fb = batch.forward_batch
            return PrefillResult(logits, logits.argmax(-1).tolist(), list(fb.prefix_lens), list(fb.track_lens))

    @_public
    def capture_prefill(self, bucket: Bucket, mode: str = "graph", graphs: bool = True) -> CapturedBucket:
        """Capture the prefill forward for every batch of a token ``bucket``; replay one with
        ``captured.replay(batch)`` (a prepared batch that fits), then ``finish_prefill(batch)``.

        ``mode``: ``breakable``, ``gdn_inside`` or ``graph`` (:mod:`mamba_edu.engine.graph`);
        ``graphs=False``: the same static-buffer forward without CUDA graphs (on a CPU too)."""
        check_capture(bucket, mode, graphs, self.backend.strategy, self.model, self.prefill_kernel)
        captured = CapturedBucket(self, bucket, mode)
        if graphs:
            with self._stop.changing("Engine.capture_prefill"):
                captured._capture()
        return captured

    # ---- decode -------------------------------------------------------------------------
    @_public
    def decode(self, steps: int) -> DecodeResult:
        """``steps`` greedy tokens for every running request. Each step feeds the previous step's
        argmax from the device; decode tracking (:func:`~mamba_edu.serving.planning.plan_decode`)
        is planned on the host and masked on the device via the scratch slot. One host read, at
        the end; then the snapshots are offered to the cache."""
        check_steps(steps)
        reqs = list(self.running.values())
        if not reqs:
            raise ValueError("decode needs running requests: call prefill first")
        plan = plan_decode([len(r.tokens) for r in reqs], [r.track_slots for r in reqs],
                           [r.next_track for r in reqs], steps, self.track_interval, SCRATCH_SLOT)
        rids, working = [r.rid for r in reqs], [r.working_slot for r in reqs]
        with self._stop.changing("Engine.decode"):
            first = torch.cat([r.next_token for r in reqs])
            ids, kvs, generated, all_logits = first, [r.kv for r in reqs], [], []
            for step in range(steps):
                batch = build_decode_batch(rids, ids, plan.seq_lens[step], working, plan.dst[step], kvs,
                                           self.model.device)
                self.backend.init_forward_metadata(batch)
                logits, kvs = self.model(batch, self.backend)
                self.backend.track_decode(batch)
                ids = logits.argmax(-1)
                generated.append(ids)
                all_logits.append(logits)
            host = torch.stack([first, *generated], 1).tolist()  # the one host sync of decode
            for i, r in enumerate(reqs):
                fed = host[i][:-1]  # the previous next token and all generated but the last
                if plan.snapshots[i] is not None:
                    self._donate(r.tokens + fed, kvs[i], r.track_slots, *plan.snapshots[i])
                r.tokens, r.kv, r.next_token = r.tokens + fed, kvs[i], generated[-1][i:i + 1]
                r.next_track = plan.next_track[i]
            return DecodeResult(rids, {rid: host[i][1:] for i, rid in enumerate(rids)}, torch.stack(all_logits))

    @_public
    def release(self, rids) -> None:
        """Finish requests (``rids``: a list of running ids): free their working and track slots
        (cached snapshots stay)."""
        rids = check_release(rids, self.running, self.pending)
        with self._stop.changing("Engine.release"):
            self.pool.free([s for rid in rids for s in (self.running[rid].working_slot,
                                                        *self.running[rid].track_slots)], self._owner)
            for rid in rids:
                del self.running[rid]
