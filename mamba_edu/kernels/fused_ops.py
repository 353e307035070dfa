"""Fused elementwise ops of the model's forward: RMSNorm (plain, after the residual add, gated by
``silu(z)`` per head), the SwiGLU product and RoPE, each one Triton launch on a GPU.

A launch-bound forward (a CUDA-graph-replayed prefill of a small batch) spends its time in the gaps
between tiny kernels; the written-out torch expressions launch several each (an add and a norm, a
norm, a silu and a multiply, a rotation of two halves and a concatenation).

``impl="auto"`` runs Triton on CUDA tensors and the torch expression elsewhere (so CPU results
are the model's own); ``"triton"`` forces the kernel (the interpreter on CPU: fp32/fp16 only);
``"torch"`` forces the expression. Inputs may be *row-strided* where stated (column slices of a
wider projection, each row contiguous); every result is a new contiguous tensor in the input's
dtype, computed in fp32 inside the kernels.

The functions here do not check their arguments: the model calls them in every layer with
tensors it built itself. :mod:`mamba_edu.kernels` exports the same five functions with their
checks (:mod:`.api`), for a learner who calls them directly.

Every kernel works on rows: row ``r`` of a ``[T, heads, width]`` tensor is head ``r % heads`` of
token ``r // heads`` (``heads = 1`` for ``[T, width]``), and one program owns ``ROWS`` rows.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from mamba_edu.kernels.launcher import bound_kernel
from mamba_edu.kernels.tiles import cdiv, next_power_of_2
from mamba_edu.kernels.validation import runs_torch


@triton.jit
def row_starts(rows, heads, row_stride, head_stride):
    """Element offsets ``[ROWS]`` (int64) of rows ``r = t·heads + h``: token ``t`` starts at
    ``t·row_stride``, head ``h`` at ``h·head_stride`` within it."""
    return (rows // heads).to(tl.int64) * row_stride + (rows % heads) * head_stride


@bound_kernel
@triton.jit
def rms_norm_kernel(x_ptr, delta_ptr, z_ptr, w_ptr, s_ptr, y_ptr, n_rows, heads, D,
                    stride_x, stride_delta, stride_z, eps,
                    ROWS: tl.constexpr, BLOCK: tl.constexpr, HAS_DELTA: tl.constexpr,
                    HAS_GATE: tl.constexpr):
    """``y = rms_norm(x [+ delta]) · w [· silu(z)]`` over rows of width ``D`` (whole rows in one
    tile); with ``HAS_DELTA`` the rounded sum is stored in ``s`` and normalised."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows < n_rows)[:, None] & (cols < D)[None, :]
    out = rows.to(tl.int64)[:, None] * D + cols[None, :]  # s and y are contiguous
    x = tl.load(x_ptr + row_starts(rows, heads, stride_x, D)[:, None] + cols[None, :],
                mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:
        delta = tl.load(delta_ptr + row_starts(rows, heads, stride_delta, D)[:, None] + cols[None, :],
                        mask=mask, other=0.0)
        s = (x + delta.to(tl.float32)).to(s_ptr.dtype.element_ty)
        tl.store(s_ptr + out, s, mask=mask)
        x = s.to(tl.float32)  # normalise the sum as stored, like the torch expression
    rstd = tl.rsqrt(tl.sum(x * x, 1) / D + eps)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    if HAS_GATE:
        z = tl.load(z_ptr + row_starts(rows, heads, stride_z, D)[:, None] + cols[None, :],
                    mask=mask, other=0.0).to(tl.float32)
        y = y * z * tl.sigmoid(z)
    tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=mask)


