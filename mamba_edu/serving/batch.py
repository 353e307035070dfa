"""The forward batch: what the scheduler hands to one forward, as CPU lists and device tensors.

Everything is decided on the host before the forward starts (the scheduler knows every length);
the device tensors are uploaded from those lists with one pinned, non-blocking copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from mamba_edu.serving.planning import TrackPlan


def upload_host_lists(parts: Sequence[Sequence[int]], device) -> list[torch.Tensor]:
    """Copy int lists to ``device`` as int64 in **one** pinned, non-blocking copy; returns views.

    Pinned (page-locked) memory is what makes ``non_blocking=True`` truly asynchronous; from
    ordinary pageable memory the host would wait for the copy.
    """
    flat = torch.tensor([int(x) for part in parts for x in part], dtype=torch.int64)
    device = torch.device(device)
    if device.type == "cuda":
        flat = flat.pin_memory()
    flat = flat.to(device, non_blocking=True)
    return list(flat.split([len(p) for p in parts]))


@dataclass(eq=False)
class ForwardBatch:
    """One forward over N sequences with T tokens in total (packed varlen).

    Host (CPU lists, length N): ``rids``, ``prefix_lens`` P, ``extend_lens`` E,
    ``working_slots``, ``track_slots``, ``track_mask``, ``track_lens`` (P + A or −1), ``plans``
    (:class:`TrackPlan` per request, extend only), ``token_ranges`` ((start, stop) in the packed batch).

    Device tensors:
        input_ids, positions: ``[T]`` int64 (positions count from 0 at the sequence start, so a
            request continuing a cached prefix starts at P).
        last_token_index: ``[N]`` rows of the last token of each sequence.
        cu_seqlens: ``[N+1]`` int64.  prefix_lens_t, working_slots_t, track_slots_t, track_lens_t:
            ``[N]`` int64.  track_mask_t: ``[N]`` bool.
        decode_track_slots_t: ``[N]`` (decode only) where each row's state is copied after the
            step: its track slot at a tracking step, the scratch slot otherwise.

    Attention: ``prefix_kv[i]`` = per attention layer ``(k, v)`` of the cached prefix (or of the
    tokens so far, in decode), or None; ``attn_masks[i]`` ``[E, P+E]`` bool for a
    sequence after a cached prefix, None otherwise (a fresh prompt is plain causal: SDPA's
    ``is_causal``, which takes the flash kernel on a GPU where a mask would force the slow path);
    ``kv_out[i][layer]`` is filled by the forward with the full KV of sequence i.
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
    attn_masks: list
    n_attn_layers: int
    plans: list[TrackPlan] = field(default_factory=list)
    decode_track_slots_t: torch.Tensor | None = None
    kv_out: list = field(default_factory=list)
    # Engine bookkeeping, untouched by the forward: the full prompts and their prefix matches.
    requests: list = field(default_factory=list)
    matches: list = field(default_factory=list)
    track_slot_lists: list = field(default_factory=list)  # each request's 1 or 2 track slots

    @property
    def size(self) -> int:
        return len(self.rids)

    def reset_kv_out(self) -> None:
        """Fresh per-forward output slots for the attention KV."""
        self.kv_out = [[None] * self.n_attn_layers for _ in self.rids]


def _token_ranges(lengths: list[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for n in lengths:
        out.append((start, start + n))
        start += n
    return out


def build_batch(mode: str, rids: list, token_ids: list[list[int]] | None, prefix_lens: list[int],
                working_slots: list[int], plans: list[TrackPlan] | None, prefix_kv: list,
                n_attn_layers: int, device, input_ids: torch.Tensor | None = None,
                decode_track_slots: list[int] | None = None) -> ForwardBatch:
    """Assemble a :class:`ForwardBatch` from host lists (one upload).

    Extend: ``token_ids[i]`` are the tokens sequence i computes (after its cached prefix) and
    ``plans`` its tracking decisions. Decode: ``input_ids [N]`` is already on the device (the
    previous step's greedy tokens, never read back) and ``decode_track_slots`` says where each
    row's state is copied after the step.
    """
    if mode not in ("extend", "decode"):
        raise ValueError(f"mode must be 'extend' or 'decode'; got {mode!r}")
    extend_lens = [len(t) for t in token_ids] if input_ids is None else [1] * len(rids)
    ranges = _token_ranges(extend_lens)
    plans = plans or []
    track_slots = [p.track_slot for p in plans] or list(working_slots)
    track_mask = [p.tracked for p in plans] or [False] * len(rids)
    track_lens = [p.track_len for p in plans] or [-1] * len(rids)
    positions = [prefix_lens[i] + j for i, n in enumerate(extend_lens) for j in range(n)]
    parts = [[t for seq in token_ids for t in seq] if input_ids is None else [], positions, [stop - 1 for _, stop in ranges],
             [0] + [stop for _, stop in ranges], prefix_lens, working_slots, track_slots, track_lens,
             [int(m) for m in track_mask], decode_track_slots or []]
    (ids, pos, last, cu, prefix_t, working_t, track_slots_t, track_lens_t, mask_t,
     decode_dst) = upload_host_lists(parts, device)
    attn_masks = [None] * len(rids)
    if mode == "extend" and n_attn_layers:
        attn_masks = [torch.ones(e, p + e, dtype=torch.bool, device=device).tril(p) if p else None
                      for p, e in zip(prefix_lens, extend_lens)]
    batch = ForwardBatch(
        mode=mode, rids=list(rids), prefix_lens=list(prefix_lens), extend_lens=extend_lens,
        working_slots=list(working_slots), track_slots=track_slots, track_mask=track_mask,
        track_lens=track_lens, token_ranges=ranges, input_ids=ids if input_ids is None else input_ids, positions=pos,
        last_token_index=last, cu_seqlens=cu, prefix_lens_t=prefix_t, working_slots_t=working_t,
        track_slots_t=track_slots_t, track_lens_t=track_lens_t, track_mask_t=mask_t.bool(),
        prefix_kv=list(prefix_kv), attn_masks=attn_masks, n_attn_layers=n_attn_layers, plans=plans,
        decode_track_slots_t=decode_dst if decode_track_slots is not None else None)
    batch.reset_kv_out()
    return batch
