"""The ``backend="torch"`` path: the package's references plus gather/scatter into the pools.

Same results as the Triton kernels, fp32 arithmetic; the fast default on CPU. Index lists are the
validated host values, so nothing here reads a GPU tensor back.
"""

from __future__ import annotations

import torch

from mamba_edu.gdn import (causal_conv1d, causal_conv1d_update, chunk_gated_delta_rule, gdn_gating,
                           recurrent_gated_delta_rule)


def _cu_list(lengths) -> list[int]:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


def prefill_torch(q, k, v, g, beta, state_pool, slots: list[int], meta, scale, use_qk_l2norm,
                  output_checkpoints, targets: list[tuple[int, int, int]]):
    """Chunked reference with the initial states gathered from, and final states scattered to,
    the pool; ``targets`` = ``(row, slot, chunk)`` tracking writes. Returns ``(o, checkpoints)``."""
    index = torch.tensor(slots, device=state_pool.device)
    res = chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=state_pool[index],
                                 cu_seqlens=_cu_list(meta.lengths), use_qk_l2norm=use_qk_l2norm,
                                 output_checkpoints=output_checkpoints or bool(targets))
    state_pool[index] = res.final_state
    for n, slot, chunk in targets:
        state_pool[slot] = (res.final_state[n] if chunk == meta.counts[n]
                            else res.checkpoints[meta.offsets[n] + chunk])
    return res.o, (res.checkpoints if output_checkpoints else None)


def decode_torch(q, k, v, a, b, A_log, dt_bias, state_pool, slots: list[int], scale,
                 use_qk_l2norm):
    """One recurrent step per sequence (padded rows start from zeros and are not written)."""
    N, HV = a.shape
    live = [n for n, s in enumerate(slots) if s >= 0]
    h0 = state_pool.new_zeros(N, *state_pool.shape[1:])
    h0[live] = state_pool[[slots[n] for n in live]]
    g, beta = gdn_gating(A_log, a, b, dt_bias)
    res = recurrent_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0,
                                     cu_seqlens=list(range(N + 1)), use_qk_l2norm=use_qk_l2norm)
    state_pool[[slots[n] for n in live]] = res.final_state[live]
    return res.o


def conv1d_prefill_torch(x, weight, bias, conv_pool, slots: list[int], meta, activation,
                         targets: list[tuple[int, int, int]]):
    """The reference conv on the gathered states; ``targets`` = ``(row, slot, chunk)``: save the
    ``W−1`` columns of ``x̃ = [state, tokens]`` before token ``min(64·chunk, L)`` to ``slot``."""
    index = torch.tensor(slots, device=conv_pool.device)
    initial = conv_pool[index]
    cu = _cu_list(meta.lengths)
    y, finals = causal_conv1d(x, weight, bias, cu_seqlens=cu, initial_states=initial,
                              activation=activation)
    for n, slot, chunk in targets:
        end = min(64 * chunk, meta.lengths[n])
        x_tilde = torch.cat([initial[n], x[cu[n]:cu[n + 1]].T.to(initial.dtype)], dim=1)
        conv_pool[slot] = x_tilde[:, end:end + initial.shape[2]]
    conv_pool[index] = finals.to(conv_pool.dtype)
    return y


def conv1d_decode_torch(x, weight, bias, conv_pool, slots: list[int], activation):
    live = [n for n, s in enumerate(slots) if s >= 0]
    state = conv_pool.new_zeros(x.shape[0], *conv_pool.shape[1:])
    state[live] = conv_pool[[slots[n] for n in live]]
    y, new_state = causal_conv1d_update(x, state, weight, bias, activation=activation)
    conv_pool[[slots[n] for n in live]] = new_state[live].to(conv_pool.dtype)
    return y
