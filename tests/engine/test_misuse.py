"""Misuse of the public API: every bad input is a clear error, raised before anything changes.

Each test asserts the error type, that the message names the argument (or the problem), and that
the engine's state is exactly as before: pool contents, slot ownership, cache contents, locks,
running and prepared requests. The last test runs random operation sequences (prefill, prepare,
forward, finish, abort, decode, release, and misuses) over all four strategies and checks the
ownership invariants after every step (docs/architecture.md, "Who owns a slot").
"""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mamba_edu.engine import Bucket, Engine, Request
from mamba_edu.gdn import (causal_conv1d, checkpoint_offsets, chunk_counts, chunk_gated_delta_rule,
                           gdn_gating, recurrent_gated_delta_rule, seq_lengths)
from mamba_edu.model import ModelConfig, build_model, get_config
from mamba_edu.serving import (SCRATCH_SLOT, STRATEGIES, PoolExhausted, RadixCache, StatePool, build_batch,
                               plan_tracking)
from mamba_edu.serving.batch import build_decode_batch, build_extend_batch
from mamba_edu.engine import PreparedPrefill

P = torch.randint(0, 128, (400,), generator=torch.Generator().manual_seed(11)).tolist()
MODEL = build_model("tiny", device="cpu")  # module level: hypothesis tests cannot take fixtures


def cache_state(cache: RadixCache):
    """Every node as (path tokens, slot, refcount), sorted: the cache's contents and locks."""
    out, stack = [], [(cache.root, ())]
    while stack:
        node, path = stack.pop()
        path = path + node.tokens
        out.append((path, node.slot, node.refcount))
        stack.extend((c, path) for c in node.children.values())
    return sorted(out, key=lambda x: (x[0], x[1] or -1))


def state(engine: Engine):
    """Everything an error must leave unchanged."""
    return dict(
        conv=engine.pool.conv.clone(), ssm=engine.pool.ssm.clone(), used=engine.pool.used_slots(),
        free=list(engine.pool._free), cache=cache_state(engine.cache), pending=set(engine.pending),
        running={rid: (r.working_slot, list(r.track_slots), r.next_track, list(r.tokens))
                 for rid, r in engine.running.items()},
        stats=vars(engine.stats).copy())


def assert_unchanged(before, engine: Engine):
    after = state(engine)
    assert torch.equal(before.pop("conv"), after.pop("conv")), "conv states changed"
    assert torch.equal(before.pop("ssm"), after.pop("ssm")), "ssm states changed"
    assert before == after


def busy_engine(strategy="sync_free", **kwargs) -> Engine:
    """An engine with a cached snapshot (128 tokens of P), one running request and one prepared batch."""
    engine = Engine(MODEL, strategy=strategy, max_requests=4, **kwargs)
    engine.prefill([Request("seed", P[:130])])
    engine.release(["seed"])
    engine.prefill([Request("run", P[:140])])
    engine.prepare_prefill([Request("prep", P[200:260])])
    return engine


def raises_unchanged(engine, exc, needle, fn):
    before = state(engine)
    with pytest.raises(exc, match=needle):
        fn()
    assert_unchanged(before, engine)


# ---- the prepared prefill: owned by its engine, used once (B1, B2, B3) ------------------------
def test_b1_abort_twice_is_refused_even_after_the_slots_were_reused():
    engine = Engine(MODEL, strategy="sync_free", max_requests=4)
    b1 = engine.prepare_prefill([Request("a", P[:70])])
    engine.abort_prefill(b1)
    engine.prefill([Request("b", P[100:170])])  # takes b1's slots
    raises_unchanged(engine, ValueError, "already aborted", lambda: engine.abort_prefill(b1))
    engine.prefill([Request("c", P[200:230])])
    working = [r.working_slot for r in engine.running.values()]
    assert len(set(working)) == 2
    engine.decode(1)


