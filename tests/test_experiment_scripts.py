"""The experiment scripts' kernels that claim to compute what the package computes do (interpreter).

``scripts/layer_floor.py``, ``scripts/scan_transposed.py``, ``scripts/inverse_blocks.py`` and
``scripts/output_fold.py`` time probes and redesigns on the H200; some of their kernels are meant
to give the package's results: the scan with its loop split at the tracked chunk, the conv
computed inside the prepare kernel, the scan on the transposed state, and the prepare kernel with
each of the inverse's variants; the output fold's script runs each path's kernels, and the
prologue GEMMs' script each projection's three ways. Small shapes, fp32 under the interpreter.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from mamba_edu import triton_interpreted
from mamba_edu.kernels import build_chunk_meta, conv1d_prefill
from mamba_edu.kernels import prefill as P
from mamba_edu.kernels.inputs import random_prefill_inputs

pytestmark = pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
H, HV, K, V = 1, 2, 64, 64
LENGTHS = [150]  # 3 chunks, the last one partial


def _script(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _prepared(track_chunk):
    x = random_prefill_inputs(LENGTHS, H, HV, K, V, seed=0)
    meta = build_chunk_meta(LENGTHS, "cpu", state_indices=[0], track_slots=[1],
                            track_chunks=[track_chunk])
    return meta, P.launch_prepare(x["k"], x["v"], x["g"], x["beta"], meta, True)


@pytest.mark.parametrize("track_chunk", [0, 1, 3, -1])
def test_split_scan_probe_matches_the_package(track_chunk):
    layer_floor = _script("layer_floor")
    meta, (gamma, k_hat, w, u) = _prepared(track_chunk)
    pool0 = 0.1 * torch.randn(2, HV, K, V, generator=torch.Generator().manual_seed(1))
    pool = pool0.clone()
    v_ref, h_ref = P.launch_scan(k_hat, w, u, gamma, pool, meta.state_indices, meta, None,
                                 meta.track_slots, meta.track_chunks)
    probe_pool, v_new, h = pool0.clone(), torch.zeros_like(u), torch.zeros_like(h_ref)
    layer_floor.scan_probe_kernel[(V // 16, 1, HV)](
        k_hat, w, u, gamma, v_new, h, probe_pool, meta.cu_seqlens, meta.chunk_offsets,
        meta.state_indices, meta.track_slots, meta.track_chunks, H, HV, K, V, K, 16,
        True, True, True, False, False, True)
    torch.testing.assert_close(probe_pool, pool, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(v_new, v_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(h, h_ref, rtol=1e-6, atol=1e-6)


def test_transposed_scan_matches_the_package():
    scan_transposed = _script("scan_transposed")
    meta, (gamma, k_hat, w, u) = _prepared(-1)
    pool0 = 0.1 * torch.randn(1, HV, K, V, generator=torch.Generator().manual_seed(1))
    pool = pool0.clone()
    v_ref, h_ref = P.launch_scan(k_hat, w, u, gamma, pool, meta.state_indices, meta)
    t_pool, v_new, h = pool0.clone(), torch.zeros_like(u), torch.zeros_like(h_ref)
    scan_transposed.scan_t_kernel[(V // 16, 1, HV)](
        k_hat, w, u, gamma, v_new, h, t_pool, meta.cu_seqlens, meta.chunk_offsets,
        meta.state_indices, H, HV, K, V, K, 16, True, True)
    torch.testing.assert_close(t_pool, pool, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v_new, v_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h, h_ref, rtol=1e-5, atol=1e-5)


def test_conv_inside_prepare_matches_two_launches():
    layer_floor = _script("layer_floor")
    gen = torch.Generator().manual_seed(2)
    T, D = sum(LENGTHS), 2 * H * K + HV * V
    proj = torch.randn(T, D + 2 * HV, generator=gen)
    x, a, b = proj[:, :D], proj[:, D:D + HV], proj[:, D + HV:]
    cw = torch.randn(D, 4, generator=gen)
    A_log, dt_bias = torch.rand(HV, generator=gen), torch.randn(HV, generator=gen)
    conv_pool = torch.randn(1, D, 3, generator=gen)
    meta = build_chunk_meta(LENGTHS, "cpu", state_indices=[0])

    y_ref = conv1d_prefill(x, cw, None, conv_pool=conv_pool.clone(), meta=meta, backend="triton")
    _, k, v = y_ref.split([H * K, H * K, HV * V], dim=-1)
    ref = P.launch_prepare(k.view(T, H, K), v.view(T, HV, V), a, b, meta, True, (A_log, dt_bias))

    y = torch.zeros(T, D)
    outs = P.prepare_outputs(y[:, :H * K].view(T, H, K), y[:, 2 * H * K:].view(T, HV, V))
    layer_floor.conv_then_prepare_kernel[(meta.NT, HV)](
        x, cw, conv_pool, y, meta.state_indices, x.stride(0), D, a, b, A_log, dt_bias, *outs,
        meta.cu_seqlens, meta.chunk_indices, a.stride(0), b.stride(0), H, HV, K, V, 4, 32,
        P.fp16_inverse(True, outs[2].dtype))
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    for got, want in zip(outs, ref):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_inverse_variants_match_the_package():
    inverse_blocks = _script("inverse_blocks")
    x = random_prefill_inputs(LENGTHS, H, HV, K, V, seed=3)
    meta = build_chunk_meta(LENGTHS, "cpu", state_indices=[0])
    args = (x["k"], x["v"], x["g"], x["beta"], meta, True)
    expected = P.launch_prepare(*args)
    for inverse in filter(None, inverse_blocks.VARIANTS.values()):
        for got, want in zip(inverse_blocks._variant_module(inverse).launch_prepare(*args),
                             expected):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_output_fold_script_times_each_kernel_of_both_paths(monkeypatch):
    """``scripts/output_fold.py`` launches the package's kernels of each path on its own (here
    once each instead of timed): the output kernel's three, the fold's two."""
    output_fold = _script("output_fold")
    monkeypatch.setattr(output_fold, "bench_us", lambda fn: (fn(), 0.0)[1])
    x = random_prefill_inputs(LENGTHS, H, HV, K, V, seed=4)
    meta = build_chunk_meta(LENGTHS, "cpu", state_indices=[0])
    pool = torch.zeros(1, HV, K, V)
    for in_scan in output_fold.PATHS.values():
        with P.forced_output_path(in_scan):
            stages = output_fold._stages(x, meta, pool, in_scan)
        assert set(stages) == ({"prepare", "scan"} if in_scan else {"prepare", "scan", "output"})


@pytest.mark.parametrize("prologue", ["norm", "swiglu", "gated"])
def test_prologue_gemms_script_runs_each_way_and_checks_it(monkeypatch, prologue):
    """``scripts/prologue_gemms.py`` part 1 (here once each instead of timed): the two launches,
    cuBLAS alone and the fused kernel agree with the fp64 expression."""
    prologue_gemms = _script("prologue_gemms")
    monkeypatch.setattr(prologue_gemms, "per_copy_us", lambda fn, n: (fn(), 1.0)[1])
    row = prologue_gemms.time_projection("test", prologue, 9, 64, 24, "cpu", torch.float32, head=32)
    assert row["err_two_launches"] <= 1e-5 and row["err_fused"] <= 1e-5
    assert row["fused_over_two_launches"] == row["fused_over_cublas"] == 1.0
