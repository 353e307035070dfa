"""The forward batch: what the scheduler hands to one forward, as CPU lists and device tensors.

Everything is decided on the host before the forward starts (the scheduler knows every length);
the device tensors are uploaded from those lists with one pinned, non-blocking copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mamba_edu.kernels.metadata import upload_host_lists
from mamba_edu.serving.planning import TrackDecision
from mamba_edu.serving.tokens import Tokens


@dataclass(eq=False)
class ForwardBatch:
    """One forward over N sequences with T tokens in total (packed varlen).

    Host (CPU lists, length N): ``rids``, ``prefix_lens`` P, ``extend_lens`` E,
    ``working_slots``, ``track_slots``, ``track_mask``, ``track_lens`` (P + A or −1), ``plans``
    (:class:`TrackDecision` per request, extend only), ``token_ranges`` ((start, stop) in the packed batch).

    Device tensors:
        input_ids, positions: ``[T]`` int64 (positions count from 0 at the sequence start, so a
            request continuing a cached prefix starts at P).
        last_token_index: ``[N]`` rows of the last token of each sequence.
        cu_seqlens: ``[N+1]`` int64.  prefix_lens_t, working_slots_t, track_slots_t, track_lens_t:
            ``[N]`` int64.  track_mask_t: ``[N]`` bool.
        decode_track_slots_t: ``[N]`` (decode only) where each row's state is copied after the
            step: its track slot at a tracking step, the scratch slot otherwise.

    ``bucket``: set on a captured bucket's batch (:class:`mamba_edu.engine.bucket.StaticBucket`):
    its tensors are the bucket's static buffers, refilled for every batch it replays, and its
    rows are padded (a dummy request, then zero-length rows).

    Attention: ``prefix_kv[i]`` = per attention layer ``(k, v)`` of the cached prefix (or of the
    tokens so far, in decode), or None. The causal mask needs no tensor: after a prefix of P
    tokens, new token t sees the prefix and the new tokens up to t
    (:func:`mamba_edu.kernels.attention.causal_attention`, bottom-right aligned).

    It holds the forward's inputs only: the model returns its outputs (logits and each
    sequence's KV, :class:`mamba_edu.model.ModelOutput`). The engine's bookkeeping of a prepared
    prefill (its requests, prefix matches, track slots, lifecycle) lives in
    :class:`mamba_edu.engine.batches.PreparedPrefill`, which holds one.
    """

    mode: str
    rids: list
    prefix_lens: list[int]
    extend_lens: list[int]
    working_slots: list[int]
    track_slots: list[int]
    track_mask: list[bool]
    track_lens: list[int]
    token_ranges: list[tuple[int, int]]
    input_ids: torch.Tensor
    positions: torch.Tensor
    last_token_index: torch.Tensor
    cu_seqlens: torch.Tensor
    prefix_lens_t: torch.Tensor
    working_slots_t: torch.Tensor
    track_slots_t: torch.Tensor
    track_lens_t: torch.Tensor
    track_mask_t: torch.Tensor
    prefix_kv: list
    plans: list[TrackDecision] = field(default_factory=list)
    decode_track_slots_t: torch.Tensor | None = None
    host_input_ids: list[int] | None = None  # input_ids as the host built them (extend only)
    bucket: object = None  # the StaticBucket whose static buffers these tensors are, or None

    @property
    def size(self) -> int:
        return len(self.rids)


def _token_ranges(lengths: list[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for n in lengths:
        out.append((start, start + n))
        start += n
    return out


def _check_ints(name: str, values, n: int | None, minimum: int) -> list[int]:
    """``values`` must be a list of ``n`` ints (not bools) ``>= minimum``; raises ValueError naming it."""
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{name} must be a list of ints; got {type(values).__name__}")
    if n is not None and len(values) != n:
        raise ValueError(f"{name} must have one entry per request (N={n}); got {len(values)}")
    for v in values:
        if type(v) is not int or v < minimum:
            raise ValueError(f"{name} must hold ints >= {minimum} (not bools); got {v!r} in {list(values)}")
    return list(values)


def build_extend_batch(rids: list, token_ids: list[list[int]], prefix_lens: list[int],
                       working_slots: list[int], plans: list[TrackDecision], prefix_kv: list,
                       device) -> ForwardBatch:
    """A prefill (extend) :class:`ForwardBatch` from host lists, uploaded with one pinned copy.

    ``token_ids[i]``: the tokens sequence i computes after its cached prefix of
    ``prefix_lens[i]`` tokens; ``plans[i]``: its tracking decision (:func:`plan_tracking`);
    ``prefix_kv[i]``: per attention layer ``(k, v)`` of the prefix, or None.
    """
    n = len(rids)
    if not n:
        raise ValueError("rids must name at least one request")
    if not isinstance(token_ids, (list, tuple)) or len(token_ids) != n:
        raise ValueError(f"token_ids must be a list of N={n} token lists")
    for i, seq in enumerate(token_ids):
        if not Tokens.of(seq, f"token_ids[{i}]"):  # an engine's Tokens pass as they are
            raise ValueError(f"token_ids[{i}] must be a non-empty list of ints >= 0")
    _check_ints("prefix_lens", prefix_lens, n, 0)
    _check_ints("working_slots", working_slots, n, 0)
    if not isinstance(plans, (list, tuple)) or len(plans) != n or not all(isinstance(p, TrackDecision) for p in plans):
        raise ValueError(f"plans must be a list of N={n} TrackDecision (from plan_tracking)")
    for i, (p, seq, pre) in enumerate(zip(plans, token_ids, prefix_lens)):
        if (p.prefix_len, p.extend_len) != (pre, len(seq)):
            raise ValueError(f"plans[{i}] was planned for P={p.prefix_len}, E={p.extend_len}; the batch has "
                             f"P={pre}, E={len(seq)}")
    return _assemble("extend", rids, [len(t) for t in token_ids], [t for seq in token_ids for t in seq],
                     prefix_lens, working_slots, plans, prefix_kv, device, None, None)


def build_decode_batch(rids: list, input_ids: torch.Tensor, seq_lens: list[int], working_slots: list[int],
                       decode_track_slots: list[int], prefix_kv: list, device) -> ForwardBatch:
    """A one-token-per-sequence decode :class:`ForwardBatch`.

    ``input_ids [N]`` is already on the device (the previous step's greedy tokens, never read
    back); ``seq_lens[i]`` is the position of the token fed now (the tokens before it);
    ``decode_track_slots[i]`` where row i's state is copied after the step (its track slot, or
    the scratch slot).
    """
    n = len(rids)
    if not isinstance(input_ids, torch.Tensor) or tuple(input_ids.shape) != (n,):
        got = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be a [N]={n} device tensor; got {got}")
    _check_ints("seq_lens", seq_lens, n, 0)
    _check_ints("working_slots", working_slots, n, 0)
    _check_ints("decode_track_slots", decode_track_slots, n, 0)
    return _assemble("decode", rids, [1] * n, [], seq_lens, working_slots, None, prefix_kv,
                     device, input_ids, decode_track_slots)


def build_batch(mode: str, rids: list, token_ids: list[list[int]] | None, prefix_lens: list[int],
                working_slots: list[int], plans: list[TrackDecision] | None, prefix_kv: list,
                device, input_ids: torch.Tensor | None = None,
                decode_track_slots: list[int] | None = None) -> ForwardBatch:
    """Assemble a :class:`ForwardBatch` from host lists (one upload): :func:`build_extend_batch`
    (``mode="extend"``) or :func:`build_decode_batch` (``mode="decode"``, ``prefix_lens`` = the
    sequence lengths so far, ``input_ids [N]`` on the device)."""
    if mode == "extend":
        return build_extend_batch(rids, token_ids, prefix_lens, working_slots, plans, prefix_kv, device)
    if mode == "decode":
        return build_decode_batch(rids, input_ids, prefix_lens, working_slots,
                                  [0] * len(rids) if decode_track_slots is None else decode_track_slots,
                                  prefix_kv, device)
    raise ValueError(f"mode must be 'extend' or 'decode'; got {mode!r}")


def _assemble(mode, rids, extend_lens, flat_ids, prefix_lens, working_slots, plans, prefix_kv,
              device, input_ids, decode_track_slots) -> ForwardBatch:
    if not isinstance(prefix_kv, (list, tuple)) or len(prefix_kv) != len(rids):
        raise ValueError(f"prefix_kv must be a list of N={len(rids)} entries (None or per-layer (k, v))")
    ranges = _token_ranges(extend_lens)
    plans = plans or []
    track_slots = [p.track_slot for p in plans] or list(working_slots)
    track_mask = [p.tracked for p in plans] or [False] * len(rids)
    track_lens = [p.track_len for p in plans] or [-1] * len(rids)
    positions = [prefix_lens[i] + j for i, n in enumerate(extend_lens) for j in range(n)]
    parts = [flat_ids, positions, [stop - 1 for _, stop in ranges],
             [0] + [stop for _, stop in ranges], prefix_lens, working_slots, track_slots, track_lens,
             [int(m) for m in track_mask], decode_track_slots or []]
    (ids, pos, last, cu, prefix_t, working_t, track_slots_t, track_lens_t, mask_t,
     decode_dst) = upload_host_lists(parts, device)
    return ForwardBatch(
        mode=mode, rids=list(rids), prefix_lens=list(prefix_lens), extend_lens=extend_lens,
        working_slots=list(working_slots), track_slots=track_slots, track_mask=track_mask,
        track_lens=track_lens, token_ranges=ranges, input_ids=ids if input_ids is None else input_ids, positions=pos,
        last_token_index=last, cu_seqlens=cu, prefix_lens_t=prefix_t, working_slots_t=working_t,
        track_slots_t=track_slots_t, track_lens_t=track_lens_t, track_mask_t=mask_t.bool(),
        prefix_kv=list(prefix_kv), plans=plans,
        decode_track_slots_t=decode_dst if decode_track_slots is not None else None,
        host_input_ids=list(flat_ids) if mode == "extend" else None)
