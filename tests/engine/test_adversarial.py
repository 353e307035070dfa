"""An adversarial pass over the public API: bad inputs beyond tests/engine/test_misuse.py, each judged.

Every case is a call that must be refused. A case is

* **clear**  : it raises ``ValueError``/``TypeError`` (``PoolExhausted``, or ``RuntimeError`` for
  the one-call-at-a-time guard) whose message matches the case's pattern (names the argument or problem),
  and, for engine cases, leaves the engine's state exactly as before;
* **vague**  : it raises one of those types, but the message does not say what was wrong;
* **silent** : it returns (a wrong result or a corrupted state), or it raised but changed state;
* **crash**  : it raises anything else (IndexError, KeyError, AttributeError, a torch error).

``python tests/engine/test_adversarial.py`` prints the tally and every case that is not clear; the test
asserts that all are clear.
"""

from __future__ import annotations

import copy
import math
import re
import pickle
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _helpers import call_during_decode  # noqa: E402
from test_misuse import P, busy_engine, state  # noqa: E402

from mamba_edu.engine import Engine, Request  # noqa: E402
from mamba_edu.gdn import (causal_conv1d, causal_conv1d_update, checkpoint_offsets,  # noqa: E402
                           chunk_counts, chunk_gated_delta_rule, cu_offsets, gdn_gating, l2norm,
                           recurrent_gated_delta_rule, seq_lengths)
from mamba_edu.kernels import (build_chunk_meta, build_chunk_meta_with_indices,  # noqa: E402
                               conv1d_decode, conv1d_prefill, gdn_decode, gdn_prefill, upload_indices)
from mamba_edu.kernels.inputs import random_pool, random_prefill_inputs  # noqa: E402
from mamba_edu.model import build_model  # noqa: E402
from mamba_edu.serving import (LinearAttentionBackend, PoolExhausted, RadixCache,  # noqa: E402
                               StatePool, plan_tracking)
from mamba_edu.serving.planning import plan_decode  # noqa: E402
from mamba_edu.engine import PreparedPrefill  # noqa: E402

CLEAR_TYPES = (ValueError, TypeError, PoolExhausted)
CASES: list[tuple[str, object, str]] = []  # (name, thunk() -> engine or None after the call, pattern)


def case(name: str, pattern: str):
    def register(fn):
        CASES.append((name, fn, pattern))
        return fn
    return register


def engine_case(name: str, pattern: str, call, setup=None, **kw):
    """A call on a busy engine (a cache entry, a running request, a prepared batch), after
    ``setup(engine)`` (whose changes are not judged)."""
    def fn():
        engine = busy_engine(**kw)
        if setup is not None:
            setup(engine)
        return engine, lambda: call(engine)
    CASES.append((name, fn, pattern))


def plain_case(name: str, pattern: str, call):
    CASES.append((name, lambda: (None, call), pattern))


# ---- requests -------------------------------------------------------------------------------
for label, rid in [("nan", float("nan")), ("list", ["a"]), ("dict", {}), ("set", {1}),
                   ("tensor", torch.tensor(1)), ("nan tuple", (1, float("nan"))), ("bytearray", bytearray(b"x"))]:
    plain_case(f"Request rid {label}", "rid must be hashable and equal to itself",
               lambda rid=rid: Request(rid, [1, 2]))
for label, ids in [("empty", []), ("str", "abc"), ("bytes", b"ab"), ("float", [1.5]), ("bool", [True]),
                   ("negative", [-3]), ("None", None), ("nested", [[1]]), ("dict", {1: 2}), ("int", 5),
                   ("numpy-ish float tensor", torch.tensor([1.0])), ("2-D tensor", torch.ones(2, 2, dtype=torch.long)),
                   ("inf", [math.inf]), ("complex", [1j]), ("empty generator", (t for t in []))]:
    plain_case(f"Request token_ids {label}", "token_ids", lambda ids=ids: Request("a", ids))

