"""Token buckets: one capture, any batch that fits (mamba_edu.engine.bucket, .graph; serving.breakable).

On a CPU the static-buffer forward runs without graphs (``capture_prefill(..., graphs=False)``):
for random batches, prefix hits and tracked positions it must give what the unpadded eager
forward gives (logits, every pool slot but the scratch slot, the prefix cache), cut where each
mode cuts, with no sync in a piece; a batch that does not fit is refused with nothing changed,
and a failure mid-replay leaves the engine as before. The GPU tests replay real graphs.
"""

from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from mamba_edu.engine import CAPTURE_MODES, Bucket, Engine, EngineStopped, Request
from mamba_edu.kernels import build_chunk_meta, gdn_prefill
from mamba_edu.kernels.metadata import build_chunk_meta_with_indices
from mamba_edu.model import build_model
from mamba_edu.profiling import count_syncs, cuda_sync_guard
from mamba_edu.serving import SCRATCH_SLOT, STRATEGIES
from mamba_edu.serving.breakable import Pieces, run_in_pieces

VOCAB = 128
CAPTURABLE = [name for name, cls in STRATEGIES.items() if cls.capturable]


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny", device="cpu")


@pytest.fixture
def tiny_copy():
    """A model of its own, for a test that casts it or hooks into it."""
    return build_model("tiny", device="cpu")


def _tokens(gen, n):
    return torch.randint(0, VOCAB, (n,), generator=gen).tolist()


def _pools_equal(a: Engine, b: Engine, tol: float = 1e-5) -> None:
    """Every slot but the scratch slot (padding and untracked rows write garbage there)."""
    keep = [s for s in range(a.pool.conv.shape[1]) if s != SCRATCH_SLOT]
    torch.testing.assert_close(a.pool.conv[:, keep], b.pool.conv[:, keep], rtol=tol, atol=tol)
    torch.testing.assert_close(a.pool.ssm[:, keep], b.pool.ssm[:, keep], rtol=tol, atol=tol)


def _cache_entries(engine: Engine) -> list:
    """Every cached path: its tokens, its snapshot slot, and its KV rounded (to compare two
    engines' caches: the same prefixes, slots and keys)."""
    out, stack = [], [(engine.cache.root, ())]
    while stack:
        node, prefix = stack.pop()
        for child in node.children.values():
            key = prefix + tuple(child.tokens)
            kv = tuple(round(float(t.double().sum()), 3) for pair in child.kv for t in pair)
            out.append((key, child.slot, kv))
            stack.append((child, key))
    return sorted(out)


def _run_both(model, strategy, mode, bucket, rounds, cache_chunk=64):
    """Each round's requests on an eager engine and on a bucket's static-buffer forward; both
    finished, then compared (logits, pools, cache)."""
    eager = Engine(model, strategy=strategy, max_requests=bucket.max_requests, cache_chunk=cache_chunk)
    padded = Engine(model, strategy=strategy, max_requests=bucket.max_requests, cache_chunk=cache_chunk)
    captured = padded.capture_prefill(bucket, mode, graphs=False)
    for requests in rounds:
        want = eager.prefill([Request(rid, t) for rid, t in requests])
        batch = padded.prepare_prefill([Request(rid, t) for rid, t in requests])
        got = captured.replay(batch)
        padded.finish_prefill(batch)
        torch.testing.assert_close(got, want.logits, rtol=1e-5, atol=1e-5)
        assert batch.forward_batch.prefix_lens == want.prefix_lens
        _pools_equal(eager, padded)
        assert _cache_entries(eager) == _cache_entries(padded)
        rids = [rid for rid, _ in requests]
        eager.release(rids)
        padded.release(rids)
    return captured


