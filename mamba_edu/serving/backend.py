"""The linear-attention backend: runs every GDN layer's conv + core on the state pool and tracks.

It implements the seam :class:`~mamba_edu.serving.seam.GDNBackend`: the model calls
:meth:`LinearAttentionBackend.forward` from each GDN layer with that layer's projections; the
backend owns the slots, the kernels and the tracking strategy. Per forward:

1. ``init_forward_metadata(batch)`` — once: the kernels' chunk metadata (host-built) and slots
   (:class:`~mamba_edu.serving.tracking.SlotArgs`), whatever the strategy precomputes, and every
   other argument that is the same in all layers (a bucket's captured forward: the
   ``init_forward_metadata_capture`` and ``_replay`` hooks);
2. per GDN layer, extend: [track.conv] → conv1d (working slots) → split q/k/v (views) →
   GDN core with the gating inside (working slots; checkpoints ``h`` unless fused) and, given the
   output gate ``z``, the output norm (in the prefill's output kernel on a GPU) → [track.ssm]
   (with ``fused`` the two kernels save the snapshots and both copies are skipped). The core is
   the ``prefill_kernel`` chosen when the backend was built: ours, or fla's
   (:mod:`~mamba_edu.serving.fla_prefill`);
3. per GDN layer, decode: conv1d step → GDN step [→ output norm]; after the model,
   :meth:`track_decode` copies the rows due for tracking into their track slots, all layers in
   one op.

The layers are checked once, when the backend is built for them; the forward trusts them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from mamba_edu.kernels import build_chunk_meta_with_indices, launch
from mamba_edu.kernels.fused_ops import gated_rms_norm
from mamba_edu.probes import profile_range
from mamba_edu.serving import fla_prefill
from mamba_edu.serving.batch import ForwardBatch
from mamba_edu.serving.gdn_layer import GDNLayerParams
from mamba_edu.serving.pool import StatePool
from mamba_edu.serving.seam import GDNBackend
from mamba_edu.serving.tracking import ForwardMetadata, SlotArgs, TrackIndices, get_strategy


class LinearAttentionBackend(GDNBackend):
    """GDN layers' state handling for one model.

    Args:
        pool: the :class:`StatePool` (one pool layer per GDN layer, conv width ``W``).
        strategy: ``naive``, ``precomputed``, ``sync_free`` or ``fused``.
        layers: the model's GDN layers (:class:`GDNLayerParams`); each one's ``conv_weight`` must
            be ``[D, W]`` like the pool's conv states, checked here once.
        prefill_kernel: the GDN core of an extend: ``triton`` (ours, :func:`launch.gdn_prefill
            <mamba_edu.kernels.launch.gdn_prefill>`) or ``fla`` (fla's Triton path, SGLang's
            fallback: :mod:`~mamba_edu.serving.fla_prefill`; CUDA, not with ``fused``). Chosen
            here, once.
    """

    def __init__(self, pool: StatePool, strategy: str, layers: Iterable[GDNLayerParams],
                 prefill_kernel: str = "triton"):
        if not isinstance(pool, StatePool):
            raise TypeError(f"pool must be a StatePool; got {type(pool).__name__}")
        self.pool = pool
        self.strategy = get_strategy(strategy)
        self.prefill_kernel = fla_prefill.check_prefill_kernel(prefill_kernel, self.strategy.name,
                                                                pool.ssm.device)
        self._gdn_prefill = fla_prefill.gdn_prefill if self.prefill_kernel == "fla" else launch.gdn_prefill
        self.conv_width = pool.conv.shape[-1] + 1
        want = (pool.conv.shape[2], self.conv_width)
        for layer in layers:
            weight = getattr(layer, "conv_weight", None)
            if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != want:
                got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
                raise ValueError(f"layer.conv_weight must be [D, W]={list(want)} to match the state pool; "
                                 f"got {got}")
        self.metadata: ForwardMetadata | None = None

    @property
    def strategy_name(self) -> str:
        return self.strategy.name

    def init_forward_metadata(self, batch: ForwardBatch) -> ForwardMetadata:
        """Prepare one eager forward of ``batch``: the kernels' :class:`SlotArgs` (chunk metadata
        and slots, one upload) and the strategy's indices."""
        with profile_range("init_forward_metadata"):
            plan = self.strategy.host_indices(batch, self.conv_width) if batch.mode == "extend" else None
            meta, indices = build_chunk_meta_with_indices(
                batch.extend_lens, batch.cu_seqlens.device, allow_empty=batch.bucket is not None,
                state_indices=batch.working_slots, **self.strategy.kernel_index_lists(plan))
            slots = SlotArgs(meta, **indices, output_checkpoints=self.strategy.needs_checkpoints)
            md = ForwardMetadata(batch, self.conv_width, slots, host_indices=plan)
            if batch.mode == "extend":
                self.strategy.prepare(md)
            self.metadata = md
            return md

    def init_forward_metadata_capture(self, static) -> None:
        """With the GDN layers inside the graph (``static.fixed``), their metadata over the
        bucket's static buffers (:meth:`StaticBucket.forward_metadata
        <mamba_edu.engine.bucket.StaticBucket.forward_metadata>`), which every replay reads again;
        otherwise the GDN layers are eager breaks and prepare this batch's own."""
        if not static.fixed:
            self.init_forward_metadata(static.batch)
            return
        with profile_range("init_forward_metadata"):
            self.metadata = static.forward_metadata(self.strategy)

    def init_forward_metadata_replay(self, static) -> None:
        """The GDN breaks of a breakable capture read the live batch's own metadata; a graph with
        the GDN layers inside reads the static buffers, which ``static.fill`` refilled."""
        if not static.fixed:
            self.init_forward_metadata(static.batch)

    def _metadata_for(self, batch: ForwardBatch) -> ForwardMetadata:
        if self.metadata is None or self.metadata.batch is not batch:
            raise ValueError("batch has no forward metadata: call init_forward_metadata(batch) first")
        return self.metadata

    def forward(self, layer: GDNLayerParams, mixed_qkv, a, b, batch: ForwardBatch,
                z=None) -> torch.Tensor:
        """One GDN layer (:meth:`GDNBackend.forward <mamba_edu.serving.seam.GDNBackend.forward>`).
        From ``layer`` it reads only what :class:`GDNLayerParams` lists."""
        if batch.mode == "extend":
            return self.forward_extend(layer, mixed_qkv, a, b, batch, z)
        return self.forward_decode(layer, mixed_qkv, a, b, batch, z)

    def forward_extend(self, layer: GDNLayerParams, mixed_qkv, a, b, batch: ForwardBatch,
                       z=None) -> torch.Tensor:
        md = self._metadata_for(batch)
        slots = md.slots
        conv_pool, ssm_pool = self.pool.layer(layer.gdn_index)
        track = self.strategy.conv_indices(md)
        if track is not None:
            self._track_conv(conv_pool, mixed_qkv, track)
        y = launch.conv1d_prefill(mixed_qkv, layer.conv_weight, layer.conv_bias, conv_pool=conv_pool,
                                  state_indices=slots.state_indices, meta=slots.meta,
                                  track_slots=slots.track_slots, track_chunks=slots.track_chunks)
        q, k, v = layer.split_qkv(y)
        norm = None if z is None else (z, layer.norm_weight, layer.norm_eps)
        o, h = self._gdn_prefill(q, k, v, a=a, b=b, A_log=layer.A_log, dt_bias=layer.dt_bias,
                                 state_pool=ssm_pool, state_indices=slots.state_indices, meta=slots.meta,
                                 track_slots=slots.track_slots, track_chunks=slots.track_chunks,
                                 output_checkpoints=slots.output_checkpoints, output_norm=norm)
        track = self.strategy.ssm_indices(md, track)
        if track is not None:
            self._track_ssm(ssm_pool, h, track)
        return o

    @staticmethod
    def _track_conv(conv_pool: torch.Tensor, mixed_qkv: torch.Tensor, track: TrackIndices) -> None:
        """The raw inputs before the tracked position are the conv state there: ``[n, D, W-1]``."""
        with profile_range("track.conv"):
            conv_pool[track.dst] = mixed_qkv[track.conv_positions].transpose(1, 2).to(conv_pool.dtype)

    @staticmethod
    def _track_ssm(ssm_pool: torch.Tensor, h: torch.Tensor, track: TrackIndices) -> None:
        """Copy the final state (from the working slot) or checkpoint ``h[row]`` to ``dst``."""
        with profile_range("track.ssm"):
            final = ssm_pool[track.working]
            state = torch.where(track.from_final[:, None, None, None], final, h[track.checkpoint].to(final.dtype))
            ssm_pool[track.dst] = state

    def forward_decode(self, layer: GDNLayerParams, mixed_qkv, a, b, batch: ForwardBatch,
                       z=None) -> torch.Tensor:
        """One decode token per sequence: ``mixed_qkv [N, D]`` → ``o [N, HV, V]`` (normed with
        ``z [N, HV·V]``, as in :meth:`forward`)."""
        slots = self._metadata_for(batch).slots.state_indices
        conv_pool, ssm_pool = self.pool.layer(layer.gdn_index)
        y = launch.conv1d_decode(mixed_qkv, layer.conv_weight, layer.conv_bias,
                                 conv_pool=conv_pool, state_indices=slots)
        q, k, v = layer.split_qkv(y)
        o = launch.gdn_decode(q, k, v, a, b, layer.A_log, layer.dt_bias, state_pool=ssm_pool,
                              state_indices=slots)
        return o if z is None else gated_rms_norm(o, z, layer.norm_weight, layer.norm_eps)

    def track_decode(self, batch: ForwardBatch) -> None:
        """After a decode step: copy each row's working state to ``batch.decode_track_slots_t``
        (its track slot when due, the scratch slot otherwise), every layer in one indexing op.
        The mask is applied on the device by the choice of slot: no host sync."""
        with profile_range("track.decode"):
            self._metadata_for(batch)
            dst, src = batch.decode_track_slots_t, batch.working_slots_t
            self.pool.conv[:, dst] = self.pool.conv[:, src]
            self.pool.ssm[:, dst] = self.pool.ssm[:, src]