for label, reqs in [("None", None), ("a Request", "REQ"), ("dict", "DICT"), ("set of ids", "SET"),
                    ("tuple of str", ("a",)), ("generator", "GEN"), ("nested list", "NEST"),
                    ("token beyond vocab", "VOCAB"), ("duplicate within", "DUP"), ("running rid", "RUN"),
                    ("pending rid", "PREP"), ("too many", "MANY")]:
    def make(reqs=reqs):
        return {"DICT": {"a": 1}, "SET": {1, 2}, "REQ": Request("n", [1]), "GEN": (r for r in [Request("n", [1])]),
                "NEST": [[Request("n", [1])]], "VOCAB": [Request("n", [1, 10 ** 6])],
                "DUP": [Request("n", [1]), Request("n", [2])], "RUN": [Request("run", [1])],
                "PREP": [Request("prep", [1])],
                "MANY": [Request(f"m{i}", [1]) for i in range(5)]}.get(reqs, reqs)
    for method in ("prefill", "prepare_prefill"):
        engine_case(f"{method} requests {label}", "request|Request|max_requests|vocab|rid",
                    lambda e, make=make, method=method: getattr(e, method)(make()))

# ---- engine construction --------------------------------------------------------------------
MODEL = build_model("tiny", device="cpu")
for label, kw, pat in [("max_requests float", dict(max_requests=2.0), "max_requests"),
                       ("max_requests True", dict(max_requests=True), "max_requests"),
                       ("cache_chunk 0", dict(cache_chunk=0), "cache_chunk"),
                       ("cache_chunk bool", dict(cache_chunk=True), "cache_chunk"),
                       ("cache_chunk 96", dict(cache_chunk=96), "cache_chunk"),
                       ("track_interval -1", dict(track_interval=-1), "track_interval"),
                       ("track_interval nan", dict(track_interval=float("nan")), "track_interval"),
                       ("cache_slots str", dict(cache_slots="4"), "cache_slots"),
                       ("ping_pong 1", dict(ping_pong=1), "ping_pong"),
                       ("strategy None", dict(strategy=None), "strategy"),
                       ("strategy upper", dict(strategy="SYNC_FREE"), "strategy"),
                       ("model None", dict(model=None), "model"),
                       ("model module", dict(model=torch.nn.Linear(2, 2)), "model")]:
    def build(kw=kw):
        kw = dict(kw)
        model = kw.pop("model", MODEL)
        return Engine(model, **kw)
    plain_case(f"Engine {label}", pat, build)

# ---- decode / release -----------------------------------------------------------------------
for label, steps in [("0", 0), ("-1", -1), ("float", 2.0), ("bool", True), ("str", "2"), ("None", None),
                     ("tensor", torch.tensor(2))]:
    engine_case(f"decode steps {label}", "steps", lambda e, steps=steps: e.decode(steps))
for label, rids, pat in [("None", None, "rids"), ("str", "run", "rids"), ("dict", {"run": 1}, "rids"),
                         ("generator", (r for r in ["run"]), "rids"), ("nan", [float("nan")], "rids"),
                         ("unhashable", [["run"]], "rids"), ("unknown", ["ghost"], "running"),
                         ("pending", ["prep"], "prepared"), ("one bad of two", ["run", "ghost"], "running"),
                         ("repeated", ("run", "run"), "distinct"), ("tensor", torch.tensor([1]), "rids")]:
    engine_case(f"release {label}", pat, lambda e, rids=rids: e.release(rids))

# ---- lifecycle objects ----------------------------------------------------------------------
def _prepared(e):
    return next(b for b in e._live)


engine_case("copy.copy a PreparedPrefill", "cannot be copied", lambda e: copy.copy(_prepared(e)))
engine_case("copy.deepcopy a PreparedPrefill", "cannot be copied", lambda e: copy.deepcopy(_prepared(e)))
engine_case("pickle a PreparedPrefill", "cannot be copied", lambda e: pickle.dumps(_prepared(e)))
engine_case("construct a PreparedPrefill", "prepare_prefill",
            lambda e: PreparedPrefill(None, e, None, [], [], []))
