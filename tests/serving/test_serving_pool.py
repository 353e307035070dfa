"""State pool: layout, zeroed allocation, the scratch slot, freeing, exhaustion."""

import pytest
import torch

from mamba_edu.serving import SCRATCH_SLOT, PoolExhausted, StatePool


def _pool(capacity=4):
    return StatePool(n_layers=2, capacity=capacity, conv_dim=6, conv_width=4, value_heads=2, key_dim=3,
                     value_dim=5)


def test_layout_and_dtypes():
    pool = _pool()
    assert pool.conv.shape == (2, 5, 6, 3) and pool.ssm.shape == (2, 5, 2, 3, 5)
    assert pool.ssm.dtype == torch.float32
    conv, ssm = pool.layer(1)
    conv[2] = 7.0
    assert (pool.conv[1, 2] == 7).all(), "layer views write into the pool"


def test_alloc_never_hands_out_scratch_and_zeroes():
    pool = _pool()
    pool.conv.fill_(3.0)
    pool.ssm.fill_(3.0)
    slots = pool.alloc(4)
    assert SCRATCH_SLOT not in slots and sorted(slots) == [1, 2, 3, 4]
    assert (pool.conv[:, slots] == 0).all() and (pool.ssm[:, slots] == 0).all()
    assert pool.n_free == 0 and pool.used_slots() == set(slots)


def test_exhaustion_changes_nothing():
    pool = _pool()
    kept = pool.alloc(3)
    pool.ssm[:, kept] = 1.5
    before = pool.ssm.clone(), pool.conv.clone()
    with pytest.raises(PoolExhausted, match="2 slots requested, 1 free"):
        pool.alloc(2)
    assert torch.equal(pool.ssm, before[0]) and torch.equal(pool.conv, before[1])
    assert pool.n_free == 1 and pool.used_slots() == set(kept)


def test_free_and_reuse():
    pool = _pool()
    a = pool.alloc(2)
    pool.free([a[0]])
    assert pool.alloc(1) == [a[0]]
    with pytest.raises(ValueError, match="slots"):
        pool.free([SCRATCH_SLOT])
    with pytest.raises(ValueError, match="slots"):
        pool.free([a[1], a[1]])


def test_copy_slot_copies_every_layer():
    pool = _pool()
    a, b = pool.alloc(2)
    pool.ssm[:, a] = torch.randn(2, 2, 3, 5)
    pool.conv[:, a] = torch.randn(2, 6, 3)
    pool.copy_slot(a, b)
    assert torch.equal(pool.ssm[:, b], pool.ssm[:, a]) and torch.equal(pool.conv[:, b], pool.conv[:, a])
    with pytest.raises(ValueError, match="dst"):
        pool.copy_slot(a, 4)


def test_bad_arguments():
    with pytest.raises(ValueError, match="capacity"):
        _pool(0)
    with pytest.raises(ValueError, match="n must be"):
        _pool().alloc(-1)
