"""What the serving backend reads from a GDN layer: the :class:`GDNLayerParams` protocol.

:class:`~mamba_edu.serving.LinearAttentionBackend` runs each GDN layer's conv and core on the
state pool, but it never imports the model: it sees a layer only through the names below.
:class:`mamba_edu.model.GDNMixer` is the one implementation in the package; any object with
these attributes (another model's layer, a test double) can take its place.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class GDNLayerParams(Protocol):
    """The parameters and the one method the backend uses, with ``H``/``HV`` key/value heads,
    ``K``/``V`` their head dims, ``W`` the conv width and ``D = 2·H·K + HV·V`` the conv channels.

    Attributes:
        gdn_index: the layer's index in the state pool (pool layer ``j`` is the model's ``j``-th
            GDN layer).
        conv_weight: ``[D, W]``, model dtype: the causal conv1d over ``mixed_qkv``.
        conv_bias: ``[D]``, model dtype.
        A_log: ``[HV]`` fp32, log decay rates: ``g = −exp(A_log)·softplus(a + dt_bias)``.
        dt_bias: ``[HV]`` fp32, the time-step bias of the gating.
        norm_weight: ``[V]``, model dtype: the weight of the output norm
            ``rms_norm(o)·norm_weight·silu(z)`` per value head (read when the model passes ``z``).
        norm_eps: the output norm's eps, a Python float.

    ``isinstance(layer, GDNLayerParams)`` checks that the names exist, not their shapes.
    """

    gdn_index: int
    conv_weight: torch.Tensor
    conv_bias: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    norm_weight: torch.Tensor
    norm_eps: float

    def split_qkv(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``y [T, D]`` (the conv output) → ``q [T, H, K]``, ``k [T, H, K]``, ``v [T, HV, V]``:
        views of ``y``'s columns whose rows keep ``y``'s row stride (the kernels read them so)."""
