"""The command line: subcommands, help with defaults, --version, exit codes, usage errors before
any work, the program name, and ``trace`` on a committed trace. Everything here is cheap: no
model is built (the demo and bench runs are in test_demo.py and test_bench_cli.py)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mamba_edu import _cli, data_dir
from _helpers import run_main
from mamba_edu.__main__ import COMMANDS, build_parser
from mamba_edu.profiling import analyze_trace

ON_GPU = torch.cuda.is_available()
RUNS = data_dir() / "runs"
NAIVE_TRACE = RUNS / "launch_bound_1x512" / "naive.pt.trace.json.gz"
needs_data = pytest.mark.skipif(not NAIVE_TRACE.exists(), reason="data/ is not in this checkout")


def run_cli(*argv, exe=(sys.executable, "-m", "mamba_edu")) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPLBACKEND": "Agg"}
    return subprocess.run([*exe, *argv], capture_output=True, text=True, env=env, timeout=300)


def test_top_help_lists_every_command(capsys):
    code, out, _ = run_main(capsys, "--help")
    assert code == 0
    names = {"demo", "bench", "bench-kernels", "bench-buckets", "bench-host", "grade", "trace"}
    for name in names:
        assert name in out
    assert set(COMMANDS) == names
    assert "--version" in out and "``" not in out


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_help_shows_device_preset_and_defaults(capsys, command):
    code, out, _ = run_main(capsys, command, "--help")
    assert code == 0
    assert "--device {auto,cpu,cuda}" in out
    assert "--preset {auto," in out and "qwen3.5-tp8" in out and "tiny" in out
    assert "(default: auto)" in out
    assert f"(default: out/{command})" in " ".join(out.split())
    assert "(default: 5)" in out if command == "demo" else "(default: 10)" in out
    assert "``" not in out and "**" not in out


def test_trace_help_shows_defaults(capsys):
    code, out, _ = run_main(capsys, "trace", "--help")
    assert code == 0
    assert "(default: 5.0)" in out and "path" in out and "``" not in out


def test_version(capsys):
    code, out, _ = run_main(capsys, "--version")
    assert code == 0
    assert out.startswith(f"{_cli.prog_name()} {_cli.version()} (torch ")


def test_no_command_is_a_usage_error(capsys):
    code, _, err = run_main(capsys)
    assert code == 2 and "no COMMAND given" in err


@pytest.mark.parametrize("argv, message", [
    (["no-such-command"], "invalid choice"),
    (["bench", "--cases", "nope"], "unknown --cases ['nope']"),
    (["bench", "--strategies", "bogus"], "unknown --strategies ['bogus']"),
    (["bench", "--repeats", "0"], "--repeats: must be at least 1"),
    (["bench", "--warmup", "-1"], "--warmup: must be at least 0"),
    (["bench", "--dtype", "nope"], "--dtype: invalid choice"),
    (["bench", "--preset", "nope"], "--preset: invalid choice"),
    (["bench", "--max-minutes", "0"], "--max-minutes: must be above 0"),
    (["demo", "--repeats", "0"], "--repeats: must be at least 1"),
    (["demo", "--repeats", "two"], "expected a whole number"),
    (["demo", "--device", "tpu"], "--device: invalid choice"),
    (["trace", "no/such/trace.json.gz"], "no such file or folder"),
])
def test_usage_errors_exit_2_before_any_work(capsys, argv, message):
    code, out, err = run_main(capsys, *argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and out == ""


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_unwritable_out_is_a_usage_error(capsys, tmp_path, command):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, out, err = run_main(capsys, command, "--out", str(blocker / "out"))
    assert code == 2
    assert f"--out {blocker / 'out'}: {blocker} exists and is not a folder" in err
    assert out == ""


def test_replot_without_results_is_a_usage_error(capsys, tmp_path):
    code, _, err = run_main(capsys, "bench", "--replot", "--out", str(tmp_path))
    assert code == 2 and "no results.json" in err


@pytest.mark.skipif(ON_GPU, reason="checks the message on a machine without a GPU")
def test_gpu_only_work_without_gpu_exits_2_and_says_why(capsys):
    code, _, err = run_main(capsys, "bench-kernels")
    assert code == 2 and "nothing to run here" in err and "CUDA GPU" in err
    code, _, err = run_main(capsys, "demo", "--device", "cuda")
    assert code == 2 and "--device cuda: no CUDA GPU is visible" in err
    code, _, err = run_main(capsys, "bench", "--device", "cuda")
    assert code == 2 and "--device cuda" in err


def test_passthrough_commands_keep_their_own_help(capsys):
    code, out, _ = run_main(capsys, "bench-kernels", "--help")
    assert code == 0 and "--budget-s" in out
    code, out, _ = run_main(capsys, "grade", "--help")
    assert code == 0 and "--timeout" in out


def test_grade_on_a_folder_without_notebooks_exits_2(capsys, tmp_path):
    code, _, err = run_main(capsys, "grade", str(tmp_path))
    assert code == 2 and "no notebook with registered exercises" in err


def test_program_name_follows_the_invocation(monkeypatch):
    import mamba_edu.__main__ as entry

    monkeypatch.setattr(sys, "argv", [entry.__file__])
    assert _cli.prog_name() == "python -m mamba_edu"
    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/mamba-edu"])
    assert _cli.prog_name() == "mamba-edu"
    monkeypatch.setattr(sys, "argv", ["/usr/lib/python3/site-packages/pytest/__main__.py"])
    assert _cli.prog_name() == "mamba-edu"  # neutral when called from elsewhere
    assert build_parser().prog == "mamba-edu"


def test_python_m_and_console_script_behave_the_same():
    by_module = run_cli("--version")
    assert by_module.returncode == 0
    assert by_module.stdout.startswith("python -m mamba_edu ")
    bad = run_cli("bench", "--cases", "nope")
    assert bad.returncode == 2 and "python -m mamba_edu bench: error: unknown --cases" in bad.stderr
    assert "Traceback" not in bad.stderr
    script = shutil.which("mamba-edu", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the mamba-edu console script is not installed next to this Python")
    by_script = run_cli("--version", exe=(script,))
    assert by_script.returncode == 0
    assert by_script.stdout.replace("mamba-edu", "python -m mamba_edu") == by_module.stdout


def test_plain_strips_markup():
    assert _cli.plain("``x`` and :func:`mamba_edu.f` are **bold**") == "x and mamba_edu.f are bold"


@needs_data
def test_trace_of_a_committed_trace_prints_the_summary_and_writes_a_png(capsys, tmp_path):
    png = tmp_path / "naive.png"
    code, out, err = run_main(capsys, "trace", str(NAIVE_TRACE), "--out", str(png))
    assert code == 0, err
    # The same figures as the package's analysis of that trace (the README's naive row).
    a = analyze_trace(NAIVE_TRACE, "prefill_forward")
    assert "range 'prefill_forward'" in out
    assert f"GPU busy {a.gpu_busy_us / 1e3:.2f} ms" in out
    assert f"= {100 * a.idle_us / a.wall_us:.1f} % of the wall time" in out
    assert f"{a.n_syncs} host waits (syncs)" in out and a.n_syncs == 144  # SGLang before #20522
    assert "aten::_local_scalar_dense → cudaStreamSynchronize" in out
    assert f"timeline: {png}" in out and "ui.perfetto.dev" in out
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_data
def test_trace_of_a_folder_draws_one_row_per_trace(capsys, tmp_path):
    png = tmp_path / "all.png"
    code, out, _ = run_main(capsys, "trace", str(RUNS / "launch_bound_1x512"), "--out", str(png),
                            "--json", "--top", "0")
    assert code == 0

    rows = [json.loads(line) for line in out.splitlines()]
    assert [Path(r["path"]).name.split(".")[0] for r in rows] == [
        "fused", "fused_graph", "naive", "precomputed", "sync_free", "sync_free_graph"]
    assert {r["label"] for r in rows} >= {"naive", "sync_free+graph"}
    assert all(r["range"] == "prefill_forward" for r in rows)
    assert png.stat().st_size > 10_000


def test_trace_without_a_range_exits_2_and_names_the_ranges(capsys, tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"traceEvents": [{"ph": "X", "name": "train_step", "cat": "user_annotation",'
                    ' "ts": 0, "dur": 10, "pid": 1, "tid": 1}]}')
    code, _, err = run_main(capsys, "trace", str(path), "--no-plot")
    assert code == 2
    assert "no 'prefill_forward' range" in err and "train_step" in err and "--range NAME" in err
    code, out, _ = run_main(capsys, "trace", str(path), "--no-plot", "--range", "train_step")
    assert code == 0 and "CPU-only trace" in out


@needs_data
def test_trace_rejects_a_non_png_out_and_an_empty_folder(capsys, tmp_path):
    code, _, err = run_main(capsys, "trace", str(NAIVE_TRACE), "--out", str(tmp_path / "x.svg"))
    assert code == 2 and "ending in .png" in err
    code, _, err = run_main(capsys, "trace", str(tmp_path))
    assert code == 2 and "no trace files" in err


REPO = Path(__file__).resolve().parents[2]


def test_version_and_help_import_neither_torch_nor_a_command():
    """--version and --help stay cheap: no torch, no command module (the CLI's promise)."""
    probe = ("import sys; from mamba_edu.__main__ import main\n"
             "for argv in (['--version'], ['--help']):\n"
             "    try: main(argv)\n"
             "    except SystemExit: pass\n"
             "heavy = sorted(m for m in sys.modules if m in ('torch', 'triton', 'numpy', 'matplotlib')"
             " or m in ('mamba_edu.demo', 'mamba_edu.benchmarks.ttft', 'mamba_edu._cli_trace'))\n"
             "print('HEAVY', heavy)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    heavy = out.stdout.strip().splitlines()[-1]
    if Path("/dev/nvidiactl").exists() or Path("/dev/dxg").exists():
        heavy = heavy.replace("'torch', ", "").replace("'torch'", "")  # torch decides there
    assert heavy == "HEAVY []", heavy


def test_help_never_shows_default_none_or_a_second_default(capsys):
    for command in ("demo", "bench", "trace"):
        code, out, _ = run_main(capsys, command, "--help")
        assert code == 0
        assert "(default: None)" not in out, command
        for entry in out.split("\n  -")[1:]:
            assert entry.lower().count("default") <= 1, entry


def test_demo_help_never_prints_a_path_of_the_installation(capsys):
    """--traces has no default path (the demo draws its own run): the help names none."""
    code, out, _ = run_main(capsys, "demo", "--help")
    assert code == 0 and "site-packages" not in out and "default: this run's" in " ".join(out.split())


def test_the_cli_names_are_the_packages_names():
    """_cli keeps the preset and strategy names for help without torch: they must be the real ones."""
    from mamba_edu._cli import PRESET_NAMES, STRATEGY_NAMES
    from mamba_edu.model.config import PRESETS
    from mamba_edu.serving import STRATEGIES

    assert PRESET_NAMES == tuple(PRESETS) and STRATEGY_NAMES == tuple(STRATEGIES)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_command_help_imports_no_torch_and_answers_fast(command):
    """Each command's --help parses before anything heavy is imported: no torch, under 1 s.
    Every command of the CLI's table is taken, a new one included: the passthrough commands
    (bench-kernels, bench-buckets, grade) build their parsers in their own modules, which must
    import torch only after parsing."""
    probe = ("import sys, time; t = time.perf_counter(); from mamba_edu.__main__ import main\n"
             f"try: main([{command!r}, '--help'])\n"
             "except SystemExit: pass\n"
             "print('TORCH', 'torch' in sys.modules, time.perf_counter() - t)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                         timeout=120)
    _, torch_imported, seconds = out.stdout.strip().splitlines()[-1].split()
    assert out.stdout.startswith("usage: "), out.stdout[-300:] + out.stderr[-300:]  # the help, not an error
    assert torch_imported == "False" and float(seconds) < 1.0, out.stdout[-300:]


def test_a_closed_pipe_ends_quietly():
    """`... trace PATH | head -c 20`: no BrokenPipeError traceback, exit 141 as cat gives."""
    trace = REPO / "data" / "runs" / "launch_bound_1x512"
    if not trace.exists():
        pytest.skip("data/ is not in this checkout")
    done = subprocess.run(f"{sys.executable} -m mamba_edu trace {trace} --no-plot | head -c 20",
                          shell=True, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert len(done.stdout) == 20 and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


def test_trace_of_a_folder_of_run_folders_takes_every_case(capsys, tmp_path):
    """`trace data/runs`: a folder of case folders, one trace each here, all analysed."""
    runs = REPO / "data" / "runs"
    if not runs.exists():
        pytest.skip("data/ is not in this checkout")
    for case in ("launch_bound_1x512", "launch_bound_16x256"):
        (tmp_path / "runs" / case).mkdir(parents=True)
        shutil.copy(runs / case / "fused.pt.trace.json.gz", tmp_path / "runs" / case)
    out_png = tmp_path / "t.png"
    code, out, _ = run_main(capsys, "trace", str(tmp_path / "runs"), "--out", str(out_png))
    assert code == 0 and out.count("fused.pt.trace.json.gz: range") == 2 and out_png.exists()


def test_bench_kernels_help_has_the_common_style(capsys):
    code, out, _ = run_main(capsys, "bench-kernels", "--help")
    assert code == 0
    assert out.startswith(f"usage: {_cli.prog_name()} bench-kernels ")
    assert "(default: " in out  # defaults shown, as for every other command


def test_ctrl_c_exits_130_without_a_traceback(capsys, monkeypatch):
    import mamba_edu.__main__ as entry

    def interrupted(argv):
        raise KeyboardInterrupt
    monkeypatch.setattr(entry, "_main", interrupted)
    code = entry.main(["demo"])
    _, err = capsys.readouterr()
    assert code == 130 and "interrupted" in err and "Traceback" not in err


def test_grade_without_nbformat_says_which_extra(capsys, monkeypatch, tmp_path):
    from mamba_edu.grading import cli as _cli_grade

    monkeypatch.setattr(_cli_grade, "missing_modules", lambda: ["nbformat", "nbclient"])
    code, _, err = run_main(capsys, "grade", str(tmp_path))
    assert code == 2 and "nbformat, nbclient" in err and "mamba_edu[grade]" in err
    assert "Traceback" not in err