def test_b2_forward_twice_is_refused():
    engine = busy_engine()
    batch = engine.prepare_prefill([Request("x", P[:200])])  # a prefix hit at 128
    engine.forward_prefill(batch)
    raises_unchanged(engine, ValueError, "forward_prefill already ran", lambda: engine.forward_prefill(batch))
    engine.finish_prefill(batch)


def test_b3_a_batch_runs_only_on_its_engine():
    e1, e2 = Engine(MODEL, strategy="sync_free", max_requests=4), busy_engine()
    batch = e1.prepare_prefill([Request("a", P[:70])])
    for call in (e2.forward_prefill, e2.abort_prefill, e2.finish_prefill):
        raises_unchanged(e2, ValueError, "another Engine", lambda: call(batch))


@pytest.mark.parametrize("done", ["finish", "abort"])
@pytest.mark.parametrize("call", ["forward_prefill", "finish_prefill", "abort_prefill"])
def test_a_finished_or_aborted_batch_is_never_used_again(done, call):
    engine = busy_engine()
    batch = engine.prepare_prefill([Request("x", P[:70])])
    engine.forward_prefill(batch)
    engine.finish_prefill(batch) if done == "finish" else engine.abort_prefill(batch)
    raises_unchanged(engine, ValueError, "finished" if done == "finish" else "already aborted",
                     lambda: getattr(engine, call)(batch))


def test_a_replay_needs_this_engines_capture_and_a_bucket_that_fits_the_device():
    engine, other = busy_engine(), Engine(MODEL, strategy="sync_free", max_requests=1)
    batch = engine.prepare_prefill([Request("x", P[:70])])
    foreign = other.capture_prefill(Bucket(128, 1), "breakable", graphs=False)
    for captured in (foreign, "graph"):
        raises_unchanged(engine, ValueError, "captured must be a CapturedBucket of this engine",
                         lambda: engine.forward_prefill(batch, captured))
    raises_unchanged(engine, ValueError, "needs at least .* GiB",
                     lambda: engine.capture_prefill(Bucket(10**9, 10**8), "breakable", graphs=False))


def test_finish_needs_a_forward_and_the_batch_own_logits():
    engine = busy_engine()
    a = engine.prepare_prefill([Request("a", P[:70])])
    raises_unchanged(engine, ValueError, "has not been run", lambda: engine.finish_prefill(a, torch.zeros(1, 128)))
    b = engine.prepare_prefill([Request("b", P[300:330])])
    engine.forward_prefill(a)
    b_logits = engine.forward_prefill(b)
    raises_unchanged(engine, ValueError, "logits must be the tensor", lambda: engine.finish_prefill(a, b_logits))
    raises_unchanged(engine, ValueError, "logits must be the tensor",
                     lambda: engine.finish_prefill(a, torch.zeros(3, 128)))


def test_only_prepared_prefills_are_accepted():
    engine = busy_engine()
    plain = build_batch("extend", ["z"], [P[:10]], [0], [1], [plan_tracking(0, 10, 64, 2)], [None], "cpu")
    for call in (engine.forward_prefill, engine.finish_prefill, engine.abort_prefill):
        raises_unchanged(engine, TypeError, "batch must be the PreparedPrefill", lambda: call(plain))


def test_prepared_prefill_keeps_the_batch_fields():
    engine = busy_engine()
    batch = engine.prepare_prefill([Request("a", P[:200]), Request("b", P[300:340])])
    assert isinstance(batch, PreparedPrefill) and batch.engine is engine and batch.status == "prepared"
    assert batch.prefix_lens == [128, 0] and batch.extend_lens == [72, 40]
    assert batch.track_mask == [True, False] and batch.track_lens == [192, -1]
    assert batch.track_slots == [lst[0] for lst in batch.track_slot_lists]
    assert batch.cu_seqlens.tolist() == [0, 72, 112] and len(batch.plans) == 2
    assert batch.owned_slots == batch.working_slots + [s for lst in batch.track_slot_lists for s in lst]


