"""The GDN decode step in one Triton kernel: one token per sequence, state in the pool.

Grid ``(⌈V/BV⌉, N, HV)``. Each program loads a ``K × BV`` slab of its sequence's state from
``pool[state_indices[n]]``, computes the gating (``g = −e^{A_log}·softplus(a + dt_bias)``,
``β = sigmoid(b)``) and the q/k L2 norm in registers, applies one step of the recurrence and writes
the slab back in place. A negative slot index marks a padded row: the state is neither read
(zeros are used) nor written. Decode is memory-bound: the state read + write is the cost.
"""

import torch
import triton
import triton.language as tl

from mamba_edu.kernels.launcher import bound_kernel
from mamba_edu.kernels.tiles import as_vector, cdiv, gate_values, next_power_of_2, tuning_configs


@bound_kernel
@triton.autotune(tuning_configs((1, 1), (2, 1), (4, 1)), key=["K", "V", "BV"],
                 restore_value=["pool_ptr"])
@triton.jit
def gdn_decode_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, o_ptr,
                      pool_ptr, state_idx_ptr, scale, stride_q, stride_k, stride_v, stride_a,
                      stride_b, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr):
    i_v = tl.program_id(0)
    n = tl.program_id(1)
    hv = tl.program_id(2)
    hk = hv // (HV // H)
    rk = tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    k_mask = rk < K
    v_mask = cv < V

    q = tl.load(q_ptr + n * stride_q + hk * K + rk, mask=k_mask, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + n * stride_k + hk * K + rk, mask=k_mask, other=0.0).to(tl.float32)
    if USE_L2NORM:
        q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6)
        k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
    v = tl.load(v_ptr + n * stride_v + hv * V + cv, mask=v_mask, other=0.0).to(tl.float32)
    g, beta = gate_values(tl.load(a_ptr + n * stride_a + hv), tl.load(b_ptr + n * stride_b + hv),
                          tl.load(A_log_ptr + hv), tl.load(dt_bias_ptr + hv))

    slot = tl.load(state_idx_ptr + n).to(tl.int64)
    live = (as_vector(slot, rk) >= 0)[:, None] & (rk < K)[:, None] & v_mask[None, :]
    state_ptr = pool_ptr + (tl.maximum(slot, 0) * HV + hv) * (K * V) + rk[:, None] * V + cv[None, :]
    S = tl.load(state_ptr, mask=live, other=0.0) * tl.exp(g)
    v_new = beta * (v - tl.sum(S * k[:, None], 0))
    S += k[:, None] * v_new[None, :]
    o = scale * tl.sum(S * q[:, None], 0)
    tl.store(o_ptr + (n * HV + hv) * V + cv, o.to(o_ptr.dtype.element_ty), mask=v_mask)
    tl.store(state_ptr, S, mask=live)


def decode_triton(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale, use_qk_l2norm):
    """Launch the decode kernel on validated inputs (q, k, v, a, b may be row-strided column
    slices); returns ``o [N, HV, V]`` in q's dtype."""
    N, H, K = q.shape
    HV, V = v.shape[1:]
    o = torch.empty(N, HV, V, device=q.device, dtype=q.dtype)
    BV = min(32, max(16, next_power_of_2(V)))
    gdn_decode_kernel[(cdiv(V, BV), N, HV)](
        q, k, v, a, b, A_log, dt_bias, o, state_pool, state_indices, scale,
        q.stride(0), k.stride(0), v.stride(0), a.stride(0), b.stride(0),
        H, HV, K, V, max(16, next_power_of_2(K)), BV, use_qk_l2norm)
    return o
