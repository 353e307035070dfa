"""The four tracking strategies are interchangeable: same outputs, same pools, and exactly the
sync counts each one is built to have (docs/conventions.md)."""

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mamba_edu.engine import Engine, Request
from mamba_edu.model import build_model
from mamba_edu.profiling import count_syncs
from mamba_edu.serving import SCRATCH_SLOT, STRATEGIES

NAMES = list(STRATEGIES)
EXTENDS = [1, 2, 5, 63, 64, 65, 127, 128, 129, 191, 192, 193]
BASE = torch.randint(0, 128, (200,), generator=torch.Generator().manual_seed(7)).tolist()


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", device="cpu")


def expected_syncs(strategy: str, n_gdn: int, any_tracked: bool) -> int:
    """SGLang's counts: before PR #20522 (naive) 9 per forward + 3 per GDN layer (1 + 2 per layer
    when nothing is tracked); after it (precomputed) 11 per forward (2)."""
    return {"naive": 9 + 3 * n_gdn if any_tracked else 1 + 2 * n_gdn,
            "precomputed": 11 if any_tracked else 2, "sync_free": 0, "fused": 0}[strategy]


def run(model, strategy, cache_chunk, ping_pong, requests):
    """Warm the cache with snapshots of BASE at 64 and 128 tokens (where Cc allows), then prefill
    ``requests`` in one batch. Returns what every strategy must agree on, plus its sync report."""
    engine = Engine(model, strategy=strategy, max_requests=4, cache_chunk=cache_chunk, ping_pong=ping_pong)
    engine.prefill([Request("warm64", BASE[:65]), Request("warm128", BASE[:129])])
    engine.release(["warm64", "warm128"])
    batch = engine.prepare_prefill(requests)
    owned = set(batch.working_slots) | {s for lst in batch.track_slot_lists for s in lst} | {SCRATCH_SLOT}
    others = [s for s in range(engine.pool.capacity + 1) if s not in owned]
    before = engine.pool.conv[:, others].clone(), engine.pool.ssm[:, others].clone()
    with count_syncs() as syncs:
        logits = engine.forward_prefill(batch)
    # No write outside the slots this batch owns (running requests, cached snapshots).
    assert torch.equal(engine.pool.conv[:, others], before[0])
    assert torch.equal(engine.pool.ssm[:, others], before[1])
    engine.finish_prefill(batch, logits)
    real = [s for s in range(1, engine.pool.capacity + 1)]  # the scratch slot holds garbage by design
    return dict(logits=logits, conv=engine.pool.conv[:, real], ssm=engine.pool.ssm[:, real],
                prefix_lens=batch.prefix_lens, track_lens=batch.track_lens,
                snapshots=engine.cache.snapshot_slots()), syncs, batch


request_specs = st.lists(st.tuples(st.sampled_from([0, 64, 128]), st.sampled_from(EXTENDS)),
                         min_size=1, max_size=3)


@settings(max_examples=5, deadline=None)
@given(specs=request_specs, cache_chunk=st.sampled_from([64, 128]), ping_pong=st.booleans(),
       seed=st.integers(0, 2**16))
@example(specs=[(0, 3), (64, 5)], cache_chunk=64, ping_pong=False, seed=0)          # untracked
@example(specs=[(0, 64), (64, 65), (128, 192)], cache_chunk=64, ping_pong=True, seed=1)  # all tracked
@example(specs=[(128, 127), (0, 129)], cache_chunk=128, ping_pong=False, seed=2)
def test_strategies_agree(model, specs, cache_chunk, ping_pong, seed):
    gen = torch.Generator().manual_seed(seed)
    requests = [Request(f"r{i}", BASE[:p] + torch.randint(0, 128, (e,), generator=gen).tolist())
                for i, (p, e) in enumerate(specs)]
    n_gdn = len(model.config.gdn_layers)
    results = {}
    for name in NAMES:
        results[name], syncs, batch = run(model, name, cache_chunk, ping_pong, requests)
        assert syncs.count == expected_syncs(name, n_gdn, any(batch.track_mask)), syncs.summary()
    ref = results["naive"]
    for name in NAMES[1:]:
        for key, value in ref.items():
            got = results[name][key]
            assert torch.equal(got, value) if isinstance(value, torch.Tensor) else got == value, (name, key)