# ---- the radix cache (B4) --------------------------------------------------------------------
def _kv(n, layers=1):
    return [(torch.zeros(n, 2, 16), torch.zeros(n, 2, 16)) for _ in range(layers)]


@pytest.mark.parametrize("bad, needle", [
    (lambda e, s: (P[300:310], SCRATCH_SLOT, _kv(10)), "scratch slot"),
    (lambda e, s: (P[300:310], e.pool.capacity, _kv(10)), "must be allocated"),
    (lambda e, s: (P[300:310], next(iter(e.cache.snapshot_slots())), _kv(10)), "already owned by the cache"),
    (lambda e, s: (P[300:310], e.running["run"].working_slot, _kv(10)), "must not be a working slot"),
    (lambda e, s: (P[300:310], e.pending["prep"], _kv(10)), "must not be a working slot"),
    (lambda e, s: (P[300:310], s, _kv(5)), "kv\\[0\\] k must cover the 10 tokens"),
    (lambda e, s: (P[300:310], s, _kv(10, layers=2)), "kv must have one \\(k, v\\) per attention layer"),
    (lambda e, s: (P[300:310], s, [(torch.zeros(10, 2, 16),)]), "kv\\[0\\] must be a pair"),
    (lambda e, s: ([], s, _kv(0)), "token_ids"),
    (lambda e, s: ([True, 3], s, _kv(2)), "token_ids"),
    (lambda e, s: (P[300:310], True, _kv(10)), "slot must be an int"),
])
def test_b4_insert_checks_everything_before_changing_the_tree(bad, needle):
    engine = busy_engine()
    spare = engine.pool.alloc(1)[0]
    args = bad(engine, spare)
    raises_unchanged(engine, ValueError, needle, lambda: engine.cache.insert(*args))
    assert engine.cache.evict(10) == 1 and not engine.cache.snapshot_slots()  # evict still works fully


def test_cache_lookup_and_lock_arguments():
    engine = busy_engine()
    raises_unchanged(engine, ValueError, "max_length", lambda: engine.cache.match(P[:200], max_length=-1))
    raises_unchanged(engine, ValueError, "token_ids", lambda: engine.cache.match("abc"))
    raises_unchanged(engine, ValueError, "node must be a RadixNode", lambda: engine.cache.lock(None))
    raises_unchanged(engine, ValueError, "n_slots", lambda: engine.cache.evict(True))
    node = engine.cache.match(P[:200]).node
    raises_unchanged(engine, ValueError, "not locked", lambda: engine.cache.unlock(node))


# ---- the pool and the planning -----------------------------------------------------------------
@pytest.mark.parametrize("call, needle", [
    (lambda p: p.alloc(True), "n must be an int"), (lambda p: p.alloc(-1), "n must be an int"),
    (lambda p: p.alloc(1.5), "n must be an int"), (lambda p: p.free([True]), "allocated slots"),
    (lambda p: p.free([SCRATCH_SLOT]), "allocated slots"), (lambda p: p.free(3), "slots must be a list"),
    (lambda p: p.copy_slot(1, SCRATCH_SLOT), "dst"), (lambda p: p.copy_slot(5, 1), "src"),
])
def test_pool_arguments(call, needle):
    pool = StatePool(1, 4, conv_dim=2, conv_width=2, value_heads=1, key_dim=1, value_dim=1)
    pool.alloc(2)
    pool.ssm.normal_()
    before = pool.ssm.clone(), pool.used_slots(), list(pool._free)
    with pytest.raises(ValueError, match=needle):
        call(pool)
    assert torch.equal(pool.ssm, before[0]) and (pool.used_slots(), pool._free) == before[1:]


@pytest.mark.parametrize("field, value", [("capacity", True), ("capacity", 0), ("conv_width", 1.0),
                                          ("value_heads", 0), ("n_layers", -1)])
def test_pool_shape_arguments(field, value):
    kwargs = dict(n_layers=1, capacity=4, conv_dim=2, conv_width=2, value_heads=1, key_dim=1, value_dim=1)
    with pytest.raises(ValueError, match=field):
        StatePool(**{**kwargs, field: value})


