"""The checks of notebook 04 reject plausible wrong answers and call a stub "not done"."""

import torch

from mamba_edu.exercises import nb04
from mamba_edu.exercises.core import FAIL, NOT_DONE, PASS, judge, lookup


def stub(*args):
    raise NotImplementedError("hint: …")


def _upload(values, device):
    return torch.tensor(values, dtype=torch.int32).to(device)


def host_meta(lengths, device, chunks=lambda n: -(-n // 64)):
    """A host-built answer; ``chunks`` is the number of chunks of a sequence of n tokens."""
    cu, table, offsets = [0], [], [0]
    for seq, n in enumerate(lengths):
        cu.append(cu[-1] + n)
        table += [[seq, c] for c in range(chunks(n))]
        offsets.append(offsets[-1] + chunks(n))
    return _upload(cu, device), _upload(table, device).view(-1, 2), _upload(offsets, device)


def device_meta(lengths, device):
    """Right values, built from a device tensor: repeat_interleave and .tolist() would sync."""
    lens = torch.tensor(lengths, device=device)
    counts = (lens + 63) // 64
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=device), counts)
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    chunk = torch.arange(len(seq), device=device) - offsets[seq]
    cu = torch.cat([lens.new_zeros(1), lens.cumsum(0)])
    return cu, torch.stack([seq, chunk], 1), offsets


def test_chunk_meta():
    ex = lookup(nb04.NOTEBOOK, 1)
    assert judge(ex, host_meta).status == PASS
    assert judge(ex, stub).status == NOT_DONE
    floor = judge(ex, lambda lengths, device: host_meta(lengths, device, lambda n: n // 64))
    assert floor.status == FAIL and "chunk" in floor.message          # L // 64: off by one
    plus_one = judge(ex, lambda lengths, device: host_meta(lengths, device, lambda n: n // 64 + 1))
    assert plus_one.status == FAIL                                     # wrong at multiples of 64
    synced = judge(ex, device_meta)
    assert synced.status == FAIL and "sync" in synced.message


def conv_state_right(prev, x):
    return torch.cat([prev, x.T], dim=1)[:, -prev.shape[1]:]


def conv_state_from_x_only(prev, x):
    """Forgets the old state: wrong (and the wrong shape) when L < W−1."""
    return x[-prev.shape[1]:].T


def conv_state_newest_first(prev, x):
    return conv_state_right(prev, x).flip(1)


def test_conv_state_after():
    ex = lookup(nb04.NOTEBOOK, 2)
    assert judge(ex, conv_state_right).status == PASS
    assert judge(ex, stub).status == NOT_DONE
    short = judge(ex, conv_state_from_x_only)
    assert short.status == FAIL and "1 new token" in short.message
    assert judge(ex, conv_state_newest_first).status == FAIL
