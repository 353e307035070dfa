"""The checks of notebook 08 reject plausible wrong answers and call a stub "not done"."""

import torch

from mamba_edu.exercises import nb08
from mamba_edu.exercises.core import FAIL, NOT_DONE, PASS, judge, lookup
from mamba_edu.gdn import recurrent_gated_delta_rule
from mamba_edu.serving import SCRATCH_SLOT


def stub(*args):
    raise NotImplementedError("hint: …")


def host_plan(batch, W, masked=False, from_device=False):
    """sync_free's host plan; ``masked`` keeps only tracked rows (a mask instead of the scratch
    slot), ``from_device`` reads the mask from the device tensor (a sync)."""
    tracked = batch.track_mask_t.tolist() if from_device else batch.track_mask
    offsets = [0]
    for e in batch.extend_lens:
        offsets.append(offsets[-1] + (e + 63) // 64)
    dst, conv, ckpt, final, chunks = [], [], [], [], []
    for i, plan in enumerate(batch.plans):
        start = batch.token_ranges[i][0]
        if tracked[i]:
            dst.append(plan.track_slot)
            conv.append([start + plan.aligned - (W - 1) + j for j in range(W - 1)])
            ckpt.append(min(offsets[i] + plan.aligned // 64, offsets[-1] - 1))
            final.append(int(plan.aligned == plan.extend_len))
            chunks.append(plan.aligned // 64)
        elif not masked:
            dst.append(SCRATCH_SLOT)
            conv.append([start] * (W - 1))
            ckpt.append(0)
            final.append(0)
            chunks.append(-1)
    return dst, conv, ckpt, final, chunks


def test_host_plan():
    ex = lookup(nb08.NOTEBOOK, 1)
    assert judge(ex, host_plan).status == PASS
    assert judge(ex, stub).status == NOT_DONE
    masked = judge(ex, lambda b, W: host_plan(b, W, masked=True))
    assert masked.status == FAIL and "scratch" in masked.message
    synced = judge(ex, lambda b, W: host_plan(b, W, from_device=True))
    assert synced.status == FAIL and "sync" in synced.message

    def own_slot(b, W):                     # untracked rows write their own track slot: no scratch
        dst, *rest = host_plan(b, W)
        return [b.track_slots[i] for i in range(len(dst))], *rest
    assert judge(ex, own_slot).status == FAIL


def test_checkpoint_bytes():
    ex = lookup(nb08.NOTEBOOK, 2)
    assert judge(ex, lambda lens, HV, K, V: sum((e + 63) // 64 for e in lens) * HV * K * V * 4).status == PASS
    assert judge(ex, stub).status == NOT_DONE
    assert judge(ex, lambda lens, HV, K, V: sum(lens) * HV * K * V * 4).status == FAIL          # per token
    assert judge(ex, lambda lens, HV, K, V: sum(e // 64 for e in lens) * HV * K * V * 4).status == FAIL  # floor
    assert judge(ex, lambda lens, HV, K, V: sum((e + 63) // 64 for e in lens) * HV * K * V * 2).status == FAIL  # bf16


def fused_scan(shift=0, write_untracked=False, skip_final=False, return_h=False):
    """A chunk-by-chunk scan with the tracking write; the flags make it wrong in one way."""
    def scan(q, k, v, g, beta, pool, lengths, working, track_slots, track_chunks):
        start, h = 0, []
        for n, L in enumerate(lengths):
            state = pool[working[n]].clone()
            n_chunks = (L + 63) // 64
            for c in range(n_chunks):
                h.append(state)
                if c == track_chunks[n] + shift or (write_untracked and track_chunks[n] < 0 and c == 0):
                    pool[track_slots[n]] = state
                s, e = start + 64 * c, min(start + 64 * (c + 1), start + L)
                state = recurrent_gated_delta_rule(q[s:e], k[s:e], v[s:e], g[s:e], beta[s:e],
                                                   initial_state=state[None], use_qk_l2norm=True).final_state[0]
            if track_chunks[n] + shift == n_chunks and not skip_final:
                pool[track_slots[n]] = state
            pool[working[n]] = state
            start += L
        return torch.stack(h) if return_h else None
    return scan


def test_fused_scan():
    ex = lookup(nb08.NOTEBOOK, 3)
    assert judge(ex, fused_scan()).status == PASS
    assert judge(ex, stub).status == NOT_DONE
    late = judge(ex, fused_scan(shift=-1))          # off by one chunk: the state 64 tokens early
    assert late.status == FAIL and "track slot" in late.message
    scratch = judge(ex, fused_scan(write_untracked=True))   # chunk −1 means: write nothing
    assert scratch.status == FAIL and "scratch" in scratch.message
    assert judge(ex, fused_scan(skip_final=True)).status == FAIL   # ⌈L/64⌉ = the final state
    assert judge(ex, fused_scan(return_h=True)).status == FAIL     # still hands back h
