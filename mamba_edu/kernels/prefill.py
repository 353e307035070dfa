"""The chunked GDN prefill in two Triton kernels (DESIGN.md §3, chunk C = 64).

1. :func:`chunk_prepare_kernel`, grid ``(NT, HV)``, one program per (chunk, value head), all in
   parallel: the chunk-local cumsum Γ of g, the L2 norm of k, ``L = strict_lower(β (k kᵀ) e^{Γs−Γj})``,
   the inverse ``T = (I+L)⁻¹`` and ``W = T(β e^Γ K)``, ``U = T(β V)``. Writes Γ, W, U.
2. :func:`chunk_scan_kernel`, grid ``(⌈V/BV⌉, N, HV)``, one program per (V-tile, sequence, value
   head), looping over the sequence's chunks: ``Ṽ = U − W S``, the output
   ``O = scale·[(Q e^Γ) S + (Q Kᵀ ⊙ e^{Γr−Γs} ⊙ [s≤r]) Ṽ]``, then ``S ← e^{Γ_C} S + (K e^{Γ_C−Γ})ᵀ Ṽ``.
   It reads S₀ from the pool slot, writes the final state back in place, and optionally writes
   checkpoints (state at every chunk start) and the ``fused`` tracking copy.

fla uses five kernels and materialises the per-chunk states ``h`` and ``Ṽ`` in HBM; computing
the output inside the sequential pass avoids both (the state never leaves registers).

The inverse works on four 16×16 sub-blocks: the diagonal blocks by forward substitution, the
others by ``T_ij = −T_ii Σ_{j≤m<i} L_im T_mj``. Every quantity there is an entry of L or T, so it
stays bounded (a power series in L would not: its terms can reach 1e13 for correlated keys).
"""

import torch
import triton
import triton.language as tl

from mamba_edu.kernels.tiles import as_vector, l2norm_rows, load_rows, store_rows, tuning_configs


@triton.jit
def _sub_block(k_ptr, v_ptr, g_ptr, beta_ptr, gamma_ptr, t0, eos, hv, gamma_start,
               H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr):
    """Load 16 tokens of one chunk; store their Γ. Returns (k̂ [16,BK], βv [16,BV], β, Γ, Γ_end)."""
    rows = t0 + tl.arange(0, 16)
    valid = rows < eos
    k = l2norm_rows(load_rows(k_ptr, t0, eos, H * K, 0, K, 16, BK), USE_L2NORM)
    v = load_rows(v_ptr, t0, eos, HV * V, 0, V, 16, BV)
    g = tl.load(g_ptr + rows * HV + hv, mask=valid, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + rows * HV + hv, mask=valid, other=0.0).to(tl.float32)
    gamma = gamma_start + tl.cumsum(g, 0)
    tl.store(gamma_ptr + rows * HV + hv, gamma, mask=valid)
    return k, v * beta[:, None], beta, gamma, gamma_start + tl.sum(g, 0)


@triton.jit
def _gram_block(ka, kb, beta_a, gamma_a, gamma_b, DIAGONAL: tl.constexpr):
    """Block (a, b) of L: ``β_a (k_a k_bᵀ) e^{Γ_a − Γ_b}``, strictly lower on a diagonal block."""
    diff = gamma_a[:, None] - gamma_b[None, :]
    if DIAGONAL:
        r = tl.arange(0, 16)
        diff = tl.where(r[:, None] > r[None, :], diff, float("-inf"))  # mask before exp
    return beta_a[:, None] * tl.dot(ka, tl.trans(kb)) * tl.exp(diff)


@triton.jit
def invert_unit_lower16(L):
    """``(I + L)⁻¹`` of a strictly lower 16×16 tile, by forward substitution row by row:
    row i of the inverse is ``e_i − Σ_{j<i} L[i,j]·(row j)``."""
    r = tl.arange(0, 16)
    inv = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    for i in range(1, 16):
        l_i = tl.sum(tl.where(r[:, None] == i, L, 0.0), 0)       # row i of L, indexed by j
        row = -tl.sum(l_i[:, None] * inv, 0)                       # rows j ≥ i of L are 0 here
        inv = tl.where(r[:, None] == i, inv + row[None, :], inv)
    return inv


