"""The lab's bound launches (mamba_edu/lab/bound_launch.py): a known kind of call reaches the
compiled kernel's launcher with exactly the arguments Triton would pass; every change Triton
specialises on binds anew; hooks, keywords and the interpreter fall back; the package's kernels
come back on exit; on a GPU an eager forward is bit-identical; in the emulation it costs fewer
Python calls with no fallback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mamba_edu.lab.bound_launch import BoundKernel, bound_launches, package_kernels

ROOT = Path(__file__).resolve().parents[2]


class FakeJIT:
    """A JITFunction's face: ``fn[grid](*args, **options)`` launches (recorded) and returns a
    compiled kernel whose ``run`` records what the launcher is given."""

    arg_names = ["x_ptr", "n", "eps", "BLOCK"]

    def __init__(self):
        self.jit_calls, self.runs = [], []

    def __getitem__(self, grid):
        def launch(*args, **options):
            self.jit_calls.append((grid, args, options))
            return SimpleNamespace(function="fn", packed_metadata="meta",
                                   run=lambda *a: self.runs.append(a))
        return launch


@pytest.fixture
def bound():
    """A BoundKernel over FakeJIT, taking its compiled path (device 0, stream 7), hooks empty."""
    k = BoundKernel(FakeJIT())
    k.interpreted = False
    k.driver = (lambda: 0, lambda device: 7)
    k.knobs = SimpleNamespace(launch_enter_hook=SimpleNamespace(calls=[]),
                              launch_exit_hook=SimpleNamespace(calls=[]))
    return k


def test_a_known_kind_reaches_the_launcher_with_tritons_arguments(bound):
    x, y = torch.zeros(64), torch.ones(64)
    bound[(3,)](x, 10, 1e-6, 32, num_warps=4)
    bound[(5, 2)](y, 10, 1e-6, 32, num_warps=4)
    assert len(bound.fn.jit_calls) == 1 and bound.binds == 1
    assert bound.fn.runs == [(5, 2, 1, 7, "fn", "meta", None, None, None, y, 10, 1e-6, 32)]


@pytest.mark.parametrize("change", ["misaligned", "dtype", "int", "float", "constexpr", "options", "none"])
def test_every_change_triton_specialises_on_binds_anew(bound, change):
    """What would give Triton another compiled kernel must not reuse the bound one: a pointer off
    16-byte alignment, another dtype, another int (Triton keys on 1, %16 and width), float,
    constexpr, launch option, or a None where a tensor was."""
    base = torch.zeros(64)
    args, options = [base, 32, 1e-6, 64], {"num_warps": 4}
    bound[(1,)](*args, **options)
    if change == "misaligned":
        args[0] = base[1:]  # 4 bytes past an aligned start
    elif change == "dtype":
        args[0] = base.half()
    elif change == "int":
        args[1] = 33
    elif change == "float":
        args[2] = 1e-5
    elif change == "constexpr":
        args[3] = 128
    elif change == "options":
        options = {"num_warps": 8}
    else:
        args[0] = None
    bound[(1,)](*args, **options)
    assert bound.binds == 2 and len(bound.fn.jit_calls) == 2 and not bound.fn.runs


def test_an_aligned_view_of_another_tensor_reuses_the_kernel(bound):
    bound[(1,)](torch.zeros(64), 32, 1e-6, 64)
    bound[(1,)](torch.zeros(64)[4:], 32, 1e-6, 64)  # 16 bytes in: still aligned
    assert bound.binds == 1 and len(bound.fn.runs) == 1


@pytest.mark.parametrize("why", ["hook", "keyword", "interpreted"])
def test_falls_back_to_triton_where_the_shortcut_could_differ(bound, why):
    x = torch.zeros(64)
    bound[(1,)](x, 32, 1e-6, 64)
    args, kwargs = (x, 32, 1e-6), {"BLOCK": 64}
    if why == "hook":
        bound.knobs.launch_enter_hook.calls.append(print)
        args, kwargs = (x, 32, 1e-6, 64), {}
    elif why == "interpreted":
        bound.interpreted = True
        args, kwargs = (x, 32, 1e-6, 64), {}
    bound[(1,)](*args, **kwargs)
    assert bound.fallbacks == 1 and len(bound.fn.jit_calls) == 2 and not bound.fn.runs


def test_the_package_kernels_come_back_on_exit_even_after_an_error():
    before = {key: fn for key, fn in package_kernels().items()}
    with pytest.raises(RuntimeError):
        with bound_launches() as wrapped:
            assert all(isinstance(getattr(m, name), BoundKernel) for m, name in before)
            assert set(wrapped) == {name for _, name in before}
            raise RuntimeError("inside")
    assert all(getattr(m, name) is fn for (m, name), fn in before.items())


def test_emulated_forward_binds_every_kernel_and_costs_fewer_calls(tmp_path):
    """The CUDA emulation of bench-host, both arms: every launch of the forward takes the bound
    path (no fallback), each kernel kind binds through Triton once, fewer Python calls."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TRITON_INTERPRET", None)
    out = tmp_path / "lab_bound.json"
    proc = subprocess.run([sys.executable, "-m", "mamba_edu.lab.bench_lab_bound", "emulate", "--rounds", "1",
                           "--runs", "1", "--preset", "tiny", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    package, bound = json.loads(out.read_text())["rounds"]
    assert (package["arm"], bound["arm"]) == ("package", "bound")
    assert bound["launches"] == package["launches"] and bound["gpu_ops"] == package["gpu_ops"]
    assert bound["launches_by_kernel"] == package["launches_by_kernel"]
    paths = bound["launch_paths"]
    assert set(paths) == set(package["launches_by_kernel"])
    assert all(p["fallbacks"] == 0 and 1 <= p["bound_by_triton"] <= 4 for p in paths.values())
    assert bound["py_calls"] < package["py_calls"]


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["naive", "fused"])
def test_gpu_eager_forward_is_bit_identical(strategy):
    """Logits and every pool slot of an eager prefill (a cached prefix, three requests): the
    bound launches give the package's results bit for bit."""
    from mamba_edu.engine import Engine, Request
    from mamba_edu.model import build_model

    def run():
        model = build_model("tiny", device="cuda", seed=1)
        engine = Engine(model, strategy=strategy, max_requests=4)
        seq = list(range(3, 400))
        engine.prefill([Request("seed", seq[:130])])
        result = engine.prefill([Request("a", seq[:200]), Request("b", seq[300:340]),
                                 Request("c", seq[:128] + seq[150:214])])
        return result.logits, engine.pool.conv.clone(), engine.pool.ssm.clone()

    want = run()
    with bound_launches() as wrapped:
        run()  # binds
        got = run()
    assert sum(k.launches - k.binds - k.fallbacks for k in wrapped.values()) > 0
    assert all(k.fallbacks == 0 for k in wrapped.values())
    assert all(torch.equal(a, b) for a, b in zip(want, got))