@given(st.sampled_from(["prefix_len", "extend_len", "track_slot", "cache_chunk"]),
       st.one_of(st.booleans(), st.floats(allow_nan=False), st.integers(max_value=-1), st.just("64")))
@settings(max_examples=30, deadline=None)
def test_plan_tracking_rejects_non_ints_and_negatives(name, value):
    args = dict(prefix_len=0, extend_len=70, cache_chunk=64, track_slot=2)
    args[name] = value
    with pytest.raises(ValueError, match=name):
        plan_tracking(**args)


def test_batch_constructors_check_their_lists():
    plan = plan_tracking(0, 10, 64, 2)
    with pytest.raises(ValueError, match="prefix_lens"):
        build_extend_batch(["a"], [P[:10]], [True], [1], [plan], [None], "cpu")
    with pytest.raises(ValueError, match="working_slots"):
        build_extend_batch(["a"], [P[:10]], [0], [1, 2], [plan], [None], "cpu")
    with pytest.raises(ValueError, match="token_ids\\[0\\]"):
        build_extend_batch(["a"], [[True] * 10], [0], [1], [plan], [None], "cpu")
    with pytest.raises(ValueError, match="plans\\[0\\] was planned for P=0, E=10"):
        build_extend_batch(["a"], [P[:11]], [0], [1], [plan], [None], "cpu")
    with pytest.raises(ValueError, match="seq_lens"):
        build_decode_batch(["a"], torch.zeros(1, dtype=torch.long), [-1], [1], [0], [None], "cpu")
    with pytest.raises(ValueError, match="input_ids"):
        build_decode_batch(["a"], torch.zeros(2, dtype=torch.long), [3], [1], [0], [None], "cpu")
    with pytest.raises(ValueError, match="mode"):
        build_batch("prefill", ["a"], [P[:10]], [0], [1], [plan], [None], "cpu")
    decode = build_decode_batch(["a"], torch.tensor([5]), [7], [1], [0], [None], "cpu")
    assert decode.prefix_lens == [7] and decode.positions.tolist() == [7] and decode.mode == "decode"


# ---- the engine's own arguments --------------------------------------------------------------
def test_engine_needs_a_model():
    for model in (None, "tiny", get_config("tiny")):
        with pytest.raises(TypeError, match="model must be a HybridModel"):
            Engine(model)


@pytest.mark.parametrize("value", ["no", 1, None, "False"])
def test_ping_pong_must_be_a_bool(value):
    with pytest.raises(TypeError, match="ping_pong must be a bool"):
        Engine(MODEL, ping_pong=value)


@pytest.mark.parametrize("requests, needle", [
    (lambda: [Request("a", [True, 3])], "token_ids of request 'a'"), (lambda: [Request("a", [1.0])], "token_ids"),
    (lambda: [Request("a", [-1])], "token_ids"), (lambda: [Request(["x"], [1])], "rid must be hashable"),
    (lambda: [Request("run", [1])], "duplicate rid"), (lambda: [Request("prep", [1])], "duplicate rid"),
    (lambda: (r for r in [Request("a", [1])]), "requests"),
    (lambda: [Request("a", torch.tensor(3))], r"token_ids of request 'a' must be .*Tensor\[\]"),
    (lambda: [Request("a", torch.ones(2, 3, dtype=torch.int64))], r"Tensor\[2, 3\]"),
    (lambda: [Request("a", __import__("numpy").array(3))], r"ndarray\[\]"),
])
def test_bad_requests_change_nothing(requests, needle):
    engine = busy_engine()
    raises_unchanged(engine, ValueError, needle, lambda: engine.prefill(requests()))
    raises_unchanged(engine, ValueError, needle, lambda: engine.prepare_prefill(requests()))