engine_case("forward a forged batch", "another Engine|PreparedPrefill|aborted|finished",
            lambda e: e.forward_prefill(object.__new__(PreparedPrefill)))
engine_case("batch.status written then reused", "finished", lambda e: _reuse(e),
            setup=lambda e: e.finish_prefill(_forwarded(e)))


def _forwarded(e):
    b = _prepared(e)
    e.forward_prefill(b)
    e._last = b
    return b


def _reuse(e):
    b = e._last
    b.__dict__["_status"] = "prepared"
    e.forward_prefill(b)


for method in ("forward_prefill", "finish_prefill", "abort_prefill", "capture_prefill"):
    for label, arg in [("None", None), ("a list", []), ("a ForwardBatch-like dict", {"rids": ["x"]}),
                       ("an int", 3)]:
        engine_case(f"{method} of {label}", "Bucket" if method == "capture_prefill" else "PreparedPrefill",
                    lambda e, m=method, a=arg: getattr(e, m)(a))
engine_case("finish_prefill with a logits str", "has not been run|logits",
            lambda e: e.finish_prefill(_prepared(e), "logits"))
engine_case("finish_prefill with foreign logits", "logits must be the tensor",
            lambda e: e.finish_prefill(_prepared(e), torch.zeros(1, 128)),
            setup=lambda e: e.forward_prefill(_prepared(e)))

# ---- ownership: pool and cache through the engine -------------------------------------------
engine_case("pool.free a running request's working slot", "belong to",
            lambda e: e.pool.free([e.running["run"].working_slot]))
engine_case("pool.free a running request's track slot", "belong to",
            lambda e: e.pool.free(list(e.running["run"].track_slots)))
engine_case("pool.free a prepared batch's slot", "belong to", lambda e: e.pool.free([e.pending["prep"]]))
engine_case("pool.free a cached snapshot", "belong to",
            lambda e: e.pool.free([next(iter(e.cache.snapshot_slots()))]))
engine_case("pool.free with a forged owner", "belong to",
            lambda e: e.pool.free([e.pending["prep"]], object()))
engine_case("pool.transfer a running slot", "belong to",
            lambda e: e.pool.transfer([e.running["run"].working_slot], None, "me"))
engine_case("cache.unlock the engine's lock", "not locked by",
            lambda e: e.cache.unlock(e.cache.match(P[:200]).node),
            setup=lambda e: e.prepare_prefill([Request("hit", P[:150])]))
engine_case("cache.unlock an unlocked node", "not locked",
            lambda e: e.cache.unlock(e.cache.match(P[:200]).node))
engine_case("cache.insert a running track slot", "belongs to|working slot",
            lambda e: e.cache.insert(P[300:310], e.running["run"].track_slots[0],
                                     [(torch.zeros(10, 2, 16), torch.zeros(10, 2, 16))] * 2))
engine_case("cache.insert a prepared track slot", "belongs to|working slot",
            lambda e: e.cache.insert(P[300:310], _prepared(e).track_slot_lists[0][0],
                                     [(torch.zeros(10, 2, 16), torch.zeros(10, 2, 16))] * 2))
engine_case("cache.lock another cache's node", "not in this cache",
            lambda e: e.cache.lock(busy_engine().cache.match(P[:200]).node))
engine_case("cache.unlock another cache's node", "not in this cache",
            lambda e: e.cache.unlock(busy_engine().cache.match(P[:200]).node))
engine_case("cache.lock an invented node", "not in this cache",
            lambda e: e.cache.lock(type(e.cache.root)((1, 2), e.cache.root, [])))
