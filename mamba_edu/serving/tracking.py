"""The four tracking strategies: *when* and *how* the tracked rows' indices are found.

Every strategy ends in the same two per-layer copies (:meth:`LinearAttentionBackend
<mamba_edu.serving.backend.LinearAttentionBackend>` does them):

* ``track.conv`` (before the conv): ``conv_pool[dst] = mixed_qkv[conv_positions]ᵀ``;
* ``track.ssm`` (after the GDN kernel): ``ssm_pool[dst] = final state or checkpoint h[…]``.

They differ only in where the :class:`TrackIndices` come from:

========== ======================================================== ======================
strategy   indices                                                   host syncs / forward
========== ======================================================== ======================
naive      every layer: ``if mask.any()`` → ``mask.nonzero()``;      2 per GDN layer,
           after the kernel ``if mask.any()`` again                  3 when tracking
precomputed once in ``init_forward_metadata``: ``bool(mask.any())``,  1, or 2 when tracking
           ``mask.nonzero()``; layers only index                     (0 inside layers)
sync_free  built on the host from the scheduler's lists, one pinned   0
           copy; fixed size N, untracked rows write the scratch slot
fused      as sync_free for the conv; the GDN kernel itself writes     0
           the tracked SSM state (no fp32 h returned, no copy)
========== ======================================================== ======================
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mamba_edu.gdn import checkpoint_offsets
from mamba_edu.serving.batch import ForwardBatch, upload_host_lists
from mamba_edu.serving.pool import SCRATCH_SLOT


@dataclass
class TrackIndices:
    """Where the tracked states of ``n`` rows come from and go to (device tensors).

    dst:            ``[n]`` destination slot (a track slot, or the scratch slot).
    conv_positions: ``[n, W-1]`` rows of the packed ``mixed_qkv [T, D]`` forming the conv window.
    working:        ``[n]`` working slot, the source when the snapshot is the final state.
    checkpoint:     ``[n]`` row of the checkpoint tensor ``h`` otherwise.
    from_final:     ``[n]`` bool, which of the two sources applies.
    """

    dst: torch.Tensor
    conv_positions: torch.Tensor
    working: torch.Tensor
    checkpoint: torch.Tensor
    from_final: torch.Tensor


def track_indices_on_device(batch: ForwardBatch, rows: torch.Tensor, conv_width: int) -> TrackIndices:
    """Indices of the tracked ``rows [n]`` computed from the batch's device tensors (no sync:
    only gathers and arithmetic; finding ``rows`` is what synced)."""
    cu = batch.cu_seqlens
    extend = cu[1:] - cu[:-1]
    n_chunks = (extend + 63) // 64
    first_checkpoint = n_chunks.cumsum(0) - n_chunks
    aligned = batch.track_lens_t[rows] - batch.prefix_lens_t[rows]  # A
    window = torch.arange(1 - conv_width, 0, device=cu.device)       # -(W-1) … -1
    # A == E means "final": its chunk index ⌈E/64⌉ lies past h; clamp it to a valid row.
    checkpoint = torch.minimum(first_checkpoint[rows] + aligned // 64, n_chunks.sum() - 1)
    return TrackIndices(dst=batch.track_slots_t[rows],
                        conv_positions=(cu[rows] + aligned)[:, None] + window,
                        working=batch.working_slots_t[rows], checkpoint=checkpoint,
                        from_final=aligned == extend[rows])


@dataclass
class HostTrackPlan:
    """Fixed-size (one entry per row) host lists behind :func:`track_indices_on_host`."""

    dst: list[int]
    conv_positions: list[list[int]]
    checkpoint: list[int]
    from_final: list[int]
    chunks: list[int]  # A/64 for tracked rows, −1 otherwise (the fused kernel's track_chunks)


def host_track_plan(batch: ForwardBatch, conv_width: int) -> HostTrackPlan:
    """Every row's indices from the scheduler's CPU lists; untracked rows go to the scratch slot."""
    offsets = checkpoint_offsets(batch.extend_lens)
    out = HostTrackPlan([], [], [], [], [])
    for i, plan in enumerate(batch.plans):
        start = batch.token_ranges[i][0]
        if plan.tracked:
            out.dst.append(plan.track_slot)
            out.conv_positions.append([start + plan.aligned - conv_width + 1 + j for j in range(conv_width - 1)])
            out.checkpoint.append(min(offsets[i] + plan.checkpoint, offsets[-1] - 1))
            out.from_final.append(int(plan.from_final))
            out.chunks.append(plan.checkpoint)
        else:  # any valid source will do: the write lands in the scratch slot
            out.dst.append(SCRATCH_SLOT)
            out.conv_positions.append([start] * (conv_width - 1))
            out.checkpoint.append(0)
            out.from_final.append(0)
            out.chunks.append(-1)
    return out


def track_indices_on_host(batch: ForwardBatch, plan: HostTrackPlan, device) -> TrackIndices:
    """Upload a :class:`HostTrackPlan` with one pinned non-blocking copy."""
    dst, conv, working, checkpoint, final = upload_host_lists(
        [plan.dst, [p for row in plan.conv_positions for p in row], batch.working_slots,
         plan.checkpoint, plan.from_final], device)
    return TrackIndices(dst=dst, conv_positions=conv.view(len(plan.dst), -1), working=working,
                        checkpoint=checkpoint, from_final=final.bool())


@dataclass
class ForwardMetadata:
    """What :meth:`LinearAttentionBackend.init_forward_metadata` prepares once per forward.

    ``chunk_meta`` is the kernels' host-built batch layout (its ``state_indices`` are the
    working slots); ``track`` the strategy's precomputed indices (None if it has none);
    ``host_plan`` the host lists of sync_free/fused; ``prefill_args`` the keyword arguments every
    layer passes to ``gdn_prefill`` (the same for all layers of the forward, so built once).
    """

    batch: ForwardBatch
    conv_width: int
    chunk_meta: object
    track: TrackIndices | None = None
    host_plan: HostTrackPlan | None = None
    prefill_args: dict = field(default_factory=dict)


class TrackingStrategy:
    """Base class: decides where the indices of the tracked rows come from.

    ``needs_checkpoints``: whether the GDN kernel must return the checkpoint tensor ``h``.
    """

    name = "base"
    needs_checkpoints = True

    def host_plan(self, batch: ForwardBatch, conv_width: int) -> HostTrackPlan | None:
        """Host lists built before the chunk metadata (sync_free/fused only)."""
        return None

    def prepare(self, md: ForwardMetadata) -> None:
        """Once per forward, in ``init_forward_metadata``."""

    def conv_indices(self, md: ForwardMetadata) -> TrackIndices | None:
        """Per GDN layer, before the conv: the rows whose conv window to save, or None."""
        return md.track

    def ssm_indices(self, md: ForwardMetadata, conv_track: TrackIndices | None) -> TrackIndices | None:
        """Per GDN layer, after the kernel: the rows whose SSM state to save, or None."""
        return md.track

    def chunk_meta_args(self, plan: HostTrackPlan | None) -> dict:
        """Extra host lists to upload with the kernels' chunk metadata."""
        return {}

    def kernel_track_args(self, md: ForwardMetadata) -> dict:
        """Extra arguments of ``gdn_prefill`` (the fused strategy's in-kernel tracking)."""
        return {}


