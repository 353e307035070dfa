"""Programmatic dependent launch (kernels/launch.py): never on a CPU; on a Hopper GPU the same
bits as plain launches, eager and in a CUDA graph, with the prefill as three kernels or as one
launch (kernels/chained.py)."""

import pytest
import torch

from mamba_edu.kernels import build_chunk_meta, conv1d_prefill, gdn_prefill
from mamba_edu.kernels.chained import forced_chained
from mamba_edu.kernels.fused_ops import gated_rms_norm, silu_mul
from mamba_edu.kernels.inputs import random_pool, random_prefill_inputs
from mamba_edu.kernels.launch import pdl_options, programmatic_launch


def test_switches_come_back_after_their_block():
    """The benchmark's and tests' switches (PDL, one launch, output path, prologue GEMMs) hold
    inside their ``with`` block only, and come back after an exception too."""
    from mamba_edu.kernels import chained, launch, prefill, prologue_linear

    def switches():
        return (launch.ENABLED, chained.ONE_LAUNCH, prefill.OUTPUT_IN_SCAN,
                prologue_linear.PROLOGUE_GEMMS)

    before = switches()
    with pytest.raises(RuntimeError):
        with programmatic_launch(not before[0]), forced_chained(not before[1]), \
                prefill.forced_output_path(not before[2]), \
                prologue_linear.forced_prologue_gemms(not before[3]):
            assert switches() == tuple(not x for x in before)
            raise RuntimeError
    assert switches() == before


def test_pdl_is_never_used_on_a_cpu():
    with programmatic_launch(True):
        assert pdl_options(torch.device("cpu")) == {"USE_PDL": False}


def _layer_chain(lengths, H=2, HV=4, K=64, V=64, W=4):
    """conv → prefill (fused tracking) → gated norm → SwiGLU on one GDN layer's shapes; returns
    ``run(graph) -> (outputs, conv_pool, ssm_pool)`` from the same starting pools every call."""
    N, D = len(lengths), 2 * H * K + HV * V
    x = random_prefill_inputs(lengths, H, HV, K, V, dtype=torch.bfloat16, device="cuda")
    gen = torch.Generator().manual_seed(5)
    T = sum(lengths)
    mixed = torch.randn(T, D, generator=gen).cuda().bfloat16()
    weight = torch.randn(D, W, generator=gen).cuda().bfloat16()
    z = torch.randn(T, HV * V, generator=gen).cuda().bfloat16()
    conv0 = torch.randn(2 * N, D, W - 1, generator=gen).cuda().bfloat16()
    ssm0 = random_pool(2 * N, HV, K, V, device="cuda")
    meta = build_chunk_meta(lengths, "cuda", state_indices=list(range(N)),
                            track_slots=list(range(N, 2 * N)), track_chunks=[1] * N)
    conv_pool, ssm_pool = conv0.clone(), ssm0.clone()

    def forward():
        y = conv1d_prefill(mixed, weight, conv_pool=conv_pool, meta=meta)
        q, k, v = y.split([H * K, H * K, HV * V], dim=-1)
        o, _ = gdn_prefill(q.view(T, H, K), k.view(T, H, K), v.view(T, HV, V), x["g"], x["beta"],
                           state_pool=ssm_pool, meta=meta)
        normed = gated_rms_norm(o, z, torch.ones(V, device="cuda", dtype=o.dtype), 1e-6)
        return y, o, silu_mul(normed.view(T, -1))

    def run(graph):
        conv_pool.copy_(conv0)
        ssm_pool.copy_(ssm0)
        if not graph:
            outs = forward()
        else:
            forward()  # compile and autotune outside the capture
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                outs = forward()
            conv_pool.copy_(conv0)
            ssm_pool.copy_(ssm0)
            g.replay()
        torch.cuda.synchronize()
        return [t.clone() for t in (*outs, conv_pool, ssm_pool)]
    return run


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("one_launch", [False, True])
def test_pdl_launches_give_the_same_bits(graph, one_launch):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs a Hopper GPU")
    run = _layer_chain([64, 200, 1, 130])
    with forced_chained(one_launch), programmatic_launch(False):
        plain = run(graph)
    with forced_chained(one_launch), programmatic_launch(True):
        assert pdl_options(torch.device("cuda"))["USE_PDL"]
        pdl = run(graph)
    for a, b in zip(plain, pdl):
        assert torch.equal(a, b)