def test_sync_sites(model):
    """naive syncs inside every layer and in SGLang's per-forward metadata; precomputed only in
    init_forward_metadata, before the first layer; the others never."""
    requests = [Request("a", [1] * 130), Request("b", BASE[:20])]  # a is tracked, b is not
    n_gdn = len(model.config.gdn_layers)
    per_forward = {"item/bool/int (_local_scalar_dense)": 2, "boolean-mask indexing": 1, "cpu()": 6}
    _, naive, _ = run(model, "naive", 64, False, requests)
    assert naive.in_function("conv_indices") == 2 * n_gdn and naive.in_function("ssm_indices") == n_gdn
    assert naive.in_function("sglang_track_metadata") == 9
    assert naive.by_op == per_forward | {"item/bool/int (_local_scalar_dense)": 2 + 2 * n_gdn, "nonzero": n_gdn}
    _, pre, _ = run(model, "precomputed", 64, False, requests)
    assert pre.in_function("sglang_track_metadata") == 9 and pre.in_function("prepare") == 2
    assert pre.by_op == per_forward | {"item/bool/int (_local_scalar_dense)": 3, "nonzero": 1}


def test_tracked_snapshot_is_the_state_at_the_tracked_position(model):
    """The track slot after prefilling 130 tokens equals the working slot after prefilling 128."""
    for name in NAMES:
        engine = Engine(model, strategy=name, max_requests=2)
        batch = engine.prepare_prefill([Request("a", BASE[:130]), Request("b", BASE[:128])])
        engine.forward_prefill(batch)
        track_a, working_b = batch.track_slots[0], batch.working_slots[1]
        # Same state up to rounding: the two rows go through the same projections in one batch.
        torch.testing.assert_close(engine.pool.ssm[:, track_a], engine.pool.ssm[:, working_b],
                                   rtol=1e-5, atol=1e-6, msg=name)
        torch.testing.assert_close(engine.pool.conv[:, track_a], engine.pool.conv[:, working_b],
                                   rtol=1e-5, atol=1e-6, msg=name)


def test_metadata_must_match_the_batch(model):
    engine = Engine(model, strategy="sync_free", max_requests=2)
    first = engine.prepare_prefill([Request("a", BASE[:10])])
    second = engine.prepare_prefill([Request("b", BASE[:10])])
    engine.backend.init_forward_metadata(first)
    with pytest.raises(ValueError, match="init_forward_metadata"):
        engine.model(second, engine.backend)


def test_unknown_strategy(model):
    with pytest.raises(ValueError, match="strategy must be one of"):
        Engine(model, strategy="fast")


@pytest.mark.gpu
@pytest.mark.parametrize("name, other", list(zip(NAMES, NAMES[1:] + NAMES[:1])))
def test_strategies_agree_on_gpu(name, other):
    """Each strategy against the next one (the last against naive): every pair is two different
    strategies, and together they chain all four."""
    model = build_model("tiny", device="cuda")
    requests = [Request("a", BASE[:130]), Request("b", BASE[:64]), Request("c", BASE[:20])]
    results = {}
    for strategy in (other, name):
        engine = Engine(model, strategy=strategy, max_requests=4)
        batch = engine.prepare_prefill(requests)
        with count_syncs() as syncs:
            logits = engine.forward_prefill(batch)
        assert syncs.count == expected_syncs(strategy, len(model.config.gdn_layers), True), syncs.summary()
        results[strategy] = logits, engine.pool.ssm[:, 1:].clone(), engine.pool.conv[:, 1:].clone()
    for a, b in zip(results[other], results[name]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
