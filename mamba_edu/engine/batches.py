"""A prepared prefill's one life: the batch the engine hands out, and the record of which batches
are still live.

:class:`PreparedPrefill` is what ``Engine.prepare_prefill`` returns: the forward's inputs (a
:class:`~mamba_edu.serving.ForwardBatch`) and the engine's bookkeeping (its underscored fields,
written only by the engine). :class:`LiveBatches` is each engine's record of its batches that are
neither finished nor aborted, and the one guard every engine call taking a batch goes through
(a batch's own ``status`` can be changed by anyone, so it is not what decides).
Neither can be copied: each stands for slots and prefix locks its engine holds, used once.
"""

from __future__ import annotations

from dataclasses import fields

import torch

from mamba_edu.serving.batch import ForwardBatch

PREPARED, FORWARDED, FINISHED, ABORTED = "prepared", "forwarded", "finished", "aborted"
_BATCH_FIELDS = frozenset(f.name for f in fields(ForwardBatch))
_MAKE = object()  # only LiveBatches.open makes a PreparedPrefill


class _NoCopy:
    """Lifecycle objects have one life: copying or pickling one is refused."""

    def __copy__(self):
        raise TypeError(f"a {type(self).__name__} cannot be copied: it stands for slots its engine "
                        f"holds, used once")

    def __deepcopy__(self, memo):
        self.__copy__()

    def __reduce_ex__(self, protocol):
        self.__copy__()


class PreparedPrefill(_NoCopy):
    """A prefill batch prepared by :meth:`Engine.prepare_prefill`: the forward's inputs
    (``forward_batch``, a :class:`~mamba_edu.serving.ForwardBatch`) and the engine's bookkeeping,
    which the forward never reads. The batch's fields read through (``batch.rids``,
    ``batch.extend_lens``, …) as copies: changing them changes nothing.

    Lifecycle (``status``): ``prepared`` → :meth:`Engine.forward_prefill` → ``forwarded`` →
    :meth:`Engine.finish_prefill` → ``finished``; or :meth:`Engine.abort_prefill` from
    ``prepared``/``forwarded`` → ``aborted``. It belongs to the engine that made it and each step
    happens at most once; anything else raises before changing state. It cannot be copied.

    ``requests``: the prompts; ``matches``: their locked prefix matches; ``track_slot_lists``:
    each request's 1 (or 2, ping-pong) track slots; ``logits`` and ``kv``: what the forward
    returned (None before it).
    """

    def __init__(self, key, live, forward_batch, requests, matches, track_slot_lists):
        if key is not _MAKE:
            raise TypeError("a PreparedPrefill is made by engine.prepare_prefill(requests)")
        self._live, self._engine, self.forward_batch = live, live.engine, forward_batch
        self._requests, self._matches = tuple(requests), tuple(matches)
        self._track_slot_lists = [list(t) for t in track_slot_lists]
        self._status = PREPARED
        self.logits, self.kv = None, None

    engine = property(lambda self: self._engine)
    status = property(lambda self: self._status, doc="prepared, forwarded, finished or aborted")
    requests = property(lambda self: list(self._requests))
    matches = property(lambda self: list(self._matches))
    track_slot_lists = property(lambda self: [list(t) for t in self._track_slot_lists])

    def __getattr__(self, name):
        if name in _BATCH_FIELDS or name == "size":
            value = getattr(self.__dict__["forward_batch"], name)
            if isinstance(value, list):
                return list(value)
            return value.clone() if isinstance(value, torch.Tensor) else value
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def owned_slots(self) -> list[int]:
        """Every slot this batch holds: working slots, then each request's track slots."""
        return self.forward_batch.working_slots + [s for lst in self._track_slot_lists for s in lst]

    def __repr__(self) -> str:
        fb = self.forward_batch
        return (f"PreparedPrefill(rids={fb.rids}, status={self.status!r}, prefix_lens={fb.prefix_lens}, "
                f"extend_lens={fb.extend_lens}, working_slots={fb.working_slots}, "
                f"track_slots={fb.track_slots}, track_mask={fb.track_mask}, track_lens={fb.track_lens})")


class LiveBatches:
    """One engine's prepared batches that are neither finished nor aborted.

    :meth:`open` makes a batch and records it, :meth:`close` ends it (finished or aborted) and
    :meth:`check` is the guard: a batch is usable only while it is in this record, so a copy, a
    forged or tampered batch, a finished or aborted one or another engine's is refused."""

    def __init__(self, engine):
        self.engine, self._batches = engine, []

    def __contains__(self, batch) -> bool:
        return any(b is batch for b in self._batches)

    def __iter__(self):
        return iter(list(self._batches))

    def open(self, forward_batch, requests, matches, track_slot_lists) -> PreparedPrefill:
        batch = PreparedPrefill(_MAKE, self, forward_batch, requests, matches, track_slot_lists)
        self._batches.append(batch)
        return batch

    def close(self, batch: PreparedPrefill, status: str) -> None:
        batch._status = status
        self._batches = [b for b in self._batches if b is not batch]

    def check(self, batch, action: str) -> PreparedPrefill:
        """``batch`` must be a live prepared prefill of this engine; raises (naming the problem)
        before anything changes."""
        if not isinstance(batch, PreparedPrefill):
            raise TypeError(f"batch must be the PreparedPrefill that engine.prepare_prefill(...) returned; "
                            f"got {type(batch).__name__}")
        if batch.__dict__.get("_engine") is not self.engine:
            raise ValueError(f"batch was prepared by another Engine: its slots and prefix locks are that "
                             f"engine's, so {action} must be called on it (engine.{action}(batch) on the "
                             f"engine whose prepare_prefill made it)")
        if batch not in self:
            if batch.status == FINISHED:
                raise ValueError(f"batch was finished: its requests are running and own its slots; "
                                 f"{action} cannot use it again (use release(rids), then prepare a new batch)")
            if batch.status != ABORTED:
                raise ValueError(f"batch is not a live batch of this engine (it was finished or aborted, "
                                 f"whatever its status says now), so {action} cannot use it; prepare a new batch")
            raise ValueError(f"batch was already aborted: its slots were given back (other requests may "
                             f"own them now), so {action} cannot use it; prepare a new batch")
        return batch

    def check_unforwarded(self, batch, action: str) -> PreparedPrefill:
        """:meth:`check`, and ``batch`` not forwarded yet: a second forward would continue from the
        states the first one wrote (wrong logits and snapshots)."""
        self.check(batch, action)
        if batch.status == FORWARDED:
            raise ValueError(f"{action}: forward_prefill already ran on this batch: its working slots now "
                             f"hold the states after its prompts, so a second forward would continue from "
                             f"them (wrong logits and snapshots). Prepare a new batch")
        return batch

    def check_forwarded(self, batch, logits, vocab: int) -> PreparedPrefill:
        """:meth:`check`, and ``batch`` forwarded, ``logits`` None or its own."""
        self.check(batch, "finish_prefill")
        if batch.logits is None:
            raise ValueError("batch has not been run: call forward_prefill(batch) (or a captured bucket's "
                             "replay(batch)) before finish_prefill (or abort_prefill(batch) to give it back)")
        if logits is not None and logits is not batch.logits:
            shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(f"logits must be the tensor forward_prefill(batch) returned for this batch "
                             f"([{batch.forward_batch.size}, {vocab}]); got another ({shape}): "
                             f"a batch is finished with its own logits")
        return batch
