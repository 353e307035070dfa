"""Causal depthwise conv1d with SiLU, for prefill (packed varlen) and the decode update.

``y[t, c] = silu(bias[c] + Σ_j weight[c, j] · x̃[t − (W−1) + j, c])`` with ``x̃`` = the sequence's
conv state (its previous ``W−1`` raw inputs) followed by its tokens (docs/conventions.md).

Prefill grid ``(NT, ⌈D/BD⌉)`` or ``(⌈D/BD⌉, NT)`` (:func:`conv_launch`): one program per 64-token
chunk and channel block. The conv is memory-bound (4 multiply-adds per element read), so the
main tile only reads x, with loads that are contiguous along the channels; only the first ``W−1``
rows of a sequence reach into the conv state, whose ``[D, W−1]`` layout makes those reads
strided, so the programs of a sequence's first chunk compute them in a small second tile
(:func:`_conv_head`, a branch the other programs skip). That program also writes the new state
(the last ``W−1`` columns of ``x̃``) after a barrier: no other program reads the slot, so there
is no race. A negative slot index means no state (zeros) and no write.

With ``TRACK`` (the ``fused`` tracking strategy) the same program also saves the conv window at a
chunk boundary of the sequence, ``x̃``'s ``W−1`` columns before token ``min(64·chunk, L)``, into
the sequence's track slot: the prefix cache's conv snapshot, with no gather/scatter kernels.
"""

import torch
import triton
import triton.language as tl

from mamba_edu.kernels.launcher import bound_kernel
from mamba_edu.kernels.tiles import as_vector, cdiv, next_power_of_2


@triton.jit
def _tap(x_ptr, w_ptr, state_ptr, rows, cols, cols_ok, live, state_live, bos, stride_x,
         j: tl.constexpr, W: tl.constexpr, READ_STATE: tl.constexpr):
    """Tap ``j`` of :func:`_conv_rows`: ``weight[c, j] · x̃[t − (W−1) + j, c]``, ``[R, BD]`` fp32."""
    src = rows - (W - 1) + j                 # token that tap j multiplies
    xj = tl.load(x_ptr + tl.maximum(src, bos).to(tl.int64)[:, None] * stride_x + cols[None, :],
                 mask=live & (src >= bos)[:, None], other=0.0).to(tl.float32)
    if READ_STATE:
        xj += tl.load(state_ptr[None, :] + tl.maximum(src - bos + (W - 1), 0)[:, None],
                      mask=state_live & (src < bos)[:, None], other=0.0).to(tl.float32)
    wj = tl.load(w_ptr + cols * W + j, mask=cols_ok, other=0.0).to(tl.float32)
    return xj * wj[None, :]


@triton.jit
def _conv_rows(x_ptr, w_ptr, bias_ptr, state_ptr, rows, cols, cols_ok, live, state_live, bos,
               stride_x, W: tl.constexpr, READ_STATE: tl.constexpr, HAS_BIAS: tl.constexpr,
               SILU: tl.constexpr):
    """Outputs ``[R, BD]`` (fp32) for the token rows ``rows [R]`` of the sequence that starts at
    ``bos`` and the channels ``cols [BD]`` (``cols_ok``: those below D); ``live [R, BD]`` masks
    the x reads. Inputs before ``bos`` come from the conv state at ``state_ptr [BD]`` (column 0
    of each channel) where ``state_live`` with ``READ_STATE``, else they count as zeros.

    The taps read the same lines of x, shifted by up to W−1 rows. Issued together, the W loads of
    a line most likely all miss L1 and go to L2. So the unshifted tap goes first and a barrier
    follows it, and the shifted taps can find their lines in L1 (faster on the H200:
    data/benchmarks/conv_launch.md)."""
    acc = tl.where(live, 0.0, 0.0)  # fp32 zeros of the tile's shape
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols_ok, other=0.0).to(tl.float32)[None, :]
    acc += _tap(x_ptr, w_ptr, state_ptr, rows, cols, cols_ok, live, state_live, bos, stride_x,
                W - 1, W, READ_STATE)
    tl.debug_barrier()
    for j in tl.static_range(W - 1):
        acc += _tap(x_ptr, w_ptr, state_ptr, rows, cols, cols_ok, live, state_live, bos,
                    stride_x, j, W, READ_STATE)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    return acc


# Launch configurations ``(num_warps, BD, CHANNELS_FIRST)``, fixed from H200 measurements
# (data/benchmarks/conv_launch.md). CHANNELS_FIRST orders the grid with channel blocks fastest, so
# that the programs running together read whole rows of x. Large batches take 64 channels per
# program, small ones 32, which doubles their programs. An autotuner's timing at small shapes
# (eager launches, with a copy of the pool restored around each) was noise, so the choice is fixed.
WIDE_LAUNCH = (4, 64, True)
NARROW_LAUNCH = (4, 32, True)
WIDE_FROM = 2048  # programs that 64-channel blocks must give for WIDE_LAUNCH


