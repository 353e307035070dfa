"""`python -m mamba_edu demo` end to end on the default device (CPU in CI)."""

from mamba_edu.__main__ import main


def test_demo_runs_and_passes(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--repeats", "1"]) == 0
    report = capsys.readouterr().out
    assert "PASS: same states from every strategy" in report
    for strategy in ("naive", "precomputed", "sync_free", "fused"):
        assert strategy in report


def test_cli_rejects_unknown_command(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["no-such-command"])