@bound_kernel
@triton.jit
def silu_mul_kernel(gu_ptr, y_ptr, T, Fw, stride_gu,
                    ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """``y[:, c] = silu(gu[:, c]) · gu[:, Fw + c]`` for a ``[ROWS, BLOCK]`` tile of columns."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (rows < T)[:, None] & (cols < Fw)[None, :]
    src = gu_ptr + rows.to(tl.int64)[:, None] * stride_gu + cols[None, :]
    gate = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(src + Fw, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows.to(tl.int64)[:, None] * Fw + cols[None, :],
             (gate * tl.sigmoid(gate) * up).to(y_ptr.dtype.element_ty), mask=mask)


@bound_kernel
@triton.jit
def rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, n_rows, heads, HALF, stride_x,
                ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Rotate-half RoPE of rows of width ``2·HALF``; ``cos, sin [T, HALF]`` are per token."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows < n_rows)[:, None] & (cols < HALF)[None, :]
    src = x_ptr + row_starts(rows, heads, stride_x, 2 * HALF)[:, None] + cols[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    table = row_starts(rows, heads, HALF, 0)[:, None] + cols[None, :]
    cos = tl.load(cos_ptr + table, mask=mask, other=0.0)
    sin = tl.load(sin_ptr + table, mask=mask, other=0.0)
    dst = y_ptr + rows.to(tl.int64)[:, None] * (2 * HALF) + cols[None, :]
    tl.store(dst, (x1 * cos - x2 * sin).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(y_ptr.dtype.element_ty), mask=mask)


@functools.cache  # a handful of widths per model; a hit enters no Python frame
def _tiling(width: int, max_block: int = 1 << 30) -> tuple[int, int, int, int]:
    """``(BLOCK, ROWS, num_warps, column tiles)``: columns per tile (a power of two), rows per
    program so that a tile holds ~2K elements, about 16 elements per thread, 1 to 8 warps, and
    ``⌈width / BLOCK⌉`` tiles across a row (1 unless ``max_block`` cuts the row)."""
    block = min(next_power_of_2(width), max_block)
    rows = max(1, min(16, 2048 // block))
    return block, rows, min(8, max(1, rows * block // 512)), cdiv(width, block)


def _launch_rms(x, delta, z, weight, eps, heads, stride_x, want_sum):
    """Launch :func:`rms_norm_kernel` over ``x.numel() // D`` rows; returns ``(s or None, y)``,
    both contiguous ``[rows, D]`` in x's dtype."""
    D = weight.shape[0]
    n_rows = math.prod(x.shape[:-1])  # the last dim is D (rms_norm's [T, D], the output norm's [T, HV, V])
    y = torch.empty(n_rows, D, device=x.device, dtype=x.dtype)
    s = torch.empty_like(y) if want_sum else None
    if y.numel() == 0:  # nothing to normalise: no launch (a grid of 0 programs, or D = 0)
        return s, y
    block, rows, warps, _ = _tiling(D)
    rms_norm_kernel[(cdiv(n_rows, rows),)](
        x, delta, z, weight, s, y, n_rows, heads, D, stride_x,
        0 if delta is None else delta.stride(0), 0 if z is None else z.stride(0), eps, rows, block,
        delta is not None, z is not None, num_warps=warps)
    return s, y


def rms_norm(x, weight, eps, impl="auto"):
    """``x · rsqrt(mean(x²) + eps) · weight`` per row: ``x [T, D]`` (row-strided allowed),
    ``weight [D]`` in x's dtype → ``[T, D]``."""
    if runs_torch(impl, x.device):
        return F.rms_norm(x, (x.shape[1],), weight, eps)
    return _launch_rms(x, None, None, weight, eps, 1, x.stride(0), False)[1]


def add_rms_norm(x, delta, weight, eps, impl="auto"):
    """The pre-norm residual step: ``s = x + delta`` (rounded to x's dtype), then ``rms_norm(s)``.
    ``x, delta [T, D]`` (row-strided allowed) → ``(s, n)``, both ``[T, D]``."""
    if runs_torch(impl, x.device):
        s = x + delta
        return s, F.rms_norm(s, (x.shape[1],), weight, eps)
    return _launch_rms(x, delta, None, weight, eps, 1, x.stride(0), True)


def gated_rms_norm(o, z, weight, eps, impl="auto"):
    """The GDN output norm, ``rms_norm(o) · weight · silu(z)`` per head over V: ``o [T, HV, V]``
    contiguous, ``z [T, HV·V]`` (row-strided allowed), ``weight [V]`` → ``[T, HV, V]``."""
    T, HV, V = o.shape
    if runs_torch(impl, o.device):
        return F.rms_norm(o, (V,), weight, eps) * F.silu(z.view(T, HV, V))
    return _launch_rms(o, None, z, weight, eps, HV, HV * V, False)[1].view(T, HV, V)


def silu_mul(gate_up, impl="auto"):
    """The SwiGLU product ``silu(gate) · up``: ``gate_up [T, 2F]`` (the halves side by side,
    row-strided allowed) → ``[T, F]``."""
    if runs_torch(impl, gate_up.device):
        gate, up = gate_up.chunk(2, -1)
        return F.silu(gate) * up
    T, F2 = gate_up.shape
    Fw = F2 // 2
    y = torch.empty(T, Fw, device=gate_up.device, dtype=gate_up.dtype)
    if y.numel() == 0:
        return y
    block, rows, warps, col_tiles = _tiling(Fw, max_block=1024)
    silu_mul_kernel[(cdiv(T, rows), col_tiles)](
        gate_up, y, T, Fw, gate_up.stride(0), rows, block, num_warps=warps)
    return y


def rope(x, cos, sin, impl="auto"):
    """Rotary position embedding, rotate-half form: ``x [T, heads, D]`` (each ``x[t]``
    contiguous), ``cos, sin [T, 1, D/2]`` fp32 (:func:`mamba_edu.model.layers.rope_tables`) →
    ``[T, heads, D]``."""
    if runs_torch(impl, x.device):
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
    T, heads, D = x.shape
    y = torch.empty(T, heads, D, device=x.device, dtype=x.dtype)
    block, rows, warps, _ = _tiling(D // 2)
    rope_kernel[(cdiv(T * heads, rows),)](
        x, cos, sin, y, T * heads, heads, D // 2, x.stride(0), rows, block, num_warps=warps)
    return y
