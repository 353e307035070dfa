"""Radix prefix cache: longest snapshot prefix, edge splits, KV slices, locks, LRU eviction."""

import pytest
import torch

from mamba_edu.serving import RadixCache, StatePool


def _cache(capacity=8):
    pool = StatePool(n_layers=1, capacity=capacity, conv_dim=2, conv_width=2, value_heads=1, key_dim=1,
                     value_dim=1)
    return pool, RadixCache(pool)


def _kv(tokens, layers=1):
    """KV rows that encode their token id, so slices can be checked."""
    t = torch.tensor(tokens, dtype=torch.float32)[:, None, None]
    return [(t + 1000 * i, -t) for i in range(layers)]


def test_match_longest_snapshot_prefix():
    pool, cache = _cache()
    seq = list(range(200))
    s64, s128 = pool.alloc(2)
    assert cache.insert(seq[:128], s128, _kv(seq))
    assert cache.insert(seq[:64], s64, _kv(seq))  # splits the 128-token edge at 64
    m = cache.match(seq[:150])
    assert (m.length, m.slot) == (128, s128)
    assert torch.equal(m.kv[0][0][:, 0, 0], torch.arange(128.0))
    assert cache.match(seq[:100]).slot == s64
    assert cache.match(seq[:128], max_length=127).length == 64
    assert cache.match([5] + seq).length == 0 and cache.match([5]).kv is None


def test_branches_and_split_node_without_snapshot():
    pool, cache = _cache()
    a = list(range(128))
    b = list(range(64)) + [999] * 64
    sa, sb = pool.alloc(2)
    cache.insert(a, sa, _kv(a, 2))
    cache.insert(b, sb, _kv(b, 2))
    assert cache.match(b + [1]).slot == sb
    assert cache.match(a[:64] + [7] * 10).length == 0, "the split node at 64 has no snapshot"
    kv = cache.match(b + [1]).kv
    assert len(kv) == 2 and torch.equal(kv[1][0][:, 0, 0], torch.tensor(b, dtype=torch.float32) + 1000)


def test_duplicate_insert_is_refused():
    pool, cache = _cache()
    s1, s2 = pool.alloc(2)
    assert cache.insert(list(range(64)), s1, _kv(range(64)))
    assert not cache.insert(list(range(64)), s2, _kv(range(64)))
    assert cache.snapshot_slots() == {s1}


def test_lru_eviction_frees_slots_and_respects_locks():
    pool, cache = _cache()
    slots = pool.alloc(3)
    seqs = [[i] * 64 for i in range(3)]
    for s, seq in zip(slots, seqs):
        cache.insert(seq, s, _kv(seq))
    cache.match(seqs[0] + [1])  # 0 is now the most recently used
    locked = cache.match(seqs[1] + [1])
    cache.lock(locked.node)
    assert cache.evictable_slots() == 2
    assert cache.evict(1) == 1 and cache.snapshot_slots() == {slots[0], slots[1]}
    assert slots[2] not in pool.used_slots()
    assert cache.evict(5) == 1, "the locked snapshot stays"
    assert cache.snapshot_slots() == {slots[1]}
    cache.unlock(locked.node)
    assert cache.evict(1) == 1 and cache.snapshot_slots() == set()
    with pytest.raises(ValueError, match="not locked|not in this cache"):
        cache.unlock(locked.node)


def test_parent_snapshot_is_kept_while_a_child_is_locked():
    pool, cache = _cache()
    s64, s128 = pool.alloc(2)
    seq = list(range(128))
    cache.insert(seq[:64], s64, _kv(seq))
    cache.insert(seq, s128, _kv(seq))
    child = cache.match(seq + [0])
    cache.lock(child.node)
    assert cache.evictable_slots() == 0 and cache.evict(2) == 0


def test_insert_needs_tokens():
    _, cache = _cache()
    with pytest.raises(ValueError, match="token_ids"):
        cache.insert([], 1, [])


def test_cached_kv_does_not_pin_the_forward_tensors():
    """The cache copies the rows it keeps: a slice would keep the batch's whole KV alive."""
    pool, cache = _cache()
    wide = torch.randn(300, 5, 4)                     # a forward's projection: 300 tokens, 5 heads
    k, v = wide[:, 1:2], wide[:, 2:3]                 # one kv head each: strided views of it
    (slot,) = pool.alloc(1)
    assert cache.insert(list(range(100)), slot, [(k, v)])
    cached_k, cached_v = cache.match(list(range(100))).kv[0]
    for cached, view in ((cached_k, k), (cached_v, v)):
        assert torch.equal(cached, view[:100])
        assert cached.untyped_storage().data_ptr() != wide.untyped_storage().data_ptr()
        assert cached.untyped_storage().nbytes() == cached.numel() * cached.element_size()


def _contents(pool, cache):
    """What a refused call must leave as it was."""
    nodes, stack = [], [cache.root]
    while stack:
        node = stack.pop()
        nodes.append((node.tokens, node.slot, node.last_used, list(node.holders)))
        stack.extend(node.children.values())
    return sorted(map(repr, nodes)), sorted(pool._free), dict(pool._owner)


def test_a_cache_that_knows_the_models_kv_refuses_another_from_its_first_entry():
    """An engine's cache is told one token's k and v: a learner's first entry of another shape or
    dtype is refused at insert, not met by the engine's next prefix hit."""
    pool, _ = _cache()
    cache = RadixCache(pool, kv_layers=1, kv_row=((2, 16), torch.float32, "cpu"))
    slot = pool.alloc(1)
    before = _contents(pool, cache)
    for wrong in (torch.zeros(4, 2, 16, dtype=torch.float64), torch.zeros(4, 1, 4)):
        with pytest.raises(ValueError, match=r"must be \[tokens, 2, 16\] torch.float32 on cpu like the model's"):
            cache.insert([1, 2, 3, 4], slot[0], [(wrong, wrong)])
        assert _contents(pool, cache) == before
    assert cache.insert([1, 2, 3, 4], slot[0], [(torch.zeros(4, 2, 16),) * 2])


@pytest.mark.parametrize("call, needle", [
    (lambda pool, cache, m: cache.match([True, 2, 3]), "not bools, floats"),
    (lambda pool, cache, m: cache.match([1.0, 2.0]), "not bools, floats"),
    (lambda pool, cache, m: cache.touch(None), "PrefixMatch"),
    (lambda pool, cache, m: RadixCache(pool).touch(m), "not in this cache's tree"),
    (lambda pool, cache, m: pool.peek(-1), "n must be an int >= 0"),
    (lambda pool, cache, m: pool.peek(True), "n must be an int >= 0"),
    (lambda pool, cache, m: pool.peek(2, extra=[0]), "extra must be distinct allocated slots"),
    (lambda pool, cache, m: RadixCache("a pool", working_slots=42), "StatePool"),
    (lambda pool, cache, m: pool.free(pool.alloc(1, owner="req0"), "req" + "0"[:1]),
     "an equal but different object: owners are compared by identity"),
])
def test_learner_calls_of_the_pool_and_cache_are_checked_and_change_nothing(call, needle):
    pool, cache = _cache()
    slot = pool.alloc(1)
    cache.insert([1, 2, 3], slot[0], [])
    match = cache.match([1, 2, 3, 4], touch=False)
    before = _contents(pool, cache)
    with pytest.raises((ValueError, TypeError), match=needle):
        call(pool, cache, match)
    if "equal but different" not in needle:  # that one allocated its slot first
        assert _contents(pool, cache) == before
