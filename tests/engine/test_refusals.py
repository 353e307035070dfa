"""Bad input refused in one line (issue: commands and kernels that end in tracebacks, allocate
without an estimate, or run without a bound)."""

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _helpers import run_main  # noqa: E402
from test_misuse import MODEL, P  # noqa: E402

from mamba_edu.engine import MAX_DECODE_STEPS, Engine, Request  # noqa: E402
from mamba_edu.kernels import add_rms_norm, gated_rms_norm, rms_norm, silu_mul  # noqa: E402


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


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("case", ["rms T=0", "rms D=0", "add D=0", "gated V=0", "gated T=0", "silu F=0", "silu T=0"])
def test_zero_size_dimensions_give_empty_outputs(impl, case):
    calls = {
        "rms T=0": (lambda: rms_norm(torch.zeros(0, 8), torch.ones(8), 1e-6, impl=impl), (0, 8)),
        "rms D=0": (lambda: rms_norm(torch.zeros(3, 0), torch.ones(0), 1e-6, impl=impl), (3, 0)),
        "add D=0": (lambda: add_rms_norm(torch.zeros(3, 0), torch.zeros(3, 0), torch.ones(0), 1e-6,
                                         impl=impl)[1], (3, 0)),
        "gated V=0": (lambda: gated_rms_norm(torch.zeros(3, 2, 0), torch.zeros(3, 0), torch.ones(0), 1e-6,
                                             impl=impl), (3, 2, 0)),
        "gated T=0": (lambda: gated_rms_norm(torch.zeros(0, 2, 4), torch.zeros(0, 8), torch.ones(4), 1e-6,
                                             impl=impl), (0, 2, 4)),
        "silu F=0": (lambda: silu_mul(torch.zeros(3, 0), impl=impl), (3, 0)),
        "silu T=0": (lambda: silu_mul(torch.zeros(0, 8), impl=impl), (0, 4)),
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
    from _helpers import small_trace, write
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


# --- the grade and trace commands, and the grading library: a probe inventory -------------------
#
# Each probe is a bad input and what its refusal must name (the argument, the value, what is
# allowed). Judged as the audit did: clear (one line, exit 2 or the expected exception, naming
# all of it), vague (refused, but a fragment missing, or an internal name), silent (accepted),
# crash (a traceback or another exception). ``python tests/engine/test_refusals.py`` prints the tally.

import contextlib  # noqa: E402
import io  # noqa: E402
import re  # noqa: E402

def cli(*argv):
    """``main(argv)`` with its output captured: (exit code, stderr, exception or None)."""
    from mamba_edu.__main__ import main
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except Exception as exc:  # noqa: BLE001 - a crash, judged below
        return 1, err.getvalue(), exc
    return code, err.getvalue(), None


def not_a_notebook(tmp: Path) -> Path:
    """A folder holding a course-named notebook that is not JSON: refused without a kernel."""
    (tmp / "00_start_here.ipynb").write_text("not json")
    return tmp


CLI_PROBES = [  # (name, argv given a scratch folder, fragments the one line must hold)
    ("grade missing path", lambda t: ("grade", str(t / "no-such")), [r"no-such", r"no such file or folder"]),
    ("grade a text file", lambda t: ("grade", str(t / "notes.txt")), [r"notes\.txt", r"not a notebook", r"\.ipynb"]),
    ("grade --timeout 0", lambda t: ("grade", str(t), "--timeout", "0"), [r"--timeout", r"got 0", r"at least 1"]),
    ("grade --jobs 0", lambda t: ("grade", str(t), "--jobs", "0"), [r"--jobs", r"got 0", r"at least 1"]),
    ("grade --max-memory 2", lambda t: ("grade", str(t), "--max-memory", "2"),
     [r"--max-memory", r"got 2", r"at least 4"]),
    ("grade --max-memory nan", lambda t: ("grade", str(t), "--max-memory", "nan"),
     [r"--max-memory", r"nan", r"finite"]),
    ("grade --max-cpu 5", lambda t: ("grade", str(t), "--max-cpu", "5"), [r"--max-cpu", r"got 5", r"at least 10"]),
    ("grade --csv /proc/x.csv", lambda t: ("grade", str(not_a_notebook(t)), "--csv", "/proc/x.csv"),
     [r"--csv /proc/x\.csv", r"cannot write"]),
    ("grade --csv in a missing folder", lambda t: ("grade", str(not_a_notebook(t)), "--csv", str(t / "a" / "b.csv")),
     [r"--csv .*b\.csv", r"no such folder"]),
    ("grade --csv a folder", lambda t: ("grade", str(not_a_notebook(t)), "--csv", str(t)), [r"--csv", r"is a folder"]),
    ("grade --feedback /proc/fb", lambda t: ("grade", str(not_a_notebook(t)), "--feedback", "/proc/fb"),
     [r"--feedback /proc/fb", r"cannot write"]),
    ("grade --feedback a file", lambda t: ("grade", str(not_a_notebook(t)), "--feedback", str(t / "notes.txt")),
     [r"--feedback", r"not a folder"]),
    ("trace missing path", lambda t: ("trace", str(t / "no-such")), [r"no-such", r"no such file or folder"]),
    ("trace empty folder", lambda t: ("trace", str(t / "empty")), [r"empty", r"no trace files"]),
    ("trace --top -1", lambda t: ("trace", str(t), "--top", "-1"), [r"--top", r"got -1", r"at least 0"]),
    ("trace --threshold-us 0", lambda t: ("trace", str(t), "--threshold-us", "0"), [r"--threshold-us", r"above 0"]),
    ("trace --index x", lambda t: ("trace", str(t), "--index", "x"), [r"--index", r"'x'", r"int"]),
    ("trace --out x.jpg", lambda t: ("trace", str(t / "t.json"), "--out", str(t / "x.jpg")),
     [r"--out", r"x\.jpg", r"\.png"]),
    ("trace --out /proc/x.png", lambda t: ("trace", str(t / "t.json"), "--out", "/proc/x.png"),
     [r"--out /proc/x\.png", r"cannot write"]),
]


def cli_verdict(argv, fragments) -> tuple[str, str]:
    code, err, exc = cli(*argv)
    if exc is not None or "Traceback" in err:
        return "crash", f"{type(exc).__name__}: {exc}" if exc else err[-300:]
    lines = [line for line in err.splitlines() if line and not line.startswith(("usage:", " ", "["))]
    if code != 2 or not lines:
        return "silent", f"exit {code}"
    said = lines[-1]
    ok = len(lines) == 1 and all(re.search(f, said) for f in fragments)
    return ("clear" if ok else "vague"), said


def student_folder(tmp: Path) -> Path:
    """A class folder with one (empty) student."""
    (tmp / "alice").mkdir()
    return tmp


def library_probes():
    """(name, call, expected exception types, fragments) for the grading library's entry points."""
    from mamba_edu.grading import classroom
    from mamba_edu.grading.containment import JudgeLimits
    return [
        ("grade_class jobs=0", lambda t: classroom.grade_class(student_folder(t), 60, jobs=0), ValueError,
         [r"jobs", r"got 0", r"at least 1"]),
        ("grade_class missing folder", lambda t: classroom.grade_class(t / "no-such", 60), ValueError,
         [r"no-such", r"no such folder"]),
        ("JudgeLimits memory=-1", lambda t: JudgeLimits(memory=-1), ValueError, [r"memory", r"got -1", r"at least"]),
        ("JudgeLimits cpu_seconds=0", lambda t: JudgeLimits(cpu_seconds=0), ValueError,
         [r"cpu_seconds", r"got 0", r"at least"]),
        ("JudgeLimits tasks=0", lambda t: JudgeLimits(tasks=0), ValueError, [r"tasks", r"got 0", r"at least"]),
    ]


def library_verdict(call, tmp, expected, fragments) -> tuple[str, str]:
    try:
        call(tmp)
    except expected as err:
        ok = "\n" not in str(err) and all(re.search(f, str(err)) for f in fragments)
        return ("clear" if ok else "vague"), str(err)
    except Exception as err:  # noqa: BLE001
        kind = "vague" if isinstance(err, (ValueError, TypeError)) else "crash"
        return kind, f"{type(err).__name__}: {err}"
    return "silent", "accepted"


def scratch(tmp: Path) -> Path:
    """The probes' folder: a text file, an empty folder, a small real trace."""
    (tmp / "notes.txt").write_text("hello")
    (tmp / "empty").mkdir()
    from _helpers import small_trace, write
    write(tmp / "t.json", small_trace())
    return tmp


@pytest.mark.parametrize("name, argv, fragments", CLI_PROBES, ids=[p[0] for p in CLI_PROBES])
def test_each_command_probe_is_refused_clearly(tmp_path, name, argv, fragments):
    verdict, said = cli_verdict(argv(scratch(tmp_path)), fragments)
    assert verdict == "clear", f"{verdict}: {said}"


@pytest.mark.parametrize("index", range(5))
def test_each_library_probe_is_refused_clearly(tmp_path, index):
    name, call, expected, fragments = library_probes()[index]
    verdict, said = library_verdict(call, tmp_path, expected, fragments)
    assert verdict == "clear", f"{name}: {verdict}: {said}"


def tally() -> dict[str, list]:
    import tempfile
    results = {"clear": [], "vague": [], "silent": [], "crash": []}
    for name, argv, fragments in CLI_PROBES:
        with tempfile.TemporaryDirectory() as tmp:
            verdict, said = cli_verdict(argv(scratch(Path(tmp))), fragments)
        results[verdict].append((name, said))
    for name, call, expected, fragments in library_probes():
        with tempfile.TemporaryDirectory() as tmp:
            verdict, said = library_verdict(call, Path(tmp), expected, fragments)
        results[verdict].append((name, said))
    return results


if __name__ == "__main__":
    res = tally()
    print(f"{sum(map(len, res.values()))} bad inputs: " + ", ".join(f"{k} {len(v)}" for k, v in res.items()))
    for verdict in ("vague", "silent", "crash"):
        for name, said in res[verdict]:
            print(f"  {verdict:6} {name}: {said[:200]}")
