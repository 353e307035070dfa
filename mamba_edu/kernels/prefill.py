"""The chunked GDN prefill in Triton kernels (docs/conventions.md, chunk C = 64).

1. :func:`chunk_prepare_kernel`, grid ``(NT, HV)``, one program per (chunk, value head), all in
   parallel: the gating (when given the raw projections a, b), the chunk-local cumsum Γ of g,
   the L2 norm k̂ of k, ``L = strict_lower(β (k̂ k̂ᵀ) e^{Γs−Γj})``, the inverse
   ``T = (I+L)⁻¹`` and ``W = T(β e^Γ K̂)``, ``U = T(β V)``. Writes Γ, k̂, W, U.
2. :func:`chunk_scan_kernel`, grid ``(⌈V/BV⌉, N, HV)``, one program per (V-tile, sequence, value
   head), looping over the sequence's chunks. Only what the next chunk needs is on this serial
   path: it writes the chunk's start state ``h[c] = S``, then ``Ṽ = U − W S`` (written too) and
   ``S ← e^{Γ_C} S + K̂ᵀ (e^{Γ_C−Γ} ⊙ Ṽ)``. It reads S₀ from the pool slot, writes the final state
   back in place, and writes the ``fused`` tracking copy when given its slots.
3. :func:`chunk_output_kernel`, grid ``(⌈V/BV⌉, NT, HV)``, one program per (V-tile, chunk, value
   head), all in parallel again: ``O = scale·[(Q̂ e^Γ) h[c] + (Q̂ K̂ᵀ ⊙ e^{Γr−Γs} ⊙ [s≤r]) Ṽ]``.
   Given the output gate z it also applies the layer's output norm ``rms_norm(O)·w·silu(z)``
   per head (one V-tile per head): one launch less than a separate norm kernel, used where the
   output's V-tile is the whole head anyway (:func:`launch_output`).

Why a separate output kernel: a chunk's output needs that chunk's start state, but nothing later
needs the output. Computing it inside the serial pass makes every chunk step longer and leaves
only ``(V/BV)·N·HV`` programs for all of that work. Writing ``h`` and ``Ṽ`` to memory costs
bandwidth but lets the output run over every (chunk, head, tile) at once. (Folding the output
into the scan, and running all three stages in one launch, were tried and measured slower on
the H200: notebook 10, the appendix, shows them and their data.) ``h`` is stored in the input dtype
(bf16 on a GPU), or in fp32 when checkpoints are requested: then the checkpoints *are* ``h``.

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

Tiles over a head dim are at least 64 wide (:func:`head_block`, masked past K or V): Triton 3.6
miscompiled, on the H200, products whose right operand was 16 or 32 wide at 4 warps, the form the
prepare kernel's ``T · X`` takes at small head dims (data/benchmarks/small_head_dims.md). The
scan's V-tile may be 16 or 32 wide. Launch configurations are fixed per batch shape from H200
measurements (:func:`scan_config`), not autotuned: an autotuner keyed on the head dims would
reuse the choice of whichever batch ran first.
"""

import torch
import triton
import triton.language as tl

from mamba_edu.gdn.varlen import CHUNK as _CHUNK
from mamba_edu.kernels.fused_ops import gated_rms_norm
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
    (bit-equal, and faster on the H200: data/benchmarks/inverse_blocks/).
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
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                  GATED: tl.constexpr, FP16_INVERSE: tl.constexpr):
    """Program (chunk ``i_chunk``, value head ``hv``) of kernel 1: Γ ``[T, HV]``, W ``[T, HV, K]``,
    U ``[T, HV, V]`` for its 64 rows, and the normalised keys k̂ ``[T, H, K]`` (written by the
    first value head of each group); returns the chunk's sequence.
    With ``GATED``, ``g_ptr``/``beta_ptr`` hold the raw projections a, b and the gating is
    computed here (with ``A_log``, ``dt_bias``). Inputs are read with their row strides.
    ``BK``, ``BV`` are at least 64 (masked past K, V): see the module docstring.
    ``FP16_INVERSE``: the inverse's products on fp16 operands (:func:`launch_prepare`)."""
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

    _write_w_u(T, k_f32 * norm[:, None], beta, gamma, v_ptr + hv * V, k_hat_ptr + hk * K,
               w_ptr + hv * K, u_ptr + hv * V, hv, bos, eos, stride_v, H, HV, K, V, BK, BV)
    return seq


