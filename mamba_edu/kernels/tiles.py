"""Small Triton helpers shared by the kernels: masked tile loads, the fused q/k L2 norm, the
Qwen3-Next gating, configs.

Everything is plain pointer arithmetic with masks (no block pointers: docs/conventions.md), and every
load is masked, because the Triton interpreter does not check bounds.
"""

import triton
import triton.language as tl

from mamba_edu._runtime import triton_interpreted


@triton.jit
def load_rows(ptr, t0, t_end, row_stride, col0, n_cols,
              ROWS: tl.constexpr, COLS: tl.constexpr):
    """Load rows ``t0 .. t0+ROWS`` (only those ``< t_end``) and columns ``col0 .. col0+COLS``
    (only those ``< n_cols``) of a row-major matrix as a ``[ROWS, COLS]`` tile in the stored
    dtype, zeros outside. ``ptr`` already points at the head's first column."""
    rows = t0 + tl.arange(0, ROWS)
    cols = col0 + tl.arange(0, COLS)
    mask = (rows < t_end)[:, None] & (cols < n_cols)[None, :]
    offs = rows.to(tl.int64)[:, None] * row_stride + cols[None, :]
    return tl.load(ptr + offs, mask=mask, other=0.0)


@triton.jit
def store_rows(ptr, value, t0, t_end, row_stride, col0, n_cols,
               ROWS: tl.constexpr, COLS: tl.constexpr):
    """Store a ``[ROWS, COLS]`` tile where :func:`load_rows` would have read it (cast to the
    destination dtype)."""
    rows = t0 + tl.arange(0, ROWS)
    cols = col0 + tl.arange(0, COLS)
    mask = (rows < t_end)[:, None] & (cols < n_cols)[None, :]
    offs = rows.to(tl.int64)[:, None] * row_stride + cols[None, :]
    tl.store(ptr + offs, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def l2norm_rows(x, USE_L2NORM: tl.constexpr):
    """``x / sqrt(Σx² + 1e-6)`` along the last axis of a ``[ROWS, COLS]`` fp32 tile (eps inside)."""
    if USE_L2NORM:
        x = x * tl.rsqrt(tl.sum(x * x, 1) + 1e-6)[:, None]
    return x


@triton.jit
def gate_values(a, b, A_log, dt_bias):
    """Log-decay ``g = −e^{A_log}·softplus(a + dt_bias)`` (softplus threshold 20) and write
    strength ``β = sigmoid(b)`` from the raw projections, in fp32 (any matching shapes)."""
    x = a.to(tl.float32) + dt_bias.to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    # exp(A_log) capped at the largest fp32, as gdn_gating does: an A_log of 100 would give inf,
    # and inf · 0 (a softplus that underflowed) is NaN; capped, g is −inf or finite.
    rate = tl.minimum(tl.exp(A_log.to(tl.float32)), 3.4028234663852886e38)
    return -rate * softplus, tl.sigmoid(b.to(tl.float32))


@triton.jit
def as_vector(scalar, like):
    """``scalar`` broadcast to the shape of the integer tensor ``like``. A mask built from a loaded
    scalar must be made from such a vector: the interpreter rejects a scalar boolean in a mask."""
    return tl.zeros_like(like) + scalar


def tuning_configs(*configs: tuple) -> list:
    """Autotune configs from ``(num_warps, num_stages)`` or ``(num_warps, num_stages, meta)``
    tuples (``meta``: constexpr values such as a block size). On a GPU all of them; under the
    interpreter only the first, where autotuning with several configs fails (docs/conventions.md)."""
    if triton_interpreted():
        configs = configs[:1]
    return [triton.Config(c[2] if len(c) > 2 else {}, num_warps=c[0], num_stages=c[1])
            for c in configs]


def cdiv(a: int, b: int) -> int:
    """``⌈a / b⌉`` of non-negative ints: launch grids in plain integer arithmetic (the host runs
    it for every launch of every layer)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``≥ n`` (1 for ``n ≤ 1``): a tile width."""
    return 1 << max(n - 1, 0).bit_length()