engine_case("pool.layer(-1)", "layer index", lambda e: e.pool.layer(-1))
engine_case("pool.layer(99)", "layer index", lambda e: e.pool.layer(99))
engine_case("pool.layer(1.0)", "layer index", lambda e: e.pool.layer(1.0))
engine_case("pool.copy_slot scratch", "allocated", lambda e: e.pool.copy_slot(0, e.pending["prep"]))
engine_case("pool.alloc nan", "n must be", lambda e: e.pool.alloc(float("nan")))
engine_case("cache.match a tensor", "token_ids", lambda e: e.cache.match(torch.tensor(P[:10])))
engine_case("cache.match touch=1", "touch", lambda e: e.cache.match(P[:10], touch=1))
engine_case("cache.evict -1", "n_slots", lambda e: e.cache.evict(-1))
engine_case("cache.eviction_plan 1.5", "n_slots", lambda e: e.cache.eviction_plan(1.5))
def _kv_like(e, rows, **kw):
    k = next(iter(e.cache.root.children.values())).kv[0][0]
    shape = kw.pop("shape", k.shape[1:])
    return [(torch.zeros(rows, *shape, dtype=kw.pop("dtype", k.dtype)),) * 2]


engine_case("cache.insert KV of another head dim", "like the model.s",
            lambda e: e.cache.insert(P[300:310], e._spare, _kv_like(e, 10, shape=(2, 3))),
            setup=lambda e: setattr(e, "_spare", e.pool.alloc(1)[0]))
engine_case("cache.insert KV of another dtype", "like the model.s",
            lambda e: e.cache.insert(P[300:310], e._spare, _kv_like(e, 10, dtype=torch.float64)),
            setup=lambda e: setattr(e, "_spare", e.pool.alloc(1)[0]))
engine_case("cache.insert KV of too many layers", "per attention layer",
            lambda e: e.cache.insert(P[300:310], e._spare, _kv_like(e, 10) * 3),
            setup=lambda e: setattr(e, "_spare", e.pool.alloc(1)[0]))

# ---- one call at a time ---------------------------------------------------------------------
def _second_thread(e):
    """A call from a second thread while the first thread's call is running."""
    call_during_decode(e, lambda: e.release(["run"]))


CASES.append(("second thread's call while a decode runs",
              lambda: (busy_engine(), None), "another call of this Engine is running"))

# ---- serving parts --------------------------------------------------------------------------
plain_case("StatePool conv_width 1", "conv_width", lambda: StatePool(1, 2, 4, 1, 1, 4, 4))
plain_case("StatePool capacity float", "capacity", lambda: StatePool(1, 2.0, 4, 4, 1, 4, 4))
plain_case("StatePool conv_dtype int", "conv_dtype",
           lambda: StatePool(1, 2, 4, 4, 1, 4, 4, conv_dtype=torch.int32))
plain_case("backend layer's conv width mismatch", "conv_weight must be",
           lambda: LinearAttentionBackend(StatePool(1, 2, 4, 4, 1, 4, 4), "sync_free",
                                          [SimpleNamespace(conv_weight=torch.zeros(4, 3))]))
plain_case("backend pool not a pool", "pool", lambda: LinearAttentionBackend("pool", "sync_free", []))
plain_case("plan_tracking prefix nan", "prefix_len", lambda: plan_tracking(float("nan"), 3, 64, 1))
plain_case("plan_tracking slot bool", "track_slot", lambda: plan_tracking(0, 3, 64, True))
plain_case("plan_decode steps 0", "steps", lambda: plan_decode([1], [[2]], [0], 0, 4, 0))
plain_case("plan_decode interval float", "track_interval", lambda: plan_decode([1], [[2]], [0], 1, 4.0, 0))
plain_case("plan_decode ragged", "one entry per request", lambda: plan_decode([1, 2], [[2]], [0], 1, 4, 0))
plain_case("RadixCache.insert into a fresh pool, scratch", "scratch",
           lambda: RadixCache(StatePool(1, 2, 4, 4, 1, 4, 4)).insert([1], 0, []))
plain_case("RadixCache.insert foreign owner", "belongs to",
           lambda: (lambda p: RadixCache(p).insert([1], p.alloc(1, owner="x")[0], []))(
               StatePool(1, 2, 4, 4, 1, 4, 4)))

# ---- kernels: metadata, indices, scalars and flags ------------------------------------------
LEN = [5, 70]
X = random_prefill_inputs(LEN, 1, 2, 16, 16, seed=1)
META = build_chunk_meta(LEN, "cpu")


