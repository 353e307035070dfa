"""`python -m mamba_edu demo` end to end on the default device (CPU in CI), and its messages."""

import pytest
import torch

from mamba_edu import demo
from mamba_edu.__main__ import main

ON_GPU = torch.cuda.is_available()


def test_demo_runs_and_passes(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--repeats", "1"]) == 0
    report = capsys.readouterr().out
    assert "PASS: same states from every strategy" in report
    for strategy in ("naive", "precomputed", "sync_free", "fused"):
        assert strategy in report
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


def fake_reports(monkeypatch):
    """Replace the model work by fixed rows, so the report's wording is tested in a second."""
    monkeypatch.setattr(demo, "reference_report", lambda device: {"lengths": [1], "err": 0.0})
    rows = [{"strategy": s, "syncs": n, "ms": 1.0, "tracked": 2, "err": 0.0,
             "pools_match_naive": True}
            for s, n in zip(demo.STRATEGIES, (18, 2, 0, 0))]
    monkeypatch.setattr(demo, "strategy_report", lambda *a, **k: rows)


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
