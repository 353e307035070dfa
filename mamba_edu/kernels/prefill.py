"""The chunked GDN prefill in Triton kernels (docs/conventions.md, chunk C = 64).

1. :func:`chunk_prepare_kernel`, grid ``(NT, HV)``, one program per (chunk, value head), all in
   parallel: the gating (when given the raw projections a, b), the chunk-local cumsum Γ of g,
   the L2 norm k̂ of k, ``L = strict_lower(β (k̂ k̂ᵀ) e^{Γs−Γj})``, the inverse
   ``T = (I+L)⁻¹`` and ``W = T(β e^Γ K̂)``, ``U = T(β V)``. Writes Γ, k̂, W, U (and, for the
   output in the scan, the fold ``Q_h``, ``O_local``: below).
2. :func:`chunk_scan_kernel`, grid ``(⌈V/BV⌉, N, HV)``, one program per (V-tile, sequence, value
   head), looping over the sequence's chunks. Only what the next chunk needs is on this serial
   path: it writes the chunk's start state ``h[c] = S``, then ``Ṽ = U − W S`` (written too) and
   ``S ← e^{Γ_C} S + K̂ᵀ (e^{Γ_C−Γ} ⊙ Ṽ)``. It reads S₀ from the pool slot, writes the final state
   back in place, and optionally writes the ``fused`` tracking copy.
3. :func:`chunk_output_kernel`, grid ``(⌈V/BV⌉, NT, HV)``, one program per (V-tile, chunk, value
   head), all in parallel again: ``O = scale·[(Q̂ e^Γ) h[c] + (Q̂ K̂ᵀ ⊙ e^{Γr−Γs} ⊙ [s≤r]) Ṽ]``.
   Given the output gate z it also applies the layer's output norm ``rms_norm(O)·w·silu(z)``
   per head (``GATE``, one V-tile per head): one launch less than a separate norm kernel, used
   where the output's V-tile is the whole head anyway (:func:`launch_output`).

Why a separate output kernel: a chunk's output needs that chunk's start state, but nothing later
needs the output. Computing it inside the serial pass makes every chunk step longer and leaves
only ``(V/BV)·N·HV`` programs for all of that work. Writing ``h`` and ``Ṽ`` to memory costs
bandwidth but lets the output run over every (chunk, head, tile) at once. The scan can also
compute the output itself (``OUTPUT``, switched on by :func:`forced_output_path`): no ``h``/``Ṽ``
round trip, one launch less. Then the prepare kernel *folds* the output (``FOLD``,
:func:`_fold_output`): a chunk's output is an affine function of its start state,
``O = O_local + Q_h h``, and both terms are computed in parallel, so the scan adds one product
beside its chain (an earlier version put three on it). On the H200 the fold was still slower at
every shape tried, 1.12–1.27× (data/benchmarks/kernels.json, ``ours_graph_ms_other_output_path``;
data/benchmarks/output_fold/): the prepare kernel grows by more than half and every V-tile
program of the scan reads the chunk's whole ``Q_h``. So the output kernel is the default, and the
fold is kept for that comparison. ``h`` is stored in the input dtype (bf16 on a GPU), or in fp32
when checkpoints are requested: then the checkpoints *are* ``h``.

The inverse is a block doubling of the 64×64 tile (:func:`invert_unit_lower`): every
intermediate is an entry of T or of L, so it stays bounded (a power series in L would not: its
terms can reach 1e13 for correlated keys), and all of it runs on tensor cores: the first steps
on the four 16×16 diagonal blocks as one batch, the last two in 64-row products.

Precision on a GPU: the Gram matrix ``K Kᵀ`` is taken from the raw keys in their own dtype
(bf16: exact products, fp32 sums) and normalised afterwards, ``K̂K̂ᵀ = diag(n) K Kᵀ diag(n)``.
``tl.dot`` on fp32 operands uses tf32 tensor cores; with 16-bit inputs the inverse's
products take fp16 operands instead (tf32's mantissa at twice its rate; bf16 would cost
accuracy there, :func:`invert_unit_lower`). T, W, U, k̂, Ṽ and h (unless checkpoints are
requested) are stored or cast to the input dtype (bf16), and the dots that read them (W, U
themselves, both dots of the scan, the output's) take operands in that dtype with fp32
accumulation, like flash-linear-attention.
The state S stays fp32 in registers. Under the interpreter dots are plain fp32 (or fp16) matmuls.

Tiles over a head dim are at least 64 wide (:func:`_block`, masked past K or V): Triton 3.6
miscompiled, on the H200, products whose right operand was 16 or 32 wide at 4 warps, the form the
prepare kernel's ``T · X`` takes at small head dims (data/benchmarks/small_head_dims.md). The
scan's V-tile may be 16 or 32 wide (bit-equal to 64 wide at K = V = 128 on the H200). Launch
configurations are fixed per batch shape from H200 measurements (:func:`_scan_config`), not
autotuned: an autotuner keyed on the head dims would reuse the choice of whichever batch ran
first.
"""

import torch
import triton
import triton.language as tl

from mamba_edu._runtime import overriding
from mamba_edu.gdn.varlen import CHUNK as _CHUNK
from mamba_edu.kernels.fused_ops import gated_rms_norm
from mamba_edu.kernels.launch import await_previous_kernel, pdl_options
from mamba_edu.kernels.tiles import gate_values, l2norm_rows, load_rows, store_rows

CHUNK = tl.constexpr(_CHUNK)  # rows per chunk (64): a compile-time constant inside the kernels
# g is floored here before Γ is summed: with g = −inf, Γ_s − Γ_j would be (−inf) − (−inf) = NaN.
# Below about −104 fp32's exp is 0, so every decay factor spanning a floored step is 0 either way
# (the chunked reference floors at −1000 in fp64); 64 floored steps keep |Γ| ≤ 7040, finite.
G_FLOOR = tl.constexpr(-110.0)


