"""The lab's byte and FLOP model (mamba_edu/lab/fused_bytes.py): its counts against the tensors
the three kernels are launched with, a count by hand, the H100's Nsight Compute counters, and the
committed table (data/benchmarks/fused_byte_model.json)."""

import inspect
import json

import pytest
import torch

from mamba_edu import triton_interpreted
from mamba_edu._runtime import data_dir
from mamba_edu.lab.fused_bytes import (BREAKDOWN_CASES, H100, PRESETS, REFERENCE_CASES, V_INDEPENDENT,
                                       Shape, best_single_pass, bytes_per_kernel, chunk_flops,
                                       fused_tensors, inverse_flops, table, three_kernel_tensors,
                                       total_bytes, two_pass_s)

DATA = data_dir() / "benchmarks"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="data/ is not in this checkout")
interpreted = pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")
KERNELS = {"chunk_prepare_kernel": "prepare", "chunk_scan_kernel": "scan", "chunk_output_kernel": "output"}
METADATA = {"cu_ptr", "chunk_idx_ptr", "chunk_off_ptr", "state_idx_ptr", "track_chunk_ptr", "track_slot_ptr"}


def _launched_tensors(lengths, H, HV, K, V, dtype):
    """The tensor arguments of each of the three kernels' launches for one tracked batch, by
    parameter name, recorded instead of run (the interpreter's launch is replaced)."""
    from triton.runtime.interpreter import InterpretedFunction

    from mamba_edu.kernels import build_chunk_meta_with_indices
    from mamba_edu.kernels.inputs import random_pool, random_prefill_inputs
    from mamba_edu.kernels.prefill import prefill_triton
    N = len(lengths)
    x = random_prefill_inputs(lengths, H, HV, K, V, dtype=dtype)
    meta, idx = build_chunk_meta_with_indices(lengths, "cpu", state_indices=list(range(N)),
                                              track_slots=list(range(N, 2 * N)), track_chunks=[0] * N)
    launched = {}

    def record(self, *args, grid, warmup, **kwargs):
        names = list(inspect.signature(self.fn).parameters)
        bound = dict(zip(names, args)) | kwargs
        launched[KERNELS[self.fn.__name__]] = {k: v for k, v in bound.items() if isinstance(v, torch.Tensor)}

    original, InterpretedFunction.run = InterpretedFunction.run, record
    try:
        prefill_triton(x["q"], x["k"], x["v"], x["g"], x["beta"], random_pool(2 * N + 1, HV, K, V),
                       idx["state_indices"], meta, K ** -0.5, True, False,
                       idx["track_slots"], idx["track_chunks"])
    finally:
        InterpretedFunction.run = original
    return launched


@interpreted
@pytest.mark.parametrize("lengths,H,HV,dtype", [([100, 100], 1, 2, torch.float16),
                                                ([130, 130, 130], 2, 4, torch.float32)])