# ---- the kernels' padding: a negative slot, a row of no tokens, a chunk table with spare rows --
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_padded_rows_start_from_zeros_and_write_nothing(backend):
    gen = torch.Generator().manual_seed(0)
    lengths, pad_lengths = [70, 30], [70, 0, 30, 45]  # a zero-length row, and a dummy row of 45
    T = sum(lengths)
    q, k = (torch.randn(T + 45, 2, 16, generator=gen) for _ in range(2))
    v = torch.randn(T + 45, 4, 16, generator=gen)
    g = -torch.rand(T + 45, 4, generator=gen)
    beta = torch.rand(T + 45, 4, generator=gen)
    pool = torch.randn(6, 4, 16, 16, generator=gen)
    plain_pool = pool.clone()
    rows = list(range(70)) + list(range(70, 100))
    o_plain, _ = gdn_prefill(q[rows], k[rows], v[rows], g[rows], beta[rows], state_pool=plain_pool,
                             state_indices=[1, 3], meta=build_chunk_meta(lengths, "cpu"), impl=backend)
    padded_pool = pool.clone()
    meta, _ = build_chunk_meta_with_indices(pad_lengths, "cpu", allow_empty=True)
    o_pad, _ = gdn_prefill(q, k, v, g, beta, state_pool=padded_pool, state_indices=[1, -1, 3, -1],
                           meta=meta, impl=backend)
    torch.testing.assert_close(o_pad[:T], o_plain, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(padded_pool, plain_pool, rtol=1e-5, atol=1e-5)  # slots 0, 2, 4, 5 untouched
    # The dummy row started from zeros: the same as a fresh slot.
    fresh = torch.zeros(1, 4, 16, 16)
    o_fresh, _ = gdn_prefill(q[T:], k[T:], v[T:], g[T:], beta[T:], state_pool=fresh, state_indices=[0],
                             meta=build_chunk_meta([45], "cpu"), impl=backend)
    torch.testing.assert_close(o_pad[T:], o_fresh, rtol=1e-4, atol=1e-4)


def test_bucket_sizes_are_checked():
    for bad in (dict(max_tokens=0, max_requests=1), dict(max_tokens=64, max_requests=True),
                dict(max_tokens=64, max_requests=1, max_prefix_tokens=-1), dict(max_tokens=6.0, max_requests=1)):
        with pytest.raises(ValueError):
            Bucket(**bad)
    assert Bucket(130, 3).chunk_capacity == 130 // 64 + 4


# ---- the static-buffer forward equals the eager one -------------------------------------------
@st.composite
def bucket_rounds(draw):
    """A bucket and two rounds of requests that fit it; the second round may extend prompts of
    the first (prefix hits after their tracked snapshots are cached)."""
    max_requests = draw(st.integers(1, 3))
    max_tokens = draw(st.sampled_from([96, 200, 320]))
    seed = draw(st.integers(0, 2 ** 16))
    gen = torch.Generator().manual_seed(seed)
    rounds, prompts = [], []
    for r in range(2):
        n = draw(st.integers(1, max_requests))
        budget, requests = max_tokens, []
        for i in range(n):
            room = budget - (n - i - 1)  # the whole prompt fits, in case its prefix is not cached
            base = prompts[i] if r == 1 and i < len(prompts) and len(prompts[i]) < room and draw(st.booleans()) else []
            new = draw(st.integers(1, room - len(base)))
            budget -= len(base) + new
            requests.append((f"r{r}-{i}", base + _tokens(gen, new)))
        rounds.append(requests)
        prompts = [t for _, t in requests]
    fill = draw(st.booleans())  # a full bucket: no padding tokens at all in the first round
    if fill:
        rid, tokens = rounds[0][-1]
        rounds[0][-1] = (rid, tokens + _tokens(gen, max_tokens - sum(len(t) for _, t in rounds[0])))
    return Bucket(max_tokens, max_requests, max_prefix_tokens=640), rounds


@pytest.mark.parametrize("strategy", CAPTURABLE)
@pytest.mark.parametrize("mode", CAPTURE_MODES)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=bucket_rounds())
def test_static_forward_equals_eager(tiny, strategy, mode, case):
    bucket, rounds = case
    _run_both(tiny, strategy, mode, bucket, rounds)


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s not in CAPTURABLE])
def test_breakable_takes_every_strategy(tiny, strategy):
    gen = torch.Generator().manual_seed(3)
    first = [("a", _tokens(gen, 150)), ("b", _tokens(gen, 40))]
    second = [("c", first[0][1][:128] + _tokens(gen, 70))]
    _run_both(tiny, strategy, "breakable", Bucket(256, 2), [first, second])


# ---- the cut -------------------------------------------------------------------------------
class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


class _RecordedPieces(Pieces):
    """Pieces that remember, for each piece and break, the ops and syncs seen in it."""

    def __init__(self, log, syncs):
        super().__init__()
        self.log, self.syncs, self.spans, self._mark = log, syncs, [], (0, 0)

    def _close(self, kind):
        ops, syncs = len(self.log.ops), self.syncs.count
        self.spans.append((kind, self.log.ops[self._mark[0]:ops], syncs - self._mark[1]))
        self._mark = (ops, syncs)

    def _begin(self):
        if self.n_pieces > 1:
            self._close("break")
        else:
            self._mark = (len(self.log.ops), self.syncs.count)

    def _end(self):
        self._close("piece")


