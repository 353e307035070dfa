"""Projections that compute the small op before them in their own prologue: one Triton GEMM where
the forward otherwise launches a norm (or SwiGLU) kernel and then a cuBLAS GEMM.

- :func:`norm_linear`: ``s = x + delta``; ``y = rms_norm(s) · w_n @ Wᵀ``, the pre-norm residual
  step and the projection after it (a GDN layer's in-projection, attention's QKV, the MLP's
  gate/up, the LM head);
- :func:`swiglu_linear`: ``y = (silu(gate) · up) @ Wᵀ``, the MLP's down projection;
- :func:`gated_norm_linear`: ``y = (rms_norm(o) · w_n · silu(z) per head) @ Wᵀ``, a GDN layer's
  output norm and out-projection.

Why it can be one kernel: a program of the GEMM owns a ``[BM, BN]`` tile of ``y`` and walks the
*whole* row of its input, ``BK`` columns at a time. So it can add ``delta``, sum the squares of
the rows as it goes, and multiply its accumulator by ``rsqrt(mean(s²) + eps)`` at the end: the
norm is a per-row scale, ``diag(r)·(s·w_n)·Wᵀ = diag(r)·((s·w_n)·Wᵀ)``. Every program of a row
block adds the same ``delta`` again; the first column block also stores ``s``, the new residual.
The GDN output norm is per head of ``V`` columns, so that kernel steps one head at a time and
norms it before the product.

Where it stands: in the 1 × 512 graph replay (notebook 10 counts them), folding the norms and
SwiGLU this way would remove about a third of the forward's kernels; it pays only if these GEMMs
are not much slower than cuBLAS's. That has never been measured on a GPU, so the package's model
keeps its two launches (a norm or SwiGLU kernel, then ``F.linear``) and these kernels live here.
Each entry point runs the fused kernel (the Triton interpreter on a CPU, fp32 or fp16).

Numerics: the SwiGLU and gated-norm operands are rounded to the input dtype exactly as their
own kernels store them. For the residual norm, the two-launch path rounds ``h = s·r·w_n`` before
its GEMM; here ``s·w_n`` is rounded and ``r`` applied to the fp32 accumulator, so the results
agree to that rounding (one ulp of the dtype per input element), not bit for bit. fp32 inputs
multiply in full fp32 (``input_precision="ieee"``), like torch's default ``F.linear``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mamba_edu.kernels.tiles import tuning_configs
from mamba_edu.kernels.validation import check_eps, check_tensor, device_of, resolve_impl

NORM = tl.constexpr(1)    # PROLOGUE values of the kernel
SWIGLU = tl.constexpr(2)
GATED = tl.constexpr(3)


# (num_warps, num_stages, tile): the first is the interpreter's; a GPU autotunes over all of them
# (skipping those whose pipeline does not fit in shared memory: with a gated norm's 128-column
# steps, the wide tiles).
_CONFIGS = tuning_configs(
    (4, 4, {"BM": 64, "BN": 128, "BK": 64}),
    (8, 3, {"BM": 128, "BN": 128, "BK": 64}),
    (4, 4, {"BM": 64, "BN": 64, "BK": 64}),
    (8, 3, {"BM": 64, "BN": 256, "BK": 64}),
    (4, 4, {"BM": 16, "BN": 64, "BK": 128}),   # the LM head: one row per sequence
)


@triton.jit
def _times_weight(acc, a, w_ptr, cols, ks, N, Kd, IEEE: tl.constexpr):
    """``acc + a @ W[cols, ks]ᵀ``: ``a [BM, BK]`` in the weights' dtype, ``W [N, Kd]``."""
    w = tl.load(w_ptr + cols.to(tl.int64)[:, None] * Kd + ks[None, :],
                mask=(cols < N)[:, None] & (ks < Kd)[None, :], other=0.0)
    if IEEE:
        acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, tl.trans(w), acc)
    return acc


