"""The lab's sm_90 resource report (mamba_edu/lab/bench_sm90_resources.py): ptxas's lines read right,
launch arguments rebuilt with their layout, and one case compiled end to end on the CPU."""

import json
import subprocess
import sys

import pytest
import torch

from mamba_edu import triton_available
from mamba_edu.benchmarks.kernels import _stage_bytes
from mamba_edu.lab.bench_sm90_resources import (LOOP_CONFIGS, _describe, _rebuild, model_megabytes,
                                                parse_ptxas, scan_builds_wu_bytes)

PTXAS = ("ptxas info    : 0 bytes gmem\n"
         "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
         "ptxas info    : Function properties for k\n"
         "    {stack} bytes stack frame, {st} bytes spill stores, {ld} bytes spill loads\n"
         "ptxas info    : Used {regs} registers, used 1 barriers\n")


def test_ptxas_lines_are_read():
    assert parse_ptxas(PTXAS.format(stack=0, st=0, ld=0, regs=117)) == {
        "registers": 117, "spill_stores": 0, "spill_loads": 0}
    assert parse_ptxas(PTXAS.format(stack=2656, st=2656, ld=2684, regs=255)) == {
        "registers": 255, "spill_stores": 2656, "spill_loads": 2684}


@pytest.mark.parametrize("text", [
    "",                                                       # ptxas printed nothing (no -v)
    "ptxas info    : Used 10 registers, used 0 barriers\n",   # no spill line: not "no spills"
    "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n",  # no register line
    "ptxas fatal   : Unresolved extern function 'foo'\n",
])
def test_a_report_without_both_lines_is_refused(text):
    with pytest.raises(ValueError, match="no register or spill line"):
        parse_ptxas(text)


@pytest.mark.parametrize("T,N,H,HV", [(512, 1, 2, 8), (8192, 1, 16, 32), (8192, 8, 16, 32), (4096, 16, 2, 8)])
def test_the_variants_byte_model_differs_from_ours_by_w_u_against_t_and_beta(T, N, H, HV):
    """scan_builds_wu writes and reads T [NT, HV, 64, 64] and β [T, HV] fp32 where ours writes
    and reads W and U [T, HV, 128] (bf16); v's read moves from the preparation to the scan and the
    output kernel is the same one."""
    ours, variant = _stage_bytes(T, N, H, HV), scan_builds_wu_bytes(T, N, H, HV)
    NT = T // 64 + N
    w_u, t, beta = T * HV * 256 * 2, NT * HV * 64 * 64 * 2, T * HV * 4
    assert variant["output"] == ours["output"]
    assert ours["prepare"] - variant["prepare"] == w_u + T * HV * 128 * 2 - t - beta
    assert ours["scan"] - variant["scan"] == w_u - t - beta - T * HV * 128 * 2
    assert 0.75 < sum(variant.values()) / sum(ours.values()) < 0.85


def test_the_byte_model_per_arm_and_case():
    assert model_megabytes("qwen3-next 1x8192", "ours") == {
        k: v / 1e6 for k, v in _stage_bytes(8192, 1, 16, 32).items()}
    assert model_megabytes("qwen3.5-tp8 8x1024", "lab_scan_builds_wu") == {
        k: v / 1e6 for k, v in scan_builds_wu_bytes(8192, 8, 2, 8).items()}
    assert model_megabytes("qwen3-next 1x512", "lab_chunk_loop") == {}


def test_arguments_rebuild_with_their_layout():
    base = torch.zeros(10, 6, dtype=torch.float16)
    for view in (base, base[:, 2:5], base[1:].t(), base.view(-1)[1:]):
        rebuilt = _rebuild(_describe(view), bf16=False)
        assert (rebuilt.shape, rebuilt.stride(), rebuilt.storage_offset(), rebuilt.dtype) == (
            view.shape, view.stride(), view.storage_offset(), view.dtype)
        # alignment drives Triton's specialisation: an odd offset must stay odd
        assert (rebuilt.data_ptr() % 16 == 0) == (view.data_ptr() % 16 == 0)
    assert _rebuild(_describe(base), bf16=True).dtype == torch.bfloat16
    assert _rebuild(_describe(base.float()), bf16=True).dtype == torch.float32  # fp32 stays
    assert _rebuild(_describe(None), bf16=True) is None and _rebuild(_describe(7), bf16=True) == 7


@pytest.mark.extra  # compiles the lab's kernels for sm_90 with ptxas
@pytest.mark.skipif(not triton_available() or sys.platform != "linux",
                    reason="needs Triton on Linux (its compiler and ptxas)")
def test_one_case_compiles_for_sm90(tmp_path):
    out = tmp_path / "r.json"
    subprocess.run([sys.executable, "-m", "mamba_edu.lab.bench_sm90_resources", "--case", "qwen3.5-tp8 1x512",
                    "--out", str(out)], check=True, capture_output=True, timeout=600)
    d = json.loads(out.read_text())
    assert {"commit", "date", "device", "torch", "triton", "ptxas"} <= set(d["meta"])
    kernels = [(r["arm"], r["kernel"]) for r in d["rows"]]
    variant = "lab_scan_builds_wu"
    assert kernels == [("ours", "chunk_prepare_kernel"), ("ours", "chunk_scan_kernel"),
                       ("ours", "chunk_output_kernel"), (variant, "prepare_t_kernel"),
                       (variant, "scan_t_kernel"), (variant, "chunk_output_kernel"),
                       ("lab_chunk_loop", "chunk_loop_kernel")] + [
        (f"lab_chunk_loop BV={bv} warps={w}", "chunk_loop_kernel") for bv, w in LOOP_CONFIGS]
    model = {(r["arm"], r["kernel"]): r["model_mb"] for r in d["rows"][:6]}
    assert model == {(arm, kernel): mb for arm in ("ours", variant)
                     for kernel, mb in zip([k for a, k in kernels[:6] if a == arm],
                                           model_megabytes("qwen3.5-tp8 1x512", arm).values())}
    assert all(r["model_mb"] is None for r in d["rows"][6:])  # the chunk loop has no byte model
    for r, (bv, w) in zip(d["rows"][7:], LOOP_CONFIGS):  # the tiling asked for is the one compiled
        assert r["num_warps"] == w and r["grid"][0] == 128 // bv
    for r in d["rows"]:
        assert 1 <= r["registers"] <= 255 and r["shared_bytes"] > 0 and r["num_warps"] >= 1
        assert r["register_limited_programs_per_sm"] == 65536 // (r["registers"] * 32 * r["num_warps"])
        assert r["shared_limited_programs_per_sm"] == 228 * 1024 // (r["shared_bytes"] + 1024)
