"""Per-rank traces of a tensor-parallel prefill (mamba_edu.tp.trace, notebook 11): 2 gloo ranks,
tiny preset. Every run goes through :func:`mamba_edu.tp.launch.launch` with a timeout, so no test
can hang."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from mamba_edu.profiling.bubbles import forward_range, load_trace, trace_events
from mamba_edu.tp.trace import COLLECTIVE_RANGES, record_tp_traces, trace_name


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp_traces")
    return out, record_tp_traces(2, out, timeout=120.0)


def _forward_collectives(path) -> Counter:
    """Collective events (any thread) inside the kept prefill_forward window, by name."""
    events = trace_events(load_trace(path))
    fwd = forward_range(events, "prefill_forward")
    return Counter(e.name for e in events if fwd.start <= e.start < fwd.end
                   and any(k in e.name for k in ("all_reduce", "allreduce", "all_gather", "allgather")))


@pytest.mark.extra  # several processes
def test_every_rank_writes_its_trace(traces):
    out, ranks = traces
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world"] == 2 for r in ranks)
    for r in ranks:
        path = Path(r["trace"])
        assert path == out / f"{trace_name(r['rank'], 2)}.json.gz" and path.stat().st_size > 0
        info = load_trace(path)["distributedInfo"]
        assert (info["backend"], info["rank"], info["world_size"]) == ("gloo", r["rank"], 2)


@pytest.mark.extra  # several processes
def test_both_traces_hold_the_collectives_of_one_forward(traces):
    """tiny: 4 layers × 2 all-reduces + the embedding's = 9 all-reduces, 1 all-gather (logits),
    each seen as our range, the c10d operator and gloo's own range, on both ranks alike."""
    _, ranks = traces
    seen = [_forward_collectives(r["trace"]) for r in ranks]
    assert seen[0] == seen[1]
    assert seen[0][COLLECTIVE_RANGES[0]] == 9 and seen[0][COLLECTIVE_RANGES[1]] == 1
    assert seen[0]["c10d::allreduce_"] == 9 and seen[0]["gloo:all_reduce"] == 9
    assert seen[0]["c10d::allgather_"] == 1 and seen[0]["gloo:all_gather"] == 1


@pytest.mark.extra  # several processes
def test_ranks_leave_each_all_reduce_after_the_last_one_entered(traces):
    """One clock for both traces: no rank can have the sum before every rank has called. (50 µs
    of slack: each process converts its profiler clock to trace time on its own.)"""
    _, ranks = traces
    spans = []
    for r in ranks:
        events = trace_events(load_trace(r["trace"]))
        fwd = forward_range(events, "prefill_forward")
        spans.append([(e.start, e.end) for e in events
                      if e.name in COLLECTIVE_RANGES and fwd.start <= e.start < fwd.end])
    assert len(spans[0]) == len(spans[1]) == 10
    for (s0, e0), (s1, e1) in zip(*spans):
        assert min(e0, e1) >= max(s0, s1) - 50.0


def test_one_rank_records_the_reference_without_collectives(tmp_path):
    (one,) = record_tp_traces(1, tmp_path, timeout=120.0)
    assert Path(one["trace"]).name == "tp1_rank0.json.gz"
    assert not _forward_collectives(one["trace"])
