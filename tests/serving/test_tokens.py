"""Token ids are checked once, where a request enters (Tokens); the cache and the batch builder
take an engine's Tokens without a second pass, and still check whatever else a learner hands them."""

import numpy as np
import pytest
import torch

from mamba_edu.engine import Engine, Request
from mamba_edu.model import build_model
from mamba_edu.serving import RadixCache, StatePool, Tokens


@pytest.mark.parametrize("ids, culprit", [([1, True], "True"), ([1, 2.0], "2.0"), ([np.int64(3)], "3"),
                                          ([4, -1], "-1"), ((1, None), "None")])
def test_tokens_refuse_what_is_not_an_int_id(ids, culprit):
    with pytest.raises(ValueError, match=rf"must be ints >= 0 \(not bools, floats or numpy ints\); got .*{culprit}"):
        Tokens(ids)


def test_tokens_keep_their_type_where_they_are_already_checked():
    t = Tokens([5, 6, 7, 8])
    assert t == (5, 6, 7, 8) and Tokens.of(t) is t
    assert type(t.part(1, 3)) is Tokens and t.part(1, 3) == (6, 7) and t.part(2) == (7, 8)
    assert type(t[1:3]) is tuple  # a plain slice is not vouched for
    assert type(Tokens.of([1, 2])) is Tokens
    with pytest.raises(ValueError, match="must be a list of ints; got str"):
        Tokens.of("123")


def test_the_cache_checks_a_learners_tokens():
    pool = StatePool(1, 4, 8, 4, 1, 2, 2)
    cache = RadixCache(pool)
    with pytest.raises(ValueError, match="not bools"):
        cache.match([1, False])
    with pytest.raises(ValueError, match="got 1.5"):
        cache.insert([1, 1.5], pool.alloc(1)[0], [])


def test_a_prefill_checks_each_prompt_once(monkeypatch):
    """Requests made, the engine's prefill (match, batch, cache insert) builds no checked Tokens:
    the per-token pass happened once, in Request."""
    torch.manual_seed(0)
    engine = Engine(build_model("tiny", device="cpu"), strategy="precomputed", max_requests=4)
    prompt = [t % 120 for t in range(1, 200)]
    requests = [Request("a", prompt), Request("b", prompt[:130])]
    assert all(type(r.token_ids) is Tokens for r in requests)
    built = []
    checked = Tokens.__new__
    monkeypatch.setattr(Tokens, "__new__", staticmethod(lambda cls, *a, **k: built.append(a) or checked(cls, *a, **k)))
    out = engine.prefill(requests)
    assert built == [] and out.track_lens == [192, 128]  # snapshots inserted, nothing checked twice
    engine.prefill([Request("c", prompt + [7] * 70)])    # a prefix hit on a's snapshot
    assert len(built) == 1                               # c's own Request, nothing more
