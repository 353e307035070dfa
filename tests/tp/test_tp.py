"""Tensor parallelism over torch.distributed (issue 32), on the CPU: 2 ranks over gloo, tiny preset.

Every run goes through :func:`mamba_edu.tp.launch.launch`, whose ``timeout`` bounds the whole
run (a watchdog terminates ranks still running then) and whose ``collective_timeout`` bounds each
collective: no test can hang. Tolerance: fp32, and a row-parallel projection sums the ranks'
partial products where the 1-rank model does one GEMM, so the sums run in another order and
agree to rounding (about 3e-7 measured), not bit for bit: ``TOL = 1e-5`` relative (norm-wise).
Decisions (prefix lengths, track positions, cache entries, slots) and decoded tokens must be equal.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from mamba_edu.model import build_model, get_config
from mamba_edu.serving import STRATEGIES
from mamba_edu.tp import TPShapes, build_tp_model, check_tp, shard_model, tp_config
from mamba_edu.tp.check import run_check
from mamba_edu.tp.launch import RankFailure
from _helpers import run_main

TOL = 1e-5
RUN = dict(timeout=120.0, collective_timeout=30.0)  # every launch: the whole run, each collective


@pytest.fixture(scope="module")
def tp2():
    """The check on 2 gloo ranks, every strategy: ``tp2[rank][i]`` is rank's row of strategy i."""
    return run_check(2, **RUN)


def rows_of(ranks):
    return [row for rank_rows in ranks for row in rank_rows]


@pytest.mark.extra  # several processes
def test_tp2_matches_one_rank_for_every_strategy(tp2):
    assert [r["strategy"] for r in tp2[0]] == list(STRATEGIES)
    for row in rows_of(tp2):
        name = f"rank {row['rank']} {row['strategy']}"
        for what, err in row["errs"].items():  # logits of both prefills and of decode; pools
            assert err <= TOL, f"{name}: {what} relative error {err:.1e} > {TOL}"
        assert row["snapshots"] >= 4 and row["snapshot_err"] <= TOL, name


@pytest.mark.extra  # several processes
def test_tp2_prefix_hits_and_decisions_are_the_same_on_every_rank(tp2):
    """Prefix hits on the first prefill's tracked snapshots (128 and 192 tokens), the same
    decisions as the 1-rank engine, and the same on both ranks (all_gather_object in the job)."""
    for row in rows_of(tp2):
        d = row["decisions"]
        assert d["prefix_lens"] == [[0, 0, 0], [128, 192, 0]]
        assert d["track_lens"][0] == [128, 192, -1] and d["prefix_hits"] == 2
        assert row["same_as_1_rank"] and row["same_on_every_rank"], row["strategy"]
    for rows in zip(*tp2):  # and from the outside: both ranks' decisions compared here too
        assert rows[0]["decisions"] == rows[1]["decisions"]


@pytest.mark.extra  # several processes
def test_tp2_decode_after_prefill(tp2):
    """4 greedy decode steps after the prefills: the same tokens as the 1-rank engine (in
    ``same_as_1_rank``), and decode tracking stored the 62-token prompt's state at 64 tokens."""
    for row in rows_of(tp2):
        d = row["decisions"]
        assert len(d["tokens"]) == 6 and all(len(t) == 4 for t in d["tokens"].values())
        assert 64 in [length for length, _ in d["cache"]], row["strategy"]


@pytest.mark.extra  # several processes
def test_tp2_syncs_per_rank_match_one_rank(tp2):
    """The collectives add no host sync: each rank counts what the 1-rank model counts."""
    for row in rows_of(tp2):
        assert row["syncs"] == row["syncs_1_rank"], row["strategy"]
    by = {row["strategy"]: row["syncs"] for row in tp2[0]}
    assert by["sync_free"] == by["fused"] == [0, 0] and by["naive"][0] > by["precomputed"][0] > 0


def test_replicated_key_heads():
    """One GDN key head and one attention KV head for 2 ranks: each rank keeps a copy (SGLang's
    replication), and the result still matches the 1-rank model."""
    cfg = get_config("tiny", gdn_key_heads=1, attn_kv_heads=1)
    assert tp_config(cfg, 2).gdn_key_heads == 1 and tp_config(cfg, 2).gdn_value_heads == 2
    for row in rows_of(run_check(2, preset=cfg, strategies=["naive", "fused"], **RUN)):
        assert max(*row["errs"].values(), row["snapshot_err"]) <= TOL, row["strategy"]
        assert row["same_as_1_rank"] and row["same_on_every_rank"]


