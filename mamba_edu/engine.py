"""The engine: prefix match → slots → planning → forward with tracking → cache insert; decode.

::

    engine = Engine(build_model("tiny"), strategy="sync_free")
    out = engine.prefill([Request("a", prompt)])      # logits [N, vocab], greedy next tokens
    dec = engine.decode(8)                            # 8 greedy tokens for every running request
    engine.release(["a"])                             # give its slots back

``prefill`` is ``prepare_prefill`` (host work) + ``forward_prefill`` (the timed forward:
metadata, layers, tracking) + ``finish_prefill`` (cache insert, bookkeeping); benchmarks call
the three parts themselves (``abort_prefill`` gives back a batch they do not finish), and
``capture_prefill`` puts the forward into a CUDA graph.

A prepared prefill (:class:`PreparedPrefill`) belongs to the engine that prepared it and is used
once: ``prepare → forward → finish``, or ``prepare [→ forward] → abort``. Running it on another
engine, running its forward twice, finishing or aborting it twice raises ``ValueError`` before
anything changes (``reset_prefill`` re-arms it for a benchmark that reruns one batch).
Every argument is checked at this boundary, before any slot, lock or cache entry changes
(docs/architecture.md states the contracts).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field, fields

import torch

from mamba_edu.model.config import ModelConfig
from mamba_edu.model.hybrid import ModelOutput
from mamba_edu.serving import (SCRATCH_SLOT, ForwardBatch, LinearAttentionBackend, PoolExhausted,
                               RadixCache, StatePool, plan_tracking)
from mamba_edu.serving.batch import build_decode_batch, build_extend_batch
from mamba_edu.serving.planning import check_cache_chunk


@dataclass(frozen=True)
class Request:
    """A prompt to prefill: a unique id and its token ids."""

    rid: Hashable
    token_ids: list[int]


@dataclass
class RunningRequest:
    """Host bookkeeping of one request between forwards.

    ``tokens``: prompt + generated tokens that have been fed; ``kv``: per attention layer
    ``(k, v)`` of those tokens; ``next_token``: ``[1]`` device tensor, the greedy token to feed next;
    ``track_slots``: 1 (or 2, ping-pong) slots, ``next_track`` the one the next tracking writes.
    """

    rid: Hashable
    tokens: list[int]
    working_slot: int
    track_slots: list[int]
    next_track: int
    kv: list
    next_token: torch.Tensor
    snapshot_len: int | None = None  # length of the latest decode-tracked snapshot not yet cached


@dataclass
class PrefillResult:
    """``logits [N, vocab]`` fp32 of each prompt's last token, ``next_tokens`` (greedy),
    ``prefix_lens`` (tokens served from the cache) and ``track_lens`` (P + A, or −1)."""

    logits: torch.Tensor
    next_tokens: list[int]
    prefix_lens: list[int]
    track_lens: list[int]


@dataclass
class DecodeResult:
    """``tokens[rid]``: the generated tokens; ``logits [steps, N, vocab]`` in ``rids`` order."""

    rids: list
    tokens: dict
    logits: torch.Tensor


@dataclass
class EngineStats:
    requests: int = 0
    prefix_hits: int = 0
    cached_tokens: int = 0
    computed_tokens: int = 0


@dataclass
class CapturedPrefill:
    """A prefill forward captured in a CUDA graph. ``replay()`` reruns it (same batch, same
    slots) and returns the static ``logits``; ``kv`` is the graph's attention KV per sequence
    (static too, rewritten by each replay); ``restore_states()`` puts back the states the
    batch's slots held before capture, so the next replay starts where eager would."""

    graph: object
    logits: torch.Tensor
    _slots: torch.Tensor
    _saved: tuple = field(repr=False)
    _pool: StatePool = field(repr=False)
    _metadata: object = field(default=None, repr=False)  # keeps the graph's index tensors alive
    kv: list | None = field(default=None, repr=False)

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.logits

    def restore_states(self) -> None:
        self._pool.conv[:, self._slots] = self._saved[0]
        self._pool.ssm[:, self._slots] = self._saved[1]


