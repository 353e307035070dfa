"""The same-run reference benchmark: its shapes, its verdicts and, on a GPU, one real case."""

import sys
import types

import pytest
import torch

from mamba_edu.benchmarks.references import ARMS, CASES, _rel_err_any_layout, case_name, main, summarize
from mamba_edu.gdn import chunk_gated_delta_rule
from mamba_edu.kernels.inputs import random_prefill_inputs
from mamba_edu.testing import rel_err

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_the_twelve_shapes_of_the_comparison():
    assert [case_name(*c) for c in CASES] == [
        "qwen3-next 1x512", "qwen3-next 16x256", "qwen3-next 8x256", "qwen3-next 8x1024",
        "qwen3-next 1x2048", "qwen3-next 1x8192", "qwen3-next 1x32768", "qwen3-next 8x4096",
        "qwen3.5-tp8 1x512", "qwen3.5-tp8 16x256", "qwen3.5-tp8 8x1024", "qwen3.5-tp8 1x8192"]
    assert list(ARMS) == ["ours", "fla_triton", "fla_dispatch", "flashqla", "flashinfer"]


def test_ratio_against_the_fastest_reference_with_median_and_spread():
    arms = {"ours": {"rounds_ms": [1.0, 1.2, 1.1]}, "fla_triton": {"rounds_ms": [2.0, 2.0, 2.2]},
            "flashqla": {"rounds_ms": [0.9, 1.0, 0.8]}}
    out = summarize(arms)
    assert out["fastest_reference"] == "flashqla"
    assert out["ratio_best"] == pytest.approx(1.1 / 0.9)
    assert arms["ours"]["median_ms"] == pytest.approx(1.1)
    assert arms["ours"]["spread"] == pytest.approx(0.2 / 1.1)


def test_an_arm_with_an_error_never_counts_as_the_fastest():
    # A reference that disagreed with the fp32 reference (or failed) may still hold times.
    arms = {"ours": {"rounds_ms": [1.0]}, "flashinfer": {"rounds_ms": [0.1], "error": "disagrees"},
            "fla_triton": {"rounds_ms": [2.0]}}
    assert summarize(arms) == dict(fastest_reference="fla_triton", ratio_best=0.5)
    assert "median_ms" not in arms["flashinfer"]


@pytest.mark.parametrize("arms", [
    {"fla_triton": {"rounds_ms": [2.0]}},                                   # ours not timed
    {"ours": {"rounds_ms": [1.0]}},                                         # no reference
    {"ours": {"rounds_ms": [1.0], "error": "x"}, "fla_triton": {"rounds_ms": [2.0]}},
    {"ours": {"rounds_ms": [1.0]}, "fla_triton": {"error": "ImportError"}},
])
def test_no_ratio_without_both_sides(arms):
    assert summarize(arms) == {}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_refuses_without_a_gpu(capsys):
    with pytest.raises(SystemExit):
        main(["--cases", "qwen3.5-tp8 1x512"])
    assert "needs a CUDA GPU" in capsys.readouterr().err


@GPU
@pytest.mark.gpu
def test_ours_on_a_gpu(tmp_path):
    import json
    out = tmp_path / "r.json"
    assert main(["--cases", "qwen3.5-tp8 1x512", "--arms", "ours,fla_triton", "--rounds", "3",
                 "--out", str(out)]) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert row["arms"]["ours"]["o_err"] < 1e-2 and len(row["arms"]["ours"]["rounds_ms"]) == 3


def test_a_lab_arm_is_compared_with_ours_not_counted_as_a_reference():
    arms = {"ours": {"rounds_ms": [2.0]}, "lab_chunk_loop": {"rounds_ms": [1.0]},
            "fla_triton": {"rounds_ms": [4.0]}}
    assert summarize(arms) == dict(fastest_reference="fla_triton", ratio_best=0.5)
    assert arms["lab_chunk_loop"]["ratio_ours"] == pytest.approx(0.5)
    assert "ratio_ours" not in arms["fla_triton"]


def _flashinfer_stand_in(q, k, v, g, beta, *, initial_state, output_final_state, output_state,
                         cu_seqlens, use_qk_l2norm_in_kernel):
    """FlashInfer's GDN prefill as its docstring states it: g is the decay factor, states are
    [N, HV, V, K]; computed by the package's fp32 reference."""
    out = chunk_gated_delta_rule(q, k, v, g.log(), beta, initial_state=initial_state.transpose(-1, -2),
                                 cu_seqlens=cu_seqlens.tolist(), use_qk_l2norm=use_qk_l2norm_in_kernel)
    output_state.copy_(out.final_state.transpose(-1, -2))
    return out.o, output_state