def test_slices_build_alike_and_one_rank_is_the_model():
    """build_tp_model (drawn layer by layer) equals shard_model of the full model on every rank;
    a 1-rank slice holds exactly the full model's weights."""
    full = build_model("tiny", device="cpu")
    for rank in range(2):
        a, b = shard_model(full, rank, 2).state_dict(), build_tp_model("tiny", rank, 2, device="cpu").state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    one, ref = shard_model(full, 0, 1).state_dict(), full.state_dict()
    assert one.keys() == ref.keys() and all(torch.equal(one[k], ref[k]) for k in ref)
    s = TPShapes.of(full.config, 1, 2)
    assert s.value_heads == (2, 2) and s.key_heads == (1, 1) and s.vocab == (64, 64)


@pytest.mark.extra  # several processes
def test_rank_failing_mid_forward_is_reported_and_nothing_hangs():
    """Rank 1 raises inside layer 1 of its first forward; rank 0, waiting in the all-reduce,
    fails at once (the peer's sockets closed) and says so; every process ends."""
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_check(2, strategies=["sync_free"], fail=(1, 1), **RUN)
    message, reports = str(info.value), info.value.reports
    assert "rank 1: RuntimeError: injected failure on rank 1 in layer 1" in message
    assert not reports[0].ok and "a collective failed" in reports[0].error
    assert "closed by peer" in reports[0].error.lower(), reports[0].error
    assert time.monotonic() - start < 60


@pytest.mark.extra  # several processes
def test_rank_hanging_mid_forward_times_out_and_is_stopped():
    """Rank 1 hangs inside layer 1: rank 0's all-reduce times out (the collective timeout) and
    reports; the watchdog then stops rank 1 and says why."""
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_check(2, strategies=["sync_free"], fail=(1, 1, "hang"), timeout=60.0,
                  collective_timeout=3.0, grace=1.0)
    reports = info.value.reports
    assert not reports[0].ok and "timed out" in reports[0].error.lower(), reports[0].error
    assert "stopped by the launcher's watchdog" in reports[1].error
    assert time.monotonic() - start < 45


@pytest.mark.parametrize("value, says", [
    ("3", "does not fit preset 'tiny'"), ("8", "GDN value heads (4) do not split into 8"),
    ("0", "must be at least 1"), ("-2", "must be at least 1"), ("x", "expected a whole number"),
    ("1.5", "expected a whole number")])
def test_bad_tp_is_a_usage_error(capsys, value, says):
    code, out, err = run_main(capsys, "demo", "--tp", value, "--device", "cpu")
    assert code == 2 and "--tp" in err and says in err, err
    assert out == ""


def test_tp_larger_than_the_gpus_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    code, _, err = run_main(capsys, "demo", "--tp", "2", "--device", "cuda")
    assert code == 2 and "one GPU per rank" in err and "torch sees 1 GPU" in err, err


def test_check_tp_reasons():
    tiny = get_config("tiny")
    assert check_tp(tiny, 1) == check_tp(tiny, 2) == check_tp(tiny, 4) == []
    assert check_tp(tiny, 0) and check_tp(tiny, True) and check_tp(tiny, 2.0)
    assert any("MLP" in r for r in check_tp(tiny.replace(mlp_width=130), 4))
    assert check_tp(tiny.replace(attn_heads=6, attn_kv_heads=2), 4) == ["attention heads (6) do not split into 4"]
    assert check_tp(tiny.replace(attn_heads=6, attn_kv_heads=3), 2) == [
        "attention KV heads (3) neither split into 2 nor divide it (to be replicated)"]
    assert check_tp(tiny.replace(gdn_key_heads=3, gdn_value_heads=6), 2) == [
        "GDN key heads (3) neither split into 2 nor divide it (to be replicated)"]
    assert check_tp(tiny.replace(attn_every=0, attn_heads=6, attn_kv_heads=3), 4) == []  # no attention layer


@pytest.mark.extra  # several processes
def test_demo_tp2_prints_pass():
    """What a user runs: ``python -m mamba_edu demo --tp 2 --device cpu`` spawns its ranks."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "mamba_edu", "demo", "--tp", "2", "--device", "cpu"],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS: the 2-rank forward matches the 1-rank model" in proc.stdout
    for strategy in STRATEGIES:
        assert f"   {strategy} " in proc.stdout