@triton.jit
def _store_wy_rows(ptr, t0, eos, row_stride, n_cols, t_0, t_1, t_2, t_3, x_0, x_1, x_2, x_3,
                   NB: tl.constexpr, COLS: tl.constexpr):
    """Store 16 rows of ``T X``: the sum of the first NB products ``T_b,m X_m`` (lower blocks)."""
    acc = tl.dot(t_0, x_0)
    if NB > 1:
        acc += tl.dot(t_1, x_1)
    if NB > 2:
        acc += tl.dot(t_2, x_2)
    if NB > 3:
        acc += tl.dot(t_3, x_3)
    store_rows(ptr, acc, t0, eos, row_stride, 0, n_cols, 16, COLS)


@triton.autotune(tuning_configs((4, 2), (8, 2), (4, 3), (8, 3)), key=["K", "V"])
@triton.jit
def chunk_prepare_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, gamma_ptr, w_ptr, u_ptr,
                         cu_ptr, chunk_idx_ptr,
                         H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr):
    """One (chunk, value head): Γ ``[T, HV]``, W ``[T, HV, K]``, U ``[T, HV, V]`` for its 64 rows."""
    i_chunk = tl.program_id(0)
    hv = tl.program_id(1)
    seq = tl.load(chunk_idx_ptr + 2 * i_chunk)
    bos = tl.load(cu_ptr + seq) + 64 * tl.load(chunk_idx_ptr + 2 * i_chunk + 1)
    eos = tl.load(cu_ptr + seq + 1)
    k_ptr += (hv // (HV // H)) * K  # value head hv reads key head hv // group
    v_ptr += hv * V

    k0, bv0, b0, gam0, end0 = _sub_block(k_ptr, v_ptr, g_ptr, beta_ptr, gamma_ptr, bos, eos, hv,
                                         0.0, H, HV, K, V, BK, BV, USE_L2NORM)
    k1, bv1, b1, gam1, end1 = _sub_block(k_ptr, v_ptr, g_ptr, beta_ptr, gamma_ptr, bos + 16, eos,
                                         hv, end0, H, HV, K, V, BK, BV, USE_L2NORM)
    k2, bv2, b2, gam2, end2 = _sub_block(k_ptr, v_ptr, g_ptr, beta_ptr, gamma_ptr, bos + 32, eos,
                                         hv, end1, H, HV, K, V, BK, BV, USE_L2NORM)
    k3, bv3, b3, gam3, end3 = _sub_block(k_ptr, v_ptr, g_ptr, beta_ptr, gamma_ptr, bos + 48, eos,
                                         hv, end2, H, HV, K, V, BK, BV, USE_L2NORM)

    # Diagonal blocks of T by substitution, then the lower blocks from the ones above them.
    t00 = invert_unit_lower16(_gram_block(k0, k0, b0, gam0, gam0, True))
    t11 = invert_unit_lower16(_gram_block(k1, k1, b1, gam1, gam1, True))
    t22 = invert_unit_lower16(_gram_block(k2, k2, b2, gam2, gam2, True))
    t33 = invert_unit_lower16(_gram_block(k3, k3, b3, gam3, gam3, True))
    l10 = _gram_block(k1, k0, b1, gam1, gam0, False)
    l20 = _gram_block(k2, k0, b2, gam2, gam0, False)
    l21 = _gram_block(k2, k1, b2, gam2, gam1, False)
    l30 = _gram_block(k3, k0, b3, gam3, gam0, False)
    l31 = _gram_block(k3, k1, b3, gam3, gam1, False)
    l32 = _gram_block(k3, k2, b3, gam3, gam2, False)
    t10 = -tl.dot(t11, tl.dot(l10, t00))
    t21 = -tl.dot(t22, tl.dot(l21, t11))
    t32 = -tl.dot(t33, tl.dot(l32, t22))
    t20 = -tl.dot(t22, tl.dot(l20, t00) + tl.dot(l21, t10))
    t31 = -tl.dot(t33, tl.dot(l31, t11) + tl.dot(l32, t21))
    t30 = -tl.dot(t33, tl.dot(l30, t00) + tl.dot(l31, t10) + tl.dot(l32, t20))

    # W = T (β e^Γ K), U = T (β V), 16 rows at a time.
    bk0 = k0 * (b0 * tl.exp(gam0))[:, None]
    bk1 = k1 * (b1 * tl.exp(gam1))[:, None]
    bk2 = k2 * (b2 * tl.exp(gam2))[:, None]
    bk3 = k3 * (b3 * tl.exp(gam3))[:, None]
    w_ptr += hv * K
    u_ptr += hv * V
    _store_wy_rows(w_ptr, bos, eos, HV * K, K, t00, t00, t00, t00, bk0, bk0, bk0, bk0, 1, BK)
    _store_wy_rows(w_ptr, bos + 16, eos, HV * K, K, t10, t11, t11, t11, bk0, bk1, bk1, bk1, 2, BK)
    _store_wy_rows(w_ptr, bos + 32, eos, HV * K, K, t20, t21, t22, t22, bk0, bk1, bk2, bk2, 3, BK)
    _store_wy_rows(w_ptr, bos + 48, eos, HV * K, K, t30, t31, t32, t33, bk0, bk1, bk2, bk3, 4, BK)
    _store_wy_rows(u_ptr, bos, eos, HV * V, V, t00, t00, t00, t00, bv0, bv0, bv0, bv0, 1, BV)
    _store_wy_rows(u_ptr, bos + 16, eos, HV * V, V, t10, t11, t11, t11, bv0, bv1, bv1, bv1, 2, BV)
    _store_wy_rows(u_ptr, bos + 32, eos, HV * V, V, t20, t21, t22, t22, bv0, bv1, bv2, bv2, 3, BV)
    _store_wy_rows(u_ptr, bos + 48, eos, HV * V, V, t30, t31, t32, t33, bv0, bv1, bv2, bv3, 4, BV)


# The pool is read and written in place: autotuning must restore it after each trial run.
@triton.autotune(tuning_configs((4, 2), (8, 2), (4, 3), (8, 3)), key=["K", "V", "BV"],
                 restore_value=["pool_ptr"])
@triton.jit
def chunk_scan_kernel(q_ptr, k_ptr, w_ptr, u_ptr, gamma_ptr, o_ptr, pool_ptr, ckpt_ptr,
                      cu_ptr, chunk_off_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr, scale,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                      WRITE_CKPT: tl.constexpr, TRACK: tl.constexpr):
    """One (V-tile, sequence, value head): the sequential pass over the sequence's chunks."""
    i_v = tl.program_id(0)
    seq = tl.program_id(1)
    hv = tl.program_id(2)
    bos = tl.load(cu_ptr + seq)
    eos = tl.load(cu_ptr + seq + 1)
    first_ckpt = tl.load(chunk_off_ptr + seq).to(tl.int64)
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

    r = tl.arange(0, 64)
    causal = r[:, None] >= r[None, :]
    for c in range(0, n_chunks):
        if WRITE_CKPT:
            tl.store(ckpt_ptr + ((first_ckpt + c) * HV + hv) * HEAD + slab, S, mask=slab_mask)
        if TRACK:
            tl.store(track_ptr, S, mask=slab_mask & (as_vector(track_chunk, rk) == c)[:, None])
        t0 = bos + 64 * c
        rows = t0 + r
        valid = rows < eos
        q = l2norm_rows(load_rows(q_ptr + hk * K, t0, eos, H * K, 0, K, 64, BK), USE_L2NORM)
        k = l2norm_rows(load_rows(k_ptr + hk * K, t0, eos, H * K, 0, K, 64, BK), USE_L2NORM)
        w = load_rows(w_ptr + hv * K, t0, eos, HV * K, 0, K, 64, BK)
        u = load_rows(u_ptr + hv * V, t0, eos, HV * V, v0, V, 64, BV)
        gamma = tl.load(gamma_ptr + rows * HV + hv, mask=valid, other=0.0)
        gamma_last = tl.load(gamma_ptr + (tl.minimum(t0 + 64, eos) - 1) * HV + hv)

        v_new = u - tl.dot(w, S)
        # Masks before exp: padded rows would otherwise give 0·inf.
        decay = tl.exp(tl.where(causal & valid[:, None], gamma[:, None] - gamma[None, :],
                                float("-inf")))
        attn = tl.dot(q, tl.trans(k)) * decay
        o = scale * (tl.dot(q * tl.exp(gamma)[:, None], S) + tl.dot(attn, v_new))
        store_rows(o_ptr + hv * V, o, t0, eos, HV * V, v0, V, 64, BV)

        k_to_end = k * tl.exp(tl.where(valid, gamma_last - gamma, float("-inf")))[:, None]
        S = S * tl.exp(gamma_last) + tl.dot(tl.trans(k_to_end), v_new)

    if TRACK:
        tl.store(track_ptr, S, mask=slab_mask & (as_vector(track_chunk, rk) == n_chunks)[:, None])
    tl.store(state_ptr, S, mask=slab_mask)


def _scan_block_v(n_programs_per_tile: int, V: int) -> int:
    """V-tile of the sequential pass: 64 wide, or 32 when that leaves fewer programs than an
    H200 has SMs (132): few long sequences are latency-bound, more programs help them."""
    bv = min(64, max(16, triton.next_power_of_2(V)))
    while bv > 32 and n_programs_per_tile * triton.cdiv(V, bv) < 132:
        bv //= 2
    return bv


def launch_prepare(k, v, g, beta, meta, use_qk_l2norm):
    """Kernel 1 on validated inputs: returns ``(gamma [T, HV] fp32, w [T, HV, K], u [T, HV, V])``
    (w, u in v's dtype on GPU, fp32 for fp32 inputs)."""
    T, H, K = k.shape
    HV, V = v.shape[1:]
    work = v.dtype if v.dtype in (torch.float16, torch.bfloat16) else torch.float32
    gamma = torch.empty(T, HV, device=k.device, dtype=torch.float32)
    w = torch.empty(T, HV, K, device=k.device, dtype=work)
    u = torch.empty(T, HV, V, device=k.device, dtype=work)
    chunk_prepare_kernel[(meta.NT, HV)](
        k, v, g, beta, gamma, w, u, meta.cu_seqlens, meta.chunk_indices, H, HV, K, V,
        max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V)), use_qk_l2norm)
    return gamma, w, u


