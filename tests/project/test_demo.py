"""`python -m mamba_edu demo` end to end on the default device (CPU in CI), and its messages."""

import re

import pytest
import torch

from mamba_edu import data_dir, demo
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
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
    assert f"recorded by this run on {demo.device_name(device)}" in report
    # the files written, each with what it shows, end the report
    assert report.rstrip().endswith(f"{tmp_path / 'traces'}  the profiler traces drawn there "
                                    f"(one per strategy): mamba-edu trace {tmp_path / 'traces'}, "
                                    "or https://ui.perfetto.dev")
    assert f"{tmp_path / 'timeline.png'}  the timeline:" in report
    # piped (no TTY): one line per strategy instead of a bar
    assert all(f"   {s}: " in report for s in STRATEGIES)


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
            for s, n in zip(STRATEGIES, (18, 2, 0, 0))]
    monkeypatch.setattr(demo, "strategy_report", lambda *a, **k: rows)


@pytest.mark.parametrize("different", ["precomputed", "fused"])
def test_demo_fails_when_pools_differ(tmp_path, capsys, monkeypatch, different):
    """Exit 1 and a FAIL line when one strategy leaves other states than naive's."""
    fake_reports(monkeypatch, different)
    assert main(["demo", "--out", str(tmp_path / "out")]) == 1
    report = capsys.readouterr().out
    assert dict((m[0], m[4]) for m in ROW.findall(report))[different] == "DIFFERENT"
    assert "FAIL: see the table above" in report and "PASS" not in report.replace("-> PASS", "")


def test_demo_refuses_missing_traces_in_one_line(tmp_path, capsys):
    missing = tmp_path / "no-data" / "runs"
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--out", str(tmp_path / "out"), "--traces", str(missing)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--traces {missing}: no such folder" in err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("usage:") is False


def test_demo_traces_draws_a_recorded_folder_instead_of_this_run(tmp_path, capsys, monkeypatch):
    runs = data_dir() / "runs"
    if demo.committed_traces(runs) is None:
        pytest.skip("data/ is not in this checkout")
    fake_reports(monkeypatch)
    for traces in (runs, runs / demo.CASE):
        out = tmp_path / traces.name
        assert main(["demo", "--out", str(out), "--traces", str(traces)]) == 0
        report = capsys.readouterr().out
        assert f"one prefill per trace in {runs / demo.CASE}, not this run" in report
        assert (out / "timeline.png").stat().st_size > 10_000 and not (out / "traces").exists()


def test_demo_refuses_a_preset_larger_than_the_free_memory_before_building_it(tmp_path, capsys,
                                                                               monkeypatch):
    """qwen3-next on a CPU with less memory free than its weights: one line, exit 2, no model."""
    import mamba_edu._runtime as runtime

    monkeypatch.setattr(runtime, "free_memory_bytes", lambda device: 2**30)
    monkeypatch.setattr(demo, "PROC_CGROUP", tmp_path / "no-cgroup")  # no container limit here
    monkeypatch.setattr(demo, "CGROUP_ROOT", tmp_path / "no-cgroup-fs")
    monkeypatch.setattr(demo, "strategy_report", lambda *a, **k: pytest.fail("built a model"))
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--preset", "qwen3-next", "--device", "cpu", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and "--preset qwen3-next needs about" in err[-1]
    assert "1.0 GiB free" in err[-1]


GiB = 2**30


def fake_cgroup(root, files: dict[str, str], proc: str):
    """A cgroup file system under ``root`` (``files``: path under it -> text) and the process's
    ``/proc/self/cgroup`` (``proc``); returns the two paths ``cgroup_memory_free`` takes."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "proc_self_cgroup").write_text(proc)
    return root / "fs", root / "proc_self_cgroup"


def test_cgroup_v2_limit_is_the_lowest_headroom_over_the_cgroup_and_its_ancestors(tmp_path):
    """v2: 8 GiB limit, 3 GiB used of which 1 GiB droppable page cache -> 6 GiB; its parent's
    4 GiB limit with 3.5 GiB used -> 0.5 GiB: the parent's is the one that binds."""
    fs, proc = fake_cgroup(tmp_path, {
        "fs/job.slice/run/memory.max": f"{8 * GiB}\n",
        "fs/job.slice/run/memory.current": f"{3 * GiB}\n",
        "fs/job.slice/run/memory.stat": f"anon {2 * GiB}\ninactive_file {GiB}\n",
        "fs/job.slice/memory.max": f"{4 * GiB}\n",
        "fs/job.slice/memory.current": f"{7 * GiB // 2}\n",
        "fs/memory.max": "max\n",
    }, "0::/job.slice/run\n")
    assert demo.cgroup_memory_free(fs, proc) == GiB // 2
    (tmp_path / "fs/job.slice/memory.max").write_text("max\n")
    assert demo.cgroup_memory_free(fs, proc) == 6 * GiB
    (tmp_path / "fs/job.slice/run/memory.max").write_text("max\n")
    assert demo.cgroup_memory_free(fs, proc) is None  # no limit anywhere: the host's MemAvailable decides


def test_cgroup_v1_limit_in_a_container_whose_path_is_not_under_the_mount(tmp_path):
    """v1 in a container: /proc/self/cgroup names /docker/<id>, but the mount's top is that
    cgroup; v1 writes "no limit" as a number near 2**63."""
    fs, proc = fake_cgroup(tmp_path, {
        "fs/memory/memory.limit_in_bytes": f"{2 * GiB}\n",
        "fs/memory/memory.usage_in_bytes": f"{GiB}\n",
        "fs/memory/memory.stat": f"inactive_file 7\ntotal_inactive_file {GiB // 4}\n",
    }, "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    assert demo.cgroup_memory_free(fs, proc) == GiB + GiB // 4
    (tmp_path / "fs/memory/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert demo.cgroup_memory_free(fs, proc) is None
    assert demo.cgroup_memory_free(tmp_path / "nothing", tmp_path / "nothing") is None


def test_demo_refuses_a_preset_larger_than_the_containers_memory_limit(tmp_path, capsys, monkeypatch):
    """The host has 1 TiB free, the container 1 GiB: the demo goes by the container's limit."""
    import mamba_edu._runtime as runtime

    fs, proc = fake_cgroup(tmp_path, {"fs/memory.max": f"{GiB}\n", "fs/memory.current": "0\n"}, "0::/\n")
    monkeypatch.setattr(runtime, "free_memory_bytes", lambda device: 1024 * GiB)
    monkeypatch.setattr(demo, "CGROUP_ROOT", fs)
    monkeypatch.setattr(demo, "PROC_CGROUP", proc)
    monkeypatch.setattr(demo, "strategy_report", lambda *a, **k: pytest.fail("built a model"))
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--preset", "qwen3-next", "--device", "cpu", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and "--preset qwen3-next needs about" in err[-1]
    assert "container's memory limit) has 1.0 GiB free" in err[-1]