@triton.jit
def _write_w_u(T, k_hat, beta, gamma, v_ptr, k_hat_ptr, w_ptr, u_ptr, hv, bos, eos, stride_v,
               H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               BK: tl.constexpr, BV: tl.constexpr):
    """Store k̂ (first value head of the group only), ``W = T (β e^Γ K̂)`` and ``U = T (β V)``:
    operands in the storage dtype (W's), fp32 accumulation. Pointers at the head's first
    column."""
    # Rows below bos do not exist: the other value heads of the group store no k̂.
    k_hat_end = tl.where(hv % (HV // H) == 0, eos, bos)
    store_rows(k_hat_ptr, k_hat, bos, k_hat_end, H * K, 0, K, CHUNK, BK)
    T = T.to(w_ptr.dtype.element_ty)
    keys_in = (k_hat * (beta * tl.exp(gamma))[:, None]).to(T.dtype)
    store_rows(w_ptr, tl.dot(T, keys_in), bos, eos, HV * K, 0, K, CHUNK, BK)
    v = load_rows(v_ptr, bos, eos, stride_v, 0, V, CHUNK, BV).to(tl.float32)
    values_in = (v * beta[:, None]).to(T.dtype)
    store_rows(u_ptr, tl.dot(T, values_in), bos, eos, HV * V, 0, V, CHUNK, BV)


@triton.heuristics({"GATED": lambda args: args["A_log_ptr"] is not None})
@triton.jit
def chunk_prepare_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr,
                         gamma_ptr, k_hat_ptr, w_ptr, u_ptr, cu_ptr, chunk_idx_ptr,
                         stride_k, stride_v, stride_g, stride_beta,
                         H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                         FP16_INVERSE: tl.constexpr, GATED: tl.constexpr):
    """Kernel 1, grid ``(NT, HV)``: :func:`prepare_chunk` for every (chunk, value head).
    ``GATED`` follows from what is passed: ``A_log_ptr`` (and ``dt_bias_ptr``) given, or None."""
    prepare_chunk(tl.program_id(0), tl.program_id(1), k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr,
                  dt_bias_ptr, gamma_ptr, k_hat_ptr, w_ptr, u_ptr, cu_ptr, chunk_idx_ptr,
                  stride_k, stride_v, stride_g, stride_beta, H, HV, K, V, BK, BV, USE_L2NORM,
                  GATED, FP16_INVERSE)


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
def state_slab(v0, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """The ``K × BV`` slab of a head's ``[K, V]`` state from column ``v0``: ``(offsets [BK, BV]
    within the head, mask)``."""
    rk = tl.arange(0, BK)
    cv = v0 + tl.arange(0, BV)
    return rk[:, None] * V + cv[None, :], (rk < K)[:, None] & (cv < V)[None, :]


@triton.jit
def scan_start(pool_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr, seq, hv, slab, slab_mask,
               HV: tl.constexpr, HEAD: tl.constexpr, TRACK: tl.constexpr):
    """Where a scan program's state lives: ``(S, state_ptr, has_state, track_ptr, track_chunk)``,
    the start state ``S`` (its slab ``slab`` of the pool slot of sequence ``seq``, value head
    ``hv``; zeros for a negative slot: a padded row, which writes no state, ``has_state`` false)
    and, with ``TRACK``, the slab of its track slot and the chunk it is tracked at (else the
    state's slab and −1: never)."""
    slot = tl.load(state_idx_ptr + seq).to(tl.int64)
    has_state = slot >= 0
    state_ptr = pool_ptr + (tl.maximum(slot, 0) * HV + hv) * HEAD + slab
    S = tl.load(state_ptr, mask=slab_mask & has_state, other=0.0)
    track_ptr, track_chunk = state_ptr, -1
    if TRACK:
        track_chunk = tl.load(track_chunk_ptr + seq)
        track_slot = tl.maximum(tl.load(track_slot_ptr + seq).to(tl.int64), 0)
        track_ptr = pool_ptr + (track_slot * HV + hv) * HEAD + slab
    return S, state_ptr, has_state, track_ptr, track_chunk


@triton.jit
def store_if_tracked(S, c, track_ptr, track_chunk, slab_mask, TRACK: tl.constexpr):
    """Store ``S``, the state after ``c`` chunks, into the track slot if it is the tracked one."""
    if TRACK:
        # A branch, not a mask: a masked store would still move S through shared memory (into
        # the store's layout) in every step.
        if c == track_chunk:
            tl.store(track_ptr, S, mask=slab_mask)


@triton.jit
def scan_sequence(i_v, seq, hv, k_hat_ptr, w_ptr, u_ptr, gamma_ptr, v_new_ptr, h_ptr, pool_ptr,
                  cu_ptr, chunk_off_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, TRACK: tl.constexpr):
    """Program (V-tile ``i_v``, sequence ``seq``, value head ``hv``) of kernel 2: the sequential
    state pass over the sequence's chunks.
    Reads the initial state from the pool slot (zeros for a negative slot: a padded row),
    writes the final state back into the slot (none for a padded row) and,
    with ``TRACK``, the tracked state into its track slot. It writes ``h [NT, HV, K, V]`` (the
    start state of every chunk) and ``Ṽ [T, HV, V]`` for :func:`output_chunk`."""
    bos, eos, first_chunk, n_chunks = sequence_chunks(seq, cu_ptr, chunk_off_ptr)
    hk = hv // (HV // H)
    v0 = i_v * BV

    slab, slab_mask = state_slab(v0, K, V, BK, BV)
    HEAD = K * V
    S, state_ptr, has_state, track_ptr, track_chunk = scan_start(
        pool_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr, seq, hv, slab, slab_mask, HV, HEAD, TRACK)

    work = w_ptr.dtype.element_ty
    for c in range(0, n_chunks):
        tl.store(h_ptr + ((first_chunk + c) * HV + hv) * HEAD + slab,
                 S.to(h_ptr.dtype.element_ty), mask=slab_mask)
        store_if_tracked(S, c, track_ptr, track_chunk, slab_mask, TRACK)
        t0 = bos + CHUNK * c
        k, w, u, gamma, gamma_last, valid = chunk_tiles(k_hat_ptr, w_ptr, u_ptr, gamma_ptr,
                                                        t0, eos, hk, hv, v0, H, HV, K, V, BK, BV)
        v_new = u - tl.dot(w, S.to(work))
        store_rows(v_new_ptr + hv * V, v_new, t0, eos, HV * V, v0, V, CHUNK, BV)
        S = advance_state(S, k, v_new, gamma, gamma_last, valid)

    store_if_tracked(S, n_chunks, track_ptr, track_chunk, slab_mask, TRACK)
    tl.store(state_ptr, S, mask=slab_mask & has_state)


@triton.heuristics({"TRACK": lambda args: args["track_slot_ptr"] is not None})
@triton.jit
def chunk_scan_kernel(k_hat_ptr, w_ptr, u_ptr, gamma_ptr, v_new_ptr, h_ptr, pool_ptr,
                      cu_ptr, chunk_off_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr, TRACK: tl.constexpr):
    """Kernel 2, grid ``(⌈V/BV⌉, N, HV)``: :func:`scan_sequence` for every (V-tile, sequence,
    value head). ``TRACK`` follows from what is passed: the track slots and chunks, or None."""
    scan_sequence(tl.program_id(0), tl.program_id(1), tl.program_id(2), k_hat_ptr, w_ptr, u_ptr,
                  gamma_ptr, v_new_ptr, h_ptr, pool_ptr, cu_ptr, chunk_off_ptr, state_idx_ptr,
                  track_slot_ptr, track_chunk_ptr, H, HV, K, V, BK, BV, TRACK)


@triton.jit
def output_chunk(i_v, i_chunk, hv, q_ptr, k_hat_ptr, v_new_ptr, h_ptr, gamma_ptr, o_ptr, z_ptr,
                 norm_w_ptr, cu_ptr, chunk_idx_ptr, scale, stride_q, stride_z, eps,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                 GATE: tl.constexpr):
    """Program (V-tile ``i_v``, chunk ``i_chunk``, value head ``hv``) of kernel 3: its 64 rows of
    ``o [T, HV, V]`` from ``h`` and ``Ṽ``. With ``GATE`` (then ``BV`` covers the whole head) the
    rows are normed before they are stored (:func:`_gated_norm`, gate ``z [T, HV·V]`` with row
    stride ``stride_z``, weight ``norm_w [V]``, ``eps``)."""
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


@triton.heuristics({"GATE": lambda args: args["z_ptr"] is not None})
@triton.jit
def chunk_output_kernel(q_ptr, k_hat_ptr, v_new_ptr, h_ptr, gamma_ptr, o_ptr, z_ptr, norm_w_ptr,
                        cu_ptr, chunk_idx_ptr, scale, stride_q, stride_z, eps,
                        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                        BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                        GATE: tl.constexpr):
    """Kernel 3, grid ``(⌈V/BV⌉, NT, HV)``: :func:`output_chunk` for every (V-tile, chunk, value
    head). The V-tiles of a chunk are neighbours in the grid, so its q and k̂ are read from L2.
    ``GATE`` follows from what is passed: the gate ``z_ptr`` (and ``norm_w_ptr``), or None."""
    output_chunk(tl.program_id(0), tl.program_id(1), tl.program_id(2), q_ptr, k_hat_ptr,
                 v_new_ptr, h_ptr, gamma_ptr, o_ptr, z_ptr, norm_w_ptr, cu_ptr, chunk_idx_ptr,
                 scale, stride_q, stride_z, eps, H, HV, K, V, BK, BV, USE_L2NORM, GATE)


def head_block(d: int) -> int:
    """A head dim as one power-of-two tile, at least 64 wide (masked past d): Triton 3.6
    miscompiled the H200 products whose right operand was 16 or 32 wide at 4 warps
    (data/benchmarks/small_head_dims.md), and ``tl.dot`` needs ≥ 16 anyway."""
    return max(64, triton.next_power_of_2(d))


# Launch choices, measured on the H200 (K = V = 128, bf16; data/benchmarks/stage_sweep.md and
# scan_tile_sweep.md). A whole sequence's chunks are one serial chain, so when few (sequence, value
# head) pairs exist the scan takes narrower V-tiles: more programs, shorter steps.
SCAN_PROGRAMS = 128      # the scan narrows its V-tile (64, 32, 16) until it has this many programs
PREPARE_WARPS = 4        # 8 warps were slower at every shape measured


def scan_config(n_chains: int, V: int) -> tuple[int, int, int]:
    """``(BV, num_warps, num_stages)`` of the scan (``n_chains`` = N·HV): the widest V-tile of 64,
    32 and 16 that gives :data:`SCAN_PROGRAMS` programs (else 16), with a deeper load pipeline
    below 64 (each program walks many chunks)."""
    bv = 16
    for wide in (64, 32):
        if n_chains * triton.cdiv(V, wide) >= SCAN_PROGRAMS:
            bv = wide
            break
    bv = min(bv, head_block(V))
    return bv, 4, 2 if bv == 64 else 3


def output_block_v(n_tiles: int, V: int) -> int:
    """V-tile of the output kernel: the whole head (q K̂ᵀ computed once per chunk), or 64 wide
    when whole heads would give fewer than two programs per SM of an H200."""
    if head_block(V) > 64 and n_tiles < 2 * 132:
        return 64
    return head_block(V)


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Storage dtype of the intermediates W, U, Ṽ (and of h without checkpoints)."""
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.float32


def fp16_inverse(use_qk_l2norm: bool, work: torch.dtype) -> bool:
    """Whether the inverse's products take fp16 operands: with 16-bit storage and keys normalised
    in the kernel (unit keys bound L and T, :func:`invert_unit_lower`). fp16 runs at twice tf32's
    rate on tensor cores, with the same mantissa."""
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


def launch_prepare(k, v, g, beta, meta, use_qk_l2norm, gating=None):
    """Kernel 1 on validated inputs: returns :func:`prepare_outputs`, filled. ``gating``:
    ``(A_log, dt_bias)`` when ``g, beta`` are the raw projections ``a, b``, else None."""
    T, H, K = k.shape
    HV, V = v.shape[1:]
    gamma, k_hat, w, u = prepare_outputs(k, v)
    A_log, dt_bias = gating or (None, None)
    chunk_prepare_kernel[(meta.NT, HV)](
        k, v, g, beta, A_log, dt_bias, gamma, k_hat, w, u, meta.cu_seqlens, meta.chunk_indices,
        k.stride(0), v.stride(0), g.stride(0), beta.stride(0),
        H, HV, K, V, head_block(K), head_block(V), use_qk_l2norm,
        fp16_inverse(use_qk_l2norm, w.dtype), num_warps=PREPARE_WARPS)
    return gamma, k_hat, w, u


def launch_scan(k_hat, w, u, gamma, state_pool, state_indices, meta, h=None,
                track_slots=None, track_chunks=None):
    """Kernel 2, the sequential pass; updates the pool and writes the tracked states when given
    ``track_slots, track_chunks``. Returns ``(v_new [T, HV, V], h [NT, HV, K, V])`` for
    :func:`launch_output`: ``h`` is the fp32 checkpoints to fill when given, else allocated in
    :func:`work_dtype`."""
    T, H, K = k_hat.shape
    HV, V = u.shape[1:]
    v_new = torch.empty_like(u)
    if h is None:
        h = torch.empty(meta.NT, HV, K, V, device=u.device, dtype=u.dtype)
    BV, warps, stages = scan_config(meta.N * HV, V)
    chunk_scan_kernel[(triton.cdiv(V, BV), meta.N, HV)](
        k_hat, w, u, gamma, v_new, h, state_pool, meta.cu_seqlens, meta.chunk_offsets,
        state_indices, track_slots, track_chunks, H, HV, K, V, head_block(K), BV,
        num_warps=warps, num_stages=stages)
    return v_new, h


def launch_output(q, k_hat, v_new, h, gamma, meta, scale, use_qk_l2norm, output_norm=None):
    """Kernel 3, fully parallel: returns ``o [T, HV, V]`` in q's dtype. With ``output_norm =
    (z, weight, eps)`` (validated, :func:`mamba_edu.kernels.gdn_prefill`) ``o`` is normed in the
    kernel: the fp32 output, where a separate :func:`~mamba_edu.kernels.fused_ops.gated_rms_norm`
    reads it rounded to q's dtype, so the two agree to that rounding, not bit for bit. Where
    :func:`output_block_v` splits heads, the norm runs as a kernel of its own instead."""
    T, H, K = q.shape
    HV, V = v_new.shape[1:]
    BV = output_block_v(meta.NT * HV, V)
    if output_norm is not None and BV < head_block(V):
        # The norm sums over the whole head, so it needs one V-tile per head; where the rule
        # splits heads (few chunks) that halves the programs, and on the H200 a separate norm
        # kernel was faster.
        o = launch_output(q, k_hat, v_new, h, gamma, meta, scale, use_qk_l2norm)
        return apply_output_norm(o, output_norm)
    o = torch.empty(T, HV, V, device=q.device, dtype=q.dtype)
    z, weight, eps = output_norm or (None, None, 0.0)
    chunk_output_kernel[(triton.cdiv(V, BV), meta.NT, HV)](
        q, k_hat, v_new, h, gamma, o, z, weight, meta.cu_seqlens, meta.chunk_indices, scale,
        q.stride(0), 0 if z is None else z.stride(0), eps, H, HV, K, V, head_block(K), BV,
        use_qk_l2norm, num_warps=4)
    return o


def apply_output_norm(o, output_norm, backend="triton"):
    """``o`` normed by :func:`~mamba_edu.kernels.fused_ops.gated_rms_norm` as a step of its own
    (where the output kernel does not norm it), or ``o`` itself when ``output_norm`` is None."""
    return o if output_norm is None else gated_rms_norm(o, *output_norm, backend=backend)


def prefill_triton(q, k, v, g, beta, state_pool, state_indices, meta, scale, use_qk_l2norm,
                   output_checkpoints, track_slots, track_chunks, gating=None, output_norm=None):
    """The three kernels on validated inputs (see :func:`mamba_edu.kernels.gdn_prefill`); returns
    ``(o, checkpoints or None)``. With ``output_norm`` the output kernel norms ``o``."""
    T, H, K = q.shape
    HV, V = v.shape[1:]
    gamma, k_hat, w, u = launch_prepare(k, v, g, beta, meta, use_qk_l2norm, gating)
    ckpt = (torch.empty(meta.NT, HV, K, V, device=q.device, dtype=torch.float32)
            if output_checkpoints else None)
    v_new, h = launch_scan(k_hat, w, u, gamma, state_pool, state_indices, meta, ckpt,
                           track_slots, track_chunks)
    return launch_output(q, k_hat, v_new, h, gamma, meta, scale, use_qk_l2norm,
                         output_norm), ckpt