@pytest.mark.parametrize("strategy,mode", [(s, "breakable") for s in STRATEGIES]
                         + [(s, "gdn_inside") for s in CAPTURABLE])
def test_the_cut(strategy, mode):
    """breakable: a break at every attention core, GDN and full attention; gdn_inside: at the
    attention cores only; the LM head after the last piece (the tail). Nothing lost or run twice,
    and no sync inside a piece."""
    torch.set_num_threads(1)
    model = build_model("tiny", device="cpu", n_layers=6, attn_every=3)
    engine = Engine(model, strategy=strategy, max_requests=3)
    engine.prefill([Request("seed", [1 + i % 120 for i in range(130)])])
    captured = engine.capture_prefill(Bucket(400, 3), mode, graphs=False)
    batch = engine.prepare_prefill([Request("a", [1 + i % 120 for i in range(130)] + [5] * 70), Request("b", [7] * 40)])
    static = captured.static
    static.fill(batch.forward_batch)
    pools = engine.pool.conv.clone(), engine.pool.ssm.clone()
    log = _OpLog()
    with count_syncs() as syncs, log:
        engine.backend.init_forward_metadata_capture(static)
        start = (len(log.ops), syncs.count)
        pieces = _RecordedPieces(log, syncs)
        out = run_in_pieces(model, static.batch, engine.backend, pieces, break_gdn=mode == "breakable")
        cut_ops = log.ops[start[0]:]
    engine.pool.conv.copy_(pools[0])  # the cut forward wrote the working slots: start again
    engine.pool.ssm.copy_(pools[1])
    with count_syncs() as plain_syncs, _OpLog() as plain:
        engine.backend.init_forward_metadata_capture(static)
        start_plain = (len(plain.ops), plain_syncs.count)
        want = model(static.batch, engine.backend)
    n_gdn = sum(layer.kind == "gdn" for layer in model.layers)
    n_attn = len(model.layers) - n_gdn
    breaks = n_gdn + n_attn if mode == "breakable" else n_attn
    assert pieces.n_pieces == breaks + 1 and len(pieces.breaks) == breaks and pieces.tail is not None
    assert [kind for kind, _, _ in pieces.spans] == ["piece", "break"] * breaks + ["piece"]
    tail_ops = log.ops[start[0] + sum(len(o) for _, o, _ in pieces.spans):]
    assert [op for _, o, _ in pieces.spans for op in o] + tail_ops == cut_ops
    assert Counter(cut_ops) == Counter(plain.ops[start_plain[0]:])
    assert all(n == 0 for kind, _, n in pieces.spans if kind == "piece")
    assert syncs.count - start[1] == plain_syncs.count - start_plain[1]
    if strategy in CAPTURABLE:
        assert syncs.count == 0  # the refill and the whole forward: nothing to wait for
    torch.testing.assert_close(out.logits, want.logits, rtol=0, atol=0)
    engine.abort_prefill(batch)


def test_sglang_qwen35_cut_has_sixty_breaks():
    """Qwen3.5-397B-A17B as SGLang captures it: 60 layers, 60 breaks, 61 pieces (counted on a
    narrow stand-in with the preset's layer pattern)."""
    model = build_model("qwen3.5", device="cpu", hidden=64, vocab=128, mlp_width=64, gdn_key_heads=1,
                        gdn_value_heads=1, gdn_key_dim=16, gdn_value_dim=16, attn_heads=1,
                        attn_kv_heads=1, attn_head_dim=16)
    engine = Engine(model, strategy="sync_free", max_requests=1)
    captured = engine.capture_prefill(Bucket(64, 1), "breakable", graphs=False)
    batch = engine.prepare_prefill([Request("a", [3] * 20)])
    captured.replay(batch)
    assert len(model.layers) == 60
    assert captured.pieces.n_pieces == 61 and len(captured.pieces.breaks) == 60
    engine.abort_prefill(batch)


# ---- refusals and failures leave the engine as it was ------------------------------------------
def _snapshot(engine):
    return (engine.pool.conv.clone(), engine.pool.ssm.clone(), sorted(engine.pool.used_slots()),
            _cache_entries(engine), dict(engine.pending))


def _assert_same(engine, before):
    conv, ssm, used, cache, pending = before
    assert torch.equal(engine.pool.conv, conv) and torch.equal(engine.pool.ssm, ssm)
    assert sorted(engine.pool.used_slots()) == used and _cache_entries(engine) == cache
    assert dict(engine.pending) == pending