def _prefill(**over):
    args = dict(X, state_pool=random_pool(4, 2, 16, 16), meta=META, state_indices=[0, 1], impl="torch")
    args.update(over)
    return gdn_prefill(**args)


for label, over, pat in [
        ("eps nan", dict(output_norm=(torch.zeros(75, 32), torch.ones(16), float("nan"))), "eps"),
        ("eps inf", dict(output_norm=(torch.zeros(75, 32), torch.ones(16), math.inf)), "eps"),
        ("eps True", dict(output_norm=(torch.zeros(75, 32), torch.ones(16), True)), "eps"),
        ("eps str", dict(output_norm=(torch.zeros(75, 32), torch.ones(16), "1e-6")), "eps"),
        ("scale nan", dict(scale=float("nan")), "scale"), ("scale inf", dict(scale=math.inf), "scale"),
        ("scale True", dict(scale=True), "scale"), ("scale 0", dict(scale=0.0), "scale"),
        ("scale -1", dict(scale=-1.0), "scale"), ("scale complex", dict(scale=1j), "scale"),
        ("use_qk_l2norm 'no'", dict(use_qk_l2norm="no"), "use_qk_l2norm"),
        ("use_qk_l2norm 1", dict(use_qk_l2norm=1), "use_qk_l2norm"),
        ("use_qk_l2norm None", dict(use_qk_l2norm=None), "use_qk_l2norm"),
        ("output_checkpoints 'no'", dict(output_checkpoints="no"), "output_checkpoints"),
        ("output_checkpoints 0", dict(output_checkpoints=0), "output_checkpoints"),
        ("state_indices bools", dict(state_indices=[True, False]), "state_indices"),
        ("state_indices floats", dict(state_indices=[0.0, 1.0]), "state_indices"),
        ("state_indices float tensor", dict(state_indices=torch.tensor([0.0, 1.0])), "state_indices"),
        ("state_indices bool tensor", dict(state_indices=torch.tensor([True, False])), "state_indices"),
        ("state_indices out of range", dict(state_indices=[0, 4]), "out of range"),
        ("state_indices huge", dict(state_indices=[0, 2 ** 40]), "state_indices"),
        ("state_indices below int32", dict(state_indices=[-2 ** 40, 0]), "state_indices"),
        ("state_indices repeated", dict(state_indices=[1, 1]), "repeat"),
        ("state_indices None", dict(state_indices=None), "state_indices"),
        ("state_indices str", dict(state_indices="01"), "state_indices"),
        ("state_indices 2-D", dict(state_indices=torch.tensor([[0, 1]])), "state_indices"),
        ("state_indices too short", dict(state_indices=[0]), "state_indices"),
        ("track_slots alone", dict(track_slots=[2, 3]), "together"),
        ("track_chunks float", dict(track_slots=[2, 3], track_chunks=[1.0, 1.0]), "track_chunks"),
        ("track_slots onto a working slot", dict(track_slots=[0, 3], track_chunks=[0, 1]), "differ"),
        ("track_chunks past the end", dict(track_slots=[2, 3], track_chunks=[0, 9]), "track_chunks"),
        ("meta None", dict(meta=None), "meta"),
        ("meta of other T", dict(meta=build_chunk_meta([74], "cpu"), state_indices=[0]), "meta describes"),
        ("meta of other N", dict(meta=build_chunk_meta([75], "cpu")), "state_indices"),
        ("meta a dict", dict(meta={"T": 75}), "meta"),
        ("state_pool int", dict(state_pool=torch.zeros(4, 2, 16, 16, dtype=torch.int32)), "state_pool"),
        ("state_pool numpy", dict(state_pool=torch.zeros(4, 2, 16, 16).numpy()), "state_pool"),
        ("q int", dict(q=X["q"].to(torch.int32)), "q"), ("g int", dict(g=X["g"].to(torch.int64)), "g"),
        ("q on meta device", dict(q=X["q"].to("meta")), "q|k|device"),
        ("raw gates half given", dict(g=None, beta=None, a=X["g"]), "a, b, A_log and dt_bias"),
        ("impl None", dict(impl=None), "impl"),
        ("activation-like kwarg", dict(output_norm=(torch.zeros(75, 32),)), "output_norm")]:
    plain_case(f"gdn_prefill {label}", pat, lambda over=over: _prefill(**over))