PREPARED, FORWARDED, FINISHED, ABORTED = "prepared", "forwarded", "finished", "aborted"


@dataclass(eq=False, repr=False)
class PreparedPrefill(ForwardBatch):
    """A prefill batch prepared by :meth:`Engine.prepare_prefill`: the forward's inputs (every
    :class:`~mamba_edu.serving.ForwardBatch` field, so it is passed to the backend and the model
    as it is) plus the engine's bookkeeping, which the forward never reads.

    Lifecycle (``status``): ``prepared`` → :meth:`Engine.forward_prefill` → ``forwarded`` →
    :meth:`Engine.finish_prefill` → ``finished``; or :meth:`Engine.abort_prefill` from
    ``prepared``/``forwarded`` → ``aborted``. It belongs to ``engine`` (its slots are that
    engine's) and each step happens at most once; anything else raises before changing state.

    ``requests``: the full prompts; ``matches``: their locked prefix matches;
    ``track_slot_lists``: each request's 1 (or 2, ping-pong) track slots; ``logits`` and ``kv``:
    what the forward returned (:class:`~mamba_edu.model.ModelOutput`; None before it).
    """

    engine: object = field(default=None, compare=False)
    requests: list = field(default_factory=list)
    matches: list = field(default_factory=list)
    track_slot_lists: list = field(default_factory=list)
    status: str = PREPARED
    logits: torch.Tensor | None = None
    kv: list | None = None
    captured: CapturedPrefill | None = None
    _started: bool = False  # a forward began (it may have raised half-way)

    @property
    def owned_slots(self) -> list[int]:
        """Every slot this batch holds: working slots, then each request's track slots."""
        return self.working_slots + [s for lst in self.track_slot_lists for s in lst]

    def __repr__(self) -> str:
        return (f"PreparedPrefill(rids={self.rids}, status={self.status!r}, prefix_lens={self.prefix_lens}, "
                f"extend_lens={self.extend_lens}, working_slots={self.working_slots}, "
                f"track_slots={self.track_slots}, track_mask={self.track_mask}, track_lens={self.track_lens})")


def _positive_int(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")
    return value


def _check_model(model) -> None:
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig) or not callable(model) or not hasattr(model, "device"):
        raise TypeError(f"model must be a HybridModel (from mamba_edu.model.build_model); "
                        f"got {type(model).__name__}")