def conv_launch(n_chunks: int, D: int) -> tuple[int, int, bool]:
    """The launch configuration for ``n_chunks`` chunks of ``D`` channels."""
    return WIDE_LAUNCH if n_chunks * cdiv(D, 64) >= WIDE_FROM else NARROW_LAUNCH


@bound_kernel
@triton.jit
def conv1d_prefill_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, pool_ptr, state_idx_ptr,
                          track_slot_ptr, track_chunk_ptr, cu_ptr, chunk_idx_ptr, D, stride_x,
                          W: tl.constexpr, HEAD: tl.constexpr, SILU: tl.constexpr,
                          BD: tl.constexpr, CHANNELS_FIRST: tl.constexpr,
                          HAS_BIAS: tl.constexpr, TRACK: tl.constexpr):
    """One (chunk, channel block) of ``y [T, D]``; chunk 0 of a sequence also does its first
    ``W−1`` rows (``HEAD`` = that, rounded up to a power of two), the tracked window when
    ``TRACK`` and the new conv state. The grid is ``(NT, ⌈D/BD⌉)``, or ``(⌈D/BD⌉, NT)`` with
    ``CHANNELS_FIRST``."""
    if CHANNELS_FIRST:
        i_chunk = tl.program_id(1)
        cols = tl.program_id(0) * BD + tl.arange(0, BD)
    else:
        i_chunk = tl.program_id(0)
        cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cols_ok = cols < D
    seq = tl.load(chunk_idx_ptr + 2 * i_chunk)
    chunk = tl.load(chunk_idx_ptr + 2 * i_chunk + 1)
    bos = tl.load(cu_ptr + seq)
    eos = tl.load(cu_ptr + seq + 1)
    slot = tl.load(state_idx_ptr + seq).to(tl.int64)
    state_ptr = pool_ptr + tl.maximum(slot, 0) * D * (W - 1) + cols * (W - 1)  # [BD] column 0

    rows = bos + 64 * chunk + tl.arange(0, 64)
    keep = ((rows < eos) & (rows >= bos + W - 1))[:, None] & cols_ok[None, :]
    y = _conv_rows(x_ptr, w_ptr, bias_ptr, state_ptr, rows, cols, cols_ok, keep, keep, bos,
                   stride_x, W, False, HAS_BIAS, SILU)
    tl.store(y_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=keep)

    if chunk == 0:  # the first W−1 rows and the new state: one program per sequence and block
        _conv_head(x_ptr, w_ptr, bias_ptr, y_ptr, pool_ptr, state_ptr, track_slot_ptr,
                   track_chunk_ptr, cols, cols_ok, seq, slot, bos, eos, D, stride_x, W, HEAD,
                   HAS_BIAS, SILU, TRACK)


@triton.jit
def _conv_head(x_ptr, w_ptr, bias_ptr, y_ptr, pool_ptr, state_ptr, track_slot_ptr,
               track_chunk_ptr, cols, cols_ok, seq, slot, bos, eos, D, stride_x,
               W: tl.constexpr, HEAD: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
               TRACK: tl.constexpr):
    """A sequence's first ``W−1`` outputs (they reach into the conv state), its tracked window
    (``TRACK``) and its new conv state, for the channels ``cols``; a negative slot reads no state
    (zeros) and writes none, a negative track chunk saves nothing."""
    has_state = as_vector(slot, cols) >= 0
    head = bos + tl.arange(0, HEAD)
    live = ((head < eos) & (head < bos + W - 1))[:, None] & cols_ok[None, :]
    y = _conv_rows(x_ptr, w_ptr, bias_ptr, state_ptr, head, cols, cols_ok, live,
                   live & has_state[None, :], bos, stride_x, W, True, HAS_BIAS, SILU)
    tl.store(y_ptr + head.to(tl.int64)[:, None] * D + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=live)
    if TRACK:
        track_chunk = tl.load(track_chunk_ptr + seq)
        track_slot = tl.maximum(tl.load(track_slot_ptr + seq).to(tl.int64), 0)
        _save_window(x_ptr, state_ptr, pool_ptr + track_slot * D * (W - 1) + cols * (W - 1),
                     cols, cols_ok & (as_vector(track_chunk, cols) >= 0), has_state, bos,
                     tl.minimum(64 * track_chunk, eos - bos), stride_x, W)
    tl.debug_barrier()  # every read of the old state above happens before it is overwritten
    _save_window(x_ptr, state_ptr, state_ptr, cols, cols_ok & has_state, has_state, bos,
                 eos - bos, stride_x, W)


