"""The engine's prefill-kernel option: ``triton`` (ours) or ``fla`` (fla-core 0.6.0's Triton path,
SGLang's fallback; mamba_edu/serving/fla_prefill.py).

On a CPU: the option is checked once, where the engine is built, before anything is allocated
(an unknown name, fla without CUDA, fla with ``fused``, fla not installed, a capture mode that puts
the GDN layers inside a graph), each refusal clear and changing nothing. On a GPU with fla: an
``fla`` engine gives the ``triton`` engine's logits, prefix hits, tracked positions and tracked
states for naive, precomputed and sync_free over random batches with prefix hits, its breakable
replays equal its eager forwards, and its sync_free forward has no host sync.
"""

import importlib.util
from importlib import metadata

import pytest
import torch

from mamba_edu.engine import Bucket, Engine, Request
from mamba_edu.engine.graph import check_capture
from mamba_edu.model import build_model
from mamba_edu.profiling import cuda_sync_guard
from mamba_edu.serving import SCRATCH_SLOT, LinearAttentionBackend, StatePool, fla_prefill
from mamba_edu.testing import rel_err

VOCAB = 128
BASE = torch.randint(0, VOCAB, (400,), generator=torch.Generator().manual_seed(11)).tolist()
COPYING = ["naive", "precomputed", "sync_free"]  # the strategies that copy from h (fla returns it)


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny", device="cpu")


# ---- CPU: checked at the boundary ---------------------------------------------------------------
@pytest.mark.parametrize("kernel", ["nope", "FLA", None, 1, ["fla"]])
def test_an_unknown_kernel_is_refused_before_the_pool_is_allocated(tiny, kernel, monkeypatch):
    def allocate(*args, **kwargs):
        raise AssertionError("the pool was allocated before the check")
    monkeypatch.setattr(StatePool, "for_model", allocate)
    with pytest.raises(ValueError, match=r"prefill_kernel must be one of \['triton', 'fla'\]"):
        Engine(tiny, prefill_kernel=kernel)


def test_fla_with_fused_is_refused(tiny):
    with pytest.raises(ValueError, match="'fused' strategy.*use naive, precomputed or sync_free"):
        Engine(tiny, strategy="fused", prefill_kernel="fla")


@pytest.mark.parametrize("strategy", COPYING)
def test_fla_needs_cuda(tiny, strategy):
    with pytest.raises(RuntimeError, match="needs a CUDA device.*on cpu"):
        Engine(tiny, strategy=strategy, prefill_kernel="fla")


def test_fla_not_installed_names_the_extra(monkeypatch):
    """The check on a CUDA device with fla missing (faked, so that it runs here with or without fla)."""
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    def no_fla():
        raise ModuleNotFoundError("No module named 'fla'")
    monkeypatch.setattr(fla_prefill.metadata, "version", missing)
    monkeypatch.setattr(fla_prefill, "fla_steps", no_fla)
    with pytest.raises(RuntimeError, match=r"pip install 'mamba_edu\[fla\]'.*No module named 'fla'"):
        fla_prefill.check_prefill_kernel("fla", "sync_free", "cuda")
    monkeypatch.setattr(fla_prefill.metadata, "version", lambda name: "0.5.0")
    with pytest.raises(RuntimeError, match="fla-core==0.6.0.*fla-core 0.5.0 is installed"):
        fla_prefill.check_prefill_kernel("fla", "sync_free", "cuda")


def test_the_backend_checks_it_too_and_a_refusal_changes_nothing(tiny):
    engine = Engine(tiny, strategy="sync_free", max_requests=2)
    assert engine.prefill_kernel == engine.backend.prefill_kernel == "triton"
    engine.prefill([Request("a", BASE[:130])])
    before = engine.pool.ssm.clone(), engine.pool.conv.clone(), engine.cache.snapshot_slots()
    layers = [layer.mixer for layer in tiny.layers if layer.kind == "gdn"]
    for kernel, error in (("fla", RuntimeError), ("cuda", ValueError)):
        with pytest.raises(error, match="prefill_kernel"):
            LinearAttentionBackend(engine.pool, "sync_free", layers, prefill_kernel=kernel)
    assert torch.equal(engine.pool.ssm, before[0]) and torch.equal(engine.pool.conv, before[1])
    assert engine.cache.snapshot_slots() == before[2]
    assert engine.prefill([Request("b", BASE[:140])]).prefix_lens == [128]  # still works


@pytest.mark.parametrize("mode", ["gdn_inside", "graph"])
def test_fla_captures_breakable_only(tiny, mode):
    engine = Engine(tiny, strategy="sync_free", max_requests=2)
    with pytest.raises(ValueError, match=f"mode '{mode}'.*prefill_kernel='fla'.*'breakable'"):
        check_capture(Bucket(64, 2), mode, False, engine.backend.strategy, tiny, "fla")
    check_capture(Bucket(64, 2), "breakable", False, engine.backend.strategy, tiny, "fla")


def test_fla_prefill_refuses_in_kernel_tracking():
    with pytest.raises(ValueError, match="no in-kernel tracking"):
        fla_prefill.gdn_prefill(None, None, None, a=None, b=None, A_log=None, dt_bias=None, state_pool=None,
                                state_indices=None, meta=None, track_slots=[1], track_chunks=[0])


# ---- GPU with fla: the same engine either way -----------------------------------------------------
needs_fla = pytest.mark.skipif(importlib.util.find_spec("fla") is None,
                               reason="needs fla-core 0.6.0: pip install 'mamba_edu[fla]'")