class Engine:
    """Prefill/decode loop over one model with a prefix cache and a tracking strategy.

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
        if not isinstance(ping_pong, bool):
            raise TypeError(f"ping_pong must be a bool (True: two track slots per request); got {ping_pong!r}")
        self.model = model
        self.config = model.config
        self.max_requests = _positive_int("max_requests", max_requests)
        self.cache_chunk = check_cache_chunk(cache_chunk)
        self.track_interval = _positive_int("track_interval", track_interval)
        self.tracks_per_request = 2 if ping_pong else 1
        cache_slots = 2 * max_requests if cache_slots is None else _positive_int("cache_slots", cache_slots)
        capacity = max_requests * (1 + self.tracks_per_request) + cache_slots
        self.pool = StatePool.for_model(self.config, capacity, model.device, model.dtype)
        self.cache = RadixCache(self.pool, working_slots=self._working_slots)
        self.backend = LinearAttentionBackend(self.pool, strategy, self.config.conv_width)
        self.running: dict[Hashable, RunningRequest] = {}
        self.pending: dict[Hashable, int] = {}  # rid -> working slot, prepared and not finished/aborted
        self.stats = EngineStats()

    @property
    def strategy(self) -> str:
        return self.backend.strategy_name

    def _working_slots(self) -> set[int]:
        """The slots forwards write now: running requests' and prepared batches' working slots."""
        return {r.working_slot for r in self.running.values()} | set(self.pending.values())

    # ---- prefill ------------------------------------------------------------------------
    def _check_requests(self, requests) -> list[Request]:
        if not isinstance(requests, (list, tuple)) or not requests:
            raise ValueError("requests must be a non-empty list of Request")
        seen = set()
        for r in requests:
            if not isinstance(r, Request):
                raise ValueError(f"requests must hold Request objects; got {type(r).__name__}")
            try:
                hash(r.rid)
            except TypeError:
                raise ValueError(f"rid must be hashable (a str, an int, a tuple); got {r.rid!r}") from None
            if r.rid in seen or r.rid in self.running or r.rid in self.pending:
                raise ValueError(f"request ids must be unique, not running and not pending; "
                                 f"got duplicate rid {r.rid!r}")
            seen.add(r.rid)
            ids = r.token_ids
            vocab = self.config.vocab
            if (not isinstance(ids, (list, tuple)) or not ids
                    or not all(type(t) is int and 0 <= t < vocab for t in ids)):
                bad = next((t for t in ids if type(t) is not int or not 0 <= t < vocab), ids) \
                    if isinstance(ids, (list, tuple)) else ids
                raise ValueError(f"token_ids of request {r.rid!r} must be a non-empty list of ints in "
                                 f"[0, vocab={vocab}) (not bools); got {bad!r}")
        active = len(self.running) + len(self.pending)
        if active + len(requests) > self.max_requests:
            raise ValueError(f"requests: {len(requests)} new + {active} running or prepared exceeds "
                             f"max_requests={self.max_requests}")
        return list(requests)

    def _alloc(self, n: int) -> list[int]:
        """``n`` free slots, evicting cached snapshots if needed; raises before changing anything."""
        missing = n - self.pool.n_free
        if missing > 0:
            if missing > self.cache.evictable_slots():
                raise PoolExhausted(f"state pool exhausted: need {n} slots, {self.pool.n_free} free and "
                                    f"{self.cache.evictable_slots()} evictable cache snapshots")
            self.cache.evict(missing)
        return self.pool.alloc(n)

    def prepare_prefill(self, requests: list[Request]) -> PreparedPrefill:
        """Host work before the forward: prefix match, slot allocation, snapshot restore, planning.

        On a hit at P tokens the snapshot is copied into the new working slot and only the
        remaining ``E = len − P`` tokens are computed (at least one, for the last logits).
        Returns a :class:`PreparedPrefill` owned by this engine; give it to
        :meth:`forward_prefill` and then :meth:`finish_prefill` (or :meth:`abort_prefill`).
        """
        requests = self._check_requests(requests)
        matches = [self.cache.match(list(r.token_ids), max_length=len(r.token_ids) - 1) for r in requests]
        for m in matches:
            self.cache.lock(m.node)
        per_request = 1 + self.tracks_per_request
        try:
            slots = self._alloc(per_request * len(requests))
        except PoolExhausted:
            for m in matches:
                self.cache.unlock(m.node)
            raise
        working = slots[::per_request]
        try:
            plans, extends = [], []
            for i, (r, m) in enumerate(zip(requests, matches)):
                if m.slot is not None:
                    self.pool.copy_slot(m.slot, working[i])
                extends.append(list(r.token_ids[m.length:]))
                plans.append(plan_tracking(m.length, len(extends[-1]), self.cache_chunk,
                                           slots[i * per_request + 1]))
            inputs = build_extend_batch([r.rid for r in requests], extends, [m.length for m in matches],
                                        working, plans, [m.kv for m in matches], self.model.device)
        except BaseException:  # e.g. out of device memory: give everything back before raising
            self.pool.free(slots)
            for m in matches:
                self.cache.unlock(m.node)
            raise
        batch = PreparedPrefill(
            **{f.name: getattr(inputs, f.name) for f in fields(ForwardBatch)}, engine=self,
            requests=requests, matches=matches,
            track_slot_lists=[slots[i * per_request + 1:(i + 1) * per_request] for i in range(len(requests))])
        self.pending.update(zip(batch.rids, batch.working_slots))
        return batch

    def _check_prepared(self, batch, action: str) -> PreparedPrefill:
        """``batch`` must be a prepared prefill of this engine that has not been finished or
        aborted; raises (naming the problem) before anything changes."""
        if not isinstance(batch, PreparedPrefill):
            raise TypeError(f"batch must be the PreparedPrefill that engine.prepare_prefill(...) returned; "
                            f"got {type(batch).__name__}")
        if batch.engine is not self:
            raise ValueError(f"batch was prepared by another Engine: its slots and prefix locks are that "
                             f"engine's, so {action} must be called on it (engine.{action}(batch) on the "
                             f"engine whose prepare_prefill made it)")
        if batch.status == FINISHED:
            raise ValueError(f"batch was finished: its requests are running and own its slots; "
                             f"{action} cannot use it again (use release(rids), then prepare a new batch)")
        if batch.status == ABORTED:
            raise ValueError(f"batch was already aborted: its slots were given back (other requests may "
                             f"own them now), so {action} cannot use it; prepare a new batch")
        return batch

    def forward_prefill(self, batch: PreparedPrefill) -> torch.Tensor:
        """The timed forward: ``init_forward_metadata`` + all layers (with tracking) → logits [N, vocab].

        Runs once per prepared batch: a second call would start from the states the first one
        wrote and raises instead (``reset_prefill(batch)`` re-arms it). A forward that raised
        half-way (e.g. stopped by ``cuda_sync_guard``) may be retried: the batch's slots are put
        back to their prepared states first.
        """
        self._check_prepared(batch, "forward_prefill")
        if batch.status == FORWARDED:
            raise ValueError("forward_prefill already ran on this batch: its working slots now hold the "
                             "states after its prompts, so a second forward would continue from them "
                             "(wrong logits and snapshots). Call engine.reset_prefill(batch) first to rerun "
                             "it from its prepared states, or prepare a new batch")
        if batch._started:
            self._restore_prepared_states(batch)
        batch._started = True
        self.backend.init_forward_metadata(batch)
        out = self._run_model(batch)
        batch.logits, batch.kv, batch.status = out.logits, out.kv, FORWARDED
        return out.logits

    def _restore_prepared_states(self, batch: PreparedPrefill) -> None:
        """Put the batch's slots back to what prepare_prefill left: zeros, and the (locked,
        unchanging) snapshot in the working slot of each prefix hit."""
        idx = torch.tensor(batch.owned_slots, device=self.pool.conv.device)
        self.pool.conv[:, idx] = 0
        self.pool.ssm[:, idx] = 0
        for m, slot in zip(batch.matches, batch.working_slots):
            if m.slot is not None:
                self.pool.copy_slot(m.slot, slot)

    def reset_prefill(self, batch: PreparedPrefill) -> None:
        """Re-arm a prepared batch for one more forward (benchmarks that rerun one batch): its
        working and track slots get back the states ``prepare_prefill`` gave them."""
        self._check_prepared(batch, "reset_prefill")
        self._restore_prepared_states(batch)
        batch.status, batch.logits, batch.kv, batch._started = PREPARED, None, None, False

    def _run_model(self, batch: ForwardBatch) -> ModelOutput:
        return self.model(batch, self.backend)

    def _donate(self, req: RunningRequest, slot_index: int, length: int) -> None:
        """Offer the snapshot in ``req.track_slots[slot_index]`` (state after ``length`` tokens)
        to the cache; if taken, give the request a fresh track slot. The fresh slot is allocated
        first: with none to be had the snapshot is simply not cached, and the request never
        writes a slot the cache owns."""
        try:
            fresh = self._alloc(1)[0]
        except PoolExhausted:
            return
        kv = [(k[:length], v[:length]) for k, v in req.kv]
        if self.cache.insert(req.tokens[:length], req.track_slots[slot_index], kv):
            req.track_slots[slot_index] = fresh
        else:
            self.pool.free([fresh])

    def finish_prefill(self, batch: PreparedPrefill, logits: torch.Tensor | None = None) -> None:
        """After the forward: register the requests, insert tracked snapshots into the cache.

        ``logits``: what ``forward_prefill(batch)`` returned (or the batch's captured graph's
        ``logits``); None means the batch's own.
        """
        self._check_prepared(batch, "finish_prefill")
        runs = [run for run in (batch, batch.captured) if run is not None and run.logits is not None]
        if not runs:
            raise ValueError("batch has not been run: call forward_prefill(batch) before finish_prefill "
                             "(or abort_prefill(batch) to give it back)")
        run = runs[0] if logits is None else next((r for r in runs if r.logits is logits), None)
        if run is None:
            shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(f"logits must be the tensor forward_prefill(batch) returned for this batch "
                             f"([{batch.size}, {self.config.vocab}]); got another ({shape}): "
                             f"a batch is finished with its own logits")
        next_tokens = run.logits.argmax(-1)
        self._close_prepared(batch, FINISHED)
        for i, (r, plan) in enumerate(zip(batch.requests, batch.plans)):
            req = RunningRequest(r.rid, list(r.token_ids), batch.working_slots[i], batch.track_slot_lists[i],
                                 0, run.kv[i], next_tokens[i:i + 1])
            self.running[r.rid] = req
            if plan.tracked:
                req.next_track = (req.next_track + 1) % self.tracks_per_request
                self._donate(req, 0, plan.track_len)
            self.stats.requests += 1
            self.stats.prefix_hits += plan.prefix_len > 0
            self.stats.cached_tokens += plan.prefix_len
            self.stats.computed_tokens += plan.extend_len

    def abort_prefill(self, batch: PreparedPrefill) -> None:
        """Give back a prepared batch that will not be finished (never run, or its forward
        failed): free its working and track slots and unlock its prefix matches. Nothing is
        cached and no request starts running. Call it at most once, instead of ``finish_prefill``."""
        self._check_prepared(batch, "abort_prefill")
        self.pool.free(batch.owned_slots)
        self._close_prepared(batch, ABORTED)

    def _close_prepared(self, batch: PreparedPrefill, status: str) -> None:
        """End a prepared batch (finished or aborted): it is no longer pending and its prefix
        matches are unlocked."""
        batch.status = status
        for rid in batch.rids:
            del self.pending[rid]
        for m in batch.matches:
            self.cache.unlock(m.node)

    def prefill(self, requests: list[Request]) -> PrefillResult:
        """Prefill new requests; they keep running (for :meth:`decode`) until :meth:`release`."""
        batch = self.prepare_prefill(requests)
        try:
            logits = self.forward_prefill(batch)
        except BaseException:
            self.abort_prefill(batch)
            raise
        self.finish_prefill(batch, logits)
        return PrefillResult(logits, logits.argmax(-1).tolist(), list(batch.prefix_lens),
                             list(batch.track_lens))

    def capture_prefill(self, batch: PreparedPrefill) -> CapturedPrefill:
        """Capture the prefill forward of ``batch`` in a CUDA graph (``sync_free``/``fused`` only).

        The metadata of a fixed batch is constant, so it is built once, outside the graph; the
        graph holds every layer with its tracking. The batch's slots are restored after the
        warm-up and the capture, so they hold their pre-capture states.
        """
        self._check_prepared(batch, "capture_prefill")
        if self.strategy not in ("sync_free", "fused"):
            raise ValueError(f"strategy must be 'sync_free' or 'fused' to capture a prefill (a sync "
                             f"cannot be captured); engine strategy is {self.strategy!r}")
        if self.model.device.type != "cuda":
            raise RuntimeError(f"capture_prefill needs a CUDA device; the model is on {self.model.device}")
        owned = batch.owned_slots + [SCRATCH_SLOT]
        slots = torch.tensor(owned, device=self.model.device)
        saved = (self.pool.conv[:, slots].clone(), self.pool.ssm[:, slots].clone())
        captured = CapturedPrefill(None, None, slots, saved, self.pool)
        captured._metadata = self.backend.init_forward_metadata(batch)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: lazy inits and autotuning happen outside the capture
                self._run_model(batch)
        torch.cuda.current_stream().wait_stream(stream)
        captured.restore_states()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self._run_model(batch)
        captured.graph, captured.logits, captured.kv = graph, out.logits, out.kv
        captured.restore_states()
        batch.captured = captured  # its replays are this batch's forwards: finish_prefill accepts their logits
        return captured

    # ---- decode -------------------------------------------------------------------------
    def decode(self, steps: int) -> DecodeResult:
        """``steps`` greedy tokens for every running request.

        Each step feeds the previous step's argmax straight from the device; decode tracking
        (after ``seq_len % track_interval == 0`` tokens) is planned on the host and masked on the
        device via the scratch slot. The tokens are read back once, at the end.
        """
        _positive_int("steps", steps)
        reqs = list(self.running.values())
        if not reqs:
            raise ValueError("decode needs running requests: call prefill first")
        ids = torch.cat([r.next_token for r in reqs])
        generated, all_logits = [], []
        for step in range(steps):
            seq_lens = [len(r.tokens) + step for r in reqs]  # position of the token fed now
            dst = []
            for r, n in zip(reqs, seq_lens):
                if (n + 1) % self.track_interval == 0:
                    dst.append(r.track_slots[r.next_track])
                    r.next_track = (r.next_track + 1) % self.tracks_per_request
                    r.snapshot_len = n + 1
                else:
                    dst.append(SCRATCH_SLOT)
            batch = build_decode_batch([r.rid for r in reqs], ids, seq_lens, [r.working_slot for r in reqs],
                                       dst, [r.kv for r in reqs], self.model.device)
            self.backend.init_forward_metadata(batch)
            logits, kv = self._run_model(batch)
            self.backend.track_decode(batch)
            for r, r_kv in zip(reqs, kv):
                r.kv = r_kv
            ids = logits.argmax(-1)
            generated.append(ids)
            all_logits.append(logits)
        first = torch.cat([r.next_token for r in reqs])
        host = torch.stack([first, *generated], 1).tolist()  # the one host sync of decode
        tokens = [row[1:] for row in host]
        for i, r in enumerate(reqs):
            r.tokens += host[i][:-1]  # what was fed: the previous next token, then all but the last
            r.next_token = generated[-1][i:i + 1]
            if r.snapshot_len is not None:
                slot_index = (r.next_track - 1) % self.tracks_per_request
                self._donate(r, slot_index, r.snapshot_len)
                r.snapshot_len = None
        return DecodeResult([r.rid for r in reqs], {r.rid: tokens[i] for i, r in enumerate(reqs)},
                            torch.stack(all_logits))

    def release(self, rids) -> None:
        """Finish requests: free their working and track slots (cached snapshots stay).

        ``rids``: a list (or tuple, set) of distinct ids of running requests; checked whole
        before anything is freed."""
        if isinstance(rids, (str, bytes)) or not isinstance(rids, (list, tuple, set, frozenset)):
            raise ValueError(f"rids must be a list of request ids (e.g. [\"a\"]); got {rids!r}")
        rids = list(rids)
        for i, rid in enumerate(rids):
            try:
                hash(rid)
            except TypeError:
                raise ValueError(f"rids must hold hashable request ids; got {rid!r}") from None
            if rid in rids[:i]:
                raise ValueError(f"rids must be distinct; {rid!r} is repeated in {rids!r}")
            if rid in self.pending:
                raise ValueError(f"rids must be running requests; {rid!r} is prepared but not finished: "
                                 f"finish_prefill or abort_prefill its batch")
            if rid not in self.running:
                raise ValueError(f"rids must be running requests; {rid!r} is not")
        for rid in rids:
            r = self.running.pop(rid)
            self.pool.free([r.working_slot, *r.track_slots])