@triton.jit
def _save_window(x_ptr, state_ptr, dst_ptr, cols, writes, has_state, bos, end, stride_x,
                 W: tl.constexpr):
    """Write ``x̃``'s ``W−1`` columns before token ``end`` of the sequence to ``dst_ptr [BD]``
    (column 0 of each channel ``cols``) where ``writes``; where ``end < W−1`` they come from the
    old state at ``state_ptr`` (zeros without ``has_state``)."""
    for p in tl.static_range(W - 1):
        rel = as_vector(end - (W - 1) + p, cols)  # position in x̃ relative to the first token
        xp = tl.load(x_ptr + (bos + tl.maximum(rel, 0)).to(tl.int64) * stride_x + cols,
                     mask=writes & (rel >= 0), other=0.0)
        sp = tl.load(state_ptr + tl.maximum(rel + (W - 1), 0),
                     mask=writes & has_state & (rel < 0), other=0.0)
        tl.store(dst_ptr + p, (xp.to(tl.float32) + sp.to(tl.float32)).to(
            dst_ptr.dtype.element_ty), mask=writes)


@bound_kernel
@triton.jit
def conv1d_update_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, pool_ptr, state_idx_ptr, D, stride_x,
                         W: tl.constexpr, BD: tl.constexpr, SILU: tl.constexpr,
                         HAS_BIAS: tl.constexpr):
    """One token per sequence: window = [state, x]; the new state drops the oldest column.
    Each thread owns whole channels, so shifting the state in place needs no barrier."""
    n = tl.program_id(0)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    d_mask = cols < D
    slot = tl.load(state_idx_ptr + n).to(tl.int64)
    live = d_mask & (as_vector(slot, cols) >= 0)
    state_ptr = pool_ptr + tl.maximum(slot, 0) * D * (W - 1) + cols * (W - 1)
    acc = tl.zeros([BD], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=d_mask, other=0.0).to(tl.float32)
    for j in tl.static_range(W):
        if j < W - 1:
            xj = tl.load(state_ptr + j, mask=live, other=0.0).to(tl.float32)
        else:
            xj = tl.load(x_ptr + n * stride_x + cols, mask=d_mask, other=0.0).to(tl.float32)
        acc += xj * tl.load(w_ptr + cols * W + j, mask=d_mask, other=0.0).to(tl.float32)
        if j > 0:  # column j of the window becomes column j−1 of the new state
            tl.store(state_ptr + (j - 1), xj.to(pool_ptr.dtype.element_ty), mask=live)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(y_ptr + n * D + cols, acc.to(y_ptr.dtype.element_ty), mask=d_mask)


_BD = 128  # channels per program of the decode update


def conv1d_prefill_triton(x, weight, bias, conv_pool, state_indices, meta, silu,
                          track_slots=None, track_chunks=None, launch=None):
    """Launch the prefill conv on validated inputs (``x`` may be a row-strided column slice);
    returns a contiguous ``y [T, D]``, updates the pool and saves the tracked windows
    (``track_slots, track_chunks`` as in :func:`~mamba_edu.kernels.conv1d_prefill`).
    ``launch``: ``(num_warps, BD, CHANNELS_FIRST)``, by default :func:`conv_launch`'s (the tests
    run other tile shapes too)."""
    T, D = x.shape
    W = weight.shape[1]
    y = torch.empty(T, D, device=x.device, dtype=x.dtype)
    warps, bd, channels_first = launch or conv_launch(meta.NT, D)
    blocks = cdiv(D, bd)
    conv1d_prefill_kernel[(blocks, meta.NT) if channels_first else (meta.NT, blocks)](
        x, weight, bias, y, conv_pool, state_indices, track_slots, track_chunks,
        meta.cu_seqlens, meta.chunk_indices, D, x.stride(0), W, next_power_of_2(W - 1),
        silu, bd, channels_first, bias is not None, track_slots is not None, num_warps=warps)
    return y


def conv1d_update_triton(x, weight, bias, conv_pool, state_indices, silu):
    """Launch the decode conv update on validated inputs; returns a contiguous ``y [N, D]``."""
    N, D = x.shape
    y = torch.empty(N, D, device=x.device, dtype=x.dtype)
    conv1d_update_kernel[(N, cdiv(D, _BD))](
        x, weight, bias, y, conv_pool, state_indices, D, x.stride(0), weight.shape[1], _BD, silu,
        bias is not None, num_warps=4)
    return y
