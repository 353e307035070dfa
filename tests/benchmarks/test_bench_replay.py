"""The replay-overhead benchmark's arithmetic (CPU) and its run on a GPU."""

import json

import pytest
import torch

from mamba_edu.benchmarks import replay
from mamba_edu.benchmarks.replay import main, overheads


def test_the_two_ratios_from_one_busy_time():
    # Kernels busy 0-40 and 50-90 µs: busy 80 µs, span 90 µs; 0.1 ms per replay by events.
    out = overheads(0.1, [(0.0, 40.0), (50.0, 90.0)])
    assert out["busy_ms"] == pytest.approx(0.08) and out["span_ms"] == pytest.approx(0.09)
    assert out["events_overhead"] == pytest.approx(0.25)
    assert out["span_overhead"] == pytest.approx(0.125)


def test_a_replay_without_kernels_is_an_error_not_a_zero():
    with pytest.raises(ValueError, match="no kernel"):
        overheads(0.1, [])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_refuses_without_a_gpu(capsys):
    with pytest.raises(SystemExit):
        main([])
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_replay_overheads_on_a_gpu(tmp_path):
    assert main(["--out", str(tmp_path / "r.json"), "--rounds", "1", "--replays", "5"]) == 0
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert [(r["case"], r["mode"]) for r in rows] == [
        (f"{replay.PRESET} {len(n)}x{n[0]}", mode) for n in replay.CASES for mode in replay.MODES]
    assert all(r["busy_ms"] > 0 and r["span_ms"] >= r["busy_ms"] for r in rows)
