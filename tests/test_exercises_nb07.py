"""The checks of notebook 07 reject plausible wrong answers and call a stub "not done"."""

import torch

from mamba_edu.exercises import nb07
from mamba_edu.exercises.core import FAIL, NOT_DONE, PASS, judge, lookup


def stub(*args):
    raise NotImplementedError("hint: …")


def indices(batch, rows, W, chunk_of=lambda A: A // 64, use_mask=False, clamp_with_item=False):
    """Precomputed indices; the keyword arguments make them wrong in one plausible way."""
    cu = batch.cu_seqlens
    E = cu[1:] - cu[:-1]
    chunks = (E + 63) // 64
    first = chunks.cumsum(0) - chunks
    if use_mask:                                   # x[mask]: right values, but a boolean index syncs
        mask = batch.track_mask_t
        A = batch.track_lens_t[mask] - batch.prefix_lens_t[mask]
    else:
        A = batch.track_lens_t[rows] - batch.prefix_lens_t[rows]
    conv = (cu[rows] + A)[:, None] + torch.arange(-(W - 1), 0)
    last = int(chunks.sum()) - 1 if clamp_with_item else chunks.sum() - 1  # int(t) syncs
    ckpt = torch.clamp(first[rows] + chunk_of(A), max=last)
    return batch.track_slots_t[rows], conv, batch.working_slots_t[rows], ckpt, A == E[rows]


def test_precomputed_indices():
    ex = lookup(nb07.NOTEBOOK, 1)
    assert judge(ex, indices).status == PASS
    assert judge(ex, stub).status == NOT_DONE
    masked = judge(ex, lambda b, r, W: indices(b, r, W, use_mask=True))
    assert masked.status == FAIL and "sync" in masked.message
    item = judge(ex, lambda b, r, W: indices(b, r, W, clamp_with_item=True))
    assert item.status == FAIL and "sync" in item.message
    off = judge(ex, lambda b, r, W: indices(b, r, W, chunk_of=lambda A: A // 64 + 1))
    assert off.status == FAIL and "checkpoint" in off.message


def test_checkpoint_row():
    ex = lookup(nb07.NOTEBOOK, 2)
    assert judge(ex, lambda lens, i, A: sum((e + 63) // 64 for e in lens[:i]) + A // 64).status == PASS
    assert judge(ex, stub).status == NOT_DONE
    floor = judge(ex, lambda lens, i, A: sum(e // 64 for e in lens[:i]) + A // 64)  # ⌊E/64⌋ rows per request
    assert floor.status == FAIL
    late = judge(ex, lambda lens, i, A: sum((e + 63) // 64 for e in lens[:i]) + A // 64 - 1)  # off by one chunk
    assert late.status == FAIL and "one chunk" in late.message
    assert judge(ex, lambda lens, i, A: i + A // 64).status == FAIL                # one row per request


def test_precomputed_syncs():
    ex = lookup(nb07.NOTEBOOK, 3)
    assert judge(ex, lambda L, tracked: 11 if tracked else 2).status == PASS
    assert judge(ex, stub).status == NOT_DONE
    assert judge(ex, lambda L, tracked: 2 if tracked else 1).status == FAIL          # any() + nonzero only
    assert judge(ex, lambda L, tracked: 9 + 3 * L if tracked else 1 + 2 * L).status == FAIL  # naive's count