def launch_scan(q, k, w, u, gamma, state_pool, state_indices, meta, scale, use_qk_l2norm,
                checkpoints=None, track_slots=None, track_chunks=None):
    """Kernel 2: the sequential pass. Returns ``o [T, HV, V]`` in q's dtype; updates the pool,
    fills ``checkpoints [NT, HV, K, V]`` if given, writes the tracked states if asked."""
    T, H, K = q.shape
    HV, V = u.shape[1:]
    o = torch.empty(T, HV, V, device=q.device, dtype=q.dtype)
    track = track_slots is not None
    BV = _scan_block_v(meta.N * HV, V)
    chunk_scan_kernel[(triton.cdiv(V, BV), meta.N, HV)](
        q, k, w, u, gamma, o, state_pool, state_pool if checkpoints is None else checkpoints,
        meta.cu_seqlens, meta.chunk_offsets, state_indices,
        track_slots if track else state_indices, track_chunks if track else state_indices,
        scale, H, HV, K, V, max(16, triton.next_power_of_2(K)), BV, use_qk_l2norm,
        checkpoints is not None, track)
    return o


def prefill_triton(q, k, v, g, beta, state_pool, state_indices, meta, scale, use_qk_l2norm,
                   output_checkpoints, track_slots, track_chunks):
    """Both kernels on validated inputs (see :func:`mamba_edu.kernels.gdn_prefill`); returns
    ``(o, checkpoints or None)``."""
    T, H, K = q.shape
    HV, V = v.shape[1:]
    gamma, w, u = launch_prepare(k, v, g, beta, meta, use_qk_l2norm)
    ckpt = (torch.empty(meta.NT, HV, K, V, device=q.device, dtype=torch.float32)
            if output_checkpoints else None)
    o = launch_scan(q, k, w, u, gamma, state_pool, state_indices, meta, scale, use_qk_l2norm,
                    ckpt, track_slots, track_chunks)
    return o, ckpt
