"""Causal attention with grouped KV heads (GQA) in one Triton launch: the forward of the model's
full-attention layers, for sequences of equal length, each after an optional cached prefix.

Why not ``F.scaled_dot_product_attention`` on the GPU: replayed from a CUDA graph on the H200,
cuDNN's SDPA kernel comes with a memset and a gap before it, in every attention layer. This kernel is one launch that needs no workspace, so nothing precedes it.

It is the flash-attention forward: one program per (block of ``BM`` queries, query head,
sequence) walks the keys in blocks of ``BN``, keeping a running softmax (row maximum ``m``,
row sum ``l``, unnormalised output ``acc``) in fp32 registers, and divides by ``l`` at the end.
The scores are never stored. The softmax uses ``exp2``: ``scale · log₂e`` is folded into the
scores, so ``2^(s·scale·log₂e) = e^(s·scale)``. The products take operands in the input dtype
(bf16 on a GPU) with fp32 accumulation; the probabilities are cast to v's dtype for the second.
fp32 inputs on a GPU multiply in tf32 (``tl.dot``'s default).

Measured on the H200 against cuDNN (docs/results.md): about as fast for one 512-token prompt,
faster after a cached prefix, slower on long prompts. Decode is slow at long contexts: a decode
token is one program per query head, with no split over the keys.

Alignment is bottom-right: with ``Lk − Lq`` cached prefix keys, query ``i`` sees keys
``j ≤ i + Lk − Lq`` (``Lq = Lk``: plain causal; ``Lq = 1``: a decode token sees every key).

``impl="auto"`` runs Triton on CUDA tensors where it measured faster, for 17 to
:data:`AUTO_MAX_QUERIES` queries per sequence, and the model's SDPA expression otherwise (decode,
long prompts) and on the CPU (so CPU results are the model's own); ``"triton"`` forces the
kernel (the interpreter on CPU: fp32/fp16 only); ``"torch"`` forces the expression.

:func:`causal_attention` here does not check its arguments: the model calls it in every
attention layer with tensors it built itself. :mod:`mamba_edu.kernels` exports it with its checks
(:mod:`.api`), for a learner who calls it directly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from mamba_edu.kernels.launcher import bound_kernel
from mamba_edu.kernels.tiles import cdiv
from mamba_edu.kernels.validation import runs_torch

HEAD_DIMS = (16, 32, 64, 128, 256)  # the head dims the kernel takes (powers of two, tl.dot ≥ 16)
LOG2E = 1.4426950408889634
BUSY_PROGRAMS = 128  # about one program per multiprocessor (the H200 has 132)
AUTO_MAX_QUERIES = 512  # "auto" takes the kernel up to this many queries per sequence (above)


@triton.jit
def _attend_keys(acc, l, m, q, k_ptr, v_ptr, stride_k, stride_v, rows, cols, start, end, Lk,
                 shift, qk_scale, D: tl.constexpr, BN: tl.constexpr, CAUSAL_MASK: tl.constexpr):
    """Fold keys ``start .. end`` (blocks of ``BN``) into the running softmax of one query block.

    ``acc [BM, BD]``, ``l, m [BM]``: the state so far (fp32); ``q [BM, BD]`` in the input dtype;
    ``k_ptr, v_ptr`` point at the sequence's first key of this KV head; ``rows [BM]``: the query
    indices within the sequence. With ``CAUSAL_MASK``, key ``j`` counts for query ``i`` only if
    ``j ≤ i + shift``; without, every key of the range is visible to every query of the block.
    Returns the new ``(acc, l, m)``.
    """
    for n0 in range(start, end, BN):
        keys = n0 + tl.arange(0, BN)
        mask = (keys < Lk)[:, None] & (cols < D)[None, :]
        key_rows = keys.to(tl.int64)[:, None]
        k = tl.load(k_ptr + key_rows * stride_k + cols[None, :], mask=mask, other=0.0)
        v = tl.load(v_ptr + key_rows * stride_v + cols[None, :], mask=mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if CAUSAL_MASK:
            # Also hides the keys past Lk from every query < Lq (i + shift < Lk).
            s = tl.where(keys[None, :] <= rows[:, None] + shift, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m = m_new
    return acc, l, m


@bound_kernel
@triton.jit
def causal_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, Lq, Lk, group, stride_q, stride_k,
                            stride_v, stride_o, qk_scale, D: tl.constexpr, BD: tl.constexpr,
                            BM: tl.constexpr, BN: tl.constexpr):
    """``o = softmax(q kᵀ · scale, bottom-right causal) v`` for queries ``BM·i .. BM·(i+1)`` of
    query head ``h`` of sequence ``n``, grid ``(⌈Lq/BM⌉, Hq, N)``.

    ``q [N·Lq, Hq, D]``, ``k, v [N·Lk, Hkv, D]`` (rows ``stride_*`` apart, each row packed),
    ``o [N·Lq, Hq, D]``; head ``h`` reads KV head ``h // group``. ``qk_scale = scale · log₂e``.
    Tiles over the head dim are ``BD ≥ D`` wide, zeros past ``D``.
    """
    block, head, seq = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    shift = Lk - Lq  # query i sees keys j <= i + shift
    m0 = block * BM
    rows = m0 + tl.arange(0, BM)
    cols = tl.arange(0, BD)
    tokens = seq.to(tl.int64) * Lq + rows
    q_mask = (rows < Lq)[:, None] & (cols < D)[None, :]
    q = tl.load(q_ptr + tokens[:, None] * stride_q + head * D + cols[None, :], mask=q_mask,
                other=0.0)
    kv_head = head // group
    k_seq = k_ptr + seq.to(tl.int64) * Lk * stride_k + kv_head * D
    v_seq = v_ptr + seq.to(tl.int64) * Lk * stride_v + kv_head * D

    acc = tl.zeros([BM, BD], tl.float32)
    l = tl.zeros([BM], tl.float32)
    m = tl.full([BM], float("-inf"), tl.float32)
    # Blocks of keys <= m0 + shift are visible to every query of the block: no causal mask there.
    # Key 0 is in the first block either way, so m is finite after it (for the rows past Lq
    # too): no row ever computes -inf - (-inf).
    unmasked_end = tl.minimum(Lk, m0 + shift + 1) // BN * BN
    end = tl.minimum(Lk, m0 + BM + shift)
    acc, l, m = _attend_keys(acc, l, m, q, k_seq, v_seq, stride_k, stride_v, rows, cols, 0,
                             unmasked_end, Lk, shift, qk_scale, D, BN, False)
    acc, l, m = _attend_keys(acc, l, m, q, k_seq, v_seq, stride_k, stride_v, rows, cols,
                             unmasked_end, end, Lk, shift, qk_scale, D, BN, True)
    out = (acc / l[:, None]).to(o_ptr.dtype.element_ty)
    tl.store(o_ptr + tokens[:, None] * stride_o + head * D + cols[None, :], out, mask=q_mask)


def _config(D: int, Lq: int, heads: int) -> tuple[int, int, int, int]:
    """``(BM, BN, num_warps, num_stages)`` for ``heads = n_seqs · Hq`` (query heads of all the
    sequences), from H200 measurements (bf16, Hq = 16, Hkv = 2, CUDA-graph replays):

    - decode and short extends (``Lq ≤ 16``): 16-row query blocks (a 64-row one would be mostly
      padding) over 128 keys per step; 64 at D = 256 once the grid holds more programs than
      :data:`BUSY_PROGRAMS`.
    - D = 256: 128 × 64 blocks at 8 warps when they fill the GPU, 64 × 64 at 4 warps below
      that.
    - D ≤ 128: 64 × 64 at 4 warps (128-row blocks were slower at every shape tried).
    """
    if Lq <= 16:
        return 16, 64 if D > 128 and heads > BUSY_PROGRAMS else 128, 4, 2
    if D > 128 and (Lq // 128) * heads >= BUSY_PROGRAMS:
        return 128, 64, 8, 2
    return 64, 64, 4, 2


def _torch_attention(q, k, v, n_seqs, scale):
    """The model's SDPA expression over ``[n_seqs, heads, L, D]`` views."""
    Lq, Lk = q.shape[0] // n_seqs, k.shape[0] // n_seqs
    q4, k4, v4 = (t.unflatten(0, (n_seqs, -1)).transpose(1, 2) for t in (q, k, v))
    # A single query (decode) sees every key: no mask at all, like plain causal needs none.
    mask = (None if Lq in (1, Lk) else
            torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril(Lk - Lq))
    o = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, is_causal=Lq == Lk,
                                       enable_gqa=True, scale=scale)
    return o.transpose(1, 2).flatten(0, 1).contiguous()


