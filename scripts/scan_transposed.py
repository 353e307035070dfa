"""The scan with its state transposed, timed against the package's scan (H200, one call).

    OUT=/some/dir python scripts/scan_transposed.py      # repository root; on a CPU: interpreter check

The package's scan holds the state slab ``S [K, BV]`` and computes ``Ṽ = U − W S`` and
``S ← e^{Γ_C} S + K̃ᵀ Ṽ``; in both products the changing operand (S, then Ṽ) is the right one,
which Hopper's ``wgmma`` reads from shared memory, so the state goes through shared memory twice
per chunk step. Transposed, ``Ṽᵀ = Uᵀ − Sᵀ Wᵀ`` and ``Sᵀ ← e^{Γ_C} Sᵀ + Ṽᵀ K̃``: the changing
operand is the left one, which a product can take from registers. ``scan_t_kernel`` does that
(same roundings, same outputs; bit-equal in the interpreter and on the H200). Writes
``$OUT/scan_transposed.json``: times in µs (graph-replay medians) and the relative errors of the
final state, Ṽ and h against the package's scan, at ``qwen3.5-tp8`` 1 × 512 and 16 × 256 and
1 × 8192.
"""

import json
import os

import torch
import triton
import triton.language as tl
import triton.testing

from mamba_edu.kernels import build_chunk_meta
from mamba_edu.kernels import prefill as P
from mamba_edu.kernels.inputs import random_prefill_inputs
from mamba_edu.kernels.tiles import load_rows, store_rows

CHUNK = tl.constexpr(64)
H, HV, K, V = 2, 8, 128, 128


@triton.jit
def scan_t_kernel(k_hat_ptr, w_ptr, u_ptr, gamma_ptr, v_new_ptr, h_ptr, pool_ptr, cu_ptr,
                  chunk_off_ptr, state_idx_ptr,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, STORE_H: tl.constexpr,
                  STORE_V: tl.constexpr):
    """Grid ``(V/BV, N, HV)``: the package's scan (no tracking) on ``Sᵀ [BV, K]``; without
    ``STORE_H``/``STORE_V`` it skips writing h/Ṽ (timing only)."""
    i_v, seq, hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, eos, first_chunk, n_chunks = P.sequence_chunks(seq, cu_ptr, chunk_off_ptr)
    hk = hv // (HV // H)
    v0 = i_v * BV
    rk, cv = tl.arange(0, BK), v0 + tl.arange(0, BV)
    slab_mask = (cv < V)[:, None] & (rk < K)[None, :]
    slab = cv[:, None] + rk[None, :] * V  # St[v, k] = S[k, v]
    slot = tl.load(state_idx_ptr + seq).to(tl.int64)
    state_ptr = pool_ptr + (slot * HV + hv) * (K * V) + slab
    St = tl.load(state_ptr, mask=slab_mask, other=0.0)
    work = w_ptr.dtype.element_ty
    r = tl.arange(0, CHUNK)
    for c in range(0, n_chunks):
        if STORE_H:
            tl.store(h_ptr + ((first_chunk + c) * HV + hv) * (K * V) + slab,
                     St.to(h_ptr.dtype.element_ty), mask=slab_mask)
        t0 = bos + CHUNK * c
        valid = t0 + r < eos
        k = load_rows(k_hat_ptr + hk * K, t0, eos, H * K, 0, K, CHUNK, BK)
        w = load_rows(w_ptr + hv * K, t0, eos, HV * K, 0, K, CHUNK, BK)
        u = load_rows(u_ptr + hv * V, t0, eos, HV * V, v0, V, CHUNK, BV)
        gamma = tl.load(gamma_ptr + (t0 + r) * HV + hv, mask=valid, other=0.0)
        gamma_last = tl.load(gamma_ptr + (tl.minimum(t0 + CHUNK, eos) - 1) * HV + hv)
        v_new = tl.trans(u).to(tl.float32) - tl.dot(St.to(work), tl.trans(w))   # [BV, 64]
        if STORE_V:
            store_rows(v_new_ptr + hv * V, tl.trans(v_new), t0, eos, HV * V, v0, V, CHUNK, BV)
        to_end = tl.exp(tl.where(valid, gamma_last - gamma, float("-inf")))
        St = St * tl.exp(gamma_last) + tl.dot((v_new * to_end[None, :]).to(work), k)
    tl.store(state_ptr, St, mask=slab_mask)


def main() -> int:
    dev = "cuda" if torch.cuda.is_available() else "cpu"

    def bench(fn):
        fn()
        if dev == "cpu":
            return 0.0
        torch.cuda.synchronize()
        return triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3

    res = {}
    for lengths in ([512], [256] * 16, [8192]) if dev == "cuda" else ([512],):
        N = len(lengths)
        x = random_prefill_inputs(lengths, H, HV, K, V, dtype=torch.bfloat16, device=dev, seed=0)
        meta = build_chunk_meta(lengths, dev, state_indices=list(range(N)))
        pool0 = 0.1 * torch.randn(N, HV, K, V, device=dev)
        gamma, k_hat, w, u = P.launch_prepare(x["k"], x["v"], x["g"], x["beta"], meta, True)
        pool = pool0.clone()
        v_ref, h_ref = P.launch_scan(k_hat, w, u, gamma, pool, meta.state_indices, meta)
        ref = pool.clone()
        tag = f"{N}x{lengths[0]}"
        res[f"{tag} shipped"] = bench(
            lambda: P.launch_scan(k_hat, w, u, gamma, pool, meta.state_indices, meta))
        for warps, BV in ((1, 16), (2, 16), (2, 32), (4, 16), (4, 32), (4, 64), (1, 32)):
            for stores in (True, False):
                vn, h, pool = torch.zeros_like(u), torch.zeros_like(h_ref), pool0.clone()
                run = lambda: scan_t_kernel[(V // BV, N, HV)](  # noqa: E731
                    k_hat, w, u, gamma, vn, h, pool, meta.cu_seqlens, meta.chunk_offsets,
                    meta.state_indices, H, HV, K, V, K, BV, stores, stores, num_warps=warps,
                    num_stages=3)
                name = f"{tag} transposed w{warps} bv{BV} stores{int(stores)}"
                run()
                if stores:
                    res[name + " rel err (final, v_new, h)"] = [
                        float((a.float() - b.float()).abs().max() / b.float().abs().max())
                        for a, b in ((pool, ref), (vn, v_ref), (h, h_ref))]
                res[name] = bench(run)
    for key, val in res.items():
        print(key, val)
    out = os.environ.get("OUT", "out/scan_transposed")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "scan_transposed.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
