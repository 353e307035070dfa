"""The chunked GDN prefill in three Triton kernels (docs/conventions.md, chunk C = 64).

1. :func:`chunk_prepare_kernel`, grid ``(NT, HV)``, one program per (chunk, value head), all in
   parallel: the gating (when given the raw projections a, b), the chunk-local cumsum Γ of g,
   the L2 norm k̂ of k, ``L = strict_lower(β (k̂ k̂ᵀ) e^{Γs−Γj})`` and the solutions of
   ``(I+L) W = β e^Γ K̂``, ``(I+L) U = β V``. Writes Γ, k̂, W, U.
2. :func:`chunk_scan_kernel`, grid ``(⌈V/BV⌉, N, HV)``, one program per (V-tile, sequence, value
   head), looping over the sequence's chunks. Only what the next chunk needs is on this serial
   path: it writes the chunk's start state ``h[c] = S``, then ``Ṽ = U − W S`` (written too) and
   ``S ← e^{Γ_C} S + K̂ᵀ (e^{Γ_C−Γ} ⊙ Ṽ)``. It reads S₀ from the pool slot, writes the final state
   back in place, and optionally writes the ``fused`` tracking copy.
3. :func:`chunk_output_kernel`, grid ``(⌈V/BV⌉, NT, HV)``, one program per (V-tile, chunk, value
   head), all in parallel again: ``O = scale·[(Q̂ e^Γ) h[c] + (Q̂ K̂ᵀ ⊙ e^{Γr−Γs} ⊙ [s≤r]) Ṽ]``.

Why three: a chunk's output needs that chunk's start state, but nothing later needs the output.
Computing it inside the serial pass makes every chunk step longer and leaves only
``(V/BV)·N·HV`` programs for all of that work, so one long sequence keeps most of the GPU idle.
Writing ``h`` and ``Ṽ`` to memory costs bandwidth but lets the output run over every
(chunk, head, tile) at once. ``h`` is stored in the input dtype (bf16 on a GPU), or in fp32 when
checkpoints are requested: then the checkpoints *are* ``h``. Small batches get more programs
from narrower V-tiles (:func:`_scan_block_v`, :func:`_output_block_v`).

The triangular system is solved in four 16-row blocks: each diagonal block of ``I+L`` is inverted
by doubling (:func:`invert_unit_lower`), then a block forward substitution gives W and U
(:func:`_solve_lower`). Every product is 16 rows tall, so the 64×64 inverse is never formed (it
would cost ten 64×64×64 products) and no intermediate grows large (a power series in L would:
its terms can reach 1e13 for correlated keys).

Precision on a GPU: the Gram matrix ``K Kᵀ`` is taken from the raw keys in their own dtype
(bf16: exact products, fp32 sums) and normalised afterwards, ``K̂K̂ᵀ = diag(r) K Kᵀ diag(r)``.
``tl.dot`` on fp32 operands uses tf32 tensor cores; that is what the triangular solve uses,
where bf16 would cost accuracy. W, U, k̂, Ṽ and h (unless checkpoints are requested) are stored
in the input dtype (bf16), and the dots that read them (both dots of the scan, the three of the
output) take operands in that dtype with fp32 accumulation, like flash-linear-attention. The
state S stays fp32 in registers. Under the interpreter dots are plain fp32 (or fp16) matmuls.

Registers: prepare walks the head dim 32 columns at a time, so its tiles are 16×32 and 16×16.
Compiled for sm_90 with Triton 3.6 at K = V = 128, the scan never spills, the output only at
4 warps with fp32 checkpoints, the prepare kernel not at 8 warps (a few bytes at 4 and 2, more
at 1; with fewer warps its 16×16 tiles are not repeated in every warp, so autotuning decides).
"""

import torch
import triton
import triton.language as tl

from mamba_edu.gdn.varlen import CHUNK as _CHUNK
from mamba_edu.kernels.tiles import (as_vector, gate_values, l2norm_rows, load_rows, store_rows,
                                     tuning_configs)

CHUNK = tl.constexpr(_CHUNK)  # rows per chunk (64): a compile-time constant inside the kernels
# g is floored here before Γ is summed: with g = −inf, Γ_s − Γ_j would be (−inf) − (−inf) = NaN.
# Below about −104 fp32's exp is 0, so every decay factor spanning a floored step is 0 either way
# (the chunked reference floors at −1000 in fp64); 64 floored steps keep |Γ| ≤ 7040, finite.
G_FLOOR = tl.constexpr(-110.0)