def causal_attention(q, k, v, n_seqs=1, scale=None, *, impl="auto"):
    """Causal GQA attention of ``n_seqs`` sequences of equal length, bottom-right aligned:
    ``q [n_seqs·Lq, Hq, D]``, ``k, v [n_seqs·Lk, Hkv, D]`` (rows may be strided) →
    ``o [n_seqs·Lq, Hq, D]``, contiguous; ``scale=None``: ``D ** -0.5``."""
    T, Hq, D = q.shape
    if impl == "auto" and not 16 < T // n_seqs <= AUTO_MAX_QUERIES:
        impl = "torch"
    if runs_torch(impl, q.device):
        return _torch_attention(q, k, v, n_seqs, scale)
    # Here, not in the checks: only this function knows whether "auto" takes the kernel.
    if D not in HEAD_DIMS:
        raise ValueError(f"q must have a head dim D in {list(HEAD_DIMS)} for the Triton kernel; "
                         f"got {D}; use impl='torch'")
    Lq, Lk = T // n_seqs, k.shape[0] // n_seqs
    scale = D ** -0.5 if scale is None else scale
    o = torch.empty(T, Hq, D, device=q.device, dtype=q.dtype)
    bm, bn, warps, stages = _config(D, Lq, n_seqs * Hq)
    # Head-dim tiles at least 64 wide (zeros past D): Triton 3.6 miscompiled, on the H200, products
    # whose right operand (here v [BN, D]) was 16 or 32 wide at 4 warps
    # (data/benchmarks/small_head_dims.md).
    causal_attention_kernel[(cdiv(Lq, bm), Hq, n_seqs)](
        q, k, v, o, Lq, Lk, Hq // k.shape[1], q.stride(0), k.stride(0), v.stride(0), o.stride(0),
        scale * LOG2E, D, max(64, D), bm, bn, num_warps=warps, num_stages=stages)
    return o