# bf16 on both sides. The two kernels round differently inside (fla's W, U, h and q̂, k̂ are bf16);
# three GDN layers and an attention layer carry that into the logits. Tracked states copied from a
# checkpoint are bf16 with fla (its h), fp32 with ours: 2^-9 relative at most from that alone.
LOGITS_TOL, STATE_TOL = 2e-2, 2e-2


def _gpu_model():
    """bf16, as served; head dims 128 as Qwen3-Next's (fla's kernels are tuned for them)."""
    return build_model("tiny", device="cuda", dtype=torch.bfloat16, gdn_key_dim=128, gdn_value_dim=128)


def _rounds(gen, n_rounds):
    """Batches of 1-3 requests, each a prefix of BASE (0, 64, 128 or 256 tokens: cached by the
    warm-up, so prefix hits) and a random extension of 1-200 tokens (tracked or not)."""
    rounds = []
    for i in range(n_rounds):
        n = int(torch.randint(1, 4, (1,), generator=gen))
        batch = []
        for j in range(n):
            prefix = [0, 64, 128, 256][int(torch.randint(0, 4, (1,), generator=gen))]
            extend = int(torch.randint(1, 201, (1,), generator=gen))
            tokens = BASE[:prefix] + torch.randint(0, VOCAB, (extend,), generator=gen).tolist()
            batch.append(Request(f"{i}-{j}", tokens))
        rounds.append(batch)
    return rounds


def _tracked_states(engine):
    slots = sorted(engine.cache.snapshot_slots())
    return slots, engine.pool.ssm[:, slots], engine.pool.conv[:, slots]


@pytest.mark.gpu
@needs_fla
@pytest.mark.parametrize("strategy", COPYING)
def test_fla_engine_equals_triton_engine(strategy):
    model = _gpu_model()
    engines = {kernel: Engine(model, strategy=strategy, max_requests=3, prefill_kernel=kernel)
               for kernel in fla_prefill.PREFILL_KERNELS}
    warm = [Request("w64", BASE[:65]), Request("w128", BASE[:129]), Request("w256", BASE[:257])]
    for engine in engines.values():
        engine.prefill(warm)
        engine.release([r.rid for r in warm])
    gen = torch.Generator().manual_seed(0)
    for requests in _rounds(gen, 8):
        ours, fla = (engines[k].prefill(requests) for k in ("triton", "fla"))
        assert (fla.prefix_lens, fla.track_lens) == (ours.prefix_lens, ours.track_lens)
        assert rel_err(fla.logits.float(), ours.logits.float()) <= LOGITS_TOL, requests
        (slots_o, ssm_o, conv_o), (slots_f, ssm_f, conv_f) = map(_tracked_states, engines.values())
        assert slots_f == slots_o
        assert rel_err(ssm_f, ssm_o) <= STATE_TOL and rel_err(conv_f.float(), conv_o.float()) <= STATE_TOL
        rids = [r.rid for r in requests]
        for engine in engines.values():
            engine.release(rids)
    assert engines["fla"].stats.prefix_hits == engines["triton"].stats.prefix_hits > 0
    real = [s for s in range(engines["fla"].pool.ssm.shape[1]) if s != SCRATCH_SLOT]
    assert rel_err(engines["fla"].pool.ssm[:, real], engines["triton"].pool.ssm[:, real]) <= STATE_TOL


@pytest.mark.gpu
@needs_fla
def test_fla_breakable_replays_equal_eager_forwards():
    """A bucket's padding rows (slot −1, rows of no tokens) through fla: with ``breakable`` the
    GDN layers run eagerly between the graph pieces, on the live batch padded to the bucket."""
    model = _gpu_model()
    eager, padded = (Engine(model, strategy="sync_free", max_requests=3, prefill_kernel="fla") for _ in range(2))
    bucket = Bucket(3 * 456, 3)  # any batch of _rounds fits: 3 requests of at most 256 + 200 tokens
    with pytest.raises(ValueError, match="prefill_kernel='fla'"):
        padded.capture_prefill(bucket, "gdn_inside")
    captured = padded.capture_prefill(bucket, "breakable")
    warm = [Request("w128", BASE[:129]), Request("w256", BASE[:257])]
    for engine in (eager, padded):
        engine.prefill(warm)
        engine.release([r.rid for r in warm])
    gen = torch.Generator().manual_seed(1)
    for requests in _rounds(gen, 6):
        want = eager.prefill(requests)
        batch = padded.prepare_prefill(requests)
        got = captured.replay(batch)
        padded.finish_prefill(batch)
        assert batch.forward_batch.prefix_lens == want.prefix_lens
        assert rel_err(got.float(), want.logits.float()) <= LOGITS_TOL
        assert padded.cache.snapshot_slots() == eager.cache.snapshot_slots()
        rids = [r.rid for r in requests]
        eager.release(rids)
        padded.release(rids)


@pytest.mark.gpu
@needs_fla
def test_fla_sync_free_forward_has_no_sync():
    """fla's one host sync on SGLang's path is ``prepare_chunk_indices``'s ``.tolist()``; handed
    our host-built chunk table, a sync_free forward has none."""
    model = _gpu_model()
    batches = []
    for _ in range(2):  # the first forward compiles and autotunes (a twin batch)
        engine = Engine(model, strategy="sync_free", max_requests=4, prefill_kernel="fla")
        engine.prefill([Request("seed", BASE[:130])])
        batches.append((engine, engine.prepare_prefill([Request("a", BASE[:200]), Request("b", BASE[300:340]),
                                                        Request("c", BASE[:128] + BASE[150:214])])))
    batches[0][0].forward_prefill(batches[0][1])
    engine, batch = batches[1]
    torch.cuda.synchronize()
    with cuda_sync_guard() as result:
        engine.forward_prefill(batch)
    assert result.passed
