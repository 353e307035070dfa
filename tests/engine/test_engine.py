"""The engine end to end: prefix hit = recompute, chains, decode, ping-pong, errors, CUDA graphs."""

import pytest
import torch

from mamba_edu.engine import Engine, Request
from mamba_edu.model import build_model
from mamba_edu.profiling import count_syncs, cuda_sync_guard
from mamba_edu.serving import SCRATCH_SLOT, STRATEGIES, PoolExhausted
from mamba_edu.engine import Bucket

SEQ = torch.randint(0, 128, (400,), generator=torch.Generator().manual_seed(3)).tolist()


@pytest.fixture(scope="module")
def gdn_only():
    return build_model("tiny", device="cpu", attn_every=0)


@pytest.fixture(scope="module")
def hybrid():
    return build_model("tiny", device="cpu")


def recompute(model, tokens):
    """Logits of the last token, computed from scratch by a fresh engine."""
    return Engine(model, strategy="naive", max_requests=1).prefill([Request("fresh", tokens)]).logits[0]


@pytest.fixture
def one_thread():
    """CPU BLAS splits a GEMM's rows across threads, so a row's rounding can depend on how many
    rows the call has; with one thread it depends only on the kernel the row count selects."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_prefix_hit_equals_recompute_gdn_only(gdn_only, strategy, one_thread):
    engine = Engine(gdn_only, strategy=strategy, max_requests=4)
    engine.prefill([Request("seed", SEQ[:130])])  # caches the state after 128 tokens
    engine.release(["seed"])
    fresh = Engine(gdn_only, strategy=strategy, max_requests=1)
    batch = fresh.prepare_prefill([Request("x", SEQ[:128])])
    fresh.forward_prefill(batch)
    snapshot, working = engine.cache.match(SEQ[:129]).slot, batch.working_slots[0]
    assert torch.equal(engine.pool.ssm[:, snapshot], fresh.pool.ssm[:, working]), "fp32 snapshot is exact"
    assert torch.equal(engine.pool.conv[:, snapshot], fresh.pool.conv[:, working])
    for n in (1, 5, 64, 100):
        tokens = SEQ[:128] + [(t + n) % 128 for t in SEQ[200:200 + n]]  # continuations differ
        out = engine.prefill([Request(n, tokens)])
        assert out.prefix_lens == [128]
        expected = recompute(gdn_only, tokens)
        if n >= 64:  # the same GEMM kernels run: bit-exact
            assert torch.equal(out.logits[0], expected), n
        else:        # a handful of rows takes the BLAS small-matrix path: rounding differs
            torch.testing.assert_close(out.logits[0], expected, rtol=1e-6, atol=2e-6)
        engine.release([n])
    assert engine.stats.prefix_hits == 4 and engine.stats.cached_tokens == 4 * 128


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_prefix_chain_a_b_c_with_attention(hybrid, strategy):
    engine = Engine(hybrid, strategy=strategy, max_requests=4)
    a = engine.prefill([Request("A", SEQ[:130])])        # tracks 128
    b = engine.prefill([Request("B", SEQ[:260])])        # hit 128, tracks 128 + 128
    c = engine.prefill([Request("C", SEQ[:300])])        # hit 256, tracks nothing (E = 44)
    assert (a.prefix_lens, b.prefix_lens, c.prefix_lens) == ([0], [128], [256])
    assert (a.track_lens, b.track_lens, c.track_lens) == ([128], [256], [-1])
    for out, n in ((b, 260), (c, 300)):
        torch.testing.assert_close(out.logits[0], recompute(hybrid, SEQ[:n]), rtol=1e-5, atol=1e-5)


def test_cache_chunk_128_tracks_only_at_multiples(hybrid):
    engine = Engine(hybrid, strategy="sync_free", max_requests=2, cache_chunk=128)
    out = engine.prefill([Request("a", SEQ[:127]), Request("b", SEQ[:300])])
    assert out.track_lens == [-1, 256]
    engine.release(["a", "b"])
    hit = engine.prefill([Request("c", SEQ[:270])])
    assert hit.prefix_lens == [256]
    torch.testing.assert_close(hit.logits[0], recompute(hybrid, SEQ[:270]), rtol=1e-5, atol=1e-5)


def test_decode_matches_recompute_and_has_no_sync_per_step(hybrid):
    engine = Engine(hybrid, strategy="sync_free", max_requests=2, track_interval=64)
    first = engine.prefill([Request("a", SEQ[:60]), Request("b", SEQ[:30])])
    with count_syncs() as syncs:
        dec = engine.decode(6)
    assert syncs.count == 1 and syncs.in_function("decode") == 1, syncs.summary()  # the final read
    fed = SEQ[:60] + [first.next_tokens[0]] + dec.tokens["a"][:-1]
    assert engine.running["a"].tokens == fed and dec.logits.shape == (6, 2, 128)
    torch.testing.assert_close(dec.logits[-1, 0], recompute(hybrid, fed), rtol=1e-4, atol=1e-4)
    assert dec.tokens["a"][-1] == int(dec.logits[-1, 0].argmax())


def test_decode_tracking_feeds_the_prefix_cache(hybrid):
    engine = Engine(hybrid, strategy="fused", max_requests=2, track_interval=64)
    engine.prefill([Request("a", SEQ[:60])])
    engine.decode(6)  # passes 64 tokens: the state after 64 is tracked and cached
    tokens = engine.running["a"].tokens
    hit = engine.prefill([Request("b", tokens[:64] + [1, 2, 3])])
    assert hit.prefix_lens == [64]
    torch.testing.assert_close(hit.logits[0], recompute(hybrid, tokens[:64] + [1, 2, 3]), rtol=1e-4, atol=1e-4)


def test_ping_pong_alternates_track_slots(hybrid):
    engine = Engine(hybrid, strategy="sync_free", max_requests=1, ping_pong=True, track_interval=64)
    out = engine.prefill([Request("a", SEQ[:70])])
    req = engine.running["a"]
    assert len(req.track_slots) == 2 and req.next_track == 1 and out.track_lens == [64]
    engine.decode(60)  # crosses 128: the second track slot is written, then donated
    assert req.next_track == 0 and len(engine.cache.snapshot_slots()) == 2
    owned = {req.working_slot, *req.track_slots}
    assert owned.isdisjoint(engine.cache.snapshot_slots()) and SCRATCH_SLOT not in owned


def test_release_frees_slots_and_keeps_snapshots(hybrid):
    engine = Engine(hybrid, strategy="sync_free", max_requests=2)
    engine.prefill([Request("a", SEQ[:70])])
    engine.release(["a"])
    assert engine.pool.used_slots() == engine.cache.snapshot_slots() and not engine.running
    with pytest.raises(ValueError, match="rids"):
        engine.release(["a"])


def test_exhaustion_leaves_everything_untouched(hybrid):
    engine = Engine(hybrid, strategy="sync_free", max_requests=2, cache_slots=1)  # 5 slots
    for rid, start in (("x", 0), ("y", 200)):
        engine.prefill([Request(rid, SEQ[start:start + 70])])
        engine.release([rid])
    assert len(engine.cache.snapshot_slots()) == 2
    conv, ssm, used = engine.pool.conv.clone(), engine.pool.ssm.clone(), engine.pool.used_slots()
    both = [Request("c", SEQ[:64] + [1]), Request("d", SEQ[200:264] + [2])]  # both hit: 2 snapshots locked
    with pytest.raises(PoolExhausted, match="need 4 slots, 3 free and 0 evictable"):
        engine.prefill(both)
    assert torch.equal(engine.pool.conv, conv) and torch.equal(engine.pool.ssm, ssm)
    assert engine.pool.used_slots() == used and not engine.running
    assert engine.prefill(both[:1]).prefix_lens == [64], "locks were released"


def test_abort_prefill_gives_slots_and_locks_back(hybrid):
    engine = Engine(hybrid, strategy="sync_free", max_requests=2)
    engine.prefill([Request("seed", SEQ[:130])])  # caches the state after 128 tokens
    engine.release(["seed"])
    used = engine.pool.used_slots()
    batch = engine.prepare_prefill([Request("a", SEQ[:200]), Request("b", SEQ[300:340])])
    assert batch.prefix_lens == [128, 0] and engine.cache.evictable_slots() == 0, "the hit is locked"
    engine.abort_prefill(batch)
    assert engine.pool.used_slots() == used and not engine.running
    assert engine.cache.evictable_slots() == 1, "the lock was released"
    with pytest.raises(ValueError, match="slots"):
        engine.abort_prefill(batch)  # its slots are free already
    done = engine.prepare_prefill([Request("c", SEQ[:10])])
    engine.finish_prefill(done, engine.forward_prefill(done))
    with pytest.raises(ValueError, match="running"):
        engine.abort_prefill(done)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(strategy="nope"), "strategy"), (dict(cache_chunk=100), "cache_chunk"),
    (dict(max_requests=0), "max_requests"), (dict(track_interval=0), "track_interval"),
    (dict(cache_slots=0), "cache_slots"),
])
def test_bad_engine_arguments(hybrid, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        Engine(hybrid, **kwargs)


@pytest.mark.parametrize("requests, needle", [
    (lambda: [], "requests"), (lambda: ["abc"], "Request"),
    (lambda: [Request("a", [1]), Request("a", [2])], "duplicate rid"),
    (lambda: [Request("a", [])], "token_ids"), (lambda: [Request("a", [128])], "token_ids"),
    (lambda: [Request(i, [1]) for i in range(3)], "max_requests"),
])
def test_bad_requests(hybrid, requests, needle):
    """Refused where the request is made (its own checks) or by the engine (vocab, ids, room)."""
    engine = Engine(hybrid, strategy="sync_free", max_requests=2)
    with pytest.raises(ValueError, match=needle):
        engine.prefill(requests())
    assert engine.pool.used_slots() == set()


def test_decode_and_capture_errors(hybrid):
    engine = Engine(hybrid, strategy="naive", max_requests=2)
    with pytest.raises(ValueError, match="running requests"):
        engine.decode(1)
    batch = engine.prepare_prefill([Request("a", SEQ[:10])])
    with pytest.raises(ValueError, match="needs a strategy that never syncs"):
        engine.capture_prefill(Bucket(64, 2), "gdn_inside", graphs=False)
    other = engine.prepare_prefill([Request("b", SEQ[:5])])
    logits, other_logits = engine.forward_prefill(batch), engine.forward_prefill(other)
    with pytest.raises(ValueError, match="logits must be the tensor forward_prefill"):
        engine.finish_prefill(batch, other_logits)  # a batch is finished with its own logits only
    engine.finish_prefill(batch, logits)
    engine.finish_prefill(other)  # None: the batch's own logits
    assert engine.running["a"].next_token.item() == int(logits[0].argmax())
    assert engine.running["b"].next_token.item() == int(other_logits[0].argmax())
    with pytest.raises(ValueError, match="steps"):
        engine.decode(0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour")
def test_capture_needs_cuda(hybrid):
    engine = Engine(hybrid, strategy="sync_free", max_requests=1)
    with pytest.raises(RuntimeError, match="CUDA"):
        engine.capture_prefill(Bucket(64, 1))


# ---- GPU ------------------------------------------------------------------------------------
def _gpu_batch(engine):
    engine.prefill([Request("seed", SEQ[:130])])
    return engine.prepare_prefill([Request("a", SEQ[:200]), Request("b", SEQ[300:340]),
                                   Request("c", SEQ[:128] + SEQ[150:214])])


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["sync_free", "fused"])
def test_no_sync_on_gpu(strategy):
    model = build_model("tiny", device="cuda")
    warm_up = Engine(model, strategy=strategy, max_requests=4)
    warm_up.forward_prefill(_gpu_batch(warm_up))  # first launches compile (a twin batch)
    engine = Engine(model, strategy=strategy, max_requests=4)
    batch = _gpu_batch(engine)
    torch.cuda.synchronize()
    with cuda_sync_guard() as result:
        engine.forward_prefill(batch)
    assert result.passed


@pytest.mark.gpu
def test_decode_on_gpu_matches_recompute():
    model = build_model("tiny", device="cuda")
    engine = Engine(model, strategy="fused", max_requests=2, track_interval=64)
    first = engine.prefill([Request("a", SEQ[:60]), Request("b", SEQ[100:130])])
    dec = engine.decode(6)
    fed = SEQ[:60] + [first.next_tokens[0]] + dec.tokens["a"][:-1]
    torch.testing.assert_close(dec.logits[-1, 0], recompute(model, fed), rtol=1e-3, atol=1e-3)
    tokens = engine.running["a"].tokens[:64] + [1]
    engine.release(["a", "b"])  # max_requests=2: make room; the decode-tracked snapshot stays cached
    hit = engine.prefill([Request("c", tokens)])
    assert hit.prefix_lens == [64]
    torch.testing.assert_close(hit.logits[0], recompute(model, tokens), rtol=1e-3, atol=1e-3)


def test_prepared_batches_count_as_active(hybrid):
    engine = Engine(hybrid, strategy="sync_free", max_requests=2)
    batch = engine.prepare_prefill([Request("a", SEQ[:70])])
    with pytest.raises(ValueError, match="pending"):
        engine.prepare_prefill([Request("a", SEQ[:30])])  # same rid, not finished yet
    second = engine.prepare_prefill([Request("b", SEQ[:30])])
    with pytest.raises(ValueError, match="max_requests=2"):
        engine.prepare_prefill([Request("c", SEQ[:30])])  # two prepared batches fill the engine
    engine.abort_prefill(second)
    engine.finish_prefill(batch, engine.forward_prefill(batch))
    assert not engine.pending and list(engine.running) == ["a"]