@pytest.mark.parametrize("requests, says", [
    ([("a", [1] * 100), ("b", [2] * 40)], "140 tokens, more than the bucket's max_tokens=128"),
    ([("a", [1] * 10), ("b", [2] * 10), ("c", [3] * 10)], "3 requests, more than the bucket's max_requests=2"),
])
def test_a_batch_that_does_not_fit_is_refused_and_nothing_changes(tiny, requests, says):
    engine = Engine(tiny, strategy="fused", max_requests=3)
    captured = engine.capture_prefill(Bucket(128, 2), "gdn_inside", graphs=False)
    batch = engine.prepare_prefill([Request(rid, t) for rid, t in requests])
    before = _snapshot(engine)
    with pytest.raises(ValueError, match=says):
        captured.replay(batch)
    _assert_same(engine, before)
    engine.forward_prefill(batch)  # still a prepared batch: it runs eagerly
    engine.finish_prefill(batch)


def test_prefix_beyond_the_graphs_buffers_is_refused(tiny):
    engine = Engine(tiny, strategy="sync_free", max_requests=3)
    engine.prefill([Request("seed", [4] * 130)])
    captured = engine.capture_prefill(Bucket(128, 2, max_prefix_tokens=64), "graph", graphs=False)
    batch = engine.prepare_prefill([Request("a", [4] * 130 + [5] * 10)])
    before = _snapshot(engine)
    with pytest.raises(ValueError, match="128 cached prefix tokens, more than the bucket's max_prefix_tokens=64"):
        captured.replay(batch)
    _assert_same(engine, before)
    engine.abort_prefill(batch)


@pytest.mark.parametrize("mode", CAPTURE_MODES)
def test_a_failure_mid_replay_stops_the_engine_until_reset(tiny, mode):
    engine = Engine(tiny, strategy="sync_free", max_requests=3)
    engine.prefill([Request("seed", [4] * 130)])
    captured = engine.capture_prefill(Bucket(256, 2, max_prefix_tokens=256), mode, graphs=False)
    batch = engine.prepare_prefill([Request("a", [4] * 130 + [5] * 70), Request("b", [6] * 90)])
    real, calls = engine.backend.forward, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the second GDN layer: the first has written the working slots
            raise RuntimeError("injected")
        return real(*args, **kwargs)

    engine.backend.forward = failing
    try:
        with pytest.raises(RuntimeError, match="injected"):
            captured.replay(batch)
    finally:
        engine.backend.forward = real
    with pytest.raises(EngineStopped, match="Engine.forward_prefill failed half way .RuntimeError: injected.*reset"):
        captured.replay(batch)
    engine.reset()
    batch = engine.prepare_prefill([Request("a", [4] * 130 + [5] * 70)])
    engine.finish_prefill(batch, captured.replay(batch))