@triton.autotune(_CONFIGS, key=["M", "N", "Kd", "PROLOGUE", "HAS_DELTA", "HEAD"])
@triton.jit
def prologue_linear_kernel(a_ptr, aux_ptr, norm_w_ptr, w_ptr, s_ptr, y_ptr, M, N, Kd,
                           stride_a, stride_aux, eps, PROLOGUE: tl.constexpr,
                           HAS_DELTA: tl.constexpr, HEAD: tl.constexpr, IEEE: tl.constexpr,
                           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Tile ``(pid_m, pid_n)`` of ``y [M, N] = prologue(a) @ Wᵀ`` with ``W [N, Kd]`` contiguous;
    ``a`` and ``aux`` have row strides ``stride_a``, ``stride_aux``.

    - ``NORM``: ``a [M, Kd]``, plus ``aux [M, Kd]`` (delta) with ``HAS_DELTA``, the sum stored
      rounded in ``s [M, Kd]`` by the programs with ``pid_n = 0``; times ``norm_w [Kd]``; rows
      scaled by ``rsqrt(mean(s²) + eps)`` after the product.
    - ``SWIGLU``: ``a [M, 2·Kd]``; the operand is ``silu(a[:, :Kd]) · a[:, Kd:]`` rounded to a's
      dtype, as the SwiGLU kernel stores it.
    - ``GATED``: ``a [M, Kd]`` holds heads of ``HEAD`` columns (a power of two), ``aux [M, Kd]``
      the gate ``z``; the operand is ``rms_norm(head) · norm_w [HEAD] · silu(z)``, rounded as the
      gated norm kernel stores it. One head per step (``BK`` unused): its norm needs all of it.
    """
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    dtype = y_ptr.dtype.element_ty
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    a_rows = a_ptr + rows.to(tl.int64)[:, None] * stride_a
    aux_rows = aux_ptr + rows.to(tl.int64)[:, None] * stride_aux
    if PROLOGUE == GATED:
        w_n = tl.load(norm_w_ptr + tl.arange(0, HEAD)).to(tl.float32)
        for k0 in range(0, Kd, HEAD):
            ks = k0 + tl.arange(0, HEAD)
            mask = (rows < M)[:, None] & (ks < Kd)[None, :]
            o = tl.load(a_rows + ks[None, :], mask=mask, other=0.0).to(tl.float32)
            z = tl.load(aux_rows + ks[None, :], mask=mask, other=0.0).to(tl.float32)
            rstd = tl.rsqrt(tl.sum(o * o, 1) / HEAD + eps)
            normed = o * rstd[:, None] * w_n[None, :]
            acc = _times_weight(acc, (normed * z * tl.sigmoid(z)).to(dtype), w_ptr, cols, ks, N,
                                Kd, IEEE)
    else:
        sum_sq = tl.zeros((BM,), dtype=tl.float32)
        for k0 in range(0, Kd, BK):
            ks = k0 + tl.arange(0, BK)
            mask = (rows < M)[:, None] & (ks < Kd)[None, :]
            if PROLOGUE == SWIGLU:
                gate = tl.load(a_rows + ks[None, :], mask=mask, other=0.0).to(tl.float32)
                up = tl.load(a_rows + Kd + ks[None, :], mask=mask, other=0.0).to(tl.float32)
                a = (gate * tl.sigmoid(gate) * up).to(dtype)
            else:
                s = tl.load(a_rows + ks[None, :], mask=mask, other=0.0)
                if HAS_DELTA:
                    delta = tl.load(aux_rows + ks[None, :], mask=mask, other=0.0)
                    s = (s.to(tl.float32) + delta.to(tl.float32)).to(dtype)
                    if pid_n == 0:
                        tl.store(s_ptr + rows.to(tl.int64)[:, None] * Kd + ks[None, :], s,
                                 mask=mask)
                s = s.to(tl.float32)
                sum_sq += tl.sum(s * s, 1)
                w_n = tl.load(norm_w_ptr + ks, mask=ks < Kd, other=0.0).to(tl.float32)
                a = (s * w_n[None, :]).to(dtype)
            acc = _times_weight(acc, a, w_ptr, cols, ks, N, Kd, IEEE)
        if PROLOGUE == NORM:
            acc = acc * tl.rsqrt(sum_sq / Kd + eps)[:, None]
    tl.store(y_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], acc.to(dtype),
             mask=(rows < M)[:, None] & (cols < N)[None, :])


def launch_prologue_linear(prologue, a, aux, norm_weight, weight, eps, Kd, head=1, s=None, kernel=None,
                           tiling=()):
    """Run :func:`prologue_linear_kernel`; returns ``(s or None, y [M, N])`` in a's dtype
    (``s``: the residual sum, with ``NORM`` and a delta in ``aux``; written into ``s`` when
    given). ``kernel, tiling``: the JIT function under the autotuner (bound, say) and its
    ``(BM, BN, BK, num_warps, num_stages)``, to launch at one tiling instead of autotuning."""
    M, N = a.shape[0], weight.shape[0]
    y = torch.empty(M, N, device=a.device, dtype=a.dtype)
    has_delta = prologue == NORM.value and aux is not None
    if has_delta and s is None:
        s = torch.empty(M, Kd, device=a.device, dtype=a.dtype)
    args = (a, a if aux is None else aux, weight if norm_weight is None else norm_weight, weight,
            y if s is None else s, y, M, N, Kd, a.stride(0), 0 if aux is None else aux.stride(0),
            eps, prologue, has_delta, head, a.dtype == torch.float32)
    if kernel is None:
        prologue_linear_kernel[lambda meta: (triton.cdiv(M, meta["BM"]), triton.cdiv(N, meta["BN"]))](*args)
    else:
        BM, BN, BK, warps, stages = tiling
        kernel[(-(-M // BM), -(-N // BN))](*args, BM, BN, BK, num_warps=warps, num_stages=stages)
    return s, y


def _check_device(name: str, t: torch.Tensor) -> None:
    """The fused kernel runs where Triton does: CUDA, or the interpreter (fp32, fp16) on a CPU."""
    resolve_impl("triton", t.device, t.dtype, name)


def _check_weight(weight, in_features: int, like: torch.Tensor) -> None:
    check_tensor("weight", weight, (None, in_features), device=like.device, dtypes=(like.dtype,))


def norm_linear(x, delta, norm_weight, eps, weight):
    """The pre-norm residual step and the projection after it:
    ``s = x + delta`` (``s = x`` when ``delta`` is None), ``y = rms_norm(s) · norm_weight @ weightᵀ``.

    Args:
        x, delta: ``[T, D]`` (row-strided allowed, one dtype; delta may be None);
        norm_weight: ``[D]``; weight: ``[N, D]`` contiguous; all in x's dtype.
    Returns:
        ``(s, y)``: the residual stream ``[T, D]`` and the projection ``[T, N]``, in x's dtype.
    """
    check_tensor("x", x, (None, None), device=device_of("x", x), rows=True)
    D = x.shape[1]
    if delta is not None:
        check_tensor("delta", delta, tuple(x.shape), device=x.device, dtypes=(x.dtype,), rows=True)
    check_tensor("norm_weight", norm_weight, (D,), device=x.device, dtypes=(x.dtype,))
    _check_weight(weight, D, x)
    eps = check_eps(eps)
    _check_device("x", x)
    s, y = launch_prologue_linear(NORM.value, x, delta, norm_weight, weight, eps, D)
    return (x if s is None else s), y


def swiglu_linear(gate_up, weight):
    """The MLP's down projection of its SwiGLU product: ``(silu(gate) · up) @ weightᵀ``.

    Args:
        gate_up: ``[T, 2F]``, gate and up halves side by side (row-strided allowed);
        weight: ``[N, F]`` contiguous, in gate_up's dtype.
    Returns:
        ``[T, N]`` in gate_up's dtype.
    """
    check_tensor("gate_up", gate_up, (None, None), device=device_of("gate_up", gate_up), rows=True)
    if gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must have an even last dim (gate and up halves); got {gate_up.shape[1]}")
    Fw = gate_up.shape[1] // 2
    _check_weight(weight, Fw, gate_up)
    _check_device("gate_up", gate_up)
    return launch_prologue_linear(SWIGLU.value, gate_up, None, None, weight, 0.0, Fw)[1]


def gated_norm_linear(o, z, norm_weight, eps, weight):
    """The GDN output norm and the out-projection after it:
    ``y = (rms_norm(o) · norm_weight · silu(z), per value head) @ weightᵀ``.

    Args:
        o: ``[T, HV, V]`` contiguous, the unnormed output of the GDN core; z: ``[T, HV·V]``
            (row-strided allowed: a column slice of the in-projection); norm_weight: ``[V]``;
            weight: ``[N, HV·V]`` contiguous; all in o's dtype.
        The kernel takes one head per step, so V must be a power of two, at least 16.
    Returns:
        ``[T, N]`` in o's dtype.
    """
    check_tensor("o", o, (None, None, None), device=device_of("o", o))
    T, HV, V = o.shape
    check_tensor("z", z, (T, HV * V), device=o.device, dtypes=(o.dtype,), rows=True)
    check_tensor("norm_weight", norm_weight, (V,), device=o.device, dtypes=(o.dtype,))
    _check_weight(weight, HV * V, o)
    eps = check_eps(eps)
    _check_device("o", o)
    if V < 16 or V & (V - 1):
        raise ValueError(f"o's head dim V={V} must be a power of two >= 16 for the fused kernel")
    return launch_prologue_linear(GATED.value, o.view(T, HV * V), z, norm_weight, weight, eps, HV * V,
                                  V)[1]