def test_three_kernel_count_is_the_launched_tensors(lengths, H, HV, dtype):
    """Each kernel's count is the bytes of the tensors it is launched with: every tensor whole,
    the pool as the batch's N slots read and written by the scan plus one tracked slot per
    sequence, and no tensor argument the model leaves out."""
    K, V, N = 16, 32, len(lengths)
    launched = _launched_tensors(lengths, H, HV, K, V, dtype)
    s = Shape(N, lengths[0], H, HV, K, V, act=torch.finfo(dtype).bits // 8, tracked=N)
    model = three_kernel_tensors(s)
    assert set(launched) == {"prepare", "scan", "output"}
    for kernel, tensors in launched.items():
        named = {t.name for t in model if t.kernel == kernel} - {"track"}  # tracked: into the pool
        assert {n.removesuffix("_ptr") for n in tensors if n not in METADATA} == named, kernel
        expected = sum(3 * N * x[0].nbytes if name == "pool_ptr" else x.nbytes
                       for name, x in tensors.items() if name not in METADATA)
        assert bytes_per_kernel(model)[kernel] == expected, kernel


def test_fused_count_by_hand():
    """2 sequences of 100 tokens, 1 key head, 2 value heads, K = 16, V = 32, fp16, fp32 gates,
    one tracked: q, k 200·16·2; v, o 200·2·32·2; g, β 200·2·4; states 2·2·16·32·4 in and out,
    the tracked one 2·16·32·4."""
    s = Shape(2, 100, 1, 2, 16, 32, act=2, gate=4, state=4, tracked=1)
    by_hand = 2 * 6400 + 2 * 25600 + 2 * 1600 + 2 * 8192 + 4096
    assert total_bytes(fused_tensors(s)) == by_hand == 87680
    from mamba_edu.kernels.inputs import random_pool, random_prefill_inputs
    x = random_prefill_inputs([100, 100], 1, 2, 16, 32, dtype=torch.float16)
    states = random_pool(2, 2, 16, 32)
    assert by_hand == (sum(t.nbytes for t in x.values()) + x["v"].nbytes  # o is v's size
                       + 2 * states.nbytes + states[0].nbytes)
    # Checkpoints add every chunk's start state (2 chunks per sequence), fp32.
    assert total_bytes(fused_tensors(Shape(2, 100, 1, 2, 16, 32, tracked=1, checkpoints=True))) == by_hand + 4 * 4096


@pytest.mark.parametrize("field,values", [("N", [1, 2, 8]), ("L", [1, 64, 65, 4096]), ("HV", [2, 4, 8]),
                                          ("tracked", [0, 1, 2]), ("checkpoints", [False, True])])
def test_counts_grow_with_the_shape_and_the_three_kernels_move_more(field, values):
    base = dict(N=2, L=300, H=2, HV=4)
    ours, fused = [], []
    for value in values:
        s = Shape(**(base | {field: value}))
        ours.append(total_bytes(three_kernel_tensors(s)))
        fused.append(total_bytes(fused_tensors(s)))
        assert ours[-1] > fused[-1]
    assert ours == sorted(ours) and fused == sorted(fused)
    assert len(set(fused)) == len(values)


def test_chunk_flops():
    """13.83 MFLOP per chunk and head at K = V = 128; the inverse's 2.29 M; a V-tile of 32 keeps
    the V-independent products whole and a quarter of the others."""
    f = chunk_flops(128, 128)
    assert inverse_flops() == 2_293_760 and sum(f.values()) == 13_828_096
    quarter = chunk_flops(128, 128, 32)
    for name in f:
        assert quarter[name] == f[name] // (1 if name in V_INDEPENDENT else 4)


def test_occupancy_and_the_two_pass_design():
    """One sequence of 32 heads fills 132 SMs best with 32-wide V-tiles (128 programs); eight
    sequences of 32 heads need no split and no groups; 8 heads of one sequence get 16 groups."""
    one = best_single_pass(Shape(1, 8192, 16, 32), H100)
    assert (one["BV"], one["programs"], one["waves"]) == (32, 128, 1)
    eight = best_single_pass(Shape(8, 1024, 16, 32), H100)
    assert (eight["BV"], eight["programs"], eight["waves"]) == (128, 256, 2)
    assert two_pass_s(Shape(8, 1024, 16, 32), H100) is None
    tp8 = two_pass_s(Shape(1, 8192, 2, 8), H100)
    assert (tp8["groups"], tp8["programs"], tp8["chunks_per_group"]) == (16, 128, 8)
    assert tp8["seconds"] < best_single_pass(Shape(1, 8192, 2, 8), H100)["seconds"] / 2


def test_the_shapes_are_the_reference_benchmarks():
    from mamba_edu.benchmarks import references
    assert PRESETS == references.PRESETS
    assert [(p, len(n), n[0]) for p, n in references.CASES] == REFERENCE_CASES
    assert all(len(set(n)) == 1 for _, n in references.CASES)  # equal lengths: Shape's N × L


def _breakdown(name):
    return json.loads((DATA / name).read_text())["rows"]


@needs_data
@pytest.mark.parametrize("case", ["qwen3-next 1x8192", "qwen3-next 8x1024"])
def test_the_model_against_the_h100_counters_of_our_kernels(case):
    """Nsight Compute on an H100 (L2 flushed before each kernel): each of our kernels moves
    90–100 % of the model's bytes at 8,192 tokens (writes still in L2 at the kernel's end are not
    counted), and its tensor operations are the model's products (the inverse's fp16 products
    are outside the two counted paths)."""
    row = next(r for r in _breakdown("breakdown_h100.json") if r["case"] == case and r["arm"] == "ours")
    n, length = map(int, case.split()[1].split("x"))
    s = Shape(n, length, 16, 32)
    model = bytes_per_kernel(three_kernel_tensors(s))
    f = chunk_flops(128, 128)
    products = {"prepare": f["gram"] + f["w"] + f["u"], "scan": f["w_s"] + f["state"],
                "output": f["qk"] + f["q_s"] + f["attn_v"]}
    for k in row["counters"]["kernels"]:
        stage = k["name"].removeprefix("chunk_").removesuffix("_kernel")
        assert 0.90 < k["dram_mb"] * 1e6 / model[stage] < 1.0, stage
        assert k["tensor_ops_g"] * 1e9 == pytest.approx(s.NT * s.HV * products[stage], rel=1e-3)


@needs_data
@pytest.mark.parametrize("case", ["qwen3-next 8x1024", "qwen3-next 8x4096"])
def test_the_fused_count_is_what_flashinfers_fused_kernel_moves(case):
    """FlashInfer's one kernel per (sequence, head) at eight sequences moves within 6 % of the
    fused model's bytes (it reads q and k after its own L2-norm pass)."""
    row = next(r for r in _breakdown("breakdown_h100_flashinfer.json") if r["case"] == case)
    fused = next(k for k in row["counters"]["kernels"] if "FullyFused" in k["name"])
    n, length = map(int, case.split()[1].split("x"))
    assert 0.94 < fused["dram_mb"] * 1e6 / total_bytes(fused_tensors(Shape(n, length, 16, 32))) < 1.0


@needs_data
def test_the_committed_table_is_the_model():
    """data/benchmarks/fused_byte_model.json is what the model and the measured files give now
    (rerun ``python -m mamba_edu.lab.fused_bytes --out data/benchmarks/fused_byte_model.json``)."""
    committed = json.loads((DATA / "fused_byte_model.json").read_text())
    assert committed["meta"]["device"] == "model (no GPU)"
    assert committed["rows"] == json.loads(json.dumps(table()))
    assert {r["case"] for r in _breakdown("breakdown_h100_flashinfer.json")} == set(BREAKDOWN_CASES)
    for r in committed["rows"]:
        assert r["bytes_ratio"] > 3
        if r["breakdown"]:
            assert r["flashinfer_h100_ms"] is not None and r["ratio_to_flashinfer"] < 1
