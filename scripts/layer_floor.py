"""Where the GDN layer's time goes at ``qwen3.5-tp8`` 1 × 512, and what a redesign would buy.

    OUT=/some/dir python scripts/layer_floor.py                  # on the H200, repository root
    DISABLE_MMA_V3=1 TRITON_CACHE_DIR=/tmp/mma_v2 OUT=/some/dir python scripts/layer_floor.py --stages-only

Each timing is the median of ``triton.testing.do_bench_cudagraph`` (graph replay), bf16,
K = V = 128, H = 2, HV = 8, one sequence of 512 tokens (8 chunks). Writes
``$OUT/layer_floor[_mma_v2].json``. The second command compiles every ``tl.dot`` as Ampere-style
``mma`` instead of Hopper's ``wgmma`` (Triton's ``DISABLE_MMA_V3``), in a cache of its own.

The kernels below are **probes, not prefills**: most of them compute something wrong on purpose
(a step without its loads, a scan from random affine terms) so that one run can tell what each
part of a kernel costs. They are timed only; the package's kernels are the ones in
``mamba_edu/kernels``. The exceptions, checked against the two calls they replace: the conv
computed inside the prepare kernel (``conv_then_prepare_kernel``) and the scan with its loop split
at the tracked chunk (``TRACK_SPLIT``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import triton
import triton.language as tl
import triton.testing

from mamba_edu.benchmarks.kernels import _layer_inputs
from mamba_edu.kernels import build_chunk_meta, conv1d_prefill
from mamba_edu.kernels import prefill as P
from mamba_edu.kernels.conv import _conv_rows
from mamba_edu.kernels.inputs import random_prefill_inputs
from mamba_edu.kernels.tiles import as_vector, load_rows, store_rows

CHUNK = tl.constexpr(64)
T, H, HV, K, V = 512, 2, 8, 128, 128
DEVICE = "cuda"
OUT = Path(os.environ.get("OUT", "out/layer_floor"))


@triton.jit
def _probe_steps(S, c_begin, c_end, k_hat_ptr, w_ptr, u_ptr, gamma_ptr, v_new_ptr, h_ptr,
                 track_ptr, track_chunk, bos, eos, first_chunk, hk, hv, v0, slab, slab_mask,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 BK: tl.constexpr, BV: tl.constexpr, STORE_H: tl.constexpr,
                 STORE_V: tl.constexpr, LOADS: tl.constexpr, CONTIG: tl.constexpr,
                 TRACK_IN_LOOP: tl.constexpr):
    """The scan's chunk steps ``c_begin .. c_end`` as :func:`mamba_edu.kernels.prefill.scan_sequence`
    runs them, with switches: ``STORE_H``/``STORE_V`` write h and Ṽ; ``LOADS`` reads each chunk's
    k̂, W, U, Γ (else chunk 0's tiles every step); ``CONTIG`` reads k̂, W, U as if each chunk's
    tile were one contiguous block (unmasked, wrong data); ``TRACK_IN_LOOP`` saves the tracked
    state under a branch in every step, as the package's scan does."""
    work = w_ptr.dtype.element_ty
    r = tl.arange(0, CHUNK)
    k = load_rows(k_hat_ptr + hk * K, bos, eos, H * K, 0, K, CHUNK, BK)
    w = load_rows(w_ptr + hv * K, bos, eos, HV * K, 0, K, CHUNK, BK)
    u = load_rows(u_ptr + hv * V, bos, eos, HV * V, v0, V, CHUNK, BV).to(tl.float32)
    gamma = tl.load(gamma_ptr + (bos + r) * HV + hv)
    for c in range(c_begin, c_end):
        if STORE_H:
            tl.store(h_ptr + ((first_chunk + c) * HV + hv) * (K * V) + slab,
                     S.to(h_ptr.dtype.element_ty), mask=slab_mask)
        if TRACK_IN_LOOP:
            if c == track_chunk:
                tl.store(track_ptr, S, mask=slab_mask)
        t0 = bos + CHUNK * c
        last_row = tl.minimum(t0 + CHUNK, eos) - 1
        if CONTIG:
            valid = t0 + r < eos
            tile = (first_chunk + c) * CHUNK * K + r[:, None] * K + tl.arange(0, BK)[None, :]
            k = tl.load(k_hat_ptr + tile)
            w = tl.load(w_ptr + tile)
            u = tl.load(u_ptr + (first_chunk + c) * CHUNK * V + r[:, None] * V
                        + (v0 + tl.arange(0, BV))[None, :]).to(tl.float32)
            gamma = tl.load(gamma_ptr + (t0 + r) * HV + hv)
            gamma_last = tl.load(gamma_ptr + last_row * HV + hv)
        elif LOADS:  # as the package's scan reads them
            k, w, u, gamma, gamma_last, valid = P.chunk_tiles(
                k_hat_ptr, w_ptr, u_ptr, gamma_ptr, t0, eos, hk, hv, v0, H, HV, K, V, BK, BV)
        else:
            valid = t0 + r < eos
            gamma_last = tl.load(gamma_ptr + last_row * HV + hv)
        v_new = u - tl.dot(w, S.to(work))
        if STORE_V:
            store_rows(v_new_ptr + hv * V, v_new, t0, eos, HV * V, v0, V, CHUNK, BV)
        S = P.advance_state(S, k, v_new, gamma, gamma_last, valid)
    return S


@triton.jit
def scan_probe_kernel(k_hat_ptr, w_ptr, u_ptr, gamma_ptr, v_new_ptr, h_ptr, pool_ptr, cu_ptr,
                      chunk_off_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr, STORE_H: tl.constexpr,
                      STORE_V: tl.constexpr, LOADS: tl.constexpr, CONTIG: tl.constexpr,
                      TRACK: tl.constexpr, TRACK_SPLIT: tl.constexpr):
    """Grid ``(V/BV, N, HV)`` like the package's scan. With ``TRACK`` the tracked state is saved
    under a branch in every step; with ``TRACK_SPLIT`` instead the chunk loop is split in two at
    the tracked chunk and the state saved between the halves (no branch in the steps)."""
    i_v, seq, hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, eos, first_chunk, n_chunks = P.sequence_chunks(seq, cu_ptr, chunk_off_ptr)
    hk = hv // (HV // H)
    v0 = i_v * BV
    rk, cv = tl.arange(0, BK), v0 + tl.arange(0, BV)
    slab_mask = (rk < K)[:, None] & (cv < V)[None, :]
    slab = rk[:, None] * V + cv[None, :]
    slot = tl.load(state_idx_ptr + seq).to(tl.int64)
    state_ptr = pool_ptr + (slot * HV + hv) * (K * V) + slab
    S = tl.load(state_ptr, mask=slab_mask, other=0.0)
    track_chunk = tl.load(track_chunk_ptr + seq)
    track_slot = tl.maximum(tl.load(track_slot_ptr + seq).to(tl.int64), 0)
    track_ptr = pool_ptr + (track_slot * HV + hv) * (K * V) + slab
    split = n_chunks
    if TRACK_SPLIT:
        split = tl.where((track_chunk >= 0) & (track_chunk < n_chunks), track_chunk, n_chunks)
    S = _probe_steps(S, 0, split, k_hat_ptr, w_ptr, u_ptr, gamma_ptr, v_new_ptr, h_ptr,
                     track_ptr, track_chunk, bos, eos, first_chunk, hk, hv, v0, slab, slab_mask,
                     H, HV, K, V, BK, BV, STORE_H, STORE_V, LOADS, CONTIG, TRACK)
    if TRACK_SPLIT:
        if track_chunk == split:
            tl.store(track_ptr, S, mask=slab_mask)
        S = _probe_steps(S, split, n_chunks, k_hat_ptr, w_ptr, u_ptr, gamma_ptr, v_new_ptr,
                         h_ptr, track_ptr, track_chunk, bos, eos, first_chunk, hk, hv, v0, slab,
                         slab_mask, H, HV, K, V, BK, BV, STORE_H, STORE_V, LOADS, CONTIG, False)
    if TRACK:
        if track_chunk == n_chunks:
            tl.store(track_ptr, S, mask=slab_mask)
    tl.store(state_ptr, S, mask=slab_mask)


@triton.jit
def affine_terms_kernel(k_hat_ptr, w_ptr, u_ptr, gamma_ptr, m_ptr, b_ptr, cu_ptr, chunk_idx_ptr,
                        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """Grid ``(NT, HV)``: the chunk step as an affine map ``S ← e^{Γ_C} S + M S + B`` with
    ``M = −K̃ᵀW [K, K]`` (bf16) and ``B = K̃ᵀU [K, V]``, ``K̃ = K̂ ⊙ e^{Γ_C−Γ}``."""
    i_chunk, hv = tl.program_id(0), tl.program_id(1)
    seq, bos, eos = P.chunk_rows(i_chunk, cu_ptr, chunk_idx_ptr)
    r = tl.arange(0, CHUNK)
    valid = bos + r < eos
    gamma = tl.load(gamma_ptr + (bos + r) * HV + hv, mask=valid, other=0.0)
    gamma_last = tl.load(gamma_ptr + (tl.minimum(bos + CHUNK, eos) - 1) * HV + hv)
    to_end = tl.exp(tl.where(valid, gamma_last - gamma, float("-inf")))
    k = load_rows(k_hat_ptr + hv // (HV // H) * K, bos, eos, H * K, 0, K, CHUNK, K)
    k_t = tl.trans((k.to(tl.float32) * to_end[:, None]).to(k.dtype))
    w = load_rows(w_ptr + hv * K, bos, eos, HV * K, 0, K, CHUNK, K)
    u = load_rows(u_ptr + hv * V, bos, eos, HV * V, 0, V, CHUNK, V)
    rk = tl.arange(0, K)
    i = i_chunk.to(tl.int64) * HV + hv
    tl.store(m_ptr + i * (K * K) + rk[:, None] * K + rk[None, :], (-tl.dot(k_t, w)).to(k.dtype))
    tl.store(b_ptr + i * (K * V) + rk[:, None] * V + rk[None, :],
             tl.dot(k_t, u).to(b_ptr.dtype.element_ty))


@triton.jit
def affine_scan_kernel(m_ptr, b_ptr, gamma_ptr, h_ptr, pool_ptr, cu_ptr, chunk_off_ptr,
                       state_idx_ptr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       BV: tl.constexpr, STORE_H: tl.constexpr):
    """Grid ``(V/BV, N, HV)``: the scan with one product per step, ``S ← M S + (e^{Γ_C} S + B)``
    (timed on random M, B: what the affine form would cost on the serial path)."""
    i_v, seq, hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, eos, first_chunk, n_chunks = P.sequence_chunks(seq, cu_ptr, chunk_off_ptr)
    rk, cv = tl.arange(0, K), i_v * BV + tl.arange(0, BV)
    slab = rk[:, None] * V + cv[None, :]
    slot = tl.load(state_idx_ptr + seq).to(tl.int64)
    state_ptr = pool_ptr + (slot * HV + hv) * (K * V) + slab
    S = tl.load(state_ptr)
    for c in range(0, n_chunks):
        i = (first_chunk + c) * HV + hv
        S_work = S.to(m_ptr.dtype.element_ty)
        if STORE_H:
            tl.store(h_ptr + i * (K * V) + slab, S_work)
        m = tl.load(m_ptr + i * (K * K) + rk[:, None] * K + rk[None, :])
        b = tl.load(b_ptr + i * (K * V) + slab).to(tl.float32)
        gamma_last = tl.load(gamma_ptr + (tl.minimum(bos + CHUNK * c + CHUNK, eos) - 1) * HV + hv)
        S = tl.dot(m, S_work, S * tl.exp(gamma_last) + b)
    tl.store(state_ptr, S)


@triton.jit
def _conv_into(x_ptr, cw_ptr, conv_pool_ptr, y_ptr, slot, col0, rows, bos, eos, D, stride_x,
               COLS: tl.constexpr, W: tl.constexpr):
    """``silu(conv)`` of ``COLS`` channels from ``col0`` at the token ``rows``, stored in ``y``
    (what :func:`mamba_edu.kernels.conv.conv1d_prefill_kernel` stores there)."""
    cols = col0 + tl.arange(0, COLS)
    cols_ok = cols < D
    live = (rows < eos)[:, None] & cols_ok[None, :]
    state_ptr = conv_pool_ptr + tl.maximum(slot, 0) * D * (W - 1) + cols * (W - 1)
    y = _conv_rows(x_ptr, cw_ptr, cw_ptr, state_ptr, rows, cols, cols_ok, live,
                   live & (as_vector(slot, cols) >= 0)[None, :], bos, stride_x, W, True, False,
                   True)
    tl.store(y_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=live)


@triton.jit
def conv_then_prepare_kernel(x_ptr, cw_ptr, conv_pool_ptr, y_ptr, state_idx_ptr, stride_x, D,
                             a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, gamma_ptr, k_hat_ptr, w_ptr,
                             u_ptr, cu_ptr, chunk_idx_ptr, stride_a, stride_b,
                             H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                             V: tl.constexpr, W: tl.constexpr, CB: tl.constexpr,
                             FP16_INVERSE: tl.constexpr):
    """Grid ``(NT, HV)``: the conv of the chunk's q (first value head of a group), k and v
    columns in blocks of ``CB`` channels into ``y``, a barrier, then the package's prepare reading
    k and v back from ``y`` (L2). The conv-state writes are left out (a later kernel's job).
    ``FP16_INVERSE`` as :func:`mamba_edu.kernels.prefill.fp16_inverse` gives it."""
    i_chunk, hv = tl.program_id(0), tl.program_id(1)
    seq = tl.load(chunk_idx_ptr + 2 * i_chunk)
    bos, eos = tl.load(cu_ptr + seq), tl.load(cu_ptr + seq + 1)
    rows = bos + CHUNK * tl.load(chunk_idx_ptr + 2 * i_chunk + 1) + tl.arange(0, CHUNK)
    slot = tl.load(state_idx_ptr + seq).to(tl.int64)
    hk = hv // (HV // H)
    for part in tl.static_range(K // CB):
        if hv % (HV // H) == 0:
            _conv_into(x_ptr, cw_ptr, conv_pool_ptr, y_ptr, slot, hk * K + part * CB, rows, bos,
                       eos, D, stride_x, CB, W)
        _conv_into(x_ptr, cw_ptr, conv_pool_ptr, y_ptr, slot, H * K + hk * K + part * CB, rows,
                   bos, eos, D, stride_x, CB, W)
        _conv_into(x_ptr, cw_ptr, conv_pool_ptr, y_ptr, slot, 2 * H * K + hv * V + part * CB,
                   rows, bos, eos, D, stride_x, CB, W)
    tl.debug_barrier()
    P.prepare_chunk(i_chunk, hv, y_ptr + H * K, y_ptr + 2 * H * K, a_ptr, b_ptr, A_log_ptr,
                    dt_bias_ptr, gamma_ptr, k_hat_ptr, w_ptr, u_ptr, cu_ptr, chunk_idx_ptr, D, D,
                    stride_a, stride_b, y_ptr, w_ptr, u_ptr, D, 1.0, H, HV, K, V, K, V, True, True,
                    FP16_INVERSE, False)


@triton.jit
def output_from_u_kernel(q_ptr, k_hat_ptr, w_ptr, u_ptr, h_ptr, gamma_ptr, o_ptr, cu_ptr,
                         chunk_idx_ptr, scale, H: tl.constexpr, HV: tl.constexpr,
                         K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    """Grid ``(V/BV, NT, HV)``: the output kernel recomputing ``Ṽ = U − W h`` itself (so the scan
    would not have to store Ṽ)."""
    i_v, i_chunk, hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    v0 = i_v * BV
    seq, bos, eos = P.chunk_rows(i_chunk, cu_ptr, chunk_idx_ptr)
    hk = hv // (HV // H)
    valid = bos + tl.arange(0, CHUNK) < eos
    q = P._queries(q_ptr, hk, bos, eos, H * K, scale, K, K, True)
    k = load_rows(k_hat_ptr + hk * K, bos, eos, H * K, 0, K, CHUNK, K)
    w = load_rows(w_ptr + hv * K, bos, eos, HV * K, 0, K, CHUNK, K)
    u = load_rows(u_ptr + hv * V, bos, eos, HV * V, v0, V, CHUNK, BV).to(tl.float32)
    gamma = tl.load(gamma_ptr + (bos + tl.arange(0, CHUNK)) * HV + hv, mask=valid, other=0.0)
    rk, cv = tl.arange(0, K), v0 + tl.arange(0, BV)
    h = tl.load(h_ptr + (i_chunk.to(tl.int64) * HV + hv) * (K * V) + rk[:, None] * V + cv[None, :])
    v_new = (u - tl.dot(w, h)).to(k.dtype)
    o = P._chunk_output(q, k, v_new, h, gamma, valid)
    store_rows(o_ptr + hv * V, o, bos, eos, HV * V, v0, V, CHUNK, BV)


def bench_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3


def stage_rows(res: dict) -> None:
    """The three prefill stages as shipped, the scan probes, the affine scan, the output probe."""
    x = random_prefill_inputs([T], H, HV, K, V, dtype=torch.bfloat16, device=DEVICE, seed=0)
    meta = build_chunk_meta([T], DEVICE, state_indices=[0], track_slots=[1], track_chunks=[1])
    pool = torch.zeros(2, HV, K, V, device=DEVICE)
    q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
    gamma, k_hat, w, u = P.launch_prepare(k, v, g, beta, meta, True)
    si = meta.state_indices
    res["prepare"] = bench_us(lambda: P.launch_prepare(k, v, g, beta, meta, True))
    res["scan"] = bench_us(lambda: P.launch_scan(k_hat, w, u, gamma, pool, si, meta))
    res["scan tracked"] = bench_us(lambda: P.launch_scan(
        k_hat, w, u, gamma, pool, si, meta, None, meta.track_slots, meta.track_chunks))
    v_new, h = P.launch_scan(k_hat, w, u, gamma, pool, si, meta)
    res["output"] = bench_us(lambda: P.launch_output(q, k_hat, v_new, h, gamma, meta, 0.088, True))

    def probe(bv=16, warps=4, stages=3, store_h=True, store_v=True, loads=True, contig=False,
              track=False, split=False):
        return lambda: scan_probe_kernel[(V // bv, 1, HV)](
            k_hat, w, u, gamma, torch.empty_like(u), h, pool, meta.cu_seqlens,
            meta.chunk_offsets, si, meta.track_slots, meta.track_chunks, H, HV, K, V, K, bv,
            store_h, store_v, loads, contig, track, split, num_warps=warps, num_stages=stages)
    probes = {
        "probe: as shipped": probe(),
        "probe: no h store": probe(store_h=False),
        "probe: no Ṽ store": probe(store_v=False),
        "probe: no stores": probe(store_h=False, store_v=False),
        "probe: no loads": probe(loads=False),
        "probe: no loads, no stores": probe(store_h=False, store_v=False, loads=False),
        "probe: contiguous unmasked tiles": probe(contig=True),
        "probe: 8 warps": probe(warps=8),
        "probe: 32-wide V-tile": probe(bv=32),
        "probe: tracked, branch in the loop (as shipped)": probe(track=True),
        "probe: tracked, loop split at the tracked chunk": probe(split=True),
    }
    for name, fn in probes.items():
        res[name] = bench_us(fn)
    finals = []
    for run in (lambda: P.launch_scan(k_hat, w, u, gamma, pool, si, meta, None, meta.track_slots,
                                      meta.track_chunks),
                probe(track=True), probe(split=True)):
        pool.zero_()
        run()
        finals.append(pool.clone())
    res["probe: tracked, max |difference| of the pool to the package's scan (branch, split)"] = [
        float((f - finals[0]).abs().max()) for f in finals[1:]]

    NT = meta.NT
    m = torch.randn(NT, HV, K, K, device=DEVICE).to(torch.bfloat16) * 0.01
    for b_dtype in (torch.float32, torch.bfloat16):
        b = torch.randn(NT, HV, K, V, device=DEVICE).to(b_dtype)
        tag = str(b_dtype).removeprefix("torch.")
        res[f"affine terms, B in {tag}"] = bench_us(lambda: affine_terms_kernel[(NT, HV)](
            k_hat, w, u, gamma, m, b, meta.cu_seqlens, meta.chunk_indices, H, HV, K, V))
        for bv in (16, 32):
            res[f"affine scan, B in {tag}, {bv}-wide V-tile"] = bench_us(
                lambda: affine_scan_kernel[(V // bv, 1, HV)](
                    m, b, gamma, h, pool, meta.cu_seqlens, meta.chunk_offsets, si, HV, K, V, bv,
                    True, num_stages=3))
    o = torch.empty(T, HV, V, device=DEVICE, dtype=torch.bfloat16)
    res["output recomputing Ṽ from U, W, h"] = bench_us(lambda: output_from_u_kernel[(2, NT, HV)](
        q, k_hat, w, u, h, gamma, o, meta.cu_seqlens, meta.chunk_indices, 0.088, H, HV, K, V, 64))


def conv_rows(res: dict) -> None:
    """The conv kernel + prepare (two launches, as shipped) against the conv inside the prepare."""
    c = _layer_inputs("qwen3.5-tp8", [T])
    meta, x, cw, conv_pool = c["meta"], c["x"], c["weight"], c["conv_pool"]
    D = x.shape[1]
    gating = (c["A_log"], c["dt_bias"])

    def two_launches():
        y = conv1d_prefill(x, cw, None, conv_pool=conv_pool, state_indices=meta.state_indices,
                           meta=meta)
        _, k, v = y.split([H * K, H * K, HV * V], dim=-1)
        return P.launch_prepare(k.view(T, H, K), v.view(T, HV, V), c["a"], c["b"], meta, True,
                                gating), y

    def one_launch(cb):
        y = torch.empty(T, D, device=DEVICE, dtype=x.dtype)
        outs = P.prepare_outputs(y[:, :H * K].view(T, H, K), y[:, 2 * H * K:].view(T, HV, V))
        conv_then_prepare_kernel[(meta.NT, HV)](
            x, cw, conv_pool, y, meta.state_indices, x.stride(0), D, c["a"], c["b"], *gating,
            *outs, meta.cu_seqlens, meta.chunk_indices, c["a"].stride(0), c["b"].stride(0),
            H, HV, K, V, 4, cb, P.fp16_inverse(True, outs[2].dtype), num_warps=4)
        return outs, y

    saved = conv_pool.clone()
    ref, y_ref = two_launches()
    conv_pool.copy_(saved)  # both read the same conv state
    got, y_got = one_launch(32)
    res["conv in prepare: max |difference| to the two launches (gamma, k_hat, W, U, y)"] = [
        float((a.float() - b.float()).abs().max()) for a, b in zip((*ref, y_ref), (*got, y_got))]
    res["conv + prepare, two launches"] = bench_us(two_launches)
    res["conv alone"] = bench_us(lambda: conv1d_prefill(
        x, cw, None, conv_pool=conv_pool, state_indices=meta.state_indices, meta=meta))
    for cb in (128, 32):
        res[f"conv in prepare, {cb}-channel blocks"] = bench_us(lambda: one_launch(cb))
    res["conv in prepare: (registers, spilled words) per compiled variant"] = [
        (kern.n_regs, kern.n_spills)
        for cache in getattr(conv_then_prepare_kernel, "device_caches", {}).values()  # GPU only
        for kern in cache[0].values()]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages-only", action="store_true", help="skip the conv rows")
    args = p.parse_args()
    mma_v2 = os.environ.get("DISABLE_MMA_V3", "0") == "1"
    res = dict(meta=dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                         triton=triton.__version__, unit="µs, graph-replay median",
                         dots="mma (DISABLE_MMA_V3=1)" if mma_v2 else "wgmma",
                         commit=os.popen("git rev-parse --short HEAD").read().strip()))
    stage_rows(res)
    if not args.stages_only:
        conv_rows(res)
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / ("layer_floor_mma_v2.json" if mma_v2 else "layer_floor.json")
    path.write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n")
    for key, val in res.items():
        print(f"{key:70s} {val:8.2f}" if isinstance(val, float) else f"{key:70s} {val}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