class NaiveTracking(TrackingStrategy):
    """Find the tracked rows again in every layer, as upstream code did before its fix."""

    name = "naive"

    def conv_indices(self, md):
        mask = md.batch.track_mask_t
        if mask.any():                       # sync: a Python bool of a device tensor
            rows = mask.nonzero()[:, 0]      # sync: the output size depends on the data
            return track_indices_on_device(md.batch, rows, md.conv_width)
        return None

    def ssm_indices(self, md, conv_track):
        return conv_track if md.batch.track_mask_t.any() else None  # sync, again


class PrecomputedTracking(TrackingStrategy):
    """Find the tracked rows once per forward; layers test a Python bool and index."""

    name = "precomputed"

    def prepare(self, md):
        mask = md.batch.track_mask_t
        if bool(mask.any()):                 # sync 1 of the forward
            md.track = track_indices_on_device(md.batch, mask.nonzero()[:, 0], md.conv_width)  # sync 2


class SyncFreeTracking(TrackingStrategy):
    """Every index from the host lists, one entry per row, scratch slot for untracked rows."""

    name = "sync_free"

    def host_plan(self, batch, conv_width):
        return host_track_plan(batch, conv_width)

    def prepare(self, md):
        md.track = track_indices_on_host(md.batch, md.host_plan, md.batch.cu_seqlens.device)


class FusedTracking(SyncFreeTracking):
    """As sync_free for the conv window; the GDN kernel writes the tracked SSM state itself."""

    name = "fused"
    needs_checkpoints = False

    def ssm_indices(self, md, conv_track):
        return None

    def chunk_meta_args(self, plan):
        return {} if plan is None else {"track_slots": plan.dst, "track_chunks": plan.chunks}

    def kernel_track_args(self, md):
        return {"track_slots": md.chunk_meta.track_slots, "track_chunks": md.chunk_meta.track_chunks}


STRATEGIES: dict[str, type[TrackingStrategy]] = {
    cls.name: cls for cls in (NaiveTracking, PrecomputedTracking, SyncFreeTracking, FusedTracking)}


def get_strategy(name: str) -> TrackingStrategy:
    """A strategy by name: ``naive``, ``precomputed``, ``sync_free`` or ``fused``."""
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {list(STRATEGIES)}; got {name!r}")
    return STRATEGIES[name]()
