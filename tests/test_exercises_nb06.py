"""The checks of notebook 06 reject plausible wrong answers and call a stub "not done"."""

import torch

from mamba_edu.exercises import nb06
from mamba_edu.exercises.core import FAIL, NOT_DONE, PASS, judge, lookup


def stub(*args):
    raise NotImplementedError("hint: …")


def test_naive_syncs():
    ex = lookup(nb06.NOTEBOOK, 1)
    assert judge(ex, lambda L, tracked: 9 + 3 * L if tracked else 1 + 2 * L).status == PASS
    assert judge(ex, stub).status == NOT_DONE
    per_layer_only = judge(ex, lambda L, tracked: 3 * L if tracked else 2 * L)  # forgets the 9 before layer 1
    assert per_layer_only.status == FAIL and "per forward" in per_layer_only.message
    assert judge(ex, lambda L, tracked: 9 + 3 * L).status == FAIL               # untracked batches pay 1 + 2L
    assert judge(ex, lambda L, tracked: 4 * L).status == FAIL                   # the old stand-in's count


def right_window(start, A, W):
    return [start + A - (W - 1) + j for j in range(W - 1)]


def test_conv_window():
    ex = lookup(nb06.NOTEBOOK, 2)
    assert judge(ex, right_window).status == PASS
    assert judge(ex, stub).status == NOT_DONE
    assert judge(ex, lambda start, A, W: [start + A - W + j for j in range(W - 1)]).status == FAIL  # one early
    assert judge(ex, lambda start, A, W: [start + A - (W - 2) + j for j in range(W - 1)]).status == FAIL  # includes A
    assert judge(ex, lambda start, A, W: [A - (W - 1) + j for j in range(W - 1)]).status == FAIL  # forgets start


def make_track(window_shift=0, all_rows=False, final_from_h=False):
    """A naive track write; the flags make it wrong in one plausible way."""
    def track(conv_pool, ssm_pool, mixed_qkv, h, batch, W):
        mask = batch.track_mask_t
        if not mask.any():
            return
        rows = torch.arange(len(mask)) if all_rows else mask.nonzero()[:, 0]
        cu = batch.cu_seqlens
        A = (batch.track_lens_t[rows] - batch.prefix_lens_t[rows]).clamp(min=W - 1)
        pos = (cu[rows] + A + window_shift)[:, None] + torch.arange(-(W - 1), 0)
        dst = batch.track_slots_t[rows]
        conv_pool[dst] = mixed_qkv[pos.clamp(0, mixed_qkv.shape[0] - 1)].transpose(1, 2)
        E = cu[1:] - cu[:-1]
        chunks = (E + 63) // 64
        first = chunks.cumsum(0) - chunks
        final = (A == E[rows]) & (not final_from_h)
        ckpt = (first[rows] + A // 64).clamp(max=h.shape[0] - 1)
        ssm_pool[dst] = torch.where(final[:, None, None, None], ssm_pool[batch.working_slots_t[rows]], h[ckpt])
    return track


def test_naive_track():
    ex = lookup(nb06.NOTEBOOK, 3)
    assert judge(ex, make_track()).status == PASS
    assert judge(ex, stub).status == NOT_DONE
    off_by_one = judge(ex, make_track(window_shift=1))      # the window ends at A, not A - 1
    assert off_by_one.status == FAIL and "conv pool" in off_by_one.message
    untracked = judge(ex, make_track(all_rows=True))        # writes untracked rows' track slots too
    assert untracked.status == FAIL and "not tracked" in untracked.message
    from_h = judge(ex, make_track(final_from_h=True))       # A == E has no checkpoint of its own
    assert from_h.status == FAIL and "ssm pool" in from_h.message
