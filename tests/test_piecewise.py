"""Piecewise capture (SGLang today): the forward cut at each GDN layer's core.

On a CPU the cut is checked without graphs: how many pieces and breaks, which ops fall where
(none lost, none run twice), no sync inside a piece for any strategy, and outputs and pools equal
to the plain forward's. The GPU tests replay the captured pieces.
"""

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mamba_edu.engine import Engine, Request
from mamba_edu.model import build_model
from mamba_edu.profiling import count_syncs
from mamba_edu.serving import STRATEGIES
from mamba_edu.serving.piecewise import Pieces, run_in_pieces

SEQ = torch.randint(0, 128, (400,), generator=torch.Generator().manual_seed(5)).tolist()
REQUESTS = [("a", SEQ[:200]), ("b", SEQ[300:340]), ("c", SEQ[:128] + SEQ[150:214])]


class _OpLog(TorchDispatchMode):
    """Every aten op of the block, in order."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


class _RecordedPieces(Pieces):
    """Pieces that remember, for each piece and break, the ops and syncs seen in it."""

    def __init__(self, log: _OpLog, syncs):
        super().__init__()
        self.log, self.syncs, self.spans = log, syncs, []  # spans: (kind, ops, syncs)
        self._mark = (0, 0)

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


def _engine_and_batch(model, strategy):
    engine = Engine(model, strategy=strategy, max_requests=4)
    engine.prefill([Request("seed", SEQ[:130])])  # a prefix hit for "c"
    return engine, engine.prepare_prefill([Request(rid, t) for rid, t in REQUESTS])


def _run(model, strategy, piecewise: bool):
    engine, batch = _engine_and_batch(model, strategy)
    fb = engine.backend
    log = _OpLog()
    with count_syncs() as syncs, log:
        fb.init_forward_metadata(batch.forward_batch)
        start = (len(log.ops), syncs.count)
        pieces = _RecordedPieces(log, syncs) if piecewise else None
        out = (run_in_pieces(engine.model, batch.forward_batch, fb, pieces) if piecewise
               else engine.model(batch.forward_batch, fb))
    forward_ops, forward_syncs = log.ops[start[0]:], syncs.count - start[1]
    return engine, batch, out, pieces, forward_ops, forward_syncs


@pytest.fixture(scope="module")
def hybrid():
    return build_model("tiny", device="cpu")


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_the_cut_and_its_outputs(hybrid, strategy):
    torch.set_num_threads(1)  # BLAS rounding must not depend on the thread split
    eager_engine, _, eager, _, eager_ops, eager_syncs = _run(hybrid, strategy, piecewise=False)
    engine, batch, out, pieces, ops, syncs = _run(hybrid, strategy, piecewise=True)
    n_gdn = sum(layer.kind == "gdn" for layer in hybrid.layers)
    assert n_gdn >= 2 and pieces.n_pieces == n_gdn + 1 and len(pieces.breaks) == n_gdn
    kinds = [kind for kind, _, _ in pieces.spans]
    assert kinds == ["piece", "break"] * n_gdn + ["piece"]
    # Nothing lost, nothing run twice: the spans are the plain forward's ops, in order.
    assert [op for _, span_ops, _ in pieces.spans for op in span_ops] == ops
    assert Counter(ops) == Counter(eager_ops) and syncs == eager_syncs
    # Capturable pieces: no sync in any piece, whatever the strategy; its syncs are in breaks.
    assert all(n == 0 for kind, _, n in pieces.spans if kind == "piece")
    # The projections are captured: every piece between two breaks has the out-projection of
    # the GDN layer before it and the in-projection of the next one (two matmuls at least).
    for kind, span_ops, _ in pieces.spans[2:-1:2]:
        assert sum(op in ("aten.mm", "aten.addmm", "aten.linear") for op in span_ops) >= 2, span_ops
    torch.testing.assert_close(out.logits, eager.logits, rtol=0, atol=0)
    assert torch.equal(engine.pool.conv, eager_engine.pool.conv)
    assert torch.equal(engine.pool.ssm, eager_engine.pool.ssm)
    engine.abort_prefill(batch)


def test_a_failing_break_closes_its_piece(hybrid):
    engine, batch = _engine_and_batch(hybrid, "sync_free")
    engine.backend.init_forward_metadata(batch.forward_batch)
    opened = []

    class Counted(Pieces):
        def _begin(self):
            opened.append(1)

        def _end(self):
            opened.pop()

    real = engine.backend.forward
    engine.backend.forward = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
    try:
        with pytest.raises(RuntimeError, match="boom"):
            run_in_pieces(engine.model, batch.forward_batch, engine.backend, Counted())
    finally:
        engine.backend.forward = real
    assert opened == []
    engine.abort_prefill(batch)


def test_capture_modes_are_checked(hybrid):
    engine = Engine(hybrid, strategy="precomputed", max_requests=2)
    batch = engine.prepare_prefill([Request("a", SEQ[:10])])
    with pytest.raises(ValueError, match="mode must be 'graph' or 'piecewise'"):
        engine.capture_prefill(batch, mode="pieces")
    with pytest.raises(ValueError, match="strategy must be 'sync_free' or 'fused'"):
        engine.capture_prefill(batch)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            engine.capture_prefill(batch, mode="piecewise")
    engine.abort_prefill(batch)


# ---- GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("strategy,mode", [(s, "piecewise") for s in STRATEGIES]
                         + [("sync_free", "graph"), ("fused", "graph")])
def test_replay_matches_eager(strategy, mode):
    """Both capture modes: each replay from the restored states gives eager's logits and pools."""
    model = build_model("tiny", device="cuda")
    engine, batch = _engine_and_batch(model, strategy)
    captured = engine.capture_prefill(batch, mode=mode)
    if mode == "piecewise":
        n_gdn = sum(layer.kind == "gdn" for layer in model.layers)
        assert captured.graph.n_pieces == n_gdn + 1 and len(captured.graph.graphs) == n_gdn + 1
    eager = engine.forward_prefill(batch).clone()
    pools = engine.pool.conv[:, 1:].clone(), engine.pool.ssm[:, 1:].clone()
    for _ in range(2):  # a second replay starts from the restored states again
        captured.restore_states()
        replayed = captured.replay().clone()
        torch.cuda.synchronize()
        torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(engine.pool.conv[:, 1:], pools[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(engine.pool.ssm[:, 1:], pools[1], rtol=1e-5, atol=1e-5)
    engine.finish_prefill(batch, captured.logits)


@pytest.mark.gpu
@pytest.mark.parametrize("mode,fail_at", [("graph", 1), ("graph", 3), ("piecewise", 2)])
def test_a_failed_capture_leaves_the_pool_as_before(mode, fail_at):
    """An exception in the warm-up (call 1-2) or the capture (call 3) of the model: the batch's
    slots hold their pre-capture states, the batch is not marked captured and still runs eagerly."""
    model = build_model("tiny", device="cuda")
    engine, batch = _engine_and_batch(model, "fused")
    before = engine.pool.conv.clone(), engine.pool.ssm.clone()
    real, calls = engine._run_model, []

    def failing(fb):
        calls.append(fb)
        if len(calls) == fail_at:
            raise RuntimeError("injected")
        return real(fb)

    engine._run_model = failing
    try:
        with pytest.raises(RuntimeError, match="injected"):
            engine.capture_prefill(batch, mode=mode)
    finally:
        engine._run_model = real
    assert torch.equal(engine.pool.conv, before[0]) and torch.equal(engine.pool.ssm, before[1])
    assert batch.captured is None
    engine.finish_prefill(batch, engine.forward_prefill(batch))
