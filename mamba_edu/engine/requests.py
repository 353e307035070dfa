"""What a caller hands the engine and what it gets back: requests, their checks, the results.

A :class:`Request` checks itself when it is made (its id and its prompt) and against a model's
vocabulary with :meth:`Request.check`; :func:`check_requests` checks a list of them as it enters
the engine, :func:`check_release` the ids given to ``Engine.release`` and :func:`check_steps` a
decode's steps; :func:`check_rid` is the one check of a request id. :class:`RunningRequest` is
the engine's bookkeeping of one request between forwards; :class:`PrefillResult`,
:class:`DecodeResult` and :class:`EngineStats` are what ``Engine.prefill``, ``Engine.decode`` and
``Engine.stats`` return.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass

import torch

from mamba_edu.serving.tokens import Tokens

#: Most steps one ``decode`` call takes: its logits and KV grow with every step until it returns.
MAX_DECODE_STEPS = 1 << 16


def _equal_to_itself(value) -> bool:
    """``value == value`` is ``True``, for the value and (in tuples and frozensets) every part:
    a NaN inside a tuple compares equal only by identity, so a rebuilt id would not find it."""
    if isinstance(value, (tuple, frozenset)):
        return all(_equal_to_itself(v) for v in value)
    if isinstance(value, float) and value != value:
        return False
    return (value == value) is True


def check_rid(rid, name: str = "rid"):
    """A request id: hashable and equal to itself (``rid == rid`` is ``True``, parts included:
    not NaN, not a tensor or an array)."""
    try:
        hash(rid)
        equal = _equal_to_itself(rid)
    except Exception:  # noqa: BLE001 - unhashable, or an == that raises: both refused alike
        equal = None
    if equal is not True:
        raise ValueError(f"{name} must be hashable and equal to itself (a str, an int, a tuple; not "
                         f"NaN, a tensor or an array); got {rid!r}")
    return rid


@dataclass(frozen=True)
class Request:
    """A prompt to prefill: a unique id and its token ids.

    The prompt is copied and checked once, here, into :class:`~mamba_edu.serving.tokens.Tokens`
    (a tuple of Python ints): changing the list it came from afterwards changes nothing, and the
    cache and the batch builder take it without a second pass. ``rid`` must be hashable and equal
    to itself."""

    rid: Hashable
    token_ids: Tokens

    def __post_init__(self):
        check_rid(self.rid)
        ids = self.token_ids
        if (isinstance(ids, (str, bytes, Mapping)) or not isinstance(ids, Iterable)
                or getattr(ids, "ndim", 1) != 1):  # a tensor or an array: one row of tokens
            raise ValueError(f"token_ids of request {self.rid!r} must be a non-empty list of ints; "
                             f"got {type(ids).__name__}{list(ids.shape) if hasattr(ids, 'shape') else ''}")
        ids = Tokens(ids.tolist() if isinstance(ids, torch.Tensor) and ids.dim() == 1 else ids,
                     f"token_ids of request {self.rid!r}")
        if not ids:
            raise ValueError(f"token_ids of request {self.rid!r} must be a non-empty list of ints >= 0; got ()")
        object.__setattr__(self, "token_ids", ids)

    def check(self, vocab: int) -> Request:
        """This request, if every token is below ``vocab``."""
        if max(self.token_ids) >= vocab:  # one pass in C; the generator below only names the culprit
            bad = next(t for t in self.token_ids if t >= vocab)
            raise ValueError(f"token_ids of request {self.rid!r} must be ints in [0, vocab={vocab}); "
                             f"got {bad!r}")
        return self


def check_requests(requests, vocab: int, active: Collection, max_requests: int) -> list[Request]:
    """``requests`` as a list, if it is a non-empty list (or tuple) of :class:`Request` with
    tokens below ``vocab``, distinct ids not in ``active`` (the engine's running and prepared
    ids), and at most ``max_requests`` with the active ones."""
    if not isinstance(requests, (list, tuple)):
        raise ValueError(f"requests must be a list of Request; got {type(requests).__name__}")
    requests = list(requests)
    if not requests:
        raise ValueError("requests must be a non-empty list of Request")
    seen = set()
    for r in requests:
        if not isinstance(r, Request):
            raise ValueError(f"requests must hold Request objects; got {type(r).__name__}")
        r.check(vocab)
        if r.rid in seen or r.rid in active:
            raise ValueError(f"request ids must be unique, not running and not pending; "
                             f"got duplicate rid {r.rid!r}")
        seen.add(r.rid)
    if len(active) + len(requests) > max_requests:
        raise ValueError(f"requests: {len(requests)} new + {len(active)} running or prepared exceeds "
                         f"max_requests={max_requests}")
    return requests


def check_release(rids, running: Collection, pending: Collection) -> list:
    """``rids`` as a list, if it is a list (or tuple, set) of distinct ids of ``running``
    requests (read once, checked whole; an id in ``pending`` is named as prepared)."""
    if isinstance(rids, (str, bytes)) or not isinstance(rids, (list, tuple, set, frozenset)):
        raise ValueError(f"rids must be a list of request ids (e.g. [\"a\"]); got {rids!r}")
    rids = list(rids)
    seen = set()
    for rid in rids:
        check_rid(rid, "each of rids")
        if rid in seen:
            raise ValueError(f"rids must be distinct; {rid!r} is repeated in {rids!r}")
        seen.add(rid)
        if rid in pending:
            raise ValueError(f"rids must be running requests; {rid!r} is prepared but not finished: "
                             f"finish_prefill or abort_prefill its batch")
        if rid not in running:
            raise ValueError(f"rids must be running requests; {rid!r} is not")
    return rids


def check_steps(steps) -> int:
    """A decode's ``steps``: an int in ``[1, MAX_DECODE_STEPS]``."""
    if type(steps) is not int or steps < 1:
        raise ValueError(f"steps must be a positive int; got {steps!r}")
    if steps > MAX_DECODE_STEPS:
        raise ValueError(f"steps must be at most {MAX_DECODE_STEPS} per call (every step's logits and "
                         f"KV are kept until the call returns); got {steps}: call decode again")
    return steps


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
