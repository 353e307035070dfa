"""Every norm and SwiGLU of the layers inside the projection after it, for the eager A/B.

The package runs each layer as ``add_rms_norm`` (a Triton kernel: the residual add and the norm)
then the mixer's in-projection (cuBLAS), and for the MLP ``add_rms_norm``, the gate/up GEMM,
``silu_mul`` (Triton) and the down GEMM. With :func:`prologue_norms`, :mod:`.prologue_gemms`'
kernels do both norms and the SwiGLU in the prologue of the GEMM after them (the GEMM with a norm
also stores the residual sum ``h``): 3 launches fewer per layer (179 of the 690 GPU operations of
an eager ``fused`` forward of ``qwen3.5-tp8``; the first layer has no residual to add), each GEMM
a Triton one instead of cuBLAS's. The final norm and the LM head stay as they are.

How it slots in without another copy of the layers' forwards: inside the context, a layer's
``fused_add_norm(x, delta)`` returns ``h`` still empty and a :class:`PendingNorm` in place of the
normed rows, ``silu_mul(gate_up)`` returns a :class:`PendingSwiGLU`, and the layers' ``F.linear``
runs the prologue GEMM when handed one of them (and torch's otherwise). The GEMM fills ``h``
before anything reads it (the next norm). A layer's norms are switched when the layer first runs
inside the context, so it needs no model.

The GEMMs launch with one fixed tiling through the package's bound launches (no autotuning: the
A/B times the host's launch path, and a bound launch is what the package's own kernels get).
"""

from __future__ import annotations

import contextlib
import types
from typing import NamedTuple

import torch
import torch.nn.functional as F

from mamba_edu.kernels.launcher import bound_kernel
from mamba_edu.lab.prologue_gemms import NORM, SWIGLU, launch_prologue_linear, prologue_linear_kernel
from mamba_edu.model import hybrid, layers

_KERNEL = bound_kernel(prologue_linear_kernel.fn)  # the JIT function under the autotuner
TILING = (64, 128, 64, 4, 4)  # BM, BN, BK, warps, stages: the autotuner's first config


class PendingNorm(NamedTuple):
    """``norm(x + delta)`` not computed yet: the next projection computes it in its prologue and
    stores the sum ``x + delta`` into ``h``."""
    x: torch.Tensor
    delta: torch.Tensor
    norm: layers.RMSNorm
    h: torch.Tensor

    @property
    def shape(self):  # a mixer reads the token count off its input
        return self.x.shape


class PendingSwiGLU(NamedTuple):
    """``silu(gate) · up`` of ``gate_up [T, 2F]`` not computed yet: the down projection's prologue."""
    gate_up: torch.Tensor


def _gemm(prologue, a, aux, norm_weight, weight, eps, Kd, s=None):
    """``y [M, N] = prologue(a) @ weightᵀ`` at :data:`TILING` (and ``s``, the residual sum, with
    ``NORM`` and aux)."""
    return launch_prologue_linear(prologue, a, aux, norm_weight, weight, eps, Kd, s=s, kernel=_KERNEL,
                                  tiling=TILING)[1]


def _linear(x, weight):
    """The layers' ``F.linear`` inside the context: a prologue GEMM for a pending input."""
    if isinstance(x, PendingNorm):
        return _gemm(NORM.value, x.x, x.delta, x.norm.weight, weight, x.norm.eps, x.x.shape[1], s=x.h)
    if isinstance(x, PendingSwiGLU):
        return _gemm(SWIGLU.value, x.gate_up, None, None, weight, 0.0, x.gate_up.shape[1] // 2)
    return F.linear(x, weight)


def _pending(norm):
    """``norm.fused_add_norm`` inside the context."""
    def fused_add_norm(x, delta):
        if delta is None:  # nothing to add: the package's path
            return layers.RMSNorm.fused_add_norm(norm, x, delta)
        h = torch.empty_like(x)
        return h, PendingNorm(x, delta, norm, h)
    return fused_add_norm


@contextlib.contextmanager
def prologue_norms():
    """Inside, every layer of every model runs its norms and SwiGLU in the prologue of the GEMM
    after them (module docstring); restored on exit."""
    switched = []

    def layer_forward(layer, *args):
        for norm in (layer.mixer_norm, layer.mlp_norm):
            if "fused_add_norm" not in vars(norm):
                norm.fused_add_norm = _pending(norm)
                switched.append(norm)
        return plain["forward"](layer, *args)

    plain = dict(forward=hybrid.HybridLayer.forward, F=layers.F, silu_mul=layers.silu_mul)
    hybrid.HybridLayer.forward = layer_forward
    layers.F, layers.silu_mul = types.SimpleNamespace(linear=_linear), PendingSwiGLU
    try:
        yield
    finally:
        hybrid.HybridLayer.forward = plain["forward"]
        layers.F, layers.silu_mul = plain["F"], plain["silu_mul"]
        for norm in switched:
            del norm.fused_add_norm
