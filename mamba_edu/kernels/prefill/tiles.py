"""The prefill's device helpers: the chunk math the three stages (and the lab's variants) share.

- where a program's rows are: :func:`chunk_rows`, :func:`sequence_chunks`;
- a chunk's preparation: :func:`chunk_gates` (``gamma`` = Γ, β), :func:`chunk_inverse`
  (``T = (I + L)⁻¹`` and ``k_hat`` = k̂, by :func:`invert_unit_lower`);
- the scan's state: :func:`scan_start`, :func:`store_if_tracked`, :func:`advance_state`,
  :func:`scan_end`;
- a chunk's output: :func:`scaled_queries`, :func:`output_tile`, :func:`gated_norm_rows`.

Every tile is 64 rows (one chunk, :data:`CHUNK`); rows past the sequence's end are masked to
zeros on load and never stored. Generic tile loads and stores are in :mod:`mamba_edu.kernels.tiles`.
"""

import triton
import triton.language as tl

from mamba_edu.gdn.varlen import CHUNK as _CHUNK
from mamba_edu.kernels.tiles import gate_values, l2norm_rows, load_rows

CHUNK = tl.constexpr(_CHUNK)  # rows per chunk (64): a compile-time constant inside the kernels
# g is floored here before Γ is summed: with g = −inf, Γ_s − Γ_j would be (−inf) − (−inf) = NaN.
# Below about −104 fp32's exp is 0, so every decay factor spanning a floored step is 0 either way
# (the chunked reference floors at −1000 in fp64); 64 floored steps keep |Γ| ≤ 7040, finite.
G_FLOOR = tl.constexpr(-110.0)


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
def chunk_gates(g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, bos, eos, hv, stride_g, stride_beta,
                GATED: tl.constexpr):
    """The chunk's ``(gamma [64], beta [64])`` fp32: Γ = the cumsum of g, zeros past ``eos``.
    With ``GATED``, ``g_ptr``/``beta_ptr`` hold the raw projections a, b and the gating is
    computed here (:func:`~mamba_edu.kernels.tiles.gate_values`)."""
    rows = bos + tl.arange(0, CHUNK)
    valid = rows < eos
    g = tl.load(g_ptr + rows * stride_g + hv, mask=valid, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + rows * stride_beta + hv, mask=valid, other=0.0).to(tl.float32)
    if GATED:
        g, beta = gate_values(g, beta, tl.load(A_log_ptr + hv), tl.load(dt_bias_ptr + hv))
    # Padded rows have g = β = 0: Γ stays flat there and their rows of L, W, U are zero.
    gamma = tl.cumsum(tl.where(valid, tl.maximum(g, G_FLOOR), 0.0), 0)
    return gamma, tl.where(valid, beta, 0.0)


@triton.jit
def inverse_norm(sum_sq, USE_L2NORM: tl.constexpr):
    """The factor that L2-normalises a row with this sum of squares (eps inside the root)."""
    if USE_L2NORM:
        return tl.rsqrt(sum_sq + 1e-6)
    return tl.full(sum_sq.shape, 1.0, tl.float32)


