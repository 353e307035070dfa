"""Where to track, decided on the host before the forward (docs/conventions.md).

For a request that extends ``E`` tokens after a cached prefix of ``P`` tokens, with cache chunk
``Cc`` (a multiple of 64):

* tracked iff ``E ≥ Cc``; tracked position ``P + A`` with ``A = ⌊E/Cc⌋·Cc``;
* SSM source: the final state if ``A == E``, else checkpoint ``h[A/64]`` of the request;
* conv source: raw inputs at extend positions ``[A−(W−1), A)`` (inside the extend: A ≥ 64 > W−1);
* destination: the request's current track slot.

Decode tracking is planned here too (:func:`plan_decode`): which step of which request writes
which track slot.
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


@dataclass(frozen=True)
class DecodePlan:
    """What ``steps`` decode steps of N running requests write, decided on the host.

    ``seq_lens[s][i]``: the position of the token request i is fed at step s;
    ``dst[s][i]``: where its state is copied after step s (a track slot at a tracking step,
    ``scratch`` otherwise); ``snapshots[i]``: ``(index into its track slots, tokens)`` of its last
    tracked state in these steps, or None; ``next_track[i]``: its next track slot index after them.
    """

    seq_lens: list[list[int]]
    dst: list[list[int]]
    snapshots: list[tuple[int, int] | None]
    next_track: list[int]


def plan_decode(lengths: list[int], track_slots: list[list[int]], next_track: list[int], steps: int,
                track_interval: int, scratch: int) -> DecodePlan:
    """Decode tracking for ``steps`` steps (docs/conventions.md): request i, having fed
    ``lengths[i]`` tokens, is tracked after step s when ``(lengths[i] + s + 1) % track_interval == 0``,
    into ``track_slots[i][next_track[i]]`` (then the next of its 1 or 2 track slots, ping-pong).
    Pure host arithmetic; nothing is changed."""
    for name, value in (("steps", steps), ("track_interval", track_interval)):
        if not _is_int(value) or value < 1:
            raise ValueError(f"{name} must be an int >= 1; got {value!r}")
    if not (len(lengths) == len(track_slots) == len(next_track)):
        raise ValueError("lengths, track_slots and next_track must have one entry per request")
    nxt, snapshots = list(next_track), [None] * len(lengths)
    seq_lens, dst = [], []
    for step in range(steps):
        row_lens, row_dst = [], []
        for i, n in enumerate(lengths):
            pos = n + step
            row_lens.append(pos)
            if (pos + 1) % track_interval == 0:
                row_dst.append(track_slots[i][nxt[i]])
                snapshots[i] = (nxt[i], pos + 1)
                nxt[i] = (nxt[i] + 1) % len(track_slots[i])
            else:
                row_dst.append(scratch)
        seq_lens.append(row_lens)
        dst.append(row_dst)
    return DecodePlan(seq_lens, dst, snapshots, nxt)
