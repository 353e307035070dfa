"""The seam between the model and the backend: :class:`GDNBackend`, every hook either side calls.

The model never sees slots, kernels or tracking. It calls three hooks: each GDN layer hands its
projections to ``forward``, each attention layer its q, k, v to ``attend``, and the forward's last
step (final norm, LM head) runs through ``logits``. The engine calls the others: before an eager
forward ``init_forward_metadata``, after a decode step ``track_decode``, and around a bucket's CUDA
graph (:mod:`mamba_edu.engine.graph`) ``init_forward_metadata_capture`` and
``init_forward_metadata_replay``. The shape is mini-sglang's ``BaseAttnBackend`` (``prepare_metadata``,
``forward``, ``prepare_for_capture``, ``prepare_for_replay``); the names are SGLang's, whose
hybrid backend the course rebuilds::

    hook                            called by, when                     SGLang
    init_forward_metadata           the engine, before an eager forward  init_forward_metadata
    forward                         each GDN layer                       forward_extend / forward_decode
    attend                          each attention layer                 (the full-attention backend's forward)
    logits                          the model's last step                (the breakable graph's eager tail)
    track_decode                    the engine, after a decode step      _track_mamba_state_decode
    init_forward_metadata_capture   the engine, before a capture         init_forward_metadata_capture_cuda_graph
    init_forward_metadata_replay    the engine, before a replay          init_forward_metadata_replay_cuda_graph

(SGLang's graph hooks drop ``_cuda_graph`` here: a bucket also runs without graphs, on a CPU.)
:class:`~mamba_edu.serving.LinearAttentionBackend` is the package's backend. While a bucket is
captured in pieces, :class:`~mamba_edu.serving.breakable.BreakingBackend` stands in for it on the
model's side only (the three model hooks).
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import torch

from mamba_edu.serving.batch import ForwardBatch
from mamba_edu.serving.gdn_layer import GDNLayerParams


class GDNBackend(abc.ABC):
    """What a backend must do for the model and the engine (see the module docstring)."""

    @abc.abstractmethod
    def init_forward_metadata(self, batch: ForwardBatch):
        """Once per eager forward of ``batch``, before the model runs: everything the layers share
        (the kernels' chunk metadata, the slots, the tracking strategy's indices). Returns it."""

    @abc.abstractmethod
    def forward(self, layer: GDNLayerParams, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                batch: ForwardBatch, z: torch.Tensor | None = None) -> torch.Tensor:
        """One GDN layer's conv and core on its pooled states: ``mixed_qkv [T, D]``, ``a, b [T, HV]``
        → ``o [T, HV, V]``; given the output gate ``z [T, HV·V]``, ``o`` is the normed output
        ``rms_norm(o)·norm_weight·silu(z)`` per value head."""

    def attend(self, layer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch):
        """A full-attention layer's core, ``layer.attend(q, k, v, batch) -> (o, kv)``: it passes
        through the backend so that a breakable graph can cut the forward there."""
        return layer.attend(q, k, v, batch)

    def logits(self, lm_head: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The forward's last step, ``lm_head()`` (final norm and LM head on the last tokens): a
        breakable graph runs it as an eager tail after its last piece."""
        return lm_head()

    @abc.abstractmethod
    def track_decode(self, batch: ForwardBatch) -> None:
        """After a decode step of ``batch``: copy the states due for tracking to their track slots."""

    @abc.abstractmethod
    def init_forward_metadata_capture(self, static) -> None:
        """Before a capture of ``static`` (a :class:`~mamba_edu.engine.bucket.StaticBucket`, its
        buffers filled), and before a forward over it run eagerly the same way: the metadata the
        forward reads."""

    @abc.abstractmethod
    def init_forward_metadata_replay(self, static) -> None:
        """Before a replay of ``static``, its buffers refilled with the live batch: whatever the
        captured forward does not read from them."""