@triton.jit
def chunk_inverse(k, gamma, beta, USE_L2NORM: tl.constexpr, FP16_INVERSE: tl.constexpr):
    """``(T [64, 64] fp32, k_hat [64, BK] fp32)`` of a chunk from its raw keys ``k [64, BK]``:
    ``T = (I + L)⁻¹`` with ``L = strict_lower(β (k̂ k̂ᵀ) e^{Γs−Γj})``.

    The Gram matrix is taken from the raw keys in their own dtype (bf16: exact products, fp32
    sums) and normalised afterwards: ``K̂K̂ᵀ = diag(n) K Kᵀ diag(n)``."""
    k_f32 = k.to(tl.float32)
    norm = inverse_norm(tl.sum(k_f32 * k_f32, 1), USE_L2NORM)
    r = tl.arange(0, CHUNK)
    diff = tl.where(r[:, None] > r[None, :], gamma[:, None] - gamma[None, :], float("-inf"))
    L = (beta * norm)[:, None] * tl.dot(k, tl.trans(k)) * norm[None, :] * tl.exp(diff)
    return invert_unit_lower(L, CHUNK, FP16_INVERSE), k_f32 * norm[:, None]


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
def scan_start(pool_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr, seq, hv, v0,
               HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
               BV: tl.constexpr, TRACK: tl.constexpr):
    """Where a scan program's state lives, and its start state: ``(S [BK, BV] fp32, slab,
    slab_mask, state_ptr, state_mask, track_ptr, track_chunk)``.

    ``slab``, ``slab_mask``: the offsets of the ``K × BV`` slab from column ``v0`` within a head's
    ``[K, V]`` state. ``S`` is that slab of the pool slot of sequence ``seq``, value head ``hv``
    (zeros for a negative slot: a padded row, whose ``state_mask`` is all false, so it writes no
    state). With ``TRACK``, ``track_ptr`` is the slab of its track slot and ``track_chunk`` the
    chunk it is tracked at (else the state's slab and −1: never)."""
    rk = tl.arange(0, BK)
    cv = v0 + tl.arange(0, BV)
    slab = rk[:, None] * V + cv[None, :]
    slab_mask = (rk < K)[:, None] & (cv < V)[None, :]
    slot = tl.load(state_idx_ptr + seq).to(tl.int64)
    # A select, not `slab_mask & (slot >= 0)`: Triton's interpreter splats a scalar comparison
    # into an int array, which its tl.load refuses as a mask from Triton 3.8 on ("mask has
    # unsupported dtype"). Compiled, the two are the same i1 and.
    state_mask = tl.where(slot >= 0, slab_mask, False)
    state_ptr = pool_ptr + (tl.maximum(slot, 0) * HV + hv) * (K * V) + slab
    S = tl.load(state_ptr, mask=state_mask, other=0.0)
    track_ptr, track_chunk = state_ptr, -1
    if TRACK:
        track_chunk = tl.load(track_chunk_ptr + seq)
        track_slot = tl.maximum(tl.load(track_slot_ptr + seq).to(tl.int64), 0)
        track_ptr = pool_ptr + (track_slot * HV + hv) * (K * V) + slab
    return S, slab, slab_mask, state_ptr, state_mask, track_ptr, track_chunk


@triton.jit
def store_if_tracked(S, c, track_ptr, track_chunk, slab_mask, TRACK: tl.constexpr):
    """Store ``S``, the state after ``c`` chunks, into the track slot if it is the tracked one."""
    if TRACK:
        # A branch, not a mask: a masked store would still move S through shared memory (into
        # the store's layout) in every step.
        if c == track_chunk:
            tl.store(track_ptr, S, mask=slab_mask)


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
def scan_end(S, n_chunks, state_ptr, state_mask, track_ptr, track_chunk, slab_mask,
             TRACK: tl.constexpr):
    """After the last chunk: the tracked copy if the final state is the tracked one, and the
    final state back into its pool slot (:func:`scan_start`'s pointers and masks)."""
    store_if_tracked(S, n_chunks, track_ptr, track_chunk, slab_mask, TRACK)
    tl.store(state_ptr, S, mask=state_mask)


@triton.jit
def scaled_queries(q_ptr, hk, bos, eos, stride_q, scale, K: tl.constexpr, BK: tl.constexpr,
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
def output_tile(q, k, v_new, h, gamma, valid):
    """``O = (Q̂ e^Γ) h + (Q̂ K̂ᵀ ⊙ e^{Γr−Γs} ⊙ [s≤r]) Ṽ`` for one chunk and V-tile: ``q [64, BK]``
    fp32 (scaled), ``k [64, BK]``, ``v_new [64, BV]`` in the storage dtype, ``h [BK, BV]`` (its
    dtype sets the first product's), ``gamma [64]``; returns ``[64, BV]`` fp32."""
    work = k.dtype
    decay = _causal_decay(gamma, valid)
    attn = tl.dot(q.to(work), tl.trans(k)) * decay
    o = tl.dot((q * tl.exp(gamma)[:, None]).to(h.dtype), h)
    return tl.dot(attn.to(work), v_new, o)


@triton.jit
def gated_norm_rows(o, z_ptr, w_ptr, bos, eos, stride_z, eps, V: tl.constexpr, BV: tl.constexpr):
    """The GDN output norm of a chunk's whole-head tile ``o [64, BV]`` fp32 (zeros past V):
    ``o · rsqrt(Σo²/V + eps) · w · z·sigmoid(z)`` per row, in fp32. ``z_ptr`` points at the head's
    first column of ``z [T, HV·V]`` (row stride ``stride_z``), ``w_ptr`` at ``w [V]``."""
    z = load_rows(z_ptr, bos, eos, stride_z, 0, V, CHUNK, BV).to(tl.float32)
    cols = tl.arange(0, BV)
    w = tl.load(w_ptr + cols, mask=cols < V, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(o * o, 1) / V + eps)
    return o * rstd[:, None] * w[None, :] * (z * tl.sigmoid(z))