@triton.jit
def _merge_blocks(X, L, r, SIZE: tl.constexpr, FP16: tl.constexpr):
    """One doubling step of :func:`invert_unit_lower`: from the inverses of the SIZE-blocks on
    the diagonal (in ``X``) to those of the 2·SIZE-blocks. ``X``, ``L``: ``[C, C]`` tiles with
    ``r = arange(C)``, or ``[n, C, C]`` batches of tiles (the masks broadcast over n)."""
    same_pair = (r[:, None] // (2 * SIZE)) == (r[None, :] // (2 * SIZE))
    other_block = (r[:, None] // SIZE) != (r[None, :] // SIZE)
    B = tl.where(same_pair & other_block, L, 0.0)
    if FP16:
        X_op = X.to(tl.float16)
        return X - tl.dot(X_op, tl.dot(B.to(tl.float16), X_op).to(tl.float16))
    return X - tl.dot(X, tl.dot(B, X))


@triton.jit
def _diagonal_blocks(L, C: tl.constexpr, D: tl.constexpr):
    """The ``D×D`` blocks on the diagonal of a ``[C, C]`` tile, as a batch ``[C/D, D, D]``."""
    NB: tl.constexpr = C // D
    b = tl.arange(0, NB)
    on_diagonal = b[:, None, None, None] == b[None, None, :, None]  # block row == block column
    return tl.sum(tl.where(on_diagonal, tl.reshape(L, (NB, D, NB, D)), 0.0), axis=2)


@triton.jit
def _block_diagonal(X, C: tl.constexpr, D: tl.constexpr):
    """The inverse of :func:`_diagonal_blocks`: a batch ``[C/D, D, D]`` placed on the diagonal of
    a ``[C, C]`` tile, zeros elsewhere."""
    NB: tl.constexpr = C // D
    b = tl.arange(0, NB)
    on_diagonal = b[:, None, None, None] == b[None, None, :, None]
    X = tl.broadcast_to(tl.expand_dims(X, 2), (NB, D, NB, D))
    return tl.reshape(tl.where(on_diagonal, X, 0.0), (C, C))


@triton.jit
def _doubling_to_16(L, r, FP16: tl.constexpr):
    """The doubling steps up to the 16-blocks: X holding the inverses of the 16×16 blocks on the
    diagonal of ``I + L``, for a ``[C, C]`` tile or a ``[n, C, C]`` batch (``r = arange(C)``)."""
    diagonal = r[:, None] == r[None, :]
    same_pair = (r[:, None] // 2) == (r[None, :] // 2)
    X = tl.where(diagonal, 1.0, tl.where(same_pair, -L, 0.0))  # the 2×2 blocks need no product
    X = _merge_blocks(X, L, r, 2, FP16)
    X = _merge_blocks(X, L, r, 4, FP16)
    return _merge_blocks(X, L, r, 8, FP16)


@triton.jit
def invert_unit_lower(L, C: tl.constexpr, FP16: tl.constexpr = False):
    """``(I + L)⁻¹`` of a strictly lower ``[C, C]`` fp32 tile (C = 16, 32 or 64) by doubling.

    A diagonal block of size 2s is ``[[A, 0], [B, D]]``; knowing the inverses of A and D, its
    inverse is ``[[A⁻¹, 0], [−D⁻¹ B A⁻¹, D⁻¹]]``. With X holding the inverses of all s-blocks on
    the diagonal, that is ``X ← X − X (B X)`` for all blocks at once, B = the entries of L inside
    a 2s-block but outside both of its s-blocks (:func:`_merge_blocks`). The 2×2 blocks need no
    product: ``[[1, 0], [l, 1]]⁻¹ = [[1, 0], [−l, 1]]``. Then log₂ C − 1 doubling steps.
    The steps up to 16 stay inside the 16×16 diagonal blocks, so they run on those blocks
    alone, as one batch ``[C/16, 16, 16]``: products of 16×16 tiles instead of C×C ones
    (H200: the prepare kernel 12–16 % faster, bit-equal; data/benchmarks/inverse_blocks/).
    The products take fp32 operands (tf32 on a GPU), or fp16 ones with ``FP16``: the same
    10-bit mantissa as tf32 at twice its tensor-core rate. Sums and X stay fp32 either way. fp16's
    range suffices because every operand is an entry of L, of T or of B·X: with unit keys,
    β ≤ 1 and g ≤ 0 the entries of L and T stay within ±1 (measured on correlated keys), those
    of B·X within ±64. bf16 operands (8-bit mantissa) tripled U's error on such chunks
    (notebook 03, section B5).
    """
    X = _block_diagonal(_doubling_to_16(_diagonal_blocks(L, C, 16), tl.arange(0, 16), FP16), C, 16)
    r = tl.arange(0, C)
    if C > 16:
        X = _merge_blocks(X, L, r, 16, FP16)
    if C > 32:
        X = _merge_blocks(X, L, r, 32, FP16)
    return X


@triton.jit
def _gates(g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, gamma_ptr, bos, eos, hv, stride_g,
           stride_beta, HV: tl.constexpr, GATED: tl.constexpr):
    """The chunk's gating and Γ (stored): returns ``(Γ [64], β [64])``, zeros past ``eos``."""
    rows = bos + tl.arange(0, CHUNK)
    valid = rows < eos
    g = tl.load(g_ptr + rows * stride_g + hv, mask=valid, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + rows * stride_beta + hv, mask=valid, other=0.0).to(tl.float32)
    if GATED:
        g, beta = gate_values(g, beta, tl.load(A_log_ptr + hv), tl.load(dt_bias_ptr + hv))
    # Padded rows have g = β = 0: Γ stays flat there and their rows of L, W, U are zero.
    g = tl.where(valid, tl.maximum(g, G_FLOOR), 0.0)
    gamma = tl.cumsum(g, 0)
    tl.store(gamma_ptr + rows * HV + hv, gamma, mask=valid)
    return gamma, tl.where(valid, beta, 0.0)


@triton.jit
def _inverse_norm(sum_sq, USE_L2NORM: tl.constexpr):
    """The factor that L2-normalises a row with this sum of squares (eps inside the root)."""
    if USE_L2NORM:
        return tl.rsqrt(sum_sq + 1e-6)
    return tl.full(sum_sq.shape, 1.0, tl.float32)


@triton.jit
def chunk_rows(i_chunk, cu_ptr, chunk_idx_ptr):
    """Chunk ``i_chunk`` of the batch (a row of ``meta.chunk_indices``): ``(seq, bos, eos)``, its
    sequence, its first token and the sequence's past-the-end token (its rows are ``bos ..
    min(bos + 64, eos)``)."""
    seq = tl.load(chunk_idx_ptr + 2 * i_chunk)
    bos = tl.load(cu_ptr + seq) + CHUNK * tl.load(chunk_idx_ptr + 2 * i_chunk + 1)
    eos = tl.load(cu_ptr + seq + 1)
    return seq, bos, eos


@triton.jit
def prepare_chunk(i_chunk, hv, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr,
                  gamma_ptr, k_hat_ptr, w_ptr, u_ptr, cu_ptr, chunk_idx_ptr,
                  stride_k, stride_v, stride_g, stride_beta,
                  q_ptr, q_state_ptr, o_local_ptr, stride_q, scale,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                  GATED: tl.constexpr, FP16_INVERSE: tl.constexpr, FOLD: tl.constexpr):
    """Program (chunk ``i_chunk``, value head ``hv``) of kernel 1: Γ ``[T, HV]``, W ``[T, HV, K]``,
    U ``[T, HV, V]`` for its 64 rows, and the normalised keys k̂ ``[T, H, K]`` (written by the
    first value head of each group); returns the chunk's sequence.
    With ``GATED``, ``g_ptr``/``beta_ptr`` hold the raw projections a, b and the gating is
    computed here (with ``A_log``, ``dt_bias``). Inputs are read with their row strides.
    ``BK``, ``BV`` are at least 64 (masked past K, V): see the module docstring.
    ``FP16_INVERSE``: the inverse's products on fp16 operands (:func:`launch_prepare`).
    With ``FOLD`` it also writes ``Q_h [T, HV, K]`` (``q_state_ptr``) and ``O_local [T, HV, V]``
    (``o_local_ptr``), the chunk's output as a function of its start state (:func:`_fold_output`,
    from q with row stride ``stride_q``, and ``scale``); without, those five arguments are unread."""
    seq, bos, eos = chunk_rows(i_chunk, cu_ptr, chunk_idx_ptr)
    gamma, beta = _gates(g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, gamma_ptr, bos, eos, hv,
                         stride_g, stride_beta, HV, GATED)

    # The raw keys' Gram matrix in their own dtype (bf16: exact products, fp32 sums), normalised
    # afterwards: K̂K̂ᵀ = diag(n) K Kᵀ diag(n).
    hk = hv // (HV // H)  # value head hv reads key head hv // group
    k = load_rows(k_ptr + hk * K, bos, eos, stride_k, 0, K, CHUNK, BK)
    k_f32 = k.to(tl.float32)
    norm = _inverse_norm(tl.sum(k_f32 * k_f32, 1), USE_L2NORM)
    r = tl.arange(0, CHUNK)
    diff = tl.where(r[:, None] > r[None, :], gamma[:, None] - gamma[None, :], float("-inf"))
    L = (beta * norm)[:, None] * tl.dot(k, tl.trans(k)) * norm[None, :] * tl.exp(diff)
    T = invert_unit_lower(L, CHUNK, FP16_INVERSE)

    T, keys_in, values_in = _write_w_u(T, k_f32 * norm[:, None], beta, gamma, v_ptr + hv * V,
                                       k_hat_ptr + hk * K, w_ptr + hv * K, u_ptr + hv * V, hv,
                                       bos, eos, stride_v, H, HV, K, V, BK, BV)
    if FOLD:
        _fold_output(q_ptr + hk * K, q_state_ptr + hv * K, o_local_ptr + hv * V, bos, eos,
                     stride_q, scale, k, norm, gamma, T, keys_in, values_in, HV, K, V, BK, BV,
                     USE_L2NORM)
    return seq


@triton.jit
def _write_w_u(T, k_hat, beta, gamma, v_ptr, k_hat_ptr, w_ptr, u_ptr, hv, bos, eos, stride_v,
               H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               BK: tl.constexpr, BV: tl.constexpr):
    """Store k̂ (first value head of the group only), ``W = T (β e^Γ K̂)`` and ``U = T (β V)``:
    operands in the storage dtype (W's), fp32 accumulation. Pointers at the head's first
    column. Returns T in that dtype and the two right operands, ``β e^Γ K̂ [64, BK]`` and
    ``β V [64, BV]``."""
    # Rows below bos do not exist: the other value heads of the group store no k̂.
    k_hat_end = tl.where(hv % (HV // H) == 0, eos, bos)
    store_rows(k_hat_ptr, k_hat, bos, k_hat_end, H * K, 0, K, CHUNK, BK)
    T = T.to(w_ptr.dtype.element_ty)
    keys_in = (k_hat * (beta * tl.exp(gamma))[:, None]).to(T.dtype)
    store_rows(w_ptr, tl.dot(T, keys_in), bos, eos, HV * K, 0, K, CHUNK, BK)
    v = load_rows(v_ptr, bos, eos, stride_v, 0, V, CHUNK, BV).to(tl.float32)
    values_in = (v * beta[:, None]).to(T.dtype)
    store_rows(u_ptr, tl.dot(T, values_in), bos, eos, HV * V, 0, V, CHUNK, BV)
    return T, keys_in, values_in


@triton.jit
def _fold_output(q_ptr, q_state_ptr, o_local_ptr, bos, eos, stride_q, scale, k, k_norm, gamma,
                 T, keys_in, values_in, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr):
    """The chunk's output as an affine function of its start state h, ``O = O_local + Q_h h``,
    written for the scan: ``Q_h [64, K]`` (``q_state_ptr``) and ``O_local [64, V]``
    (``o_local_ptr``), both at the head's first column, rows ``bos .. eos``.

    With ``A = scale·(Q̂ K̂ᵀ ⊙ e^{Γr−Γs} ⊙ [s≤r])`` the output is ``scale·(Q̂ e^Γ) h + A Ṽ``, and
    ``Ṽ = U − W h``; so ``Q_h = scale·Q̂ e^Γ − A W`` and ``O_local = A U``, the output from a
    zero state. As ``W = T·keys_in`` and ``U = T·values_in``, both come from ``P = A T``.
    Inputs: the raw keys ``k [64, BK]`` and their factors ``k_norm [64]``, ``Γ [64]``,
    ``T [64, 64]``, ``keys_in [64, BK]``, ``values_in [64, BV]`` (the last three in the
    storage dtype)."""
    q = load_rows(q_ptr, bos, eos, stride_q, 0, K, CHUNK, BK)
    q_f32 = q.to(tl.float32)
    q_norm = scale * _inverse_norm(tl.sum(q_f32 * q_f32, 1), USE_L2NORM)
    decay = _causal_decay(gamma, bos + tl.arange(0, CHUNK) < eos)
    A = q_norm[:, None] * tl.dot(q, tl.trans(k)) * k_norm[None, :] * decay
    P = tl.dot(A.to(T.dtype), T).to(T.dtype)
    q_state = q_f32 * (q_norm * tl.exp(gamma))[:, None] - tl.dot(P, keys_in)
    store_rows(q_state_ptr, q_state, bos, eos, HV * K, 0, K, CHUNK, BK)
    store_rows(o_local_ptr, tl.dot(P, values_in), bos, eos, HV * V, 0, V, CHUNK, BV)


@triton.jit
def chunk_prepare_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr,
                         gamma_ptr, k_hat_ptr, w_ptr, u_ptr, cu_ptr, chunk_idx_ptr,
                         stride_k, stride_v, stride_g, stride_beta,
                         q_ptr, q_state_ptr, o_local_ptr, stride_q, scale,
                         H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                         GATED: tl.constexpr, FP16_INVERSE: tl.constexpr, FOLD: tl.constexpr,
                         USE_PDL: tl.constexpr):
    """Kernel 1, grid ``(NT, HV)``: :func:`prepare_chunk` for every (chunk, value head)."""
    await_previous_kernel(USE_PDL)
    prepare_chunk(tl.program_id(0), tl.program_id(1), k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr,
                  dt_bias_ptr, gamma_ptr, k_hat_ptr, w_ptr, u_ptr, cu_ptr, chunk_idx_ptr,
                  stride_k, stride_v, stride_g, stride_beta, q_ptr, q_state_ptr, o_local_ptr,
                  stride_q, scale, H, HV, K, V, BK, BV, USE_L2NORM, GATED, FP16_INVERSE, FOLD)


@triton.jit
def _queries(q_ptr, hk, bos, eos, stride_q, scale, K: tl.constexpr, BK: tl.constexpr,
             USE_L2NORM: tl.constexpr):
    """``scale · q̂`` for the chunk's rows ``[64, BK]`` fp32 (key head ``hk``, zeros past eos)."""
    q = load_rows(q_ptr + hk * K, bos, eos, stride_q, 0, K, CHUNK, BK).to(tl.float32)
    return scale * l2norm_rows(q, USE_L2NORM)


@triton.jit
def _causal_decay(gamma, valid):
    """``e^{Γr−Γs}·[s≤r]`` ``[64, 64]`` fp32 for a chunk's ``Γ [64]``, rows past the sequence's
    end (``valid`` false) zero."""
    r = tl.arange(0, CHUNK)
    # Masks before exp: padded rows would otherwise give 0·inf.
    causal = (r[:, None] >= r[None, :]) & valid[:, None]
    return tl.exp(tl.where(causal, gamma[:, None] - gamma[None, :], float("-inf")))


@triton.jit
def _chunk_output(q, k, v_new, h, gamma, valid):
    """``O = (Q̂ e^Γ) h + (Q̂ K̂ᵀ ⊙ e^{Γr−Γs} ⊙ [s≤r]) Ṽ`` for one chunk and V-tile: ``q [64, BK]``
    fp32 (scaled), ``k [64, BK]``, ``v_new [64, BV]`` in the storage dtype, ``h [BK, BV]`` (its
    dtype sets the first product's), ``gamma [64]``; returns ``[64, BV]`` fp32."""
    work = k.dtype
    decay = _causal_decay(gamma, valid)
    attn = tl.dot(q.to(work), tl.trans(k)) * decay
    o = tl.dot((q * tl.exp(gamma)[:, None]).to(h.dtype), h)
    return tl.dot(attn.to(work), v_new, o)


@triton.jit
def _gated_norm(o, z_ptr, w_ptr, bos, eos, stride_z, eps, V: tl.constexpr, BV: tl.constexpr):
    """The GDN output norm of a chunk's whole-head tile ``o [64, BV]`` fp32 (zeros past V):
    ``o · rsqrt(Σo²/V + eps) · w · z·sigmoid(z)`` per row, in fp32. ``z_ptr`` points at the head's
    first column of ``z [T, HV·V]`` (row stride ``stride_z``), ``w_ptr`` at ``w [V]``."""
    z = load_rows(z_ptr, bos, eos, stride_z, 0, V, CHUNK, BV).to(tl.float32)
    cols = tl.arange(0, BV)
    w = tl.load(w_ptr + cols, mask=cols < V, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(o * o, 1) / V + eps)
    return o * rstd[:, None] * w[None, :] * (z * tl.sigmoid(z))


@triton.jit
def sequence_chunks(seq, cu_ptr, chunk_off_ptr):
    """Sequence ``seq``'s tokens and chunks: ``(bos, eos, first_chunk, n_chunks)``, its first
    and past-the-end token, the global index of its first chunk (int64: it numbers rows of h)
    and its number of chunks."""
    bos = tl.load(cu_ptr + seq)
    eos = tl.load(cu_ptr + seq + 1)
    first_chunk = tl.load(chunk_off_ptr + seq).to(tl.int64)
    n_chunks = tl.load(chunk_off_ptr + seq + 1) - tl.load(chunk_off_ptr + seq)
    return bos, eos, first_chunk, n_chunks


@triton.jit
def chunk_tiles(k_hat_ptr, w_ptr, u_ptr, gamma_ptr, t0, eos, hk, hv, v0,
                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BK: tl.constexpr, BV: tl.constexpr):
    """What one chunk step of the scan reads for the chunk starting at token ``t0``:
    ``(k̂ [64, BK], W [64, BK], U [64, BV] fp32, Γ [64], Γ of its last row, valid [64])``,
    zeros past ``eos`` (key head ``hk``, value head ``hv``, V-tile from column ``v0``)."""
    r = tl.arange(0, CHUNK)
    valid = t0 + r < eos
    k = load_rows(k_hat_ptr + hk * K, t0, eos, H * K, 0, K, CHUNK, BK)
    w = load_rows(w_ptr + hv * K, t0, eos, HV * K, 0, K, CHUNK, BK)
    u = load_rows(u_ptr + hv * V, t0, eos, HV * V, v0, V, CHUNK, BV).to(tl.float32)
    gamma = tl.load(gamma_ptr + (t0 + r) * HV + hv, mask=valid, other=0.0)
    gamma_last = tl.load(gamma_ptr + (tl.minimum(t0 + CHUNK, eos) - 1) * HV + hv)
    return k, w, u, gamma, gamma_last, valid


@triton.jit
def advance_state(S, k, v_new, gamma, gamma_last, valid):
    """The state after the chunk, ``e^{Γ_C} S + K̂ᵀ (e^{Γ_C−Γ} ⊙ Ṽ)``: ``S [BK, BV]`` fp32,
    ``k [64, BK]`` in the storage dtype (which the product's operands take), ``v_new [64, BV]``
    fp32, ``gamma``, ``valid [64]``, ``gamma_last`` = Γ of the chunk's last row."""
    # Row s of Ṽ reaches the chunk end decayed by e^{Γ_C − Γ_s}; mask before exp (padded
    # rows would otherwise give 0·inf).
    to_end = tl.exp(tl.where(valid, gamma_last - gamma, float("-inf")))
    return S * tl.exp(gamma_last) + tl.dot(tl.trans(k), (v_new * to_end[:, None]).to(k.dtype))


@triton.jit
def scan_sequence(i_v, seq, hv, k_hat_ptr, w_ptr, u_ptr, gamma_ptr, v_new_ptr, h_ptr, pool_ptr,
                  q_state_ptr, o_local_ptr, o_ptr,
                  cu_ptr, chunk_off_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, TRACK: tl.constexpr,
                  STORE_H: tl.constexpr, OUTPUT: tl.constexpr):
    """Program (V-tile ``i_v``, sequence ``seq``, value head ``hv``) of kernel 2: the sequential
    state pass over the sequence's chunks.
    Reads the initial state from the pool slot, writes the final state back into the slot and,
    with ``TRACK``, the tracked state into its track slot. With ``STORE_H`` it writes
    ``h [NT, HV, K, V]`` (start state of every chunk). Without ``OUTPUT`` it writes
    ``Ṽ [T, HV, V]`` for :func:`output_chunk`; with ``OUTPUT`` it writes no Ṽ but the output
    ``o [T, HV, V] = O_local + Q_h h`` from the two tiles :func:`prepare_chunk` wrote
    (``q_state_ptr`` ``[T, HV, K]``, ``o_local_ptr`` ``[T, HV, V]``)."""
    bos, eos, first_chunk, n_chunks = sequence_chunks(seq, cu_ptr, chunk_off_ptr)
    hk = hv // (HV // H)
    v0 = i_v * BV

    # The K × BV slab of this head's state, at its place in a [K, V] state.
    rk = tl.arange(0, BK)
    cv = v0 + tl.arange(0, BV)
    slab_mask = (rk < K)[:, None] & (cv < V)[None, :]
    slab = rk[:, None] * V + cv[None, :]
    HEAD = K * V
    slot = tl.load(state_idx_ptr + seq).to(tl.int64)
    state_ptr = pool_ptr + (slot * HV + hv) * HEAD + slab
    S = tl.load(state_ptr, mask=slab_mask, other=0.0)
    if TRACK:
        track_chunk = tl.load(track_chunk_ptr + seq)
        track_slot = tl.maximum(tl.load(track_slot_ptr + seq).to(tl.int64), 0)
        track_ptr = pool_ptr + (track_slot * HV + hv) * HEAD + slab

    work = w_ptr.dtype.element_ty
    for c in range(0, n_chunks):
        if STORE_H:
            tl.store(h_ptr + ((first_chunk + c) * HV + hv) * HEAD + slab,
                     S.to(h_ptr.dtype.element_ty), mask=slab_mask)
        if TRACK:
            # A branch, not a mask: a masked store would still move S through shared memory
            # (into the store's layout) in every step.
            if c == track_chunk:
                tl.store(track_ptr, S, mask=slab_mask)
        t0 = bos + CHUNK * c
        k, w, u, gamma, gamma_last, valid = chunk_tiles(k_hat_ptr, w_ptr, u_ptr, gamma_ptr,
                                                        t0, eos, hk, hv, v0, H, HV, K, V, BK, BV)
        S_work = S.to(work)
        v_new = u - tl.dot(w, S_work)
        if OUTPUT:
            # One product beside the chain: nothing later needs o.
            q_state = load_rows(q_state_ptr + hv * K, t0, eos, HV * K, 0, K, CHUNK, BK)
            o = load_rows(o_local_ptr + hv * V, t0, eos, HV * V, v0, V, CHUNK, BV)
            o = tl.dot(q_state, S_work, o.to(tl.float32))
            store_rows(o_ptr + hv * V, o, t0, eos, HV * V, v0, V, CHUNK, BV)
        else:
            store_rows(v_new_ptr + hv * V, v_new, t0, eos, HV * V, v0, V, CHUNK, BV)
        S = advance_state(S, k, v_new, gamma, gamma_last, valid)

    if TRACK:
        if track_chunk == n_chunks:
            tl.store(track_ptr, S, mask=slab_mask)
    tl.store(state_ptr, S, mask=slab_mask)


@triton.jit
def chunk_scan_kernel(k_hat_ptr, w_ptr, u_ptr, gamma_ptr, v_new_ptr, h_ptr, pool_ptr,
                      q_state_ptr, o_local_ptr, o_ptr,
                      cu_ptr, chunk_off_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr, TRACK: tl.constexpr,
                      STORE_H: tl.constexpr, OUTPUT: tl.constexpr, USE_PDL: tl.constexpr):
    """Kernel 2, grid ``(⌈V/BV⌉, N, HV)``: :func:`scan_sequence` for every (V-tile, sequence,
    value head)."""
    await_previous_kernel(USE_PDL)
    scan_sequence(tl.program_id(0), tl.program_id(1), tl.program_id(2), k_hat_ptr, w_ptr, u_ptr,
                  gamma_ptr, v_new_ptr, h_ptr, pool_ptr, q_state_ptr, o_local_ptr, o_ptr, cu_ptr,
                  chunk_off_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr, H, HV, K, V,
                  BK, BV, TRACK, STORE_H, OUTPUT)


@triton.jit
def output_chunk(i_v, i_chunk, hv, q_ptr, k_hat_ptr, v_new_ptr, h_ptr, gamma_ptr, o_ptr, z_ptr,
                 norm_w_ptr, cu_ptr, chunk_idx_ptr, scale, stride_q, stride_z, eps,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                 GATE: tl.constexpr):
    """Program (V-tile ``i_v``, chunk ``i_chunk``, value head ``hv``) of kernel 3: its 64 rows of
    ``o [T, HV, V]`` from ``h`` and ``Ṽ``. With ``GATE`` (then ``BV`` covers the whole head) the
    rows are normed before they are stored (:func:`_gated_norm`, gate ``z [T, HV·V]`` with row
    stride ``stride_z``, weight ``norm_w [V]``, ``eps``); without, those four are unread."""
    v0 = i_v * BV
    seq, bos, eos = chunk_rows(i_chunk, cu_ptr, chunk_idx_ptr)
    hk = hv // (HV // H)
    valid = bos + tl.arange(0, CHUNK) < eos

    q = _queries(q_ptr, hk, bos, eos, stride_q, scale, K, BK, USE_L2NORM)
    k = load_rows(k_hat_ptr + hk * K, bos, eos, H * K, 0, K, CHUNK, BK)
    v_new = load_rows(v_new_ptr + hv * V, bos, eos, HV * V, v0, V, CHUNK, BV)
    gamma = tl.load(gamma_ptr + (bos + tl.arange(0, CHUNK)) * HV + hv, mask=valid, other=0.0)
    # Row i_chunk of h is this chunk's start state (chunks are numbered like the checkpoints).
    rk = tl.arange(0, BK)
    cv = v0 + tl.arange(0, BV)
    h_offs = (i_chunk.to(tl.int64) * HV + hv) * (K * V) + rk[:, None] * V + cv[None, :]
    h = tl.load(h_ptr + h_offs, mask=(rk < K)[:, None] & (cv < V)[None, :], other=0.0)
    o = _chunk_output(q, k, v_new, h, gamma, valid)
    if GATE:
        o = _gated_norm(o, z_ptr + hv * V, norm_w_ptr, bos, eos, stride_z, eps, V, BV)
    store_rows(o_ptr + hv * V, o, bos, eos, HV * V, v0, V, CHUNK, BV)


@triton.jit
def chunk_output_kernel(q_ptr, k_hat_ptr, v_new_ptr, h_ptr, gamma_ptr, o_ptr, z_ptr, norm_w_ptr,
                        cu_ptr, chunk_idx_ptr, scale, stride_q, stride_z, eps,
                        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                        BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                        GATE: tl.constexpr, USE_PDL: tl.constexpr):
    """Kernel 3, grid ``(⌈V/BV⌉, NT, HV)``: :func:`output_chunk` for every (V-tile, chunk, value
    head). The V-tiles of a chunk are neighbours in the grid, so its q and k̂ are read from L2."""
    await_previous_kernel(USE_PDL)
    output_chunk(tl.program_id(0), tl.program_id(1), tl.program_id(2), q_ptr, k_hat_ptr,
                 v_new_ptr, h_ptr, gamma_ptr, o_ptr, z_ptr, norm_w_ptr, cu_ptr, chunk_idx_ptr,
                 scale, stride_q, stride_z, eps, H, HV, K, V, BK, BV, USE_L2NORM, GATE)


def _block(d: int) -> int:
    """A head dim as one power-of-two tile, at least 64 wide (masked past d): Triton 3.6
    miscompiled the H200 products whose right operand was 16 or 32 wide at 4 warps
    (data/benchmarks/small_head_dims.md), and ``tl.dot`` needs ≥ 16 anyway."""
    return max(64, triton.next_power_of_2(d))


# Launch choices, measured on the H200 (K = V = 128, bf16; data/benchmarks/stage_sweep.md and
# scan_tile_sweep.md). A whole sequence's chunks are one serial chain, so when few (sequence, value
# head) pairs exist the scan takes narrower V-tiles: more programs, shorter steps (1×8192: 32 wide
# 0.16 ms, 64 wide 0.25 ms; 1×512 with 8 value heads: 16 wide 9.9 µs, 32 wide 12.9 µs).
SCAN_PROGRAMS = 128      # the scan narrows its V-tile (64, 32, 16) until it has this many programs
PREPARE_WARPS = 4        # 209 µs at 1×8192 (8 warps: 419 µs)
OUTPUT_IN_SCAN = False   # the output kernel runs after the scan (module docstring)


def forced_output_path(in_scan: bool):
    """Within the block, every prefill computes its output inside the scan (``in_scan``) or with
    the output kernel: for the tests and the benchmark, which compare the two."""
    return overriding(globals(), "OUTPUT_IN_SCAN", in_scan)


def _scan_config(n_chains: int, V: int) -> tuple[int, int, int]:
    """``(BV, num_warps, num_stages)`` of the scan (``n_chains`` = N·HV): the widest V-tile of 64,
    32 and 16 that gives :data:`SCAN_PROGRAMS` programs (else 16), with a deeper load pipeline
    below 64 (each program walks many chunks)."""
    bv = 16
    for wide in (64, 32):
        if n_chains * triton.cdiv(V, wide) >= SCAN_PROGRAMS:
            bv = wide
            break
    bv = min(bv, _block(V))
    return bv, 4, 2 if bv == 64 else 3


def _output_block_v(n_tiles: int, V: int) -> int:
    """V-tile of the output kernel: the whole head (q K̂ᵀ computed once per chunk), or 64 wide
    when whole heads would give fewer than two programs per SM of an H200."""
    if _block(V) > 64 and n_tiles < 2 * 132:
        return 64
    return _block(V)


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Storage dtype of the intermediates W, U, Ṽ (and of h without checkpoints)."""
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.float32


def fp16_inverse(use_qk_l2norm: bool, work: torch.dtype) -> bool:
    """Whether the inverse's products take fp16 operands: with 16-bit storage and keys normalised
    in the kernel (unit keys bound L and T, :func:`invert_unit_lower`). In tf32 the doubling was
    ~45 % of the prepare kernel's time (1×8192, H200); fp16 runs at twice tf32's rate, as
    precisely."""
    return use_qk_l2norm and work != torch.float32


def prepare_outputs(k, v):
    """What kernel 1 writes, allocated: ``(gamma [T, HV] fp32, k_hat [T, H, K], w [T, HV, K],
    u [T, HV, V])``, all but gamma in :func:`work_dtype`."""
    T, H, K = k.shape
    HV, V = v.shape[1:]
    work = work_dtype(v.dtype)
    return (torch.empty(T, HV, device=k.device, dtype=torch.float32),
            torch.empty(T, H, K, device=k.device, dtype=work),
            torch.empty(T, HV, K, device=k.device, dtype=work),
            torch.empty(T, HV, V, device=k.device, dtype=work))


def launch_prepare(k, v, g, beta, meta, use_qk_l2norm, gating=None, queries=None):
    """Kernel 1 on validated inputs: returns :func:`prepare_outputs`, filled. ``gating``:
    ``(A_log, dt_bias)`` when ``g, beta`` are the raw projections ``a, b``. With ``queries =
    (q, scale)`` it also folds the output (:func:`_fold_output`) and returns, after those four,
    ``q_state [T, HV, K]`` and ``o_local [T, HV, V]`` in :func:`work_dtype`."""
    T, H, K = k.shape
    HV, V = v.shape[1:]
    gamma, k_hat, w, u = prepare_outputs(k, v)
    A_log, dt_bias = gating or (g, g)  # unread without gating
    q, scale = queries or (k, 1.0)
    folded = (torch.empty_like(w), torch.empty_like(u)) if queries else (w, u)  # unread without
    chunk_prepare_kernel[(meta.NT, HV)](
        k, v, g, beta, A_log, dt_bias, gamma, k_hat, w, u, meta.cu_seqlens, meta.chunk_indices,
        k.stride(0), v.stride(0), g.stride(0), beta.stride(0), q, *folded, q.stride(0), scale,
        H, HV, K, V, _block(K), _block(V), use_qk_l2norm, gating is not None,
        fp16_inverse(use_qk_l2norm, w.dtype), queries is not None,
        num_warps=PREPARE_WARPS, **pdl_options(u.device))
    return (gamma, k_hat, w, u, *folded) if queries else (gamma, k_hat, w, u)


def launch_scan(k_hat, w, u, gamma, state_pool, state_indices, meta, h=None,
                track_slots=None, track_chunks=None, folded=None):
    """Kernel 2, the sequential pass; updates the pool and writes the tracked states if asked.
    ``h``: the fp32 checkpoints to fill, if wanted. Without ``folded`` returns
    ``(v_new [T, HV, V], h [NT, HV, K, V])`` for :func:`launch_output` (``h`` allocated in
    :func:`work_dtype` unless given). With ``folded = (q_state, o_local)`` from
    :func:`launch_prepare` the scan computes the output itself and returns ``o [T, HV, V]``
    (in their dtype, q's)."""
    T, H, K = k_hat.shape
    HV, V = u.shape[1:]
    out = torch.empty_like(u)  # Ṽ, or o with the output folded
    output = folded is not None
    if not output:
        folded = (w, u)  # unread
        if h is None:
            h = torch.empty(meta.NT, HV, K, V, device=u.device, dtype=u.dtype)
    store_h = h is not None
    track = track_slots is not None
    BV, warps, stages = _scan_config(meta.N * HV, V)
    chunk_scan_kernel[(triton.cdiv(V, BV), meta.N, HV)](
        k_hat, w, u, gamma, out, h if store_h else u, state_pool, *folded, out,
        meta.cu_seqlens, meta.chunk_offsets, state_indices,
        track_slots if track else state_indices, track_chunks if track else state_indices,
        H, HV, K, V, _block(K), BV, track, store_h, output,
        num_warps=warps, num_stages=stages, **pdl_options(u.device))
    return out if output else (out, h)


def launch_output(q, k_hat, v_new, h, gamma, meta, scale, use_qk_l2norm, output_norm=None):
    """Kernel 3, fully parallel: returns ``o [T, HV, V]`` in q's dtype. With ``output_norm =
    (z, weight, eps)`` (validated, :func:`mamba_edu.kernels.gdn_prefill`) ``o`` is normed in the
    kernel: the fp32 output, where a separate :func:`~mamba_edu.kernels.fused_ops.gated_rms_norm`
    reads it rounded to q's dtype, so the two agree to that rounding, not bit for bit. Where
    :func:`_output_block_v` splits heads, the norm runs as a kernel of its own instead."""
    T, H, K = q.shape
    HV, V = v_new.shape[1:]
    BV = _output_block_v(meta.NT * HV, V)
    if output_norm is not None and BV < _block(V):
        # The norm sums over the whole head, so it needs one V-tile per head; where the rule
        # splits heads (few chunks) that halves the programs, and on the H200 a separate norm
        # kernel was faster (1×512, qwen3.5-tp8: 25.6 against 27.2 µs with the norm fused).
        o = launch_output(q, k_hat, v_new, h, gamma, meta, scale, use_qk_l2norm)
        return apply_output_norm(o, output_norm)
    o = torch.empty(T, HV, V, device=q.device, dtype=q.dtype)
    z, weight, eps = output_norm or (o, o, 0.0)  # unread without the norm
    chunk_output_kernel[(triton.cdiv(V, BV), meta.NT, HV)](
        q, k_hat, v_new, h, gamma, o, z, weight, meta.cu_seqlens, meta.chunk_indices, scale,
        q.stride(0), z.stride(0), eps, H, HV, K, V, _block(K), BV, use_qk_l2norm,
        output_norm is not None, num_warps=4, **pdl_options(o.device))
    return o


def apply_output_norm(o, output_norm, backend="triton"):
    """``o`` normed by :func:`~mamba_edu.kernels.fused_ops.gated_rms_norm` as a step of its own
    (where the output is not computed by kernel 3), or ``o`` itself when ``output_norm`` is None."""
    return o if output_norm is None else gated_rms_norm(o, *output_norm, backend=backend)


def prefill_triton(q, k, v, g, beta, state_pool, state_indices, meta, scale, use_qk_l2norm,
                   output_checkpoints, track_slots, track_chunks, gating=None, output_norm=None):
    """The kernels on validated inputs (see :func:`mamba_edu.kernels.gdn_prefill`); returns
    ``(o, checkpoints or None)``. Three kernels, or two with the output in the scan. With
    ``output_norm`` the output kernel norms ``o``; with the output in the scan a norm kernel
    follows it."""
    T, H, K = q.shape
    HV, V = v.shape[1:]
    prepared = launch_prepare(k, v, g, beta, meta, use_qk_l2norm, gating,
                              queries=(q, scale) if OUTPUT_IN_SCAN else None)
    gamma, k_hat, w, u = prepared[:4]
    ckpt = (torch.empty(meta.NT, HV, K, V, device=q.device, dtype=torch.float32)
            if output_checkpoints else None)
    if OUTPUT_IN_SCAN:
        o = launch_scan(k_hat, w, u, gamma, state_pool, state_indices, meta, ckpt,
                        track_slots, track_chunks, folded=prepared[4:])
        return apply_output_norm(o, output_norm), ckpt
    v_new, h = launch_scan(k_hat, w, u, gamma, state_pool, state_indices, meta, ckpt,
                           track_slots, track_chunks)
    return launch_output(q, k_hat, v_new, h, gamma, meta, scale, use_qk_l2norm,
                         output_norm), ckpt
