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
(in one CUDA graph, or in SGLang's breakable pieces).
What a caller hands in and gets back (:class:`Request`, its checks, the results) lives in
:mod:`mamba_edu.serving.requests`; a prepared batch's life (:class:`PreparedPrefill`, the
engine's record of its live batches) in :mod:`mamba_edu.serving.prepared`; a captured bucket
(:class:`CapturedBucket`) in :mod:`mamba_edu.serving.bucket`.

Contracts (docs/architecture.md):

* **Transactions.** Every public call checks its arguments in one pass, before anything changes,
  and either completes or leaves the engine, its pool, its cache and its requests exactly as they
  were. A failure half way (out of memory, Ctrl-C) is undone by an :class:`_Undo` taken before the
  call's first change: the pool's free list and owners, the cache's tree (inserts, evictions,
  locks, recency), the running and pending requests, the live batches and the stats, and the
  states of every slot the call writes (saved before its first write). So a ``prepare_prefill``
  whose snapshot copy fails gets its evictions back, a ``finish_prefill`` or ``decode`` that fails
  after a cache insert takes the insert back, and a ``prefill`` that fails leaves no trace (not
  even its prepare's evictions). A failed forward puts its batch's slots back to their prepared
  states (the batch may be run again or aborted).
* **Ownership.** Every slot the engine holds is allocated to it in the pool, and every prefix lock
  is taken in its name: ``engine.pool.free``, ``engine.cache.unlock`` or ``engine.cache.insert``
  called by anyone else refuse them.
* **One life per batch.** A :class:`PreparedPrefill` is used once: ``prepare → forward → finish``,
  or ``prepare [→ forward] → abort``; the engine keeps the list of its live batches, so a copy, a
  finished or aborted batch, or another engine's batch is refused.
* **One thread.** An ``Engine`` is single-threaded: a call from a second thread while another
  thread's call runs raises ``RuntimeError`` (use one engine per thread, or a lock around it).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Hashable

import torch

from mamba_edu.model.config import ModelConfig
from mamba_edu.model.hybrid import ModelOutput
from mamba_edu.serving import (SCRATCH_SLOT, ForwardBatch, LinearAttentionBackend, PoolExhausted,
                               RadixCache, StatePool, plan_tracking)
from mamba_edu.serving.batch import build_decode_batch, build_extend_batch
from mamba_edu.serving.bucket import CAPTURE_MODES, Bucket, CapturedBucket, StaticBucket, empty_batch
from mamba_edu.serving.planning import check_cache_chunk, plan_decode
from mamba_edu.serving.prepared import ABORTED, FINISHED, FORWARDED, PREPARED, LiveBatches, PreparedPrefill
from mamba_edu.serving.requests import (DecodeResult, EngineStats, PrefillResult, Request, RunningRequest,
                                        check_rid)


#: Most steps one ``decode`` call takes: its logits and KV grow with every step until it returns.
MAX_DECODE_STEPS = 1 << 16


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


class _Undo:
    """What one engine call may change, saved before it changes anything, so that a failure half
    way (out of memory, Ctrl-C) can put all of it back with :meth:`rollback`.

    Host (saved at once, plain copies): the pool's free list and owners, the cache's tree (edges,
    snapshots, locks, recency), the running and pending requests, the live batches (with their
    statuses and track slot lists) and the stats. Device: the states of the slots the call writes,
    saved by :meth:`save_states` before each slot's first write (a snapshot about to be evicted and
    reused, a free slot about to be zeroed, a working slot about to get a prefix snapshot)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.books = engine.pool._save_bookkeeping()
        self.tree = engine.cache._save_tree()
        self.running, self.pending = dict(engine.running), dict(engine.pending)
        self.stats = vars(engine.stats).copy()
        self.live = engine._live._save()
        self.tracks = [(b, [list(t) for t in b._track_slot_lists]) for b in engine._live]
        self.states, self.saved = [], set()

    def save_states(self, slots) -> None:
        """Keep the current states of ``slots`` (those not kept already) for :meth:`rollback`."""
        new = sorted(set(slots) - self.saved)
        if new:
            pool = self.engine.pool
            idx = torch.tensor(new, device=pool.conv.device)
            self.states.append((idx, pool.conv[:, idx].clone(), pool.ssm[:, idx].clone()))
            self.saved.update(new)

    def rollback(self) -> None:
        """Put everything back as it was when this undo was taken (host first: plain assignments).
        If putting back fails too, the engine is marked broken and refuses every later call."""
        try:
            self._put_back()
        except BaseException as err:
            self.engine._broken = f"{type(err).__name__}: {err}"
            raise

    def _put_back(self) -> None:
        e = self.engine
        e.pool._restore_bookkeeping(self.books)
        e.cache._restore_tree(self.tree)
        e.running.clear()
        e.running.update(self.running)
        e.pending.clear()
        e.pending.update(self.pending)
        vars(e.stats).update(self.stats)
        e._live._restore(self.live)
        for batch, lists in self.tracks:
            batch._track_slot_lists[:] = [list(t) for t in lists]
        for idx, conv, ssm in reversed(self.states):
            e.pool.conv[:, idx] = conv
            e.pool.ssm[:, idx] = ssm


def _inside_a_call(engine, frame) -> bool:
    """Whether ``frame`` or one of its callers is a public call of ``engine``."""
    while frame is not None:
        if frame.f_code is _CALL_CODE and frame.f_locals.get("self") is engine:
            return True
        frame = frame.f_back
    return False


def _single_threaded(method):
    """Refuse a call while another thread's call on the same engine runs, and a call that
    re-enters the engine from outside it (a forward hook); the engine's own nested calls
    (``prefill`` calls ``prepare_prefill``) pass."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if self._broken is not None:
            raise RuntimeError(f"Engine.{method.__name__}: this Engine is broken: undoing an earlier failed "
                               f"call failed too ({self._broken}), so its pool and cache are in an unknown "
                               f"state. Build a new Engine")
        me = threading.get_ident()
        # One atomic step claims the engine (dict.setdefault under the GIL), nothing ever waits,
        # and nesting is read from the call stack, not from a counter: an interrupt anywhere in
        # this wrapper can at most leave a claim of this thread behind, which this thread's next
        # call takes over and releases.
        holder = self._claim.setdefault("thread", me)
        if holder != me:
            raise RuntimeError(f"Engine.{method.__name__}: another thread is using this Engine. "
                               f"An Engine is single-threaded: use one engine per thread, or "
                               f"hold a lock around every call")
        caller = sys._getframe(1)
        if _inside_a_call(self, caller):
            if caller.f_code.co_filename != __file__:
                raise RuntimeError(f"Engine.{method.__name__} was called from inside another call of this "
                                   f"Engine (a forward hook or a callback?): a call cannot re-enter the "
                                   f"engine while it runs; act after the outer call returns")
            return method(self, *args, **kwargs)  # prefill calls prepare_prefill: the outer call releases
        try:
            return method(self, *args, **kwargs)
        finally:
            self._claim.pop("thread", None)
    return call


_CALL_CODE = _single_threaded(lambda self: None).__code__  # the wrapper's code, shared by every method


class Engine:
    """Prefill/decode loop over one model with a prefix cache and a tracking strategy.

    Single-threaded (see the module docstring); every public call is a transaction.

    Args:
        model: a :class:`mamba_edu.model.HybridModel`.
        strategy: ``naive``, ``precomputed``, ``sync_free`` or ``fused`` (docs/conventions.md).
        max_requests: most requests running at once.
        cache_chunk: ``Cc``, a multiple of 64: extends of at least Cc tokens are tracked.
        ping_pong: 2 track slots per request instead of 1 (for an overlapping scheduler).
        track_interval: decode tracks every this many tokens (seq_len % interval == 0).
        cache_slots: pool slots for cached snapshots (default ``2·max_requests``).
    """

    def __init__(self, model, strategy: str = "sync_free", max_requests: int = 8, cache_chunk: int = 64,
                 ping_pong: bool = False, track_interval: int = 256, cache_slots: int | None = None):
        _check_model(model)
        if type(ping_pong) is not bool:
            raise TypeError(f"ping_pong must be a bool (True: two track slots per request); got {ping_pong!r}")
        self._claim: dict = {}  # {"thread": id} while a call runs (see _single_threaded)
        self._broken: str | None = None  # why, once an undo failed (every call is then refused)
        self.model = model
        self.config = model.config
        self.max_requests = _positive_int("max_requests", max_requests)
        self.cache_chunk = check_cache_chunk(cache_chunk)
        self.track_interval = _positive_int("track_interval", track_interval)
        self.tracks_per_request = 2 if ping_pong else 1
        cache_slots = 2 * max_requests if cache_slots is None else _positive_int("cache_slots", cache_slots)
        capacity = max_requests * (1 + self.tracks_per_request) + cache_slots
        backend = LinearAttentionBackend(
            StatePool.for_model(self.config, capacity, model.device, model.dtype), strategy,
            self.config.conv_width)
        self.pool = backend.pool
        self.cache = RadixCache(self.pool, working_slots=self._working_slots,
                                kv_layers=len(self.config.attn_layers))
        self.backend = backend
        self._owner = _Owner()
        self.running: dict[Hashable, RunningRequest] = {}
        self.pending: dict[Hashable, int] = {}  # rid -> working slot, prepared and not finished/aborted
        self._live = LiveBatches(self)  # the prepared batches not finished or aborted
        self.stats = EngineStats()

    @property
    def strategy(self) -> str:
        return self.backend.strategy_name

    def _working_slots(self) -> set[int]:
        """The slots forwards write now: running requests' and prepared batches' working slots."""
        return {r.working_slot for r in self.running.values()} | set(self.pending.values())

    # ---- prefill ------------------------------------------------------------------------
    def _check_requests(self, requests) -> list[Request]:
        if not isinstance(requests, (list, tuple)):
            raise ValueError(f"requests must be a list of Request; got {type(requests).__name__}")
        requests = list(requests)
        if not requests:
            raise ValueError("requests must be a non-empty list of Request")
        seen = set()
        for r in requests:
            if not isinstance(r, Request):
                raise ValueError(f"requests must hold Request objects; got {type(r).__name__}")
            r.check(self.config.vocab)
            if r.rid in seen or r.rid in self.running or r.rid in self.pending:
                raise ValueError(f"request ids must be unique, not running and not pending; "
                                 f"got duplicate rid {r.rid!r}")
            seen.add(r.rid)
        active = len(self.running) + len(self.pending)
        if active + len(requests) > self.max_requests:
            raise ValueError(f"requests: {len(requests)} new + {active} running or prepared exceeds "
                             f"max_requests={self.max_requests}")
        return requests

    def _alloc(self, n: int, undo: _Undo) -> list[int]:
        """``n`` free slots for this engine, evicting cached snapshots if needed; raises
        :class:`PoolExhausted` before changing anything. The slots' states (zeroed by the
        allocation: a snapshot that was evicted, or a free slot's) are saved in ``undo`` first."""
        missing = n - self.pool.n_free
        freed = []
        if missing > 0:
            freed = [v.slot for v in self.cache.eviction_plan(missing) if v.slot is not None]
            if len(freed) < missing:
                raise PoolExhausted(f"state pool exhausted: need {n} slots, {self.pool.n_free} free and "
                                    f"{len(freed)} evictable cache snapshots")
        undo.save_states(self.pool.peek(n, freed))
        if missing > 0:
            self.cache.evict(missing)
        return self.pool.alloc(n, self._owner)

    @_single_threaded
    def prepare_prefill(self, requests: list[Request]) -> PreparedPrefill:
        """Host work before the forward: prefix match, slot allocation, snapshot restore, planning.

        On a hit at P tokens the snapshot is copied into the new working slot and only the
        remaining ``E = len − P`` tokens are computed (at least one, for the last logits).
        Returns a :class:`PreparedPrefill` owned by this engine; give it to
        :meth:`forward_prefill` and then :meth:`finish_prefill` (or :meth:`abort_prefill`).
        Everything that can fail (the checks, the plan, the upload) happens before the pool
        or the cache changes; a failure after that (the snapshot copies) is undone, evictions
        included.
        """
        return self._prepare(requests)

    def _prepare(self, requests, undo: _Undo | None = None) -> PreparedPrefill:
        """``prepare_prefill``; with ``undo`` (``prefill``'s own) the caller undoes a failure."""
        requests = self._check_requests(requests)
        matches = [self.cache.match(list(r.token_ids), max_length=len(r.token_ids) - 1, touch=False)
                   for r in requests]
        per_request = 1 + self.tracks_per_request
        need = per_request * len(requests)
        missing = need - self.pool.n_free
        victims = self.cache.eviction_plan(max(missing, 0), protect=[m.node for m in matches])
        freed = [v.slot for v in victims if v.slot is not None]
        if len(freed) < missing:
            raise PoolExhausted(f"state pool exhausted: need {need} slots, {self.pool.n_free} free and "
                                f"{len(freed)} evictable cache snapshots")
        slots = self.pool.peek(need, freed)
        working = slots[::per_request]
        extends = [list(r.token_ids[m.length:]) for r, m in zip(requests, matches)]
        plans = [plan_tracking(m.length, len(e), self.cache_chunk, slots[i * per_request + 1])
                 for i, (m, e) in enumerate(zip(matches, extends))]
        inputs = build_extend_batch([r.rid for r in requests], extends, [m.length for m in matches],
                                    working, plans, [m.kv for m in matches], self.model.device)
        # Commit: evict, take the planned slots, restore the snapshots, lock; undone on a failure.
        own = undo is None
        undo = _Undo(self) if own else undo
        try:
            undo.save_states(slots)  # free slots and the snapshots about to be evicted
            self.cache.evict(max(missing, 0), protect=[m.node for m in matches])
            taken = self.pool.alloc(need, self._owner)
            if taken != slots:  # the plan above is what alloc does; a mismatch is a bug
                raise RuntimeError(f"internal error: planned slots {slots}, allocated {taken}")
            for m, slot in zip(matches, working):
                if m.slot is not None:
                    self.pool.copy_slot(m.slot, slot, self._owner)
            for m in matches:
                self.cache.lock(m.node, self._owner)
                self.cache.touch(m)
            batch = self._live.open(inputs, requests, matches,
                                    [slots[i * per_request + 1:(i + 1) * per_request] for i in range(len(requests))])
            self.pending.update(zip(inputs.rids, working))
        except BaseException:
            if own:
                undo.rollback()
            raise
        return batch

    @_single_threaded
    def forward_prefill(self, batch: PreparedPrefill) -> torch.Tensor:
        """The timed forward: ``init_forward_metadata`` + all layers (with tracking) → logits [N, vocab].

        Runs once per prepared batch: a second call would start from the states the first one
        wrote and raises instead (``reset_prefill(batch)`` re-arms it). A forward that raises
        half-way (e.g. stopped by ``cuda_sync_guard``) puts the batch's slots back to their
        prepared states, so it may be retried.
        """
        return self._forward(batch, "forward_prefill", self._eager_forward)

    def _eager_forward(self, fb: ForwardBatch):
        self.backend.init_forward_metadata(fb)
        return self._run_model(fb)

    def _forward(self, batch: PreparedPrefill, action: str, run) -> torch.Tensor:
        """``run(batch.forward_batch) -> (logits, kv)`` as the batch's one forward, with the
        checks and the undo of :meth:`forward_prefill` (``action`` names the caller)."""
        self._live.check(batch, action)
        if batch.status == FORWARDED:
            raise ValueError(f"{action}: forward_prefill already ran on this batch: its working slots now "
                             "hold the states after its prompts, so a second forward would continue from "
                             "them (wrong logits and snapshots). Call engine.reset_prefill(batch) first to "
                             "rerun it from its prepared states, or prepare a new batch")
        if batch._started:  # an earlier forward failed and its undo failed too
            self._restore_prepared_states(batch)
        batch._started = True
        scratch = self.pool.conv[:, SCRATCH_SLOT].clone(), self.pool.ssm[:, SCRATCH_SLOT].clone()
        try:
            logits, kv = run(batch.forward_batch)
            batch.logits, batch.kv, batch._status = logits, kv, FORWARDED  # the commit: one line
        except BaseException:
            self._restore_prepared_states(batch)
            self.pool.conv[:, SCRATCH_SLOT], self.pool.ssm[:, SCRATCH_SLOT] = scratch
            batch._started = False
            raise
        return logits

    def _restore_prepared_states(self, batch: PreparedPrefill) -> None:
        """Put the batch's slots back to what prepare_prefill left: zeros, and the (locked,
        unchanging) snapshot in the working slot of each prefix hit."""
        idx = torch.tensor(batch.owned_slots, device=self.pool.conv.device)
        self.pool.conv[:, idx] = 0
        self.pool.ssm[:, idx] = 0
        for m, slot in zip(batch._matches, batch.forward_batch.working_slots):
            if m.slot is not None:
                self.pool.copy_slot(m.slot, slot, self._owner)

    @_single_threaded
    def reset_prefill(self, batch: PreparedPrefill) -> None:
        """Re-arm a prepared batch for one more forward (benchmarks that rerun one batch): its
        working and track slots get back the states ``prepare_prefill`` gave them."""
        self._live.check(batch, "reset_prefill")
        undo = _Undo(self)
        try:
            undo.save_states(batch.owned_slots)
            self._restore_prepared_states(batch)
        except BaseException:
            undo.rollback()
            raise
        batch._status, batch.logits, batch.kv, batch._started = PREPARED, None, None, False

    def _run_model(self, batch: ForwardBatch) -> ModelOutput:
        return self.model(batch, self.backend)

    def _donate(self, tokens, kv, track_slots: list[int], index: int, length: int, undo: _Undo) -> None:
        """Offer the snapshot in ``track_slots[index]`` (state after ``length`` tokens) to the
        cache; if taken, the list gets a fresh slot in its place. The fresh slot is allocated
        first: with none to be had the snapshot is simply not cached, and the request never
        writes a slot the cache owns. A failure half way is the caller's to undo (``undo``: the
        insert, the allocation and its evictions go back with the call's other changes)."""
        try:
            fresh = self._alloc(1, undo)[0]
        except PoolExhausted:
            return
        took = self.cache.insert(list(tokens[:length]), track_slots[index],
                                 [(k[:length], v[:length]) for k, v in kv], self._owner)
        if took:
            track_slots[index] = fresh
        else:
            self.pool.free([fresh], self._owner)

    @_single_threaded
    def finish_prefill(self, batch: PreparedPrefill, logits: torch.Tensor | None = None) -> None:
        """After the forward: insert tracked snapshots into the cache, then register the requests.

        ``logits``: what ``forward_prefill(batch)`` (or ``captured.replay(batch)``) returned; None
        means the batch's own. If it fails half way (out of memory), everything
        is undone (the cache inserts too): the batch stays forwarded and can be finished (or
        aborted) again.
        """
        self._live.check(batch, "finish_prefill")
        if batch.logits is None:
            raise ValueError("batch has not been run: call forward_prefill(batch) (or a captured bucket's "
                             "replay(batch)) before finish_prefill (or abort_prefill(batch) to give it back)")
        run = batch
        if logits is not None and logits is not batch.logits:
            shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(f"logits must be the tensor forward_prefill(batch) returned for this batch "
                             f"([{batch.forward_batch.size}, {self.config.vocab}]); got another ({shape}): "
                             f"a batch is finished with its own logits")
        undo = _Undo(self)
        try:
            next_tokens = run.logits.argmax(-1)
            fb = batch.forward_batch
            for i, (r, plan) in enumerate(zip(batch._requests, fb.plans)):  # cache inserts first
                if plan.tracked:
                    self._donate(r.token_ids, run.kv[i], batch._track_slot_lists[i], 0, plan.track_len, undo)
            for i, (r, plan) in enumerate(zip(batch._requests, fb.plans)):
                track = batch._track_slot_lists[i]
                self.running[r.rid] = RunningRequest(r.rid, list(r.token_ids), fb.working_slots[i], list(track),
                                                     int(plan.tracked) % self.tracks_per_request, run.kv[i],
                                                     next_tokens[i:i + 1])
                self.stats.requests += 1
                self.stats.prefix_hits += plan.prefix_len > 0
                self.stats.cached_tokens += plan.prefix_len
                self.stats.computed_tokens += plan.extend_len
            self._close_prepared(batch, FINISHED)
        except BaseException:
            undo.rollback()
            raise

    @_single_threaded
    def abort_prefill(self, batch: PreparedPrefill) -> None:
        """Give back a prepared batch that will not be finished (never run, or its forward
        failed): free its working and track slots and unlock its prefix matches. Nothing is
        cached and no request starts running. Call it at most once, instead of ``finish_prefill``."""
        self._live.check(batch, "abort_prefill")
        undo = _Undo(self)
        try:
            self.pool.free(batch.owned_slots, self._owner)
            self._close_prepared(batch, ABORTED)
        except BaseException:
            undo.rollback()
            raise

    def _close_prepared(self, batch: PreparedPrefill, status: str) -> None:
        """End a prepared batch (finished or aborted): it is no longer live nor pending and its
        prefix matches are unlocked."""
        self._live.close(batch, status)
        for rid in batch.forward_batch.rids:
            del self.pending[rid]
        for m in batch._matches:
            self.cache.unlock(m.node, self._owner)

    @_single_threaded
    def prefill(self, requests: list[Request]) -> PrefillResult:
        """Prefill new requests; they keep running (for :meth:`decode`) until :meth:`release`.

        A failure anywhere (prepare, forward or finish) leaves no trace: the prepare's evictions,
        slots, locks and snapshot copies, the forward's states (the scratch slot's too) and the
        finish's cache inserts are all undone."""
        undo = _Undo(self)
        try:
            undo.save_states([SCRATCH_SLOT])
            batch = self._prepare(requests, undo)
            logits = self.forward_prefill(batch)
            self.finish_prefill(batch, logits)
        except BaseException:
            undo.rollback()
            raise
        fb = batch.forward_batch
        return PrefillResult(logits, logits.argmax(-1).tolist(), list(fb.prefix_lens), list(fb.track_lens))

    @_single_threaded
    def capture_prefill(self, bucket: Bucket, mode: str = "graph", graphs: bool = True) -> CapturedBucket:
        """Capture the prefill forward for every batch of a token ``bucket``; replay one with
        ``captured.replay(batch)`` (a prepared batch that fits), then ``finish_prefill(batch)``.

        Modes (:mod:`mamba_edu.serving.breakable`, :mod:`mamba_edu.serving.bucket`):

        * ``"breakable"``: SGLang's default today: graph pieces, every attention core (GDN and
          full attention) an eager break reading the live batch, the LM head an eager tail;
          every strategy.
        * ``"gdn_inside"``: the same, but the GDN layers run inside the pieces on the bucket's
          fixed-capacity metadata (SGLang's open issue #35851); ``sync_free``/``fused`` only.
        * ``"graph"``: the whole forward in one graph, attention included (over the bucket's
          static prefix KV); ``sync_free``/``fused`` only.

        ``graphs=False`` runs the same static-buffer forward, cut the same way, without CUDA
        graphs (on a CPU too): what each replay computes, for tests and comparisons. Capturing
        runs the forward on padding only (no request's slot is touched); the scratch slot is
        put back afterwards.
        """
        if not isinstance(bucket, Bucket):
            raise TypeError(f"bucket must be a Bucket(max_tokens, max_requests[, max_prefix_tokens]); "
                            f"got {type(bucket).__name__}")
        if mode not in CAPTURE_MODES:
            raise ValueError(f"mode must be one of {list(CAPTURE_MODES)}; got {mode!r}")
        if type(graphs) is not bool:
            raise TypeError(f"graphs must be a bool; got {graphs!r}")
        if mode != "breakable" and not self.backend.strategy.capturable:
            raise ValueError(f"mode {mode!r} runs the GDN layers inside a graph, which needs a strategy "
                             f"that never syncs (sync_free or fused); engine strategy is {self.strategy!r}")
        if graphs and self.model.device.type != "cuda":
            raise RuntimeError(f"capture_prefill needs a CUDA device; the model is on {self.model.device} "
                               "(graphs=False runs the same forward without graphs)")
        static = StaticBucket(bucket, self.model, self.config.conv_width, fixed=mode != "breakable",
                              prefix_in_graph=mode == "graph")
        captured = CapturedBucket(self, static, mode)
        if not graphs:
            return captured
        scratch = self.pool.conv[:, SCRATCH_SLOT].clone(), self.pool.ssm[:, SCRATCH_SLOT].clone()
        try:
            static.fill(empty_batch(self.model.device))  # padding only: the dummy request's tokens
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: lazy inits and autotuning happen outside the capture
                    self._eager_forward(static.batch)
            torch.cuda.current_stream().wait_stream(stream)
            self.backend.init_forward_metadata(static.batch)
            captured.capture(self.model, self.backend)
        finally:
            torch.cuda.synchronize()  # the warm-up stream too, if it failed before the wait
            self.pool.conv[:, SCRATCH_SLOT], self.pool.ssm[:, SCRATCH_SLOT] = scratch
        return captured

    # ---- decode -------------------------------------------------------------------------
    @_single_threaded
    def decode(self, steps: int) -> DecodeResult:
        """``steps`` greedy tokens for every running request.

        Each step feeds the previous step's argmax straight from the device; decode tracking
        (after ``seq_len % track_interval == 0`` tokens, :func:`~mamba_edu.serving.planning.plan_decode`)
        is planned on the host and masked on the device via the scratch slot. The tokens are read
        back once, at the end. Nothing is committed unless every step succeeded: a failure puts
        the working slots' states back and leaves every request as it was.
        """
        _positive_int("steps", steps)
        if steps > MAX_DECODE_STEPS:
            raise ValueError(f"steps must be at most {MAX_DECODE_STEPS} per call (every step's logits and "
                             f"KV are kept until the call returns); got {steps}: call decode again")
        reqs = list(self.running.values())
        if not reqs:
            raise ValueError("decode needs running requests: call prefill first")
        plan = plan_decode([len(r.tokens) for r in reqs], [r.track_slots for r in reqs],
                           [r.next_track for r in reqs], steps, self.track_interval, SCRATCH_SLOT)
        rids, working = [r.rid for r in reqs], [r.working_slot for r in reqs]
        written = sorted(set(working) | {s for row in plan.dst for s in row})  # scratch included
        idx = torch.tensor(written, device=self.pool.conv.device)
        saved = self.pool.conv[:, idx].clone(), self.pool.ssm[:, idx].clone()
        new_tracks = [list(r.track_slots) for r in reqs]  # a donation swaps a slot in here
        before = [(r.tokens, r.kv, r.next_token, r.track_slots, r.next_track) for r in reqs]
        undo = None  # taken before the first cache insert (only when one is due)
        try:
            ids = torch.cat([r.next_token for r in reqs])
            kvs, generated, all_logits = [r.kv for r in reqs], [], []
            for step in range(steps):
                batch = build_decode_batch(rids, ids, plan.seq_lens[step], working, plan.dst[step], kvs,
                                           self.model.device)
                self.backend.init_forward_metadata(batch)
                logits, kvs = self._run_model(batch)
                self.backend.track_decode(batch)
                ids = logits.argmax(-1)
                generated.append(ids)
                all_logits.append(logits)
            first = torch.cat([r.next_token for r in reqs])
            host = torch.stack([first, *generated], 1).tolist()  # the one host sync of decode
            if any(s is not None for s in plan.snapshots):
                undo = _Undo(self)
                for i, r in enumerate(reqs):  # cache inserts first
                    if plan.snapshots[i] is not None:
                        self._donate(r.tokens + host[i][:-1], kvs[i], new_tracks[i], *plan.snapshots[i], undo)
            stacked = torch.stack(all_logits)
            for i, r in enumerate(reqs):  # the commit, undone below if an interrupt cuts it short
                r.tokens = r.tokens + host[i][:-1]  # what was fed: the previous next token, all but the last
                r.kv, r.next_token = kvs[i], generated[-1][i:i + 1]
                r.track_slots, r.next_track = new_tracks[i], plan.next_track[i]
        except BaseException:
            for r, fields in zip(reqs, before):
                r.tokens, r.kv, r.next_token, r.track_slots, r.next_track = fields
            if undo is not None:  # the inserts, fresh slots and evictions (before the states below)
                undo.rollback()
            self.pool.conv[:, idx] = saved[0]
            self.pool.ssm[:, idx] = saved[1]
            raise
        return DecodeResult(rids, {rid: host[i][1:] for i, rid in enumerate(rids)}, stacked)

    @_single_threaded
    def release(self, rids) -> None:
        """Finish requests: free their working and track slots (cached snapshots stay).

        ``rids``: a list (or tuple, set) of distinct ids of running requests, read once and
        checked whole before anything is freed."""
        if isinstance(rids, (str, bytes)) or not isinstance(rids, (list, tuple, set, frozenset)):
            raise ValueError(f"rids must be a list of request ids (e.g. [\"a\"]); got {rids!r}")
        rids = list(rids)
        seen = set()
        for rid in rids:
            check_rid(rid, "each of rids")
            if rid in seen:
                raise ValueError(f"rids must be distinct; {rid!r} is repeated in {rids!r}")
            seen.add(rid)
            if rid in self.pending:
                raise ValueError(f"rids must be running requests; {rid!r} is prepared but not finished: "
                                 f"finish_prefill or abort_prefill its batch")
            if rid not in self.running:
                raise ValueError(f"rids must be running requests; {rid!r} is not")
        undo = _Undo(self)
        try:
            self.pool.free([s for rid in rids for s in (self.running[rid].working_slot,
                                                        *self.running[rid].track_slots)], self._owner)
            for rid in rids:
                del self.running[rid]
        except BaseException:
            undo.rollback()
            raise
