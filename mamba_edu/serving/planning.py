"""Where to track, decided on the host before the forward (docs/conventions.md).

For a request that extends ``E`` tokens after a cached prefix of ``P`` tokens, with cache chunk
``Cc`` (a multiple of 64):

* tracked iff ``E ≥ Cc``; tracked position ``P + A`` with ``A = ⌊E/Cc⌋·Cc``;
* SSM source: the final state if ``A == E``, else checkpoint ``h[A/64]`` of the request;
* conv source: raw inputs at extend positions ``[A−(W−1), A)`` (inside the extend: A ≥ 64 > W−1);
* destination: the request's current track slot.
"""

from __future__ import annotations

from dataclasses import dataclass

from mamba_edu.gdn import CHUNK


@dataclass(frozen=True)
class TrackDecision:
    """One request's tracking decision (all host integers).

    ``aligned`` is A (0 when untracked); ``track_len`` is ``P + A`` or −1; ``checkpoint`` is the
    chunk index ``A/64`` whose start state is saved (``== ⌈E/64⌉`` means the final state).
    """

    prefix_len: int
    extend_len: int
    tracked: bool
    aligned: int
    track_slot: int

    @property
    def track_len(self) -> int:
        return self.prefix_len + self.aligned if self.tracked else -1

    @property
    def from_final(self) -> bool:
        """The SSM snapshot is the final state (``A == E``), not a checkpoint."""
        return self.tracked and self.aligned == self.extend_len

    @property
    def checkpoint(self) -> int:
        return self.aligned // CHUNK


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_cache_chunk(cache_chunk: int) -> int:
    if not _is_int(cache_chunk) or cache_chunk < CHUNK or cache_chunk % CHUNK:
        raise ValueError(f"cache_chunk must be a positive multiple of {CHUNK}; got {cache_chunk!r}")
    return cache_chunk


def plan_tracking(prefix_len: int, extend_len: int, cache_chunk: int, track_slot: int) -> TrackDecision:
    """The tracking decision for one request (see the module docstring)."""
    check_cache_chunk(cache_chunk)
    for name, value, minimum in (("prefix_len", prefix_len, 0), ("extend_len", extend_len, 1),
                                 ("track_slot", track_slot, 0)):
        if not _is_int(value) or value < minimum:
            raise ValueError(f"{name} must be an int >= {minimum} (not a bool); got {value!r}")
    tracked = extend_len >= cache_chunk
    aligned = (extend_len // cache_chunk) * cache_chunk if tracked else 0
    return TrackDecision(prefix_len, extend_len, tracked, aligned, track_slot)