DEC = dict(q=torch.zeros(2, 1, 16), k=torch.zeros(2, 1, 16), v=torch.zeros(2, 2, 16), a=torch.zeros(2, 2),
           b=torch.zeros(2, 2), A_log=torch.zeros(2), dt_bias=torch.zeros(2))
for label, over, pat in [("scale nan", dict(scale=float("nan")), "scale"), ("scale True", dict(scale=True), "scale"),
                         ("use_qk_l2norm 'yes'", dict(use_qk_l2norm="yes"), "use_qk_l2norm"),
                         ("slots floats", dict(state_indices=[0.0, 1.0]), "state_indices"),
                         ("slots bools", dict(state_indices=[True, False]), "state_indices"),
                         ("slot too big", dict(state_indices=[0, 3]), "out of range"),
                         ("a int", dict(a=torch.zeros(2, 2, dtype=torch.int64)), "a must have dtype"),
                         ("A_log 2-D", dict(A_log=torch.zeros(1, 2)), "A_log")]:
    def dec(over=over):
        args = dict(DEC, state_pool=torch.zeros(3, 2, 16, 16), state_indices=[0, 1])
        args.update(over)
        return gdn_decode(**args)
    plain_case(f"gdn_decode {label}", pat, dec)

for label, over, pat in [("x int", dict(x=torch.zeros(75, 8, dtype=torch.int64)), "x"),
                         ("weight W=1", dict(weight=torch.zeros(8, 1)), "weight"),
                         ("bias wrong", dict(bias=torch.zeros(7)), "bias"),
                         ("activation relu", dict(activation="relu"), "activation"),
                         ("activation True", dict(activation=True), "activation"),
                         ("state_indices floats", dict(state_indices=[0.5, 1.0]), "state_indices"),
                         ("conv_pool int", dict(conv_pool=torch.zeros(2, 8, 3, dtype=torch.int32)), "conv_pool"),
                         ("meta of other T", dict(meta=build_chunk_meta([74], "cpu")), "meta|state_indices")]:
    def conv(over=over):
        args = dict(x=torch.zeros(75, 8), weight=torch.zeros(8, 4), conv_pool=torch.zeros(2, 8, 3),
                    meta=META, state_indices=[0, 1], impl="torch")
        args.update(over)
        return conv1d_prefill(**args)
    plain_case(f"conv1d_prefill {label}", pat, conv)
plain_case("conv1d_decode slots floats", "state_indices",
           lambda: conv1d_decode(torch.zeros(2, 8), torch.zeros(8, 4), conv_pool=torch.zeros(2, 8, 3),
                                 state_indices=[0.0, 1.0]))

for label, call, pat in [("lengths floats", lambda: build_chunk_meta([3.0], "cpu"), "lengths"),
                         ("lengths bools", lambda: build_chunk_meta([True], "cpu"), "lengths"),
                         ("lengths str", lambda: build_chunk_meta("35", "cpu"), "lengths"),
                         ("lengths tensor", lambda: build_chunk_meta(torch.tensor([3]), "cpu"), "lengths"),
                         ("lengths empty generator", lambda: build_chunk_meta((n for n in []), "cpu"), "lengths"),
                         ("lengths huge", lambda: build_chunk_meta([2 ** 31], "cpu"), "lengths"),
                         ("indices wrong N", lambda: build_chunk_meta_with_indices([3, 4], "cpu", state_indices=[0]),
                          "state_indices"),
                         ("indices floats", lambda: build_chunk_meta_with_indices([3], "cpu", track_slots=[0.0]),
                          "track_slots"),
                         ("indices beyond int32", lambda: build_chunk_meta_with_indices([3], "cpu", state_indices=[2 ** 33]),
                          "state_indices"),
                         ("upload_indices floats", lambda: upload_indices([1.5], "cpu"), "values"),
                         ("upload_indices bools", lambda: upload_indices([True], "cpu"), "values"),
                         ("upload_indices beyond int32", lambda: upload_indices([2 ** 31], "cpu"), "values"),
                         ("upload_indices str", lambda: upload_indices("12", "cpu"), "values")]:
    plain_case(f"chunk meta {label}", pat, call)


