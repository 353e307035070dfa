"""Bound launches (mamba_edu/kernels/launcher.py): a known kind of call reaches the compiled
kernel's launcher with exactly the arguments Triton would pass; every change Triton specialises on
binds anew; hooks, keywords and the interpreter take Triton's path; in the CUDA emulation every
kernel of a forward binds once per kind and never falls back; on a GPU an eager forward equals the
one through Triton's path bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mamba_edu.kernels.launcher import BoundKernel

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
    """A BoundKernel over FakeJIT on its compiled path: device 0, stream 7, hooks empty."""
    k = BoundKernel(FakeJIT())
    hooks = SimpleNamespace(launch_enter_hook=SimpleNamespace(calls=[]),
                            launch_exit_hook=SimpleNamespace(calls=[]))
    k.setup = (hooks, False, len(FakeJIT.arg_names), lambda: 0, lambda device: 7)
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


def test_the_kinds_kept_are_bounded(bound, monkeypatch):
    monkeypatch.setattr("mamba_edu.kernels.launcher.MAX_KINDS", 3)
    x = torch.zeros(64)
    for n in range(5):  # five lengths: five kinds
        bound[(1,)](x, n, 1e-6, 64)
    assert len(bound.bound) <= 3 and bound.binds == 5
    bound[(1,)](x, 4, 1e-6, 64)  # the newest is kept
    assert bound.binds == 5 and len(bound.fn.runs) == 1


@pytest.mark.parametrize("why", ["hook", "keyword", "interpreted"])
def test_falls_back_to_triton_where_the_shortcut_could_differ(bound, why):
    x = torch.zeros(64)
    bound[(1,)](x, 32, 1e-6, 64)
    args, kwargs = (x, 32, 1e-6), {"BLOCK": 64}
    if why == "hook":
        bound.setup[0].launch_enter_hook.calls.append(print)
        args, kwargs = (x, 32, 1e-6, 64), {}
    elif why == "interpreted":
        bound.setup = (bound.setup[0], True, *bound.setup[2:])
        args, kwargs = (x, 32, 1e-6, 64), {}
    bound[(1,)](*args, **kwargs)
    assert bound.fallbacks == 1 and len(bound.fn.jit_calls) == 2 and not bound.fn.runs


def package_kernels() -> dict:
    """``{name: BoundKernel}`` of every kernel the package launches."""
    from mamba_edu.kernels import attention, conv, decode, fused_ops
    from mamba_edu.kernels.prefill import output, prepare, scan
    return {name: k for module in (attention, conv, decode, fused_ops, output, prepare, scan)
            for name, k in vars(module).items() if isinstance(k, BoundKernel)}


def test_every_package_kernel_is_bound():
    assert set(package_kernels()) == {
        "rms_norm_kernel", "silu_mul_kernel", "rope_kernel", "causal_attention_kernel",
        "conv1d_prefill_kernel", "conv1d_update_kernel", "gdn_decode_kernel",
        "chunk_prepare_kernel", "chunk_scan_kernel", "chunk_output_kernel"}


SAME_LAUNCHES = """
import json, os, sys
os.environ["TRITON_INTERPRET"] = "0"  # bench-host's emulation runs Triton's real launch path
from mamba_edu.benchmarks import host
import mamba_edu.kernels.prefill, mamba_edu.kernels.decode
from mamba_edu.kernels.launcher import BoundKernel
kernels = [k for m, mod in list(sys.modules.items()) if m.startswith("mamba_edu.kernels")
           for k in vars(mod).values() if isinstance(k, BoundKernel)]
launches, original = [], host._FakeLauncher.__call__

def describe(a):
    if hasattr(a, "stride"):
        return [str(a.dtype), list(a.shape), list(a.stride()), a.storage_offset()]
    return repr(a)

def recorded(self, gx, gy, gz, stream, function, packed, meta, enter, leave, *args):
    launches.append([id(self), gx, gy, gz, stream, [describe(a) for a in args]])
    return original(self, gx, gy, gz, stream, function, packed, meta, enter, leave, *args)

host._FakeLauncher.__call__ = recorded
from triton import knobs
out = {}
for mode in ("triton", "bound"):
    for k in kernels:  # "triton": every call through JITFunction.run, as under the interpreter
        k.bound, k.setup = {}, ((knobs.runtime, True, len(k.fn.arg_names), None, None) if mode == "triton" else None)
    launches.clear()
    host.measure("tiny", strategies=("naive", "fused"), runs=2, warmup=1, count_calls=False, log=lambda *a: None)
    ids = {}  # the compiled kernels in order of first use: Triton's choice, comparable across runs
    out[mode] = [[ids.setdefault(x[0], len(ids)), *x[1:]] for x in launches]
    out[mode + "_counts"] = {k.fn.__name__: [k.launches, k.binds, k.fallbacks] for k in kernels if k.launches}
    for k in kernels:
        k.launches = k.binds = k.fallbacks = 0
print(json.dumps(out))
"""


def test_emulated_bound_launches_are_tritons_launches():
    """Every launch of emulated eager forwards (bench-host's CUDA emulation: Triton's real launch
    path, a stub C launcher; naive and fused, warm-up included), once with every call through
    ``JITFunction.run`` and once bound: the same compiled kernels (Triton's choice, in order of
    first use), grids, stream and arguments, launch by launch; bound, every kernel binds through
    Triton a few times (once per kind of call) and never falls back."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", SAME_LAUNCHES], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert len(out["triton"]) > 100 and out["bound"] == out["triton"]
    assert all(binds == 0 and fallbacks == launches for launches, binds, fallbacks in out["triton_counts"].values())
    assert set(out["bound_counts"]) == set(out["triton_counts"])
    for name, (launches, binds, fallbacks) in out["bound_counts"].items():
        assert fallbacks == 0 and 1 <= binds <= 4 and launches > 2 * binds, (name, launches, binds)


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["naive", "fused"])
def test_gpu_eager_forward_equals_tritons_path_bit_for_bit(strategy, monkeypatch):
    """Logits and every pool slot of an eager prefill (a cached prefix, three requests): the
    bound launches give what Triton's own path gives (every kernel forced to fall back)."""
    from mamba_edu.engine import Engine, Request
    from mamba_edu.model import build_model

    def run():
        model = build_model("tiny", device="cuda", seed=1)
        engine = Engine(model, strategy=strategy, max_requests=4)
        seq = [(7 * i + 3) % model.config.vocab for i in range(400)]
        engine.prefill([Request("seed", seq[:130])])
        result = engine.prefill([Request("a", seq[:200]), Request("b", seq[300:340]),
                                 Request("c", seq[:128] + seq[150:214])])
        return result.logits, engine.pool.conv.clone(), engine.pool.ssm.clone()

    kernels = package_kernels()
    run()  # binds
    before = {name: (k.launches, k.binds, k.fallbacks) for name, k in kernels.items()}
    got = run()
    bound_launches = sum(k.launches - before[n][0] - (k.binds - before[n][1]) for n, k in kernels.items())
    assert bound_launches > 0 and all(k.fallbacks == before[n][2] for n, k in kernels.items())
    for k in kernels.values():  # Triton's path: as under the interpreter
        monkeypatch.setattr(k, "setup", (k.setup[0], True, *k.setup[2:]) if k.setup else None)
    want = run()
    assert all(torch.equal(a, b) for a, b in zip(want, got))
