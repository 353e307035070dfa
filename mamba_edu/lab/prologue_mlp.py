"""The MLP half of every layer in two launches instead of four, for the eager A/B.

The package runs a layer's MLP half as ``add_rms_norm`` (a Triton kernel: ``h = x + mixer_out``
and its norm), the gate/up GEMM (cuBLAS), ``silu_mul`` (Triton) and the down GEMM (cuBLAS). With
:func:`prologue_mlp`, two of :mod:`.prologue_gemms`' kernels do it: the gate/up GEMM with the
residual add and the norm in its prologue (it writes ``h`` too), then the down GEMM with SwiGLU in
its prologue. That is 2 launches fewer per layer (120 of the 690 of an eager ``fused`` forward of
``qwen3.5-tp8``), each remaining one a Triton GEMM instead of cuBLAS's.

How it slots in without another copy of the layer's forward: inside the context,
``HybridLayer.forward``'s ``self.mlp_norm.fused_add_norm(x, mixer_out)`` returns ``h`` still
empty and a :class:`PendingNorm` in place of the normed rows; ``self.mlp(normed)`` then launches
the fused GEMM, which fills ``h`` before anything reads it (the next layer's first norm). It needs
no model: each layer's MLP norm is switched when the layer first runs inside the context.

The GEMMs launch with one fixed tiling through the package's bound launches (no autotuning: the
A/B times the host's launch path, and a bound launch is what the package's own kernels get).
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from mamba_edu.kernels.launcher import bound_kernel
from mamba_edu.kernels.tiles import cdiv
from mamba_edu.lab.prologue_gemms import NORM, SWIGLU, prologue_linear_kernel
from mamba_edu.model import hybrid, layers

_KERNEL = bound_kernel(prologue_linear_kernel.fn)  # the JIT function under the autotuner
BM, BN, BK, WARPS, STAGES = 64, 128, 64, 4, 4     # the autotuner's first config


class PendingNorm(NamedTuple):
    """``norm(x + delta)`` not computed yet: the MLP's gate/up GEMM computes it in its prologue and
    stores the sum ``x + delta`` into ``h``."""
    x: torch.Tensor
    delta: torch.Tensor
    norm: layers.RMSNorm
    h: torch.Tensor


def _gemm(prologue, a, aux, norm_weight, weight, eps, Kd, s=None):
    """``y [M, N] = prologue(a) @ weightᵀ`` (and ``s``, the residual sum, with ``NORM`` and aux)."""
    M, N = a.shape[0], weight.shape[0]
    y = torch.empty(M, N, device=a.device, dtype=a.dtype)
    _KERNEL[(cdiv(M, BM), cdiv(N, BN))](
        a, a if aux is None else aux, weight if norm_weight is None else norm_weight, weight,
        y if s is None else s, y, M, N, Kd, a.stride(0), 0 if aux is None else aux.stride(0),
        eps, prologue, s is not None, 1, a.dtype == torch.float32, BM, BN, BK,
        num_warps=WARPS, num_stages=STAGES)
    return y


def _mlp_forward(mlp, x):
    """The MLP's forward (as ``MLP.forward``) on rows, or on a :class:`PendingNorm`: two GEMMs."""
    if not isinstance(x, PendingNorm):
        return plain_mlp_forward(mlp, x)
    D = x.x.shape[1]
    gate_up = _gemm(NORM.value, x.x, x.delta, x.norm.weight, mlp.gate_up, x.norm.eps, D, s=x.h)
    return _gemm(SWIGLU.value, gate_up, None, None, mlp.down, 0.0, gate_up.shape[1] // 2)


plain_mlp_forward = layers.MLP.forward


@contextlib.contextmanager
def prologue_mlp():
    """Inside, every layer of every model runs its MLP half as two prologue GEMMs (module
    docstring); restored on exit. A layer's MLP norm is switched at the layer's first call."""
    switched = []

    def pending(norm):
        def fused_add_norm(x, delta):
            if delta is None:  # nothing to add: the package's path
                return layers.RMSNorm.fused_add_norm(norm, x, delta)
            h = torch.empty_like(x)
            return h, PendingNorm(x, delta, norm, h)
        return fused_add_norm

    def layer_forward(layer, *args):
        if "fused_add_norm" not in vars(layer.mlp_norm):
            layer.mlp_norm.fused_add_norm = pending(layer.mlp_norm)
            switched.append(layer.mlp_norm)
        return plain_layer_forward(layer, *args)

    hybrid.HybridLayer.forward, layers.MLP.forward = layer_forward, _mlp_forward
    try:
        yield
    finally:
        hybrid.HybridLayer.forward, layers.MLP.forward = plain_layer_forward, plain_mlp_forward
        for norm in switched:
            del norm.fused_add_norm


plain_layer_forward = hybrid.HybridLayer.forward