def _written_index_reaches_kernel(write):
    """A meta index written through .data/.numpy() after the upload: the kernel must not see it.
    Raises AssertionError (a crash in the tally) if the written value reached the kernel."""
    meta, idx = build_chunk_meta_with_indices(LEN, "cpu", state_indices=[0, 1])
    pool = random_pool(4, 2, 16, 16)
    want = pool.clone()
    gdn_prefill(**X, state_pool=want, meta=meta, state_indices=[0, 1], impl="torch")
    write(idx["state_indices"])
    got = pool.clone()
    gdn_prefill(**X, state_pool=got, meta=meta, **idx, impl="torch")
    if not torch.equal(got, want):
        raise AssertionError("a write around the version counter reached the kernel")
    raise ValueError("ok: the kernels read their private copy (written value ignored)")


plain_case("index written via .data", "private copy",
           lambda: _written_index_reaches_kernel(lambda t: t.data.copy_(torch.tensor([3, 3]))))
plain_case("index written via .numpy()", "private copy",
           lambda: _written_index_reaches_kernel(lambda t: t.numpy().__setitem__(0, 3)))
plain_case("index written in place", "changed in place", lambda: (lambda m: (
    m[1]["state_indices"].add_(1), gdn_prefill(**X, state_pool=random_pool(4, 2, 16, 16), meta=m[0],
                                                **m[1], impl="torch")))(
    build_chunk_meta_with_indices(LEN, "cpu", state_indices=[0, 1])))

# ---- the references (gdn) -------------------------------------------------------------------
T, H, K, HV, V = 10, 1, 4, 1, 4
RQ, RK, RV = torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, HV, V)
RG, RB = -torch.rand(T, HV), torch.rand(T, HV)
for fn in (chunk_gated_delta_rule, recurrent_gated_delta_rule):
    name = fn.__name__
    for label, over, pat in [("g > 0", dict(g=torch.full((T, HV), 0.5)), "g must be a log-decay"),
                             ("g NaN", dict(g=torch.full((T, HV), float("nan"))), "g must be a log-decay"),
                             ("q int", dict(q=torch.ones(T, H, K, dtype=torch.int64)), "q must be a floating"),
                             ("scale nan", dict(scale=float("nan")), "scale"),
                             ("scale True", dict(scale=True), "scale"),
                             ("scale tensor", dict(scale=torch.tensor(0.5)), "scale"),
                             ("use_qk_l2norm 'no'", dict(use_qk_l2norm="no"), "use_qk_l2norm"),
                             ("output_checkpoints 'no'", dict(output_checkpoints="no"), "output_checkpoints"),
                             ("initial_state int", dict(initial_state=torch.zeros(1, HV, K, V, dtype=torch.int32)),
                              "initial_state"),
                             ("initial_state list", dict(initial_state=[0.0]), "initial_state"),
                             ("cu_seqlens floats", dict(cu_seqlens=[0.0, 10.0]), "cu_seqlens"),
                             ("cu_seqlens generator", dict(cu_seqlens=(c for c in [0, 5])), "cu_seqlens")]:
        def ref(fn=fn, over=over):
            args = dict(q=RQ, k=RK, v=RV, g=RG, beta=RB)
            args.update(over)
            return fn(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("g"), args.pop("beta"), **args)
        plain_case(f"{name} {label}", pat, ref)
