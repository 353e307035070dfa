"""`python -m mamba_edu demo` end to end on the default device (CPU in CI), and its messages."""

import re

import pytest
import torch

from mamba_edu import demo
from mamba_edu.__main__ import main
from mamba_edu.engine import Engine, Request
from mamba_edu.model import build_model
from mamba_edu.profiling import count_syncs
from mamba_edu.serving import STRATEGIES

ON_GPU = torch.cuda.is_available()
# One row of the strategy table: name, tracked, syncs/forward, forward ms, pools vs naive's (error).
ROW = re.compile(r"^ +(\w+) +(\d+) +(\d+) +([\d.]+)  (same|DIFFERENT) \(([-+.\de]+)\)$", re.M)


def sniffed_syncs(device, preset: str, lengths) -> dict[str, int]:
    """Syncs of one prefill of ``lengths`` per strategy, counted here on engines of our own
    (after a warm-up forward), not read from the demo."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(preset, device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    counts = {}
    for strategy in STRATEGIES:
        engine = Engine(model, strategy=strategy, max_requests=len(lengths))
        for attempt in range(2):
            batch = engine.prepare_prefill(
                [Request((attempt, i), torch.randint(model.config.vocab, (n,), generator=gen).tolist())
                 for i, n in enumerate(lengths)])
            with count_syncs() as syncs:
                logits = engine.forward_prefill(batch)
            engine.finish_prefill(batch, logits)
            engine.release(batch.rids)
        counts[strategy] = syncs.count
    return counts


def test_demo_runs_and_passes(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--repeats", "1"]) == 0
    report = capsys.readouterr().out
    assert "PASS: same states from every strategy" in report
    rows = {m[0]: m[1:] for m in ROW.findall(report)}
    assert list(rows) == list(STRATEGIES), report
    device = torch.device("cuda" if ON_GPU else "cpu")
    preset, lengths = demo.DEFAULT_JOB[device.type]
    sniffed = sniffed_syncs(device, preset, lengths)
    for strategy, (tracked, syncs, _ms, pools, err) in rows.items():
        assert int(syncs) == sniffed[strategy], (strategy, syncs, sniffed)
        assert int(tracked) == sum(n >= 64 for n in lengths)
        assert pools == "same"
        if not ON_GPU or strategy != "fused":  # bit-identical pools (fused on a GPU: bf16 states)
            assert float(err) == 0.0
    assert sniffed["naive"] > sniffed["precomputed"] > 0 == sniffed["sync_free"] == sniffed["fused"]
    assert "\r" not in report and "fwd/s" not in report  # no progress bar: not a TTY
    if not ON_GPU:
        assert "CPU timings: nothing waits for a GPU" in report
        assert "vary from run to run" in report
    if demo.committed_traces(demo.H200_RUNS) is not None or ON_GPU:
        assert (tmp_path / "timeline.png").stat().st_size > 10_000


def test_cli_rejects_unknown_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["no-such-command"])
    assert exit_.value.code == 2


def fake_reports(monkeypatch, different: str | None = None):
    """Replace the model work by fixed rows, so the report's wording is tested in a second;
    ``different`` names a strategy whose pools do not match naive's."""
    monkeypatch.setattr(demo, "reference_report", lambda device: {"lengths": [1], "err": 0.0})
    rows = [{"strategy": s, "syncs": n, "ms": 1.0, "tracked": 2, "err": 0.0 if s != different else 0.5,
             "pools_match_naive": s != different}
            for s, n in zip(demo.STRATEGIES, (18, 2, 0, 0))]
    monkeypatch.setattr(demo, "strategy_report", lambda *a, **k: rows)


@pytest.mark.parametrize("different", ["precomputed", "fused"])
def test_demo_fails_when_pools_differ(tmp_path, capsys, monkeypatch, different):
    """Exit 1 and a FAIL line when one strategy leaves other states than naive's."""
    fake_reports(monkeypatch, different)
    missing = tmp_path / "no-data"
    assert main(["demo", "--out", str(tmp_path / "out"), "--traces", str(missing)]) == 1
    report = capsys.readouterr().out
    assert dict((m[0], m[4]) for m in ROW.findall(report))[different] == "DIFFERENT"
    assert "FAIL: see the table above" in report and "PASS" not in report.replace("-> PASS", "")


@pytest.mark.skipif(ON_GPU, reason="on a GPU the timeline is recorded live")
def test_demo_without_data_says_where_the_traces_are(tmp_path, capsys, monkeypatch):
    """Installed from a wheel there is no data/: the demo still passes and says why no figure."""
    fake_reports(monkeypatch)
    missing = tmp_path / "no-data" / "runs"
    assert main(["demo", "--out", str(tmp_path / "out"), "--traces", str(missing)]) == 0
    report = capsys.readouterr().out
    assert f"skipped, no H200 traces in {missing}" in report
    assert "not in an installed wheel" in report and "--traces DIR" in report
    assert not (tmp_path / "out" / "timeline.png").exists()


@pytest.mark.skipif(ON_GPU, reason="on a GPU the timeline is recorded live")
def test_demo_traces_accepts_a_runs_folder_or_a_case_folder(tmp_path, capsys, monkeypatch):
    if demo.committed_traces(demo.H200_RUNS) is None:
        pytest.skip("data/ is not in this checkout")
    fake_reports(monkeypatch)
    case = demo.H200_RUNS / demo.H200_CASE
    for traces in (demo.H200_RUNS, case):
        out = tmp_path / traces.name
        assert main(["demo", "--out", str(out), "--traces", str(traces)]) == 0
        assert f"3. Timeline figure: {out / 'timeline.png'}" in capsys.readouterr().out
        assert (out / "timeline.png").stat().st_size > 10_000


@pytest.mark.skipif(ON_GPU, reason="on a GPU the timeline is recorded live")
def test_demo_says_the_figure_is_drawn_from_the_committed_h200_traces(tmp_path, capsys, monkeypatch):
    if demo.committed_traces(demo.H200_RUNS) is None:
        pytest.skip("data/ is not in this checkout")
    fake_reports(monkeypatch)
    assert main(["demo", "--out", str(tmp_path)]) == 0
    report = capsys.readouterr().out
    assert "drawn from the committed H200 traces in" in report and "not from this run" in report


@pytest.mark.skipif(ON_GPU, reason="on a GPU the timeline is recorded live")
def test_demo_without_committed_traces_draws_its_own_run_and_says_so(tmp_path, capsys):
    """As from a wheel (no data/): the figure comes from this run's CPU traces, labelled so."""
    missing = tmp_path / "no-data" / "runs"
    out = tmp_path / "out"
    assert main(["demo", "--out", str(out), "--traces", str(missing), "--repeats", "1"]) == 0
    report = capsys.readouterr().out
    assert f"3. Timeline figure: {out / 'timeline.png'}" in report
    assert "drawn from this run's own CPU traces" in report and "no GPU timeline" in report
    assert (out / "timeline.png").stat().st_size > 10_000
    assert sorted(p.name for p in (out / "traces").iterdir()) == sorted(
        f"{s}.json.gz" for s in STRATEGIES)
