"""The four tracking strategies: *when* and *how* the tracked rows' indices are found.

The first three end in the same two per-layer copies (:meth:`LinearAttentionBackend
<mamba_edu.serving.backend.LinearAttentionBackend>` does them):

* ``track.conv`` (before the conv): ``conv_pool[dst] = mixed_qkv[conv_positions]ᵀ``;
* ``track.ssm`` (after the GDN kernel): ``ssm_pool[dst] = final state or checkpoint h[…]``.

They differ only in where the :class:`TrackIndices` come from; ``fused`` has no copies at all.
``naive`` and ``precomputed`` reproduce SGLang (``hybrid_linear_attn_backend.py`` and
``gdn_backend.py``) before and after its PR #20522, host syncs included (L = number of GDN
layers; see ``docs/sglang.md``):

=========== ======================================================= =========================
strategy    indices                                                  host syncs / forward
=========== ======================================================= =========================
naive       once per forward :func:`sglang_track_metadata` (9 syncs, 9 + 3·L when tracking
            1 if nothing is tracked); every layer again                (SGLang before #20522),
            ``if mask.any()`` → ``mask.nonzero()`` for the conv          1 + 2·L otherwise
            destinations, and ``if mask.any()`` before the SSM copy
precomputed :func:`sglang_track_metadata`, then ``has_mamba_track_mask  11 when tracking, else 2
            = bool(mask.any())`` and ``mask.nonzero()`` once; layers    (SGLang after #20522),
            test a Python bool and index                               0 inside the layers
sync_free   built on the host from the scheduler's lists, one pinned  0
            copy; fixed size N, untracked rows write the scratch slot
fused       the same host lists, given to the kernels: the conv kernel   0
            saves the tracked conv window, the GDN kernel the tracked
            SSM state (no fp32 h returned, no copy kernels)
=========== ======================================================= =========================
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from mamba_edu.gdn import checkpoint_offsets
from mamba_edu.kernels import ChunkMeta
from mamba_edu.probes import host_only
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


def sglang_track_metadata(batch: ForwardBatch, conv_width: int) -> TrackIndices | None:
    """The tracked rows' indices as SGLang builds them once per forward (``_forward_metadata``
    with ``_init_track_conv_indices`` and ``_init_track_ssm_indices``), the same before and after
    PR #20522, host syncs included: 9 when a row is tracked, 1 otherwise. None if none is."""
    mask = batch.track_mask_t
    if not mask.any():                                        # sync: the gate
        return None
    cu = batch.cu_seqlens
    # Conv windows, on the device: the rows before each tracked position A.
    aligned = batch.track_lens_t - batch.prefix_lens_t      # A (−P−1 for untracked rows)
    start = (cu[:-1] + aligned - (conv_width - 1))[mask]     # sync: boolean-mask gather
    window = torch.arange(conv_width - 1, device=cu.device)
    conv_positions = (start[:, None] + window).clamp(0, cu[-1] - 1)  # sync: a tensor bound is read as a number
    # SSM sources, on the host: six copies back, the split into final / checkpoint, one upload.
    mask_c, extend_c = mask.cpu(), (cu[1:] - cu[:-1]).cpu()                       # syncs 4, 5
    dst_c, working_c = batch.track_slots_t.cpu(), batch.working_slots_t.cpu()    # syncs 6, 7
    track_c, prefix_c = batch.track_lens_t.cpu(), batch.prefix_lens_t.cpu()      # syncs 8, 9
    with host_only():
        rel = (track_c - prefix_c)[mask_c]
        n_chunks = (extend_c + 63) // 64
        first_checkpoint = n_chunks.cumsum(0) - n_chunks
        # A == E means "final": its chunk index ⌈E/64⌉ lies past h; clamp it to a valid row.
        checkpoint = torch.minimum(first_checkpoint[mask_c] + rel // 64, n_chunks.sum() - 1)
        lists = [t.tolist() for t in (dst_c[mask_c], working_c[mask_c], checkpoint,
                                      rel == extend_c[mask_c])]
    # SGLang uploads these four from pageable memory, a host stall it does not count as a sync;
    # one pinned copy keeps that stall out of the comparison.
    dst, working, checkpoint, final = upload_host_lists(lists, cu.device)
    return TrackIndices(dst=dst, conv_positions=conv_positions, working=working,
                        checkpoint=checkpoint, from_final=final.bool())


@dataclass
class HostTrackIndices:
    """Fixed-size (one entry per row) host lists behind :func:`track_indices_on_host`."""

    dst: list[int]
    conv_positions: list[list[int]]
    checkpoint: list[int]
    from_final: list[int]
    chunks: list[int]  # A/64 for tracked rows, −1 otherwise (the fused kernel's track_chunks)


def host_track_indices(batch: ForwardBatch, conv_width: int) -> HostTrackIndices:
    """Every row's indices from the scheduler's CPU lists; untracked rows go to the scratch slot."""
    offsets = checkpoint_offsets(batch.extend_lens)
    last_token = batch.token_ranges[-1][1] - 1  # a valid row for the windows of untracked rows
    out = HostTrackIndices([], [], [], [], [])
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
            out.conv_positions.append([min(start, last_token)] * (conv_width - 1))
            out.checkpoint.append(0)
            out.from_final.append(0)
            out.chunks.append(-1)
    return out


def working_sources(batch: ForwardBatch) -> list[int]:
    """Each row's working slot as a source of its final state; a bucket's padding rows, which
    have none, read the scratch slot (their copies land there too)."""
    return [w if w >= 0 else SCRATCH_SLOT for w in batch.working_slots]


def track_indices_on_host(batch: ForwardBatch, plan: HostTrackIndices, device) -> TrackIndices:
    """Upload a :class:`HostTrackIndices` with one pinned non-blocking copy."""
    dst, conv, working, checkpoint, final = upload_host_lists(
        [plan.dst, [p for row in plan.conv_positions for p in row], working_sources(batch),
         plan.checkpoint, plan.from_final], device)
    return TrackIndices(dst=dst, conv_positions=conv.view(len(plan.dst), -1), working=working,
                        checkpoint=checkpoint, from_final=final.bool())


@dataclass(frozen=True)
class SlotArgs:
    """What every GDN layer of one forward passes to its kernels besides its own tensors: the same
    in all layers, so built once per forward.

    meta:               the kernels' :class:`~mamba_edu.kernels.ChunkMeta` (the batch's layout).
    state_indices:      ``[N]`` each row's working slot (−1: a bucket's padding row, no state).
    track_slots:        ``[N]`` with ``fused``, each row's track slot (the scratch slot if untracked);
                        else None.
    track_chunks:       ``[N]`` with ``fused``, the chunk whose state to save (−1: none); else None.
    output_checkpoints: whether the GDN prefill returns the checkpoints ``h`` (the strategy copies
                        from them), see :attr:`TrackingStrategy.needs_checkpoints`.

    The index tensors are uploaded with ``meta`` in one copy and remember their host values
    (:func:`~mamba_edu.kernels.build_chunk_meta_with_indices`).
    """

    meta: ChunkMeta
    state_indices: torch.Tensor
    track_slots: torch.Tensor | None = None
    track_chunks: torch.Tensor | None = None
    output_checkpoints: bool = True


@dataclass
class ForwardMetadata:
    """What :meth:`LinearAttentionBackend.init_forward_metadata` prepares once per forward.

    ``slots`` the kernels' arguments (:class:`SlotArgs`); ``track`` the strategy's precomputed
    indices (None if it has none); ``host_indices`` the host lists of sync_free/fused.
    """

    batch: ForwardBatch
    conv_width: int
    slots: SlotArgs | None = None
    track: TrackIndices | None = None
    host_indices: HostTrackIndices | None = None


class TrackingStrategy:
    """Base class: decides where the indices of the tracked rows come from.

    ``needs_checkpoints``: whether the GDN kernel must return the checkpoint tensor ``h``.
    """

    name = "base"
    needs_checkpoints = True
    capturable = False  # never syncs, so its forward can run inside a CUDA graph

    def host_indices(self, batch: ForwardBatch, conv_width: int) -> HostTrackIndices | None:
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

    def kernel_index_lists(self, plan: HostTrackIndices | None) -> dict:
        """Extra index lists for the kernels (the fused strategy's in-kernel tracking), uploaded
        with the chunk metadata and passed to ``conv1d_prefill`` and ``gdn_prefill``."""
        return {}


class NaiveTracking(TrackingStrategy):
    """SGLang before PR #20522: the per-forward metadata, then every GDN layer asks the device
    again whether any row is tracked and which ones."""

    name = "naive"

    def prepare(self, md):
        md.track = sglang_track_metadata(md.batch, md.conv_width)

    def conv_indices(self, md):
        mask = md.batch.track_mask_t
        if mask.any():                       # sync: a Python bool of a device tensor
            rows = mask.nonzero()[:, 0]      # sync: the output size depends on the data
            return replace(md.track, dst=md.batch.track_slots_t[rows])
        return None

    def ssm_indices(self, md, conv_track):
        return md.track if md.batch.track_mask_t.any() else None  # sync, again


class PrecomputedTracking(TrackingStrategy):
    """SGLang after PR #20522: the same per-forward metadata plus ``has_mamba_track_mask`` and the
    tracked rows' destinations, found once; layers test a Python bool and index."""

    name = "precomputed"

    def prepare(self, md):
        mask = md.batch.track_mask_t
        md.track = sglang_track_metadata(md.batch, md.conv_width)
        if bool(mask.any()):                 # sync: has_mamba_track_mask
            rows = mask.nonzero()[:, 0]      # sync: mamba_track_mask_indices
            md.track = replace(md.track, dst=md.batch.track_slots_t[rows])  # conv_states_mask_indices


class SyncFreeTracking(TrackingStrategy):
    """Every index from the host lists, one entry per row, scratch slot for untracked rows."""

    name = "sync_free"
    capturable = True

    def host_indices(self, batch, conv_width):
        return host_track_indices(batch, conv_width)

    def prepare(self, md):
        md.track = track_indices_on_host(md.batch, md.host_indices, md.batch.cu_seqlens.device)


class FusedTracking(SyncFreeTracking):
    """The kernels write the snapshots themselves: the conv kernel the tracked conv window, the
    GDN kernel the tracked SSM state (both are given ``track_slots``/``track_chunks``)."""

    name = "fused"
    needs_checkpoints = False

    def prepare(self, md):
        """Nothing to upload: the kernels' two lists came with the chunk metadata."""

    def conv_indices(self, md):
        return None

    def ssm_indices(self, md, conv_track):
        return None

    def kernel_index_lists(self, plan):
        return {} if plan is None else {"track_slots": plan.dst, "track_chunks": plan.chunks}


STRATEGIES: dict[str, type[TrackingStrategy]] = {
    cls.name: cls for cls in (NaiveTracking, PrecomputedTracking, SyncFreeTracking, FusedTracking)}


def get_strategy(name: str) -> TrackingStrategy:
    """A strategy by name: ``naive``, ``precomputed``, ``sync_free`` or ``fused``."""
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {list(STRATEGIES)}; got {name!r}")
    return STRATEGIES[name]()