for label, call, pat in [
        ("gating int a", lambda: gdn_gating(torch.zeros(2), torch.zeros(3, 2, dtype=torch.long), torch.zeros(3, 2),
                                             torch.zeros(2)), "a must be a floating"),
        ("gating A_log list", lambda: gdn_gating([0.0, 0.0], torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(2)),
         "A_log"),
        ("l2norm eps nan", lambda: l2norm(torch.ones(2, 3), float("nan")), "eps"),
        ("l2norm eps -1", lambda: l2norm(torch.ones(2, 3), -1.0), "eps"),
        ("l2norm eps True", lambda: l2norm(torch.ones(2, 3), True), "eps"),
        ("l2norm int x", lambda: l2norm(torch.ones(2, 3, dtype=torch.long)), "x must be a floating"),
        ("conv int x", lambda: causal_conv1d(torch.ones(6, 4, dtype=torch.long), torch.ones(4, 3)), "x must be a floating"),
        ("conv int weight", lambda: causal_conv1d(torch.ones(6, 4), torch.ones(4, 3, dtype=torch.long)),
         "weight must be a floating"),
        ("conv bias list", lambda: causal_conv1d(torch.ones(6, 4), torch.ones(4, 3), [0.0] * 4), "bias"),
        ("conv update int state", lambda: causal_conv1d_update(torch.ones(2, 4), torch.ones(2, 4, 2, dtype=torch.long),
                                                             torch.ones(4, 3)), "conv_state must be a floating"),
        ("chunk_counts generator of bools", lambda: chunk_counts(b for b in [True]), "lengths"),
        ("chunk_counts str", lambda: chunk_counts("12"), "lengths"),
        ("chunk_counts chunk float", lambda: chunk_counts([3], 64.0), "chunk"),
        ("cu_offsets floats", lambda: cu_offsets([1.5]), "lengths"),
        ("checkpoint_offsets negative", lambda: checkpoint_offsets([-1]), "lengths"),
        ("seq_lengths float tensor", lambda: seq_lengths(torch.tensor([0.0, 3.0]), 3), "cu_seqlens")]:
    plain_case(label, pat, call)


# ---- the judge --------------------------------------------------------------------------------
def judge(name, fn, pattern) -> tuple[str, str]:
    engine, call = fn()
    if name.startswith("second thread"):  # the first thread's decode changes state: judge the refusal
        try:
            _second_thread(engine)
        except RuntimeError as err:
            ok = "run" in engine.running and re.search(pattern, str(err))
            return ("clear", str(err)) if ok else ("vague", str(err))
        return "silent", "a second thread's call ran beside the first"
    before = state(engine) if engine is not None else None
    try:
        call()
    except CLEAR_TYPES + (RuntimeError,) as err:
        if isinstance(err, RuntimeError) and not isinstance(err, PoolExhausted) \
                and "another call of this Engine" not in str(err):
            return "crash", f"{type(err).__name__}: {err}"
        if engine is not None:
            after = state(engine)
            same = (torch.equal(before.pop("conv"), after.pop("conv"))
                    and torch.equal(before.pop("ssm"), after.pop("ssm")) and before == after)
            if not same:
                return "silent", f"raised ({err}) but the engine's state changed"
        if re.search(pattern, str(err)):
            return "clear", str(err)
        return "vague", f"{type(err).__name__}: {err}"
    except Exception as err:  # noqa: BLE001
        return "crash", f"{type(err).__name__}: {err}"
    return "silent", "returned without an error"


def tally():
    results = {"clear": [], "vague": [], "silent": [], "crash": []}
    for name, fn, pattern in CASES:
        verdict, message = judge(name, fn, pattern)
        results[verdict].append((name, message))
    return results


@pytest.mark.parametrize("name, fn, pattern", CASES, ids=[c[0] for c in CASES])
def test_adversarial_case_is_clear(name, fn, pattern):
    verdict, message = judge(name, fn, pattern)
    assert verdict == "clear", f"{verdict}: {message}"


def test_the_pass_has_at_least_150_cases():
    assert len(CASES) >= 150


if __name__ == "__main__":
    res = tally()
    print(f"{len(CASES)} bad inputs: " + ", ".join(f"{k} {len(v)}" for k, v in res.items()))
    for verdict in ("vague", "silent", "crash"):
        for name, message in res[verdict]:
            print(f"  {verdict:6} {name}: {message[:200]}")