@pytest.mark.parametrize("rids, needle", [
    (["run", "run"], "rids must be distinct"), ("run", "rids must be a list"), (["nope"], "rids must be running"),
    (["prep"], "prepared but not finished"), (["run", "nope"], "rids must be running"),
    ([["x"]], "hashable"), (None, "rids must be a list"),
])
def test_release_checks_every_rid_first(rids, needle):
    engine = busy_engine()
    raises_unchanged(engine, ValueError, needle, lambda: engine.release(rids))


def test_decode_steps_and_an_empty_engine():
    engine = busy_engine()
    for steps in (0, True, 1.0, -2):
        raises_unchanged(engine, ValueError, "steps", lambda: engine.decode(steps))
    empty = Engine(MODEL, max_requests=1)
    raises_unchanged(empty, ValueError, "decode needs running requests", lambda: empty.decode(1))


@pytest.mark.parametrize("field, value, needle", [
    ("max_requests", True, "max_requests must be a positive int"), ("max_requests", 0, "max_requests"),
    ("track_interval", 0, "track_interval must be a positive int"), ("cache_slots", 2.0, "cache_slots"),
    ("cache_chunk", 100, "cache_chunk must be a positive multiple of 64"), ("cache_chunk", True, "cache_chunk"),
    ("strategy", "fast", "strategy must be one of"),
])
def test_engine_sizes_are_checked_at_construction(field, value, needle):
    with pytest.raises(ValueError, match=needle):
        Engine(MODEL, **{field: value})


# ---- the model ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, "float32", None])
def test_build_model_rejects_a_non_float_dtype_at_build_time(dtype):
    with pytest.raises(ValueError, match="dtype must be a floating torch dtype"):
        build_model("tiny", device="cpu", dtype=dtype)


@pytest.mark.parametrize("field, value", [("hidden", 64.0), ("n_layers", True), ("conv_width", "4"),
                                          ("rope_theta", 0.0), ("norm_eps", -1e-6), ("attn_every", 1.5),
                                          ("gdn_key_heads", 0), ("gdn_key_dim", 0)])
def test_config_fields_must_be_numbers_of_the_right_kind(field, value):
    with pytest.raises(ValueError, match=field):
        get_config("tiny", **{field: value})
    assert isinstance(get_config("tiny"), ModelConfig)


# ---- the GDN references (B5, B7, empty heads, bool lengths) -------------------------------------
def _gdn(T=130, H=1, HV=2, K=8, V=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(T, H, K, generator=gen), torch.randn(T, H, K, generator=gen),
            torch.randn(T, HV, V, generator=gen), -torch.rand(T, HV, generator=gen),
            torch.rand(T, HV, generator=gen))


@given(st.lists(st.integers(0, 129), min_size=1, max_size=6), st.sampled_from([-math.inf, -1e30, -5e3]))
@settings(max_examples=15, deadline=None)
def test_b5_strong_decay_chunked_matches_the_recurrence_and_stays_finite(rows, value):
    q, k, v, g, beta = _gdn()
    g[rows, 0] = value
    cu = torch.tensor([0, 50, 130])
    h0 = torch.randn(2, 2, 8, 8, generator=torch.Generator().manual_seed(1))
    ref = recurrent_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, use_qk_l2norm=True,
                                     output_checkpoints=True)
    out = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, use_qk_l2norm=True,
                                 output_checkpoints=True)
    for a, b in zip(out[:3], ref[:3]):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_b5_raw_gating_with_a_huge_A_log_never_gives_nan():
    a = torch.tensor([[1.0, 1.0], [-200.0, 0.0], [30.0, -30.0]])
    g, beta = gdn_gating(torch.tensor([100.0, 0.0]), a, a, torch.zeros(2))
    assert not g.isnan().any() and (g <= 0).all() and g[0, 0] == -math.inf
    q, k, v, _, b = _gdn(T=3)
    ref = recurrent_gated_delta_rule(q, k, v, g, b, use_qk_l2norm=True)
    out = chunk_gated_delta_rule(q, k, v, g, b, use_qk_l2norm=True)
    assert torch.isfinite(out.o).all() and torch.isfinite(out.final_state).all()
    torch.testing.assert_close(out.o, ref.o, rtol=1e-5, atol=1e-5)


