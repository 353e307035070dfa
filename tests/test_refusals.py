"""Bad input refused in one line (issue: commands and kernels that end in tracebacks, allocate
without an estimate, or run without a bound)."""

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _helpers import run_main  # noqa: E402
from test_misuse import MODEL, P  # noqa: E402

from mamba_edu.engine import MAX_DECODE_STEPS, Engine, Request  # noqa: E402
from mamba_edu.kernels.fused_ops import add_rms_norm, gated_rms_norm, rms_norm, silu_mul  # noqa: E402


@pytest.mark.parametrize("argv, says", [
    (("bench", "--seed", str(10**30), "--quick"), "--seed: must be at most"),
    (("grade", "--timeout", str(10**8), "notebooks"), "--timeout: must be at most 86400"),
    (("demo", "--out", "/proc/no-such-folder", "--device", "cpu", "--preset", "tiny"), "cannot write there"),
])
def test_a_bad_argument_is_one_usage_line(capsys, argv, says):
    code, out, err = run_main(capsys, *argv)
    assert code == 2 and says in err and "Traceback" not in err, err


def test_a_model_too_large_for_the_machine_is_refused_with_its_size(capsys, monkeypatch):
    import mamba_edu._runtime as runtime
    monkeypatch.setattr(runtime, "free_memory_bytes", lambda device: 2**30)  # 1 GiB free
    code, _, err = run_main(capsys, "demo", "--preset", "qwen3-next", "--device", "cpu")
    assert code == 2 and "GiB for its weights alone" in err and "1.0 GiB free" in err, err


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case", ["rms T=0", "rms D=0", "add D=0", "gated V=0", "gated T=0", "silu F=0", "silu T=0"])
def test_zero_size_dimensions_give_empty_outputs(backend, case):
    calls = {
        "rms T=0": (lambda: rms_norm(torch.zeros(0, 8), torch.ones(8), 1e-6, backend=backend), (0, 8)),
        "rms D=0": (lambda: rms_norm(torch.zeros(3, 0), torch.ones(0), 1e-6, backend=backend), (3, 0)),
        "add D=0": (lambda: add_rms_norm(torch.zeros(3, 0), torch.zeros(3, 0), torch.ones(0), 1e-6,
                                         backend=backend)[1], (3, 0)),
        "gated V=0": (lambda: gated_rms_norm(torch.zeros(3, 2, 0), torch.zeros(3, 0), torch.ones(0), 1e-6,
                                             backend=backend), (3, 2, 0)),
        "gated T=0": (lambda: gated_rms_norm(torch.zeros(0, 2, 4), torch.zeros(0, 8), torch.ones(4), 1e-6,
                                             backend=backend), (0, 2, 4)),
        "silu F=0": (lambda: silu_mul(torch.zeros(3, 0), backend=backend), (3, 0)),
        "silu T=0": (lambda: silu_mul(torch.zeros(0, 8), backend=backend), (0, 4)),
    }
    call, shape = calls[case]
    assert tuple(call().shape) == shape


def test_decode_steps_are_bounded_and_a_refused_call_changes_nothing():
    engine = Engine(MODEL, strategy="sync_free", max_requests=1)
    engine.prefill([Request("a", P[:20])])
    tokens = list(engine.running["a"].tokens)
    with pytest.raises(ValueError, match=f"at most {MAX_DECODE_STEPS}"):
        engine.decode(2**62)
    assert engine.running["a"].tokens == tokens


@pytest.mark.parametrize("kw", [{"timeout": math.nan}, {"timeout": math.inf}, {"collective_timeout": -1.0},
                                {"grace": 0}])
def test_tp_launch_needs_finite_timeouts(kw):
    from mamba_edu.tp.launch import launch
    with pytest.raises(ValueError, match="finite number of seconds"):
        launch(print, 1, **kw)


# --- the trace command: untrusted text, many traces ------------------------------------------

def hostile_trace(path: Path, op: str) -> Path:
    from test_trace_loader_hostile import small_trace, write
    trace = small_trace()
    for event in trace["traceEvents"]:
        if event["name"] == "aten::nonzero":
            event["name"] = op  # a bubble's cause, which the report names
    return write(path, trace)


def test_escape_codes_and_lone_surrogates_in_a_trace_reach_no_terminal(capsys, tmp_path):
    path = hostile_trace(tmp_path / "t.json", "aten::\x1b[2J\x1b]0;owned\x07mm\udc80")
    code, out, err = run_main(capsys, "trace", str(path), "--no-plot", "--top", "5")
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out and "\\x1b[2J" in out and "\\udc80" in out


def test_the_timeline_of_many_traces_draws_a_bounded_number_of_rows(capsys, tmp_path):
    from mamba_edu._cli_trace import MAX_ROWS
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(MAX_ROWS + 6):
        hostile_trace(folder / f"t{i:03d}.json", "aten::mm")
    code, out, err = run_main(capsys, "trace", str(folder), "--out", str(tmp_path / "t.png"))
    assert code == 0, err
    assert f"the first {MAX_ROWS} of {MAX_ROWS + 6} traces" in out and out.count("GPU busy") >= MAX_ROWS + 6