@triton.jit
def _merge_blocks(X, L, r, SIZE: tl.constexpr):
    """One doubling step of :func:`invert_unit_lower`: from the inverses of the SIZE-blocks on
    the diagonal (in ``X``) to those of the 2·SIZE-blocks."""
    same_pair = (r[:, None] // (2 * SIZE)) == (r[None, :] // (2 * SIZE))
    other_block = (r[:, None] // SIZE) != (r[None, :] // SIZE)
    B = tl.where(same_pair & other_block, L, 0.0)
    return X - tl.dot(X, tl.dot(B, X))


@triton.jit
def invert_unit_lower(L, C: tl.constexpr):
    """``(I + L)⁻¹`` of a strictly lower ``[C, C]`` fp32 tile (C = 16, 32 or 64) by doubling.

    A diagonal block of size 2s is ``[[A, 0], [B, D]]``; knowing the inverses of A and D, its
    inverse is ``[[A⁻¹, 0], [−D⁻¹ B A⁻¹, D⁻¹]]``. With X holding the inverses of all s-blocks on
    the diagonal, that is ``X ← X − X (B X)`` for all blocks at once, B = the entries of L inside
    a 2s-block but outside both of its s-blocks (:func:`_merge_blocks`). The 2×2 blocks need no
    product: ``[[1, 0], [l, 1]]⁻¹ = [[1, 0], [−l, 1]]``. Then log₂ C − 1 doubling steps.
    """
    r = tl.arange(0, C)
    diagonal = r[:, None] == r[None, :]
    same_pair = (r[:, None] // 2) == (r[None, :] // 2)
    X = tl.where(diagonal, 1.0, tl.where(same_pair, -L, 0.0))
    X = _merge_blocks(X, L, r, 2)
    X = _merge_blocks(X, L, r, 4)
    X = _merge_blocks(X, L, r, 8)
    if C > 16:
        X = _merge_blocks(X, L, r, 16)
    if C > 32:
        X = _merge_blocks(X, L, r, 32)
    return X


@triton.jit
def _gate_rows(g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, gamma_ptr, t0, eos, hv, gamma_before,
               stride_g, stride_beta, HV: tl.constexpr, GATED: tl.constexpr):
    """Rows ``t0 .. t0+16`` of a chunk: the gating and Γ (continuing from ``gamma_before``, the
    Γ of the row before); stores Γ. Returns ``(Γ [16], β [16], Γ of the last row)``."""
    rows = t0 + tl.arange(0, 16)
    valid = rows < eos
    g = tl.load(g_ptr + rows * stride_g + hv, mask=valid, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + rows * stride_beta + hv, mask=valid, other=0.0).to(tl.float32)
    if GATED:
        g, beta = gate_values(g, beta, tl.load(A_log_ptr + hv), tl.load(dt_bias_ptr + hv))
    # Padded rows have g = β = 0: Γ stays flat there and their rows of L, W, U are zero.
    g = tl.where(valid, tl.maximum(g, G_FLOOR), 0.0)
    gamma = gamma_before + tl.cumsum(g, 0)
    tl.store(gamma_ptr + rows * HV + hv, gamma, mask=valid)
    return gamma, tl.where(valid, beta, 0.0), gamma_before + tl.sum(g, 0)


@triton.jit
def _inverse_norm(sum_sq, USE_L2NORM: tl.constexpr):
    """The factor that L2-normalises a row with this sum of squares (eps inside the root)."""
    if USE_L2NORM:
        return tl.rsqrt(sum_sq + 1e-6)
    return tl.full(sum_sq.shape, 1.0, tl.float32)


@triton.jit
def _coupling(gram, norm_i, norm_j, gamma_i, gamma_j, beta_i, DIAGONAL: tl.constexpr):
    """Block (i, j), i ≥ j, of ``L = strict_lower(β (K̂K̂ᵀ) e^{Γs−Γj})`` from the same block of
    the raw keys' Gram matrix ``K Kᵀ`` and the rows' normalising factors."""
    diff = gamma_i[:, None] - gamma_j[None, :]
    if DIAGONAL:
        r = tl.arange(0, 16)
        diff = tl.where(r[:, None] > r[None, :], diff, float("-inf"))  # masked before exp
    return (beta_i * norm_i)[:, None] * gram * norm_j[None, :] * tl.exp(diff)


@triton.jit
def _key_rows(k_ptr, k_hat_ptr, t0, eos, k_hat_end, norm, stride_k, col0,
              H: tl.constexpr, K: tl.constexpr):
    """Columns ``col0 .. col0+32`` of k̂ for rows ``t0 .. t0+16`` (``[16, 32]`` fp32, from the
    raw keys and their normalising factors ``norm [16]``); stored as k̂ below ``k_hat_end``."""
    k = load_rows(k_ptr, t0, eos, stride_k, col0, K, 16, 32).to(tl.float32) * norm[:, None]
    store_rows(k_hat_ptr, k, t0, k_hat_end, H * K, col0, K, 16, 32)
    return k


@triton.jit
def _solve_lower(D0, D1, D2, D3, L10, L20, L21, L30, L31, L32, X0, X1, X2, X3):
    """``(I + L)⁻¹ X`` for X in four 16-row blocks, by block forward substitution:
    ``Y_i = D_i (X_i − Σ_{j<i} L_ij Y_j)`` with ``D_i = (I + L_ii)⁻¹``."""
    Y0 = tl.dot(D0, X0)
    Y1 = tl.dot(D1, X1 - tl.dot(L10, Y0))
    Y2 = tl.dot(D2, X2 - tl.dot(L20, Y0) - tl.dot(L21, Y1))
    Y3 = tl.dot(D3, X3 - tl.dot(L30, Y0) - tl.dot(L31, Y1) - tl.dot(L32, Y2))
    return Y0, Y1, Y2, Y3


@triton.jit
def _store_blocks(ptr, Y0, Y1, Y2, Y3, t0, eos, row_stride, col0, n_cols):
    """Store four ``[16, 32]`` blocks as rows ``t0 .. t0+64``, columns ``col0 .. col0+32``."""
    store_rows(ptr, Y0, t0, eos, row_stride, col0, n_cols, 16, 32)
    store_rows(ptr, Y1, t0 + 16, eos, row_stride, col0, n_cols, 16, 32)
    store_rows(ptr, Y2, t0 + 32, eos, row_stride, col0, n_cols, 16, 32)
    store_rows(ptr, Y3, t0 + 48, eos, row_stride, col0, n_cols, 16, 32)


@triton.autotune(tuning_configs((8, 1), (4, 1), (2, 1), (1, 1)), key=["K", "V"])
@triton.jit
def chunk_prepare_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr,
                         gamma_ptr, k_hat_ptr, w_ptr, u_ptr, cu_ptr, chunk_idx_ptr,
                         stride_k, stride_v, stride_g, stride_beta,
                         H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                         GATED: tl.constexpr):
    """One (chunk, value head): Γ ``[T, HV]``, W ``[T, HV, K]``, U ``[T, HV, V]`` for its 64 rows,
    and the normalised keys k̂ ``[T, H, K]`` (written by the first value head of each group).
    With ``GATED``, ``g_ptr``/``beta_ptr`` hold the raw projections a, b and the gating is
    computed here (with ``A_log``, ``dt_bias``). Inputs are read with their row strides.

    The chunk is handled as four 16-row blocks: L has 10 blocks on or below the diagonal, each
    diagonal block is inverted alone (:func:`invert_unit_lower`), and W, U come out of a block
    forward substitution (:func:`_solve_lower`), 32 columns at a time. That never forms the
    64×64 inverse and costs a few 16-row products instead of several 64×64×64 ones."""
    i_chunk = tl.program_id(0)
    hv = tl.program_id(1)
    seq = tl.load(chunk_idx_ptr + 2 * i_chunk)
    bos = tl.load(cu_ptr + seq) + CHUNK * tl.load(chunk_idx_ptr + 2 * i_chunk + 1)
    eos = tl.load(cu_ptr + seq + 1)
    # Rows below bos do not exist: the other value heads of the group store no k̂.
    k_hat_end = tl.where(hv % (HV // H) == 0, eos, bos)

    G0, b0, end = _gate_rows(g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, gamma_ptr, bos, eos, hv,
                             0.0, stride_g, stride_beta, HV, GATED)
    G1, b1, end = _gate_rows(g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, gamma_ptr, bos + 16, eos,
                             hv, end, stride_g, stride_beta, HV, GATED)
    G2, b2, end = _gate_rows(g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, gamma_ptr, bos + 32, eos,
                             hv, end, stride_g, stride_beta, HV, GATED)
    G3, b3, end = _gate_rows(g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, gamma_ptr, bos + 48, eos,
                             hv, end, stride_g, stride_beta, HV, GATED)

    # The 10 blocks of the raw keys' Gram matrix on or below the diagonal and the rows' sums of
    # squares, 32 columns at a time (masked past K): small operands keep every tile in registers.
    k_rows = k_ptr + (hv // (HV // H)) * K  # value head hv reads key head hv // group
    S00 = tl.zeros([16, 16], dtype=tl.float32)
    S10 = S00
    S11 = S00
    S20 = S00
    S21 = S00
    S22 = S00
    S30 = S00
    S31 = S00
    S32 = S00
    S33 = S00
    n0 = tl.zeros([16], dtype=tl.float32)
    n1 = n0
    n2 = n0
    n3 = n0
    for c in range(0, BK, 32):
        a0 = load_rows(k_rows, bos, eos, stride_k, c, K, 16, 32)
        a1 = load_rows(k_rows, bos + 16, eos, stride_k, c, K, 16, 32)
        a2 = load_rows(k_rows, bos + 32, eos, stride_k, c, K, 16, 32)
        a3 = load_rows(k_rows, bos + 48, eos, stride_k, c, K, 16, 32)
        n0 += tl.sum(a0.to(tl.float32) * a0.to(tl.float32), 1)
        n1 += tl.sum(a1.to(tl.float32) * a1.to(tl.float32), 1)
        n2 += tl.sum(a2.to(tl.float32) * a2.to(tl.float32), 1)
        n3 += tl.sum(a3.to(tl.float32) * a3.to(tl.float32), 1)
        S00 = tl.dot(a0, tl.trans(a0), S00)
        S10 = tl.dot(a1, tl.trans(a0), S10)
        S11 = tl.dot(a1, tl.trans(a1), S11)
        S20 = tl.dot(a2, tl.trans(a0), S20)
        S21 = tl.dot(a2, tl.trans(a1), S21)
        S22 = tl.dot(a2, tl.trans(a2), S22)
        S30 = tl.dot(a3, tl.trans(a0), S30)
        S31 = tl.dot(a3, tl.trans(a1), S31)
        S32 = tl.dot(a3, tl.trans(a2), S32)
        S33 = tl.dot(a3, tl.trans(a3), S33)
    n0 = _inverse_norm(n0, USE_L2NORM)
    n1 = _inverse_norm(n1, USE_L2NORM)
    n2 = _inverse_norm(n2, USE_L2NORM)
    n3 = _inverse_norm(n3, USE_L2NORM)

    D0 = invert_unit_lower(_coupling(S00, n0, n0, G0, G0, b0, True), 16)
    D1 = invert_unit_lower(_coupling(S11, n1, n1, G1, G1, b1, True), 16)
    D2 = invert_unit_lower(_coupling(S22, n2, n2, G2, G2, b2, True), 16)
    D3 = invert_unit_lower(_coupling(S33, n3, n3, G3, G3, b3, True), 16)
    L10 = _coupling(S10, n1, n0, G1, G0, b1, False)
    L20 = _coupling(S20, n2, n0, G2, G0, b2, False)
    L21 = _coupling(S21, n2, n1, G2, G1, b2, False)
    L30 = _coupling(S30, n3, n0, G3, G0, b3, False)
    L31 = _coupling(S31, n3, n1, G3, G1, b3, False)
    L32 = _coupling(S32, n3, n2, G3, G2, b3, False)

    # W = (I + L)⁻¹ (β e^Γ K̂), U = (I + L)⁻¹ (β V), 32 columns at a time; fp32 operands (tf32
    # on a GPU).
    k_hat_rows = k_hat_ptr + (hv // (HV // H)) * K
    for c in range(0, BK, 32):
        W0, W1, W2, W3 = _solve_lower(
            D0, D1, D2, D3, L10, L20, L21, L30, L31, L32,
            _key_rows(k_rows, k_hat_rows, bos, eos, k_hat_end, n0, stride_k, c, H, K)
            * (b0 * tl.exp(G0))[:, None],
            _key_rows(k_rows, k_hat_rows, bos + 16, eos, k_hat_end, n1, stride_k, c, H, K)
            * (b1 * tl.exp(G1))[:, None],
            _key_rows(k_rows, k_hat_rows, bos + 32, eos, k_hat_end, n2, stride_k, c, H, K)
            * (b2 * tl.exp(G2))[:, None],
            _key_rows(k_rows, k_hat_rows, bos + 48, eos, k_hat_end, n3, stride_k, c, H, K)
            * (b3 * tl.exp(G3))[:, None])
        _store_blocks(w_ptr + hv * K, W0, W1, W2, W3, bos, eos, HV * K, c, K)
    v_rows = v_ptr + hv * V
    for c in range(0, BV, 32):
        U0, U1, U2, U3 = _solve_lower(
            D0, D1, D2, D3, L10, L20, L21, L30, L31, L32,
            load_rows(v_rows, bos, eos, stride_v, c, V, 16, 32).to(tl.float32) * b0[:, None],
            load_rows(v_rows, bos + 16, eos, stride_v, c, V, 16, 32).to(tl.float32) * b1[:, None],
            load_rows(v_rows, bos + 32, eos, stride_v, c, V, 16, 32).to(tl.float32) * b2[:, None],
            load_rows(v_rows, bos + 48, eos, stride_v, c, V, 16, 32).to(tl.float32) * b3[:, None])
        _store_blocks(u_ptr + hv * V, U0, U1, U2, U3, bos, eos, HV * V, c, V)


# The pool is read and written in place: autotuning must restore it after each trial run.
@triton.autotune(tuning_configs((4, 2), (4, 3), (4, 4), (8, 3)), key=["K", "V", "BV"],
                 restore_value=["pool_ptr"])
@triton.jit
def chunk_scan_kernel(k_hat_ptr, w_ptr, u_ptr, gamma_ptr, v_new_ptr, h_ptr, pool_ptr,
                      cu_ptr, chunk_off_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr, TRACK: tl.constexpr):
    """One (V-tile, sequence, value head): the sequential state pass over the sequence's chunks.
    Reads the initial state from the pool slot, writes ``h [NT, HV, K, V]`` (start state of every
    chunk) and ``Ṽ [T, HV, V]``, the final state back into the slot and, with ``TRACK``, the
    tracked state into its track slot."""
    i_v = tl.program_id(0)
    seq = tl.program_id(1)
    hv = tl.program_id(2)
    bos = tl.load(cu_ptr + seq)
    eos = tl.load(cu_ptr + seq + 1)
    first_chunk = tl.load(chunk_off_ptr + seq).to(tl.int64)
    n_chunks = tl.load(chunk_off_ptr + seq + 1) - tl.load(chunk_off_ptr + seq)
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
    r = tl.arange(0, CHUNK)
    for c in range(0, n_chunks):
        tl.store(h_ptr + ((first_chunk + c) * HV + hv) * HEAD + slab,
                 S.to(h_ptr.dtype.element_ty), mask=slab_mask)
        if TRACK:
            tl.store(track_ptr, S, mask=slab_mask & (as_vector(track_chunk, rk) == c)[:, None])
        t0 = bos + CHUNK * c
        valid = t0 + r < eos
        k = load_rows(k_hat_ptr + hk * K, t0, eos, H * K, 0, K, CHUNK, BK)
        w = load_rows(w_ptr + hv * K, t0, eos, HV * K, 0, K, CHUNK, BK)
        u = load_rows(u_ptr + hv * V, t0, eos, HV * V, v0, V, CHUNK, BV).to(tl.float32)
        gamma = tl.load(gamma_ptr + (t0 + r) * HV + hv, mask=valid, other=0.0)
        gamma_last = tl.load(gamma_ptr + (tl.minimum(t0 + CHUNK, eos) - 1) * HV + hv)

        v_new = u - tl.dot(w, S.to(work))
        store_rows(v_new_ptr + hv * V, v_new, t0, eos, HV * V, v0, V, CHUNK, BV)
        # Row s of Ṽ reaches the chunk end decayed by e^{Γ_C − Γ_s}; mask before exp (padded
        # rows would otherwise give 0·inf).
        to_end = tl.exp(tl.where(valid, gamma_last - gamma, float("-inf")))
        S = S * tl.exp(gamma_last) + tl.dot(tl.trans(k), (v_new * to_end[:, None]).to(work))

    if TRACK:
        tl.store(track_ptr, S, mask=slab_mask & (as_vector(track_chunk, rk) == n_chunks)[:, None])
    tl.store(state_ptr, S, mask=slab_mask)


@triton.autotune(tuning_configs((4, 1), (8, 1)), key=["K", "V", "BV"])
@triton.jit
def chunk_output_kernel(q_ptr, k_hat_ptr, v_new_ptr, h_ptr, gamma_ptr, o_ptr, cu_ptr,
                        chunk_idx_ptr, scale, stride_q,
                        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                        BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr):
    """One (V-tile, chunk, value head): its 64 rows of ``o [T, HV, V]`` from ``h`` and ``Ṽ``.
    The V-tiles of a chunk are neighbours in the grid, so its q and k̂ are read from L2."""
    v0 = tl.program_id(0) * BV
    i_chunk = tl.program_id(1)
    hv = tl.program_id(2)
    seq = tl.load(chunk_idx_ptr + 2 * i_chunk)
    bos = tl.load(cu_ptr + seq) + CHUNK * tl.load(chunk_idx_ptr + 2 * i_chunk + 1)
    eos = tl.load(cu_ptr + seq + 1)
    hk = hv // (HV // H)
    r = tl.arange(0, CHUNK)
    valid = bos + r < eos

    work = k_hat_ptr.dtype.element_ty
    q = scale * l2norm_rows(load_rows(q_ptr + hk * K, bos, eos, stride_q, 0, K, CHUNK, BK)
                            .to(tl.float32), USE_L2NORM)
    k = load_rows(k_hat_ptr + hk * K, bos, eos, H * K, 0, K, CHUNK, BK)
    v_new = load_rows(v_new_ptr + hv * V, bos, eos, HV * V, v0, V, CHUNK, BV)
    gamma = tl.load(gamma_ptr + (bos + r) * HV + hv, mask=valid, other=0.0)
    # Row i_chunk of h is this chunk's start state (chunks are numbered like the checkpoints).
    rk = tl.arange(0, BK)
    cv = v0 + tl.arange(0, BV)
    h_offs = (i_chunk.to(tl.int64) * HV + hv) * (K * V) + rk[:, None] * V + cv[None, :]
    h = tl.load(h_ptr + h_offs, mask=(rk < K)[:, None] & (cv < V)[None, :], other=0.0)

    # Masks before exp: padded rows would otherwise give 0·inf.
    causal = (r[:, None] >= r[None, :]) & valid[:, None]
    decay = tl.exp(tl.where(causal, gamma[:, None] - gamma[None, :], float("-inf")))
    attn = tl.dot(q.to(work), tl.trans(k)) * decay
    o = tl.dot((q * tl.exp(gamma)[:, None]).to(h.dtype), h)
    o = tl.dot(attn.to(work), v_new, o)
    store_rows(o_ptr + hv * V, o, bos, eos, HV * V, v0, V, CHUNK, BV)


def _block(d: int) -> int:
    """A whole head dim as one power-of-two tile (``tl.dot`` needs ≥ 16)."""
    return max(16, triton.next_power_of_2(d))


def _scan_block_v(n_programs_per_tile: int, V: int) -> int:
    """V-tile of the sequential pass: 64 wide, or 32 when that leaves fewer than 128 programs:
    few sequences are latency-bound, and narrower tiles shorten every chunk step and spread the
    heads over more SMs of an H200 (132)."""
    bv = min(64, _block(V))
    if bv > 32 and n_programs_per_tile * triton.cdiv(V, bv) < 128:
        bv = 32
    return bv


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Storage dtype of the intermediates W, U, Ṽ (and of h without checkpoints)."""
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.float32


def launch_prepare(k, v, g, beta, meta, use_qk_l2norm, gating=None):
    """Kernel 1 on validated inputs: returns ``(gamma [T, HV] fp32, k_hat [T, H, K],
    w [T, HV, K], u [T, HV, V])`` (all but gamma in :func:`work_dtype`). ``gating``:
    ``(A_log, dt_bias)`` when ``g, beta`` are the raw projections ``a, b``."""
    T, H, K = k.shape
    HV, V = v.shape[1:]
    gamma = torch.empty(T, HV, device=k.device, dtype=torch.float32)
    k_hat = torch.empty(T, H, K, device=k.device, dtype=work_dtype(v.dtype))
    w = torch.empty(T, HV, K, device=k.device, dtype=k_hat.dtype)
    u = torch.empty(T, HV, V, device=k.device, dtype=k_hat.dtype)
    A_log, dt_bias = gating or (g, g)  # unread without gating
    chunk_prepare_kernel[(meta.NT, HV)](
        k, v, g, beta, A_log, dt_bias, gamma, k_hat, w, u, meta.cu_seqlens, meta.chunk_indices,
        k.stride(0), v.stride(0), g.stride(0), beta.stride(0), H, HV, K, V,
        _block(K), _block(V), use_qk_l2norm, gating is not None)
    return gamma, k_hat, w, u


def launch_scan(k_hat, w, u, gamma, state_pool, state_indices, meta, h=None,
                track_slots=None, track_chunks=None):
    """Kernel 2, the sequential pass: returns ``(v_new [T, HV, V], h [NT, HV, K, V])``; updates
    the pool and writes the tracked states if asked. ``h`` may be given (the fp32 checkpoints);
    else it is allocated in :func:`work_dtype`, like ``v_new``."""
    T, H, K = k_hat.shape
    HV, V = u.shape[1:]
    v_new = torch.empty_like(u)
    if h is None:
        h = torch.empty(meta.NT, HV, K, V, device=u.device, dtype=u.dtype)
    track = track_slots is not None
    BV = _scan_block_v(meta.N * HV, V)
    chunk_scan_kernel[(triton.cdiv(V, BV), meta.N, HV)](
        k_hat, w, u, gamma, v_new, h, state_pool, meta.cu_seqlens, meta.chunk_offsets,
        state_indices, track_slots if track else state_indices,
        track_chunks if track else state_indices, H, HV, K, V, _block(K), BV, track)
    return v_new, h


def _output_block_v(n_tiles: int, V: int) -> int:
    """V-tile of the output kernel: the whole head (q K̂ᵀ computed once per chunk), or 64 wide
    when whole heads would give fewer than two programs per SM of an H200. Never narrower than
    64, masked past V: Triton 3.6 miscompiled products 16 or 32 wide at 4 warps on the H200
    (data/benchmarks/small_head_dims.md)."""
    if _block(V) > 64 and n_tiles < 2 * 132:
        return 64
    return max(64, _block(V))


def launch_output(q, k_hat, v_new, h, gamma, meta, scale, use_qk_l2norm):
    """Kernel 3, fully parallel: returns ``o [T, HV, V]`` in q's dtype."""
    T, H, K = q.shape
    HV, V = v_new.shape[1:]
    o = torch.empty(T, HV, V, device=q.device, dtype=q.dtype)
    BV = _output_block_v(meta.NT * HV, V)
    chunk_output_kernel[(triton.cdiv(V, BV), meta.NT, HV)](
        q, k_hat, v_new, h, gamma, o, meta.cu_seqlens, meta.chunk_indices, scale,
        q.stride(0), H, HV, K, V, _block(K), BV, use_qk_l2norm)
    return o


def prefill_triton(q, k, v, g, beta, state_pool, state_indices, meta, scale, use_qk_l2norm,
                   output_checkpoints, track_slots, track_chunks, gating=None):
    """The three kernels on validated inputs (see :func:`mamba_edu.kernels.gdn_prefill`);
    returns ``(o, checkpoints or None)``."""
    T, H, K = q.shape
    HV, V = v.shape[1:]
    gamma, k_hat, w, u = launch_prepare(k, v, g, beta, meta, use_qk_l2norm, gating)
    ckpt = (torch.empty(meta.NT, HV, K, V, device=q.device, dtype=torch.float32)
            if output_checkpoints else None)
    v_new, h = launch_scan(k_hat, w, u, gamma, state_pool, state_indices, meta, ckpt,
                           track_slots, track_chunks)
    o = launch_output(q, k_hat, v_new, h, gamma, meta, scale, use_qk_l2norm)
    return o, ckpt
