"""What a prefill will do, decided before the engine changes anything: prefix matches, slots,
evictions, tracking and the uploaded forward batch (:func:`plan_prefill`)."""

from __future__ import annotations

from dataclasses import dataclass

from mamba_edu.engine.requests import Request
from mamba_edu.serving import PoolExhausted, PrefixMatch, RadixCache, StatePool, plan_tracking
from mamba_edu.serving.batch import ForwardBatch, build_extend_batch


@dataclass
class PrefillPlan:
    """``requests`` (N), their unlocked prefix ``matches``, the ``slots`` the pool will hand out
    (per request a working slot then its track slots), how many cached snapshots to evict first
    (``evictions``) and the forward's ``inputs`` (uploaded)."""

    requests: list[Request]
    matches: list[PrefixMatch]
    slots: list[int]
    evictions: int
    inputs: ForwardBatch

    def track_slot_lists(self, tracks_per_request: int) -> list[list[int]]:
        per_request = 1 + tracks_per_request
        return [self.slots[i * per_request + 1:(i + 1) * per_request] for i in range(len(self.requests))]


def plan_prefill(requests: list[Request], cache: RadixCache, pool: StatePool, tracks_per_request: int,
                 cache_chunk: int, device) -> PrefillPlan:
    """The plan of a prefill of checked ``requests``, changing nothing; :class:`PoolExhausted`
    if the free slots and the evictable snapshots are too few. A hit at P tokens computes only
    the remaining ``E = len − P`` tokens (at least one, for the last logits)."""
    matches = [cache.match(r.token_ids, max_length=len(r.token_ids) - 1, touch=False) for r in requests]
    per_request = 1 + tracks_per_request
    need = per_request * len(requests)
    missing = max(need - pool.n_free, 0)
    freed = [v.slot for v in cache.eviction_plan(missing, protect=[m.node for m in matches]) if v.slot is not None]
    if len(freed) < missing:
        raise PoolExhausted(f"state pool exhausted: need {need} slots, {pool.n_free} free and "
                            f"{len(freed)} evictable cache snapshots")
    slots = pool.peek(need, freed)
    extends = [r.token_ids.part(m.length) for r, m in zip(requests, matches)]
    plans = [plan_tracking(m.length, len(e), cache_chunk, slots[i * per_request + 1])
             for i, (m, e) in enumerate(zip(matches, extends))]
    inputs = build_extend_batch([r.rid for r in requests], extends, [m.length for m in matches],
                                slots[::per_request], plans, [m.kv for m in matches], device)
    return PrefillPlan(requests, matches, slots, missing, inputs)