CHANGES = {  # what a learner may do to the model after a capture: the graph would read stale weights
    "the model cast": lambda m: m.to(torch.float64),
    "its layers cast, not the embedding": lambda m: m.layers.to(torch.float64),
    "one weight given new storage": lambda m: setattr(m.layers[0].mlp_norm.weight, "data",
                                                       m.layers[0].mlp_norm.weight.data.clone()),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_model_changed_after_capture_is_refused_at_replay(tiny_copy, change):
    engine = Engine(tiny_copy, strategy="sync_free", max_requests=2)
    captured = engine.capture_prefill(Bucket(128, 2), "gdn_inside", graphs=False)
    batch = engine.prepare_prefill([Request("a", [1] * 40)])
    CHANGES[change](tiny_copy)
    before = _snapshot(engine)
    with pytest.raises(ValueError, match="weights were cast, moved or replaced since the capture .*capture the bucket again"):
        captured.replay(batch)
    _assert_same(engine, before)
    assert engine.stopped is None


def test_a_captured_bucket_runs_only_through_the_engine(tiny):
    """Its one public call is ``replay`` (an engine call, claimed and checked); capturing and running
    the static buffers are the engine's, inside its own calls."""
    from mamba_edu.engine.graph import CapturedBucket
    public = {name for name, value in vars(CapturedBucket).items() if callable(value) and not name.startswith("_")}
    assert public == {"replay", "refusal"}


def test_a_bucket_too_big_for_the_device_is_refused_with_its_size(tiny):
    engine = Engine(tiny, strategy="sync_free", max_requests=2)
    with pytest.raises(ValueError, match=r"needs at least \d+\.\d GiB .*more than the"):
        engine.capture_prefill(Bucket(10**9, 10**8), "breakable", graphs=False)


def test_a_replay_from_inside_another_call_is_refused(tiny_copy):
    engine = Engine(tiny_copy, strategy="sync_free", max_requests=3)
    captured = engine.capture_prefill(Bucket(128, 2), "breakable", graphs=False)
    batch = engine.prepare_prefill([Request("a", [1] * 40)])
    said = []

    def hook(module, args):
        with pytest.raises(RuntimeError, match="another call of this Engine is running") as refused:
            captured.replay(batch)
        said.append(str(refused.value))

    handle = tiny_copy.register_forward_pre_hook(hook)
    try:
        engine.prefill([Request("b", [2] * 30)])
    finally:
        handle.remove()
    assert said and "Engine.forward_prefill" in said[0]
    engine.finish_prefill(batch, captured.replay(batch))  # after the outer call: it runs


def test_capture_arguments_are_checked(tiny):
    engine = Engine(tiny, strategy="precomputed", max_requests=2)
    with pytest.raises(TypeError, match="Bucket"):
        engine.capture_prefill((64, 2))
    with pytest.raises(ValueError, match="mode must be one of"):
        engine.capture_prefill(Bucket(64, 2), "piecewise")
    for mode in ("gdn_inside", "graph"):
        with pytest.raises(ValueError, match="never syncs"):
            engine.capture_prefill(Bucket(64, 2), mode, graphs=False)
    with pytest.raises(TypeError, match="graphs must be a bool"):
        engine.capture_prefill(Bucket(64, 2), "breakable", graphs=1)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            engine.capture_prefill(Bucket(64, 2), "breakable")


# ---- GPU: real graphs ------------------------------------------------------------------------
def _random_batch(gen, bucket):
    n = int(torch.randint(1, bucket.max_requests + 1, (1,), generator=gen))
    total = int(torch.randint(n, bucket.max_tokens + 1, (1,), generator=gen))
    cuts = sorted(torch.randperm(total - 1, generator=gen)[:n - 1].add(1).tolist())
    return [e - s for s, e in zip([0, *cuts], [*cuts, total])]


@pytest.mark.gpu
@pytest.mark.parametrize("strategy,mode", [(s, m) for m in CAPTURE_MODES for s in CAPTURABLE]
                         + [("naive", "breakable"), ("precomputed", "breakable")])
def test_replays_of_random_batches_equal_their_eager_forwards(strategy, mode):
    """20 batches of one bucket, each replayed and run eagerly on a twin engine: the same logits
    and pools; for the sync-free strategies, no sync in the refill and the replay."""
    model = build_model("tiny", device="cuda")
    bucket = Bucket(320, 3, max_prefix_tokens=640)
    eager, padded = (Engine(model, strategy=strategy, max_requests=3) for _ in range(2))
    captured = padded.capture_prefill(bucket, mode)
    gen = torch.Generator().manual_seed(0)
    for i in range(20):
        requests = [(f"{i}-{j}", _tokens(gen, n)) for j, n in enumerate(_random_batch(gen, bucket))]
        want = eager.prefill([Request(rid, t) for rid, t in requests])
        batch = padded.prepare_prefill([Request(rid, t) for rid, t in requests])
        torch.cuda.synchronize()
        if strategy in CAPTURABLE and mode != "breakable":
            with cuda_sync_guard():  # raises at the first sync, the refill's included
                got = captured.replay(batch)
        else:
            got = captured.replay(batch)
        padded.finish_prefill(batch)
        torch.testing.assert_close(got, want.logits, rtol=2e-3, atol=2e-3)
        _pools_equal(eager, padded, tol=2e-3)
        eager.release([rid for rid, _ in requests])
        padded.release([rid for rid, _ in requests])


@pytest.mark.gpu
@pytest.mark.parametrize("mode,fail_at", [("graph", 1), ("graph", 3), ("breakable", 3)])
def test_a_failed_capture_stops_the_engine_until_reset(mode, fail_at):
    """An exception in the warm-up (calls 1-2) or the capture (call 3): the engine refuses every
    later call until reset(), which gives one that prefills."""
    model = build_model("tiny", device="cuda")
    engine = Engine(model, strategy="fused", max_requests=3)
    engine.prefill([Request("seed", [1 + i % 120 for i in range(130)])])
    real, calls = model.forward, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == fail_at:
            raise RuntimeError("injected")
        return real(*args, **kwargs)

    model.forward = failing
    try:
        with pytest.raises(RuntimeError, match="injected"):
            engine.capture_prefill(Bucket(256, 2), mode)
    finally:
        del model.forward
    with pytest.raises(EngineStopped, match="capture_prefill failed half way"):
        engine.prefill([Request("a", [3] * 50)])
    engine.reset()
    engine.prefill([Request("a", [3] * 50)])
