"""The cache's and the engine's slots are capabilities: holding the cache object is not owning
its snapshots; an entry's KV has the model's attention layers from the first insert; a deep
cache needs no recursion (issue: audit findings on ownership, kv=[] and RecursionError)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_misuse import MODEL, P  # noqa: E402

from mamba_edu.engine import Engine, Request  # noqa: E402
from mamba_edu.serving import RadixCache, StatePool  # noqa: E402


def engine_with_a_snapshot():
    engine = Engine(MODEL, strategy="sync_free", max_requests=2, cache_slots=2)
    engine.prefill([Request("a", P[:130])])
    return engine, next(iter(engine.cache.snapshot_slots()))


def test_passing_the_cache_object_frees_none_of_its_snapshots():
    engine, snapshot = engine_with_a_snapshot()
    with pytest.raises(ValueError, match="only a slot's owner gives it back"):
        engine.pool.free([snapshot], owner=engine.cache)
    assert snapshot in engine.cache.snapshot_slots() and engine.pool.is_allocated(snapshot)


def test_nobody_but_the_cache_writes_a_cached_snapshot():
    engine, snapshot = engine_with_a_snapshot()
    before = engine.pool.conv[:, snapshot].clone()
    working = engine.running["a"].working_slot
    for owner in (None, engine.cache):
        with pytest.raises(ValueError, match="only a slot's owner writes it"):
            engine.pool.copy_slot(working, snapshot, owner)
    assert torch.equal(engine.pool.conv[:, snapshot], before)


def test_an_entry_without_the_models_attention_layers_is_refused_from_the_first():
    engine = Engine(MODEL, strategy="sync_free", max_requests=2, cache_slots=2)
    slot = engine.pool.alloc(1, owner="me")[0]
    with pytest.raises(ValueError, match=r"one \(k, v\) per attention layer of the model"):
        engine.cache.insert([1, 2, 3], slot, [], owner="me")
    engine.pool.free([slot], owner="me")
    engine.prefill([Request("a", P[:130])])  # tracked prefills still cache
    assert engine.cache.snapshot_slots()


def test_a_deep_cache_needs_no_recursion():
    depth = sys.getrecursionlimit() + 200
    pool = StatePool(1, depth + 2, 2, 2, 1, 2, 2)
    cache = RadixCache(pool, kv_layers=0)
    for n in range(1, depth + 1):  # one snapshot per prefix length: a chain as deep as the tokens
        slot = pool.alloc(1, owner="me")[0]
        assert cache.insert(list(range(n)), slot, [], owner="me")
    match = cache.match(list(range(depth)))
    assert match.length == depth and "RadixNode" in repr(match)
    assert cache.evictable_slots() == depth
    assert cache.evict(depth) == depth and not cache.snapshot_slots()


# --- files a learner controls: read once, regular only ---------------------------------------

def test_read_regular_refuses_links_pipes_devices_and_folders_at_the_open(tmp_path):
    import os

    from mamba_edu.grading.containment import read_regular
    (tmp_path / "nb.ipynb").write_bytes(b"{}")
    assert read_regular(tmp_path / "nb.ipynb") == b"{}"
    (tmp_path / "link.ipynb").symlink_to(tmp_path / "nb.ipynb")
    os.mkfifo(tmp_path / "reply.pt")  # a reader that opened it blocking would wait for ever
    for path in (tmp_path / "link.ipynb", tmp_path / "reply.pt", Path("/dev/zero"), tmp_path):
        with pytest.raises((OSError, ValueError)):
            read_regular(path)
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(ValueError, match="more than the 100"):
        read_regular(tmp_path / "big", max_bytes=100)
