"""The ``impl="torch"`` path: the package's references plus gather/scatter into the pools.

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


def _gather_states(pool: torch.Tensor, slots: list[int], rows: list[int]):
    """``[len(rows), …]`` initial states of ``rows``: the pool's slot, zeros for a negative slot
    (a padded row); and the positions and slots of the rows that have one."""
    initial = pool.new_zeros(len(rows), *pool.shape[1:])
    live = [i for i, n in enumerate(rows) if slots[n] >= 0]
    live_slots = [slots[rows[i]] for i in live]
    initial[live] = pool[live_slots]
    return initial, live, live_slots


def prefill_torch(q, k, v, g, beta, state_pool, slots: list[int], meta, scale, use_qk_l2norm,
                  output_checkpoints, targets: list[tuple[int, int, int]]):
    """Chunked reference with the initial states gathered from, and final states scattered to,
    the pool; ``targets`` = ``(row, slot, chunk)`` tracking writes. Returns ``(o, checkpoints)``.
    Padding, as a bucket lays it out: a negative slot starts from zeros and is not written back;
    a row of no tokens computes nothing; checkpoints past the batch's own (``meta.NT`` may be a
    capacity) are zeros."""
    rows = [n for n, length in enumerate(meta.lengths) if length > 0]
    initial, live, live_slots = _gather_states(state_pool, slots, rows)
    res = chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial,
                                 cu_seqlens=_cu_list([meta.lengths[n] for n in rows]),
                                 use_qk_l2norm=use_qk_l2norm,
                                 output_checkpoints=output_checkpoints or bool(targets))
    final = dict(zip(rows, res.final_state))
    for n, slot, chunk in targets:
        if chunk < meta.counts[n]:
            state_pool[slot] = res.checkpoints[meta.offsets[n] + chunk]
        elif n in final:
            state_pool[slot] = final[n]
        else:  # a row of no tokens: its final state is its initial one
            state_pool[slot] = state_pool[slots[n]] if slots[n] >= 0 else 0
    state_pool[live_slots] = res.final_state[live]
    ckpt = res.checkpoints if output_checkpoints else None
    if ckpt is not None and ckpt.shape[0] < meta.NT:
        ckpt = torch.cat([ckpt, ckpt.new_zeros(meta.NT - ckpt.shape[0], *ckpt.shape[1:])])
    return res.o, ckpt


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
    ``W−1`` columns of ``x̃ = [state, tokens]`` before token ``min(64·chunk, L)`` to ``slot``.
    Padded rows as in :func:`prefill_torch`."""
    rows = [n for n, length in enumerate(meta.lengths) if length > 0]
    initial, live, live_slots = _gather_states(conv_pool, slots, rows)
    cu = _cu_list(meta.lengths)
    y, finals = causal_conv1d(x, weight, bias, cu_seqlens=_cu_list([meta.lengths[n] for n in rows]),
                              initial_states=initial, activation=activation)
    for n, slot, chunk in targets:
        start = conv_pool[slots[n]] if slots[n] >= 0 else conv_pool.new_zeros(conv_pool.shape[1:])
        end = min(64 * chunk, meta.lengths[n])
        x_tilde = torch.cat([start, x[cu[n]:cu[n + 1]].T.to(start.dtype)], dim=1)
        conv_pool[slot] = x_tilde[:, end:end + start.shape[1]]
    conv_pool[live_slots] = finals[live].to(conv_pool.dtype)
    return y


def conv1d_decode_torch(x, weight, bias, conv_pool, slots: list[int], activation):
    live = [n for n, s in enumerate(slots) if s >= 0]
    state = conv_pool.new_zeros(x.shape[0], *conv_pool.shape[1:])
    state[live] = conv_pool[[slots[n] for n in live]]
    y, new_state = causal_conv1d_update(x, state, weight, bias, activation=activation)
    conv_pool[[slots[n] for n in live]] = new_state[live].to(conv_pool.dtype)
    return y
