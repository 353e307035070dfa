"""A token bucket: fixed-size static buffers that any batch of at most ``max_tokens`` tokens and
``max_requests`` requests is copied into, so that one captured CUDA graph replays them all.

A server never sees the same batch twice. It captures one graph per padded **bucket** of tokens
and, before each replay, refills the graph's input buffers from the host with the live batch
(SGLang's ``PrefillCudaGraphRunner``). Everything that differs from batch to batch must therefore
live in a buffer of fixed size whose address never changes, and every launch grid must be fixed:

* **Rows**: ``max_requests + 1`` of them. The live requests come first, then one **dummy request**
  that takes the padding tokens (``max_tokens − T`` of them, maybe none), then rows of zero
  tokens (SGLang pads with zero-length sentinels the same way). Padding rows have working slot
  −1: the kernels start them from zeros and write no state, so they touch no slot anyone owns.
* **Chunk table**: ``⌊max_tokens/64⌋ + rows`` rows (``Σ⌈Lᵢ/64⌉ ≤ ⌊T/64⌋ + N``); the unused ones
  point past the batch (:data:`~mamba_edu.kernels.metadata.EMPTY_CHUNK`), so their programs
  load and store nothing.
* **Tracking**: one entry per row; an untracked row writes the scratch slot (``sync_free``) or
  has chunk −1 (``fused``: skip).

:meth:`StaticBucket.fill` builds every list on the host from the scheduler's batch and sends them
with two pinned, non-blocking copies (int64 and int32): no device-to-host sync. With ``fixed``
metadata (GDN layers inside the graph), :meth:`StaticBucket.forward_metadata` hands the kernels
these static buffers; otherwise each forward builds its own, as an eager forward does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mamba_edu.gdn.varlen import CHUNK, checkpoint_offsets, chunk_counts, cu_offsets
from mamba_edu.kernels.metadata import ChunkMeta, chunk_table, remember_host_values
from mamba_edu.serving.batch import ForwardBatch
from mamba_edu.serving.planning import TrackDecision
from mamba_edu.serving.pool import SCRATCH_SLOT
from mamba_edu.serving.tracking import (ForwardMetadata, SlotArgs, TrackIndices, host_track_indices,
                                        working_sources)

PAD_TOKEN = 0


@dataclass(frozen=True)
class Bucket:
    """The size one capture serves: at most ``max_tokens`` new tokens and ``max_requests``
    requests; with the attention inside the graph (mode ``graph``), at most
    ``max_prefix_tokens`` cached prefix tokens in all (their KV is copied in before a replay)."""

    max_tokens: int
    max_requests: int
    max_prefix_tokens: int = 0

    def __post_init__(self):
        for name, minimum in (("max_tokens", 1), ("max_requests", 1), ("max_prefix_tokens", 0)):
            value = getattr(self, name)
            if type(value) is not int or value < minimum:
                raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")

    @property
    def rows(self) -> int:
        """The live requests' rows and the dummy request's."""
        return self.max_requests + 1

    @property
    def chunk_capacity(self) -> int:
        """An upper bound of ``Σ⌈Lᵢ/64⌉`` for any batch of the bucket."""
        return self.max_tokens // CHUNK + self.rows

    def pad(self, extend_lens: list[int], working_slots: list[int]) -> tuple[list[int], list[int]]:
        """The rows a batch is padded to: ``(lengths, working slots)``, ``rows`` of each: the live
        rows, the dummy row with the padding tokens, then rows of 0 tokens; padding slots −1."""
        n = len(extend_lens)
        lengths = list(extend_lens) + [self.max_tokens - sum(extend_lens)] + [0] * (self.rows - n - 1)
        return lengths, list(working_slots) + [-1] * (self.rows - n)

    def refusal(self, batch: ForwardBatch, prefix_in_graph: bool) -> str | None:
        """Why ``batch`` does not fit, or None."""
        tokens = sum(batch.extend_lens)
        if batch.size > self.max_requests:
            return f"{batch.size} requests, more than the bucket's max_requests={self.max_requests}"
        if tokens > self.max_tokens:
            return f"{tokens} tokens, more than the bucket's max_tokens={self.max_tokens}"
        if prefix_in_graph and sum(batch.prefix_lens) > self.max_prefix_tokens:
            return (f"{sum(batch.prefix_lens)} cached prefix tokens, more than the bucket's "
                    f"max_prefix_tokens={self.max_prefix_tokens}")
        return None


def _views(buffer: torch.Tensor, sizes: dict[str, int]) -> dict[str, torch.Tensor]:
    return dict(zip(sizes, buffer.split(list(sizes.values()))))


def _upload_into(buffer: torch.Tensor, lists: list[list[int]]) -> None:
    """One pinned non-blocking host-to-device copy of the concatenated ``lists`` into ``buffer``
    (a fresh pinned tensor each time: PyTorch's pinned allocator keeps it until the copy ran)."""
    host = torch.tensor([x for part in lists for x in part], dtype=buffer.dtype)
    if buffer.device.type == "cuda":
        host = host.pin_memory()
    buffer.copy_(host, non_blocking=True)


class StaticBucket:
    """The static buffers of one bucket and the :class:`ForwardBatch` made of them (its host
    fields describe the batch last filled in).

    Args:
        bucket: the :class:`Bucket`. model: the model (its config, device and dtype).
        conv_width: the GDN conv width ``W``. fixed: the GDN layers read :meth:`forward_metadata`
            (static, fixed capacity) instead of building their own per forward.
        prefix_in_graph: the attention cores run inside the graph (:meth:`attend` then uses the
            static prefix KV buffers).
    """

    def __init__(self, bucket: Bucket, model, conv_width: int, fixed: bool, prefix_in_graph: bool):
        cfg, device = model.config, model.device
        self.bucket, self.fixed, self.prefix_in_graph = bucket, fixed, prefix_in_graph
        self.conv_width = conv_width
        R, Tb, P = bucket.rows, bucket.max_tokens, bucket.max_prefix_tokens if prefix_in_graph else 0
        self._long = {"input_ids": Tb, "positions": Tb, "last_token_index": R, "cu_seqlens": R + 1,
                      "prefix_lens": R, "working_slots": R, "track_slots": R, "track_lens": R,
                      "track_mask": R, "token_rows": Tb, "prefix_rows": P, "prefix_positions": P,
                      "dst": R, "conv_positions": R * (conv_width - 1), "track_working": R,
                      "checkpoint": R, "from_final": R}
        self._int = {"cu": R + 1, "chunks": 2 * bucket.chunk_capacity, "offsets": R + 1,
                     "state_indices": R, "kernel_track_slots": R, "track_chunks": R}
        self._long_buffer = torch.zeros(sum(self._long.values()), dtype=torch.int64, device=device)
        self._int_buffer = torch.zeros(sum(self._int.values()), dtype=torch.int32, device=device)
        self.long, self.int = _views(self._long_buffer, self._long), _views(self._int_buffer, self._int)
        self.track_mask = torch.zeros(R, dtype=torch.bool, device=device)
        self.from_final = torch.zeros(R, dtype=torch.bool, device=device)
        kv_shape = (P, cfg.attn_kv_heads, cfg.attn_head_dim)
        self.prefix_kv = [(torch.zeros(kv_shape, device=device, dtype=model.dtype),
                           torch.zeros(kv_shape, device=device, dtype=model.dtype))
                          for _ in cfg.attn_layers]
        self.live: ForwardBatch | None = None  # the batch last filled in
        lv = self.long
        self.batch = ForwardBatch(
            mode="extend", rids=[], prefix_lens=[], extend_lens=[], working_slots=[], track_slots=[],
            track_mask=[], track_lens=[], token_ranges=[], input_ids=lv["input_ids"],
            positions=lv["positions"], last_token_index=lv["last_token_index"], cu_seqlens=lv["cu_seqlens"],
            prefix_lens_t=lv["prefix_lens"], working_slots_t=lv["working_slots"], track_slots_t=lv["track_slots"],
            track_lens_t=lv["track_lens"], track_mask_t=self.track_mask, prefix_kv=[], bucket=self)

    # ---- the host refill --------------------------------------------------------------------
    def fill(self, live: ForwardBatch) -> None:
        """Copy the live batch (its host lists, and the prefix KV when attention runs inside the
        graph) into the static buffers: two pinned non-blocking copies, no sync. Refuses (before
        anything is written) a batch that does not fit."""
        reason = self.bucket.refusal(live, self.prefix_in_graph)
        if reason:
            raise ValueError(f"the batch does not fit the captured bucket: {reason}")
        R, Tb, N = self.bucket.rows, self.bucket.max_tokens, live.size
        pad = Tb - sum(live.extend_lens)
        b = self.batch
        b.rids = list(live.rids) + [f"<pad {i}>" for i in range(R - N)]
        b.extend_lens, b.working_slots = self.bucket.pad(live.extend_lens, live.working_slots)
        b.prefix_lens = list(live.prefix_lens) + [0] * (R - N)
        b.plans = list(live.plans) + [TrackDecision(0, n, False, 0, SCRATCH_SLOT) for n in b.extend_lens[N:]]
        b.track_slots = [p.track_slot for p in b.plans]
        b.track_mask = [p.tracked for p in b.plans]
        b.track_lens = [p.track_len for p in b.plans]
        cu = cu_offsets(b.extend_lens)
        b.token_ranges = list(zip(cu[:-1], cu[1:]))
        b.prefix_kv = list(live.prefix_kv) + [None] * (R - N)
        self.live = live

        ids = list(live.host_input_ids) + [PAD_TOKEN] * pad
        positions = [b.prefix_lens[i] + j for i, n in enumerate(b.extend_lens) for j in range(n)]
        token_rows = [i for i, n in enumerate(b.extend_lens) for _ in range(n)]
        prefix_rows, prefix_positions = self._prefix_layout(live)
        plan = host_track_indices(b, self.conv_width)
        long = {"input_ids": ids, "positions": positions,
                "last_token_index": [max(stop - 1, 0) for _, stop in b.token_ranges],
                "cu_seqlens": cu, "prefix_lens": b.prefix_lens, "working_slots": b.working_slots,
                "track_slots": b.track_slots, "track_lens": b.track_lens,
                "track_mask": [int(m) for m in b.track_mask], "token_rows": token_rows,
                "prefix_rows": prefix_rows, "prefix_positions": prefix_positions, "dst": plan.dst,
                "conv_positions": [p for row in plan.conv_positions for p in row],
                "track_working": working_sources(b), "checkpoint": plan.checkpoint,
                "from_final": plan.from_final}
        ints = {"cu": cu, "chunks": chunk_table(b.extend_lens, self.bucket.chunk_capacity),
                "offsets": checkpoint_offsets(b.extend_lens), "state_indices": b.working_slots,
                "kernel_track_slots": plan.dst, "track_chunks": plan.chunks}
        _upload_into(self._long_buffer, [long[name] for name in self._long])
        _upload_into(self._int_buffer, [ints[name] for name in self._int])
        torch.ne(self.long["track_mask"], 0, out=self.track_mask)
        torch.ne(self.long["from_final"], 0, out=self.from_final)
        for name, values in ints.items():
            remember_host_values(self.int[name], values)
        if self.prefix_in_graph:
            self._copy_prefix_kv(live)

    def _prefix_layout(self, live: ForwardBatch) -> tuple[list[int], list[int]]:
        """Row and position of every entry of the static prefix KV buffers (−1: unused)."""
        rows, positions = [], []
        if self.prefix_in_graph:
            for i, p in enumerate(live.prefix_lens):
                rows += [i] * p
                positions += list(range(p))
        unused = len(self.long["prefix_rows"]) - len(rows)
        return rows + [-1] * unused, positions + [0] * unused

    def _copy_prefix_kv(self, live: ForwardBatch) -> None:
        """Each prefix hit's cached KV into the static buffers (device-to-device copies)."""
        start = 0
        for i, p in enumerate(live.prefix_lens):
            if p:
                for (k_buf, v_buf), (k, v) in zip(self.prefix_kv, live.prefix_kv[i]):
                    k_buf[start:start + p].copy_(k[:p])
                    v_buf[start:start + p].copy_(v[:p])
            start += p

    # ---- what the forward reads -------------------------------------------------------------
    def forward_metadata(self, strategy) -> ForwardMetadata:
        """The GDN layers' metadata over the static buffers (fixed grids: ``rows`` sequences,
        ``chunk_capacity`` chunks): what a graph with the GDN layers inside replays."""
        if not strategy.capturable:
            raise ValueError(f"only sync_free and fused can run the GDN layers inside a graph (the "
                             f"others sync); got {strategy.name!r}")
        b, ints = self.batch, self.int
        meta = ChunkMeta(lengths=tuple(b.extend_lens), counts=tuple(chunk_counts(b.extend_lens)),
                         offsets=tuple(checkpoint_offsets(b.extend_lens)), N=self.bucket.rows,
                         T=self.bucket.max_tokens, NT=self.bucket.chunk_capacity,
                         cu_seqlens=ints["cu"], chunk_indices=ints["chunks"].view(-1, 2),
                         chunk_offsets=ints["offsets"])
        fused = strategy.name == "fused"
        slots = SlotArgs(meta, ints["state_indices"],
                         track_slots=ints["kernel_track_slots"] if fused else None,
                         track_chunks=ints["track_chunks"] if fused else None,
                         output_checkpoints=strategy.needs_checkpoints)
        md = ForwardMetadata(b, self.conv_width, slots)
        if not fused:
            lv = self.long
            md.track = TrackIndices(dst=lv["dst"], conv_positions=lv["conv_positions"].view(b.size, -1),
                                    working=lv["track_working"], checkpoint=lv["checkpoint"],
                                    from_final=self.from_final)
        return md

    def attend(self, layer, q, k, v) -> torch.Tensor:
        """Attention layer ``layer``'s core over the whole bucket, ``o [max_tokens, heads, D]``.

        Inside the graph: one masked attention over the static prefix KV and the bucket's keys,
        key j visible to query i when both are in the same row and j's position ≤ i's (the same
        bottom-right causal rule as an eager forward; a padding token sees its own row). Its
        cost grows with ``max_tokens²``, not with each sequence's length². Between graph pieces
        (a break) the live batch's rows are attended one by one, as an eager forward does, and
        the padding not at all: nothing reads its output.
        """
        if not self.prefix_in_graph:
            o = torch.zeros_like(q)
            live = sum(self.live.extend_lens)
            if live:
                o[:live] = layer.attend_each(q[:live], k[:live], v[:live], self.live)[0]
            return o
        k_prefix, v_prefix = self.prefix_kv[layer.attn_index]
        lv = self.long
        key_rows = torch.cat([lv["prefix_rows"], lv["token_rows"]])
        key_pos = torch.cat([lv["prefix_positions"], lv["positions"]])
        visible = (key_rows[None, :] == lv["token_rows"][:, None]) & (key_pos[None, :] <= lv["positions"][:, None])
        keys, values = torch.cat([k_prefix, k]), torch.cat([v_prefix, v])
        o = F.scaled_dot_product_attention(q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
                                           attn_mask=visible, enable_gqa=True)
        return o.transpose(0, 1)

    def results(self, logits: torch.Tensor, layer_kv: list) -> tuple[torch.Tensor, list]:
        """The live requests' part of a forward over the bucket: ``logits [N, vocab]`` and, per
        request, per attention layer, ``(k, v)`` of its prefix and new tokens, copied out of the
        static buffers (the next replay overwrites them)."""
        live = self.live
        kv = []
        for i, (start, stop) in enumerate(live.token_ranges):
            prefix = live.prefix_kv[i]
            row = []
            for j, (k, v) in enumerate(layer_kv):
                k_i, v_i = k[start:stop], v[start:stop]
                if prefix is not None:
                    k_i, v_i = torch.cat([prefix[j][0], k_i]), torch.cat([prefix[j][1], v_i])
                row.append((k_i.clone(), v_i.clone()))
            kv.append(row)
        return logits[:live.size].clone(), kv


def empty_batch(device) -> ForwardBatch:
    """A batch of no request: filled into a bucket it is padding only (what a capture runs)."""
    none = torch.zeros(0, dtype=torch.int64, device=device)
    return ForwardBatch(mode="extend", rids=[], prefix_lens=[], extend_lens=[], working_slots=[],
                        track_slots=[], track_mask=[], track_lens=[], token_ranges=[], input_ids=none,
                        positions=none, last_token_index=none, cu_seqlens=none, prefix_lens_t=none,
                        working_slots_t=none, track_slots_t=none, track_lens_t=none,
                        track_mask_t=none.bool(), prefix_kv=[], host_input_ids=[])
