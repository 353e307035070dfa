"""Causal depthwise conv1d with SiLU, for prefill (packed varlen) and the decode update.

``y[t, c] = silu(bias[c] + Σ_j weight[c, j] · x̃[t − (W−1) + j, c])`` with ``x̃`` = the sequence's
conv state (its previous ``W−1`` raw inputs) followed by its tokens (docs/conventions.md).

Prefill grid ``(NT, ⌈D/BD⌉)``: one program per 64-token chunk and channel block. Only chunk 0 of
a sequence looks into the conv state, so that same program also writes the new state (the last
``W−1`` columns of ``x̃``) after a barrier: no other program reads the slot, so there is no race.
A negative slot index means no state (zeros) and no write.
"""

import torch
import triton
import triton.language as tl

from mamba_edu.kernels.tiles import as_vector


@triton.jit
def conv1d_prefill_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, pool_ptr, state_idx_ptr,
                          cu_ptr, chunk_idx_ptr, D, stride_x,
                          W: tl.constexpr, BD: tl.constexpr, HAS_BIAS: tl.constexpr,
                          SILU: tl.constexpr):
    i_chunk = tl.program_id(0)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    d_mask = cols < D
    seq = tl.load(chunk_idx_ptr + 2 * i_chunk)
    chunk = tl.load(chunk_idx_ptr + 2 * i_chunk + 1)
    bos = tl.load(cu_ptr + seq)
    eos = tl.load(cu_ptr + seq + 1)
    rows = bos + 64 * chunk + tl.arange(0, 64)
    slot = tl.load(state_idx_ptr + seq).to(tl.int64)
    state_ptr = pool_ptr + tl.maximum(slot, 0) * D * (W - 1) + cols * (W - 1)  # [BD] column 0

    acc = tl.zeros([64, BD], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    for j in tl.static_range(W):
        src = rows - (W - 1) + j                 # token that tap j multiplies
        in_x = (src >= bos) & (rows < eos)
        in_state = (src < bos) & (rows < eos) & (as_vector(slot, src) >= 0)
        xj = tl.load(x_ptr + tl.maximum(src, 0).to(tl.int64)[:, None] * stride_x + cols[None, :],
                     mask=in_x[:, None] & d_mask[None, :], other=0.0)
        sj = tl.load(state_ptr[None, :] + tl.maximum(src - bos + (W - 1), 0)[:, None],
                     mask=in_state[:, None] & d_mask[None, :], other=0.0)
        wj = tl.load(w_ptr + cols * W + j, mask=d_mask, other=0.0).to(tl.float32)
        acc += (xj.to(tl.float32) + sj.to(tl.float32)) * wj[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(y_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=(rows < eos)[:, None] & d_mask[None, :])

    # New state = the last W−1 columns of x̃ (old state columns when the sequence is short).
    tl.debug_barrier()  # every read of the old state above happens before it is overwritten
    writes = d_mask & (as_vector(slot, cols) >= 0) & (as_vector(chunk, cols) == 0)
    length = as_vector(eos - bos, cols)
    for p in tl.static_range(W - 1):
        rel = length - (W - 1) + p               # position in x̃ relative to the first token
        from_x = writes & (rel >= 0)
        xp = tl.load(x_ptr + (bos + tl.maximum(rel, 0)).to(tl.int64) * stride_x + cols,
                     mask=from_x, other=0.0)
        sp = tl.load(state_ptr + tl.maximum(rel + (W - 1), 0), mask=writes & (rel < 0), other=0.0)
        tl.store(state_ptr + p, (xp.to(tl.float32) + sp.to(tl.float32)).to(
            pool_ptr.dtype.element_ty), mask=writes)


@triton.jit
def conv1d_update_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, pool_ptr, state_idx_ptr, D, stride_x,
                         W: tl.constexpr, BD: tl.constexpr, HAS_BIAS: tl.constexpr,
                         SILU: tl.constexpr):
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


_BD = 128  # channels per program


def conv1d_prefill_triton(x, weight, bias, conv_pool, state_indices, meta, silu):
    """Launch the prefill conv on validated inputs (``x`` may be a row-strided column slice);
    returns a contiguous ``y [T, D]``, updates the pool."""
    T, D = x.shape
    y = torch.empty(T, D, device=x.device, dtype=x.dtype)
    conv1d_prefill_kernel[(meta.NT, triton.cdiv(D, _BD))](
        x, weight, weight if bias is None else bias, y, conv_pool, state_indices,
        meta.cu_seqlens, meta.chunk_indices, D, x.stride(0), weight.shape[1], _BD,
        bias is not None, silu, num_warps=4)
    return y


def conv1d_update_triton(x, weight, bias, conv_pool, state_indices, silu):
    """Launch the decode conv update on validated inputs; returns a contiguous ``y [N, D]``."""
    N, D = x.shape
    y = torch.empty(N, D, device=x.device, dtype=x.dtype)
    conv1d_update_kernel[(N, triton.cdiv(D, _BD))](
        x, weight, weight if bias is None else bias, y, conv_pool, state_indices, D, x.stride(0),
        weight.shape[1], _BD, bias is not None, silu, num_warps=4)
    return y
