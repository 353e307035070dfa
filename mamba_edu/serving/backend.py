"""The linear-attention backend: runs every GDN layer's conv + core on the state pool and tracks.

The model calls :meth:`LinearAttentionBackend.forward` from each GDN layer with that layer's
projections; the backend owns the slots, the kernels and the tracking strategy. Per forward:

1. ``init_forward_metadata(batch)`` — once: the kernels' chunk metadata (host-built), whatever
   the strategy precomputes, and every other argument that is the same in all layers;
2. per GDN layer, extend: [track.conv] → conv1d (working slots) → split q/k/v (views) →
   GDN core with the gating inside (working slots; checkpoints ``h`` unless fused) and, given the
   output gate ``z``, the output norm (in the prefill's output kernel on a GPU) → [track.ssm]
   (with ``fused`` the two kernels save the snapshots and both copies are skipped);
3. per GDN layer, decode: conv1d step → GDN step [→ output norm]; after the model,
   :meth:`track_decode` copies the rows due for tracking into their track slots, all layers in
   one op.
"""

from __future__ import annotations

import torch

from mamba_edu.kernels import build_chunk_meta_with_indices, launch
from mamba_edu.kernels.fused_ops import gated_rms_norm
from mamba_edu.probes import profile_range
from mamba_edu.serving.batch import ForwardBatch
from mamba_edu.serving.gdn_layer import GDNLayerParams
from mamba_edu.serving.pool import StatePool
from mamba_edu.serving.tracking import ForwardMetadata, TrackIndices, get_strategy


class LinearAttentionBackend:
    """GDN layers' state handling for one model.

    Args:
        pool: the :class:`StatePool` (one pool layer per GDN layer).
        strategy: ``naive``, ``precomputed``, ``sync_free`` or ``fused``.
        conv_width: the conv kernel width ``W``.
    """

    def __init__(self, pool: StatePool, strategy: str, conv_width: int):
        if not isinstance(pool, StatePool):
            raise TypeError(f"pool must be a StatePool; got {type(pool).__name__}")
        if type(conv_width) is not int or conv_width != pool.conv.shape[-1] + 1:
            raise ValueError(f"conv_width must be the pool's conv width W={pool.conv.shape[-1] + 1} "
                             f"(its conv states hold W-1 inputs); got {conv_width!r}")
        self.pool = pool
        self.strategy = get_strategy(strategy)
        self.conv_width = conv_width
        self.metadata: ForwardMetadata | None = None

    @property
    def strategy_name(self) -> str:
        return self.strategy.name

    def init_forward_metadata(self, batch: ForwardBatch) -> ForwardMetadata:
        """Prepare one forward of ``batch``: chunk metadata and the strategy's indices. A bucket
        captured with its GDN layers inside the graph has them already, in its static buffers
        (:meth:`StaticBucket.forward_metadata <mamba_edu.engine.bucket.StaticBucket.forward_metadata>`)."""
        with profile_range("init_forward_metadata"):
            if batch.bucket is not None and batch.bucket.fixed:
                self.metadata = batch.bucket.forward_metadata(self.strategy)
                return self.metadata
            plan = self.strategy.host_indices(batch, self.conv_width) if batch.mode == "extend" else None
            meta, indices = build_chunk_meta_with_indices(
                batch.extend_lens, batch.cu_seqlens.device, allow_empty=batch.bucket is not None,
                state_indices=batch.working_slots, **self.strategy.kernel_index_lists(plan))
            md = ForwardMetadata(batch, self.conv_width, meta, indices, host_indices=plan)
            if batch.mode == "extend":
                self.strategy.prepare(md)
                md.conv_args = dict(meta=meta, **indices)
                md.prefill_args = dict(md.conv_args, output_checkpoints=self.strategy.needs_checkpoints)
            self.metadata = md
            return md

    def _metadata_for(self, batch: ForwardBatch) -> ForwardMetadata:
        if self.metadata is None or self.metadata.batch is not batch:
            raise ValueError("batch has no forward metadata: call init_forward_metadata(batch) first")
        return self.metadata

    def forward(self, layer: GDNLayerParams, mixed_qkv, a, b, batch: ForwardBatch,
                z=None) -> torch.Tensor:
        """One GDN layer: ``mixed_qkv [T, D]``, ``a, b [T, HV]`` → ``o [T, HV, V]``. Given the
        output gate ``z [T, HV·V]`` (row-strided allowed), ``o`` is the normed output
        ``rms_norm(o)·norm_weight·silu(z)`` per value head. From ``layer`` it reads only what
        :class:`GDNLayerParams` lists."""
        if batch.mode == "extend":
            return self.forward_extend(layer, mixed_qkv, a, b, batch, z)
        return self.forward_decode(layer, mixed_qkv, a, b, batch, z)

    def attend(self, layer, q, k, v, batch: ForwardBatch):
        """A full-attention layer's core (``layer.attend``): ``(o, kv)``. It passes through the
        backend, as in SGLang's hybrid backend, so that a breakable graph can cut there."""
        return layer.attend(q, k, v, batch)

    @staticmethod
    def logits(lm_head):
        """The forward's last step, ``lm_head()`` (final norm and LM head on the last tokens):
        a breakable graph runs it as an eager tail after its last piece, as SGLang does."""
        return lm_head()

    def _pool_layer(self, layer: GDNLayerParams):
        """The pool's views for ``layer``, after checking that its conv weight fits the pool."""
        conv_pool, ssm_pool = self.pool.layer(getattr(layer, "gdn_index", None))
        weight = getattr(layer, "conv_weight", None)
        want = (conv_pool.shape[1], self.conv_width)
        if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != want:
            got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
            raise ValueError(f"layer.conv_weight must be [D, W]={list(want)} to match the state pool; "
                             f"got {got}")
        return conv_pool, ssm_pool

    def forward_extend(self, layer: GDNLayerParams, mixed_qkv, a, b, batch: ForwardBatch,
                       z=None) -> torch.Tensor:
        md = self._metadata_for(batch)
        conv_pool, ssm_pool = self._pool_layer(layer)
        track = self.strategy.conv_indices(md)
        if track is not None:
            self._track_conv(conv_pool, mixed_qkv, track)
        y = launch.conv1d_prefill(mixed_qkv, layer.conv_weight, layer.conv_bias,
                                  conv_pool=conv_pool, **md.conv_args)
        q, k, v = layer.split_qkv(y)
        norm = None if z is None else (z, layer.norm_weight, layer.norm_eps)
        o, h = launch.gdn_prefill(q, k, v, a=a, b=b, A_log=layer.A_log, dt_bias=layer.dt_bias,
                                  state_pool=ssm_pool, output_norm=norm, **md.prefill_args)
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
        md = self._metadata_for(batch)
        conv_pool, ssm_pool = self._pool_layer(layer)
        slots = md.indices["state_indices"]
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