@given(st.integers(1, 5), st.lists(st.integers(1, 7), min_size=1, max_size=3))
@settings(max_examples=20, deadline=None)
def test_b7_conv_final_state_is_the_last_w_minus_1_inputs(W, lengths):
    T, D = sum(lengths), 3
    x = torch.randn(T, D)
    cu = torch.tensor(checkpoint_offsets(lengths, chunk=1))
    y, finals = causal_conv1d(x, torch.randn(D, W), cu_seqlens=cu)
    assert finals.shape == (len(lengths), D, W - 1)
    for n, (start, stop) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        padded = torch.cat([torch.zeros(W - 1, D), x[start:stop]])
        torch.testing.assert_close(finals[n], padded[len(padded) - (W - 1):].T)


def test_conv_weight_needs_a_width():
    with pytest.raises(ValueError, match="weight must have shape \\[D, W\\]"):
        causal_conv1d(torch.randn(4, 3), torch.randn(3, 0))


@pytest.mark.parametrize("fn", [recurrent_gated_delta_rule, chunk_gated_delta_rule])
@pytest.mark.parametrize("dims, needle", [(dict(H=0), "H \\(q.shape\\[1\\]\\)"), (dict(K=0), "K \\(q.shape\\[2\\]\\)"),
                                          (dict(HV=0), "HV|heads"), (dict(V=0), "V \\(v.shape\\[2\\]\\)")])
def test_empty_heads_are_a_value_error_not_a_zero_division(fn, dims, needle):
    with pytest.raises(ValueError, match=needle):
        fn(*_gdn(T=4, **dims))


@pytest.mark.parametrize("cu", [[0, True, 4], [0, 2.0, 4]])
def test_cu_seqlens_lists_hold_ints(cu):
    with pytest.raises(ValueError, match="cu_seqlens must hold integers"):
        seq_lengths(cu, 4)


@pytest.mark.parametrize("lengths, chunk", [([True], 64), ([3, -1], 64), ([3], 0), ([3], True)])
def test_chunk_counts_arguments(lengths, chunk):
    with pytest.raises(ValueError, match="lengths|chunk"):
        chunk_counts(lengths, chunk)


# ---- random operation sequences over all strategies ------------------------------------------
OPS = ["prefill", "prepare", "forward", "finish", "abort", "decode", "release", "misuse"]


def owners(engine: Engine, batches) -> dict:
    """owner -> its slots: each running request, each live prepared batch, each cached snapshot."""
    out = {("run", rid): [r.working_slot, *r.track_slots] for rid, r in engine.running.items()}
    out.update({("batch", id(b)): b.owned_slots for b in batches if b.status in ("prepared", "forwarded")})
    stack = [engine.cache.root]
    while stack:
        node = stack.pop()
        if node.slot is not None:
            out[("cache", id(node))] = [node.slot]
        stack.extend(node.children.values())
    return out