def test_the_flashinfer_arm_hands_over_the_start_state_in_flashinfers_layout(monkeypatch):
    """FlashInfer's state is [N, HV, V, K]: a start state passed as [K, V] gives outputs off by
    several percent (seen on the H100) while the final state, after the decays, still agrees."""
    module = types.ModuleType("flashinfer.gdn_prefill")
    module.chunk_gated_delta_rule = _flashinfer_stand_in
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    monkeypatch.setitem(sys.modules, "flashinfer.gdn_prefill", module)
    lengths, H, HV, K = [40, 70], 1, 2, 16
    x = random_prefill_inputs(lengths, H, HV, K, K, seed=3)
    x["g"] = x["g"] * 0.05  # slow decay: the start state shapes every output
    h0 = torch.randn(len(lengths), HV, K, K, generator=torch.Generator().manual_seed(5))
    case = types.SimpleNamespace(sets=[x] * 3, h0=h0, cu=torch.tensor([0, 40, 110]))
    _, out, _ = ARMS["flashinfer"](case)
    o, final = out()
    ref = chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=h0,
                                 cu_seqlens=[0, 40, 110], use_qk_l2norm=True)
    assert rel_err(o, ref.o) < 1e-5
    assert _rel_err_any_layout(final, ref.final_state) < 1e-5


def _worker(tmp_path, script: str):
    """A stand-in for an arm's process: ``script`` is the Python it runs."""
    import sys as _sys
    from mamba_edu.benchmarks.references import Worker
    return Worker([_sys.executable, "-c", script], open(tmp_path / "w.log", "w+"))


_SERVES = """
import json, sys
print("a library's own line on stdout")
print("@@arm " + json.dumps(dict(o_err=0.001, state_err=0.001)), flush=True)
ms = iter([TIMES])
for line in sys.stdin:
    print("@@arm " + json.dumps([next(ms), 1980.0]), flush=True)
"""


def test_each_arm_in_its_own_process_is_timed_in_rotated_rounds(tmp_path):
    from mamba_edu.benchmarks.references import time_rounds
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    ours, ref = _worker(tmp_path / "a", _SERVES.replace("TIMES", "1.0, 1.2, 1.1")), \
        _worker(tmp_path / "b", _SERVES.replace("TIMES", "2.0, 2.2, 2.1"))
    row = {"arms": {"ours": ours.reply(), "fla_triton": ref.reply()}}
    time_rounds(row, {"ours": ours.time, "fla_triton": ref.time}, rounds=3)
    ours.close(), ref.close()
    assert row["arms"]["ours"]["rounds_ms"] == [1.0, 1.2, 1.1]
    assert row["arms"]["fla_triton"]["median_ms"] == 2.1
    assert row["ratio_best"] == pytest.approx(1.1 / 2.1)


def test_an_arm_whose_process_dies_gets_its_reason_and_never_counts(tmp_path):
    """A CUDA error ends the arm's process: its row entry says so, the other arms keep theirs."""
    from mamba_edu.benchmarks.references import time_rounds
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    dies = _worker(tmp_path / "a", """
import json, sys
print("@@arm " + json.dumps({"o_err": 0.001}), flush=True)
sys.stdin.readline()
sys.stderr.write("RuntimeError: CUDA error: an illegal memory access was encountered\\n")
sys.exit(1)
""")
    ours = _worker(tmp_path / "b", _SERVES.replace("TIMES", "1.0, 1.0, 1.0"))
    row = {"arms": {"flashqla": dies.reply(), "ours": ours.reply()}}
    time_rounds(row, {"flashqla": dies.time, "ours": ours.time}, rounds=3)
    dies.close(), ours.close()
    assert "illegal memory access" in row["arms"]["flashqla"]["error"]
    assert "exited with 1" in row["arms"]["flashqla"]["error"]
    assert len(row["arms"]["ours"]["rounds_ms"]) == 3 and "ratio_best" not in row


def test_a_worker_that_dies_before_its_entry_says_why(tmp_path):
    worker = _worker(tmp_path, "import sys; sys.stderr.write('ImportError: no tilelang\\\\n'); sys.exit(3)")
    with pytest.raises(RuntimeError, match="exited with 3: ImportError: no tilelang"):
        worker.reply()
    worker.close()