def slot_states(engine: Engine, slots):
    return {s: (engine.pool.conv[:, s].clone(), engine.pool.ssm[:, s].clone()) for s in slots}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@given(data=st.data())
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_operation_sequences_keep_ownership(strategy, data):
    engine = Engine(MODEL, strategy=strategy, max_requests=3, cache_slots=2, track_interval=64,
                    ping_pong=data.draw(st.booleans(), "ping_pong"))
    batches, n = [], [0]
    snapshots = {}  # cache node -> its snapshot's states when first seen: must never change

    def new_requests(k):
        reqs = []
        for _ in range(k):
            n[0] += 1
            start = data.draw(st.sampled_from([0, 0, 150]), "start")   # shared starts: prefix hits
            length = data.draw(st.integers(1, 140), "length")
            tail = data.draw(st.integers(0, 2), "tail")                 # diverge after the prefix
            reqs.append(Request(f"r{n[0]}", P[start:start + length] + [(7 * n[0] + j) % 128 for j in range(tail)]))
        return reqs

    for _ in range(data.draw(st.integers(3, 9), "steps")):
        op = data.draw(st.sampled_from(OPS), "op")
        live = [b for b in batches if b.status in ("prepared", "forwarded")]
        before_owners = owners(engine, batches)
        before = state(engine)
        involved = set()
        try:
            if op in ("prefill", "prepare"):
                reqs = new_requests(data.draw(st.integers(1, 2), "k"))
                if op == "prefill":
                    engine.prefill(reqs)
                    involved |= {("run", r.rid) for r in reqs}
                else:
                    batches.append(engine.prepare_prefill(reqs))
                    involved.add(("batch", id(batches[-1])))
            elif op in ("forward", "finish", "abort") and live:
                b = data.draw(st.sampled_from(live), "batch")
                involved |= {("batch", id(b))} | {("run", rid) for rid in b.rids}
                if op == "forward" and b.status == "prepared":
                    engine.forward_prefill(b)
                elif op == "finish" and b.status == "forwarded":
                    engine.finish_prefill(b)
                elif op == "abort":
                    engine.abort_prefill(b)
            elif op == "decode" and engine.running:
                engine.decode(data.draw(st.integers(1, 3), "decode_steps"))
                involved |= {("run", rid) for rid in engine.running}
            elif op == "release" and engine.running:
                engine.release(data.draw(st.lists(st.sampled_from(sorted(engine.running)), min_size=1,
                                                  max_size=2, unique=True), "rids"))
            elif op == "misuse":
                kind = data.draw(st.sampled_from(["reuse", "bad_release", "bad_request", "foreign"]), "misuse")
                used = [b for b in batches if b.status in ("forwarded", "finished", "aborted")]
                with pytest.raises((ValueError, TypeError)):
                    if kind == "reuse" and used:
                        b = data.draw(st.sampled_from(used), "used")
                        getattr(engine, "forward_prefill" if b.status != "aborted" else "abort_prefill")(b)
                    elif kind == "bad_release":
                        engine.release(["nobody"] + sorted(engine.running))
                    elif kind == "foreign":
                        engine.forward_prefill(Engine(MODEL, strategy=strategy, max_requests=1)
                                               .prepare_prefill([Request("f", P[:5])]))
                    else:
                        engine.prefill([Request("bad", [1, 128])])
                assert_unchanged(before, engine)
                continue
        except (ValueError, PoolExhausted) as err:  # too many requests at once: must change nothing
            assert "max_requests" in str(err) or "pool exhausted" in str(err), err
            assert_unchanged(before, engine)
            continue
        after_owners = owners(engine, batches)
        # Ownership equals the used slots, and no slot has two owners (scratch never owned).
        owned = [s for slots in after_owners.values() for s in slots]
        assert len(owned) == len(set(owned)) and SCRATCH_SLOT not in owned
        assert set(owned) == engine.pool.used_slots()
        # The cache's slots in the pool are exactly its snapshots' (insert's refusal relies on it).
        assert engine.cache.snapshot_slots() == {s for s in owned if engine.pool.owner_of(s) is engine.cache._key}
        # No slot of an uninvolved owner was written.
        for owner, slots in before_owners.items():
            if owner in involved or after_owners.get(owner) != slots:
                continue
            old = {s: (before["conv"][:, s], before["ssm"][:, s]) for s in slots}
            for s, (conv, ssm) in slot_states(engine, slots).items():
                assert torch.equal(conv, old[s][0]) and torch.equal(ssm, old[s][1]), (op, owner, s)
        # Cached snapshots never change while cached.
        stack = [engine.cache.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node.slot is None:
                continue
            now = slot_states(engine, [node.slot])[node.slot]
            if node in snapshots:
                assert torch.equal(now[0], snapshots[node][0]) and torch.equal(now[1], snapshots[node][1])
            else:
                snapshots[node] = now
