"""The lab's norms and SwiGLU in the prologue of the projections (mamba_edu/lab/prologue_norms.py):
the package's logits and pools through an engine, on the CPU in the interpreter and in bf16 on a
GPU, the launches it promises, and the model as it was afterwards."""

import pytest
import torch
import torch.nn.functional as F

from mamba_edu import triton_interpreted
from mamba_edu.engine import Engine, Request
from mamba_edu.kernels.fused_ops import silu_mul
from mamba_edu.lab import prologue_norms as lab
from mamba_edu.model import build_model, hybrid, layers
from mamba_edu.testing import rel_err

interpreted = pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")
GEN = torch.Generator().manual_seed(11)
PROMPTS = [torch.randint(0, 128, (n,), generator=GEN).tolist() for n in (150, 70)]
PLAIN_FORWARD = hybrid.HybridLayer.forward


def _prefill(model):
    """Logits of two prefills (the second a prefix hit of the first's tracked states) and of two
    decode steps, and the pool."""
    engine = Engine(model, strategy="fused", max_requests=4, track_interval=64)
    first = engine.prefill([Request("a", PROMPTS[0]), Request("b", PROMPTS[1])]).logits
    second = engine.prefill([Request("c", PROMPTS[0][:128] + PROMPTS[1][:30])]).logits
    steps = engine.decode(2).logits.flatten(0, 1)
    return torch.cat([first, second, steps]).float(), engine.pool.ssm.clone()


FORWARDS = 4  # two prefills, two decode steps


def _restored(model):
    assert (hybrid.HybridLayer.forward, layers.F, layers.silu_mul) == (PLAIN_FORWARD, F, silu_mul)
    assert all("fused_add_norm" not in vars(norm) for layer in model.layers
               for norm in (layer.mixer_norm, layer.mlp_norm))


@pytest.mark.parametrize("device, dtype, tol", [
    pytest.param("cpu", torch.float32, 1e-5, marks=interpreted),
    pytest.param("cuda", torch.bfloat16, 2e-2, marks=pytest.mark.gpu)])
def test_prologue_norms_give_the_packages_forward(device, dtype, tol):
    """Logits and SSM states within the dtype's tolerance of the package's (the norm is applied
    to the GEMM's accumulator, not to rounded rows: not bit for bit); three lab launches per
    layer and forward but the first layer's mixer norm (no residual to add yet); the model's
    methods restored after."""
    model = build_model("tiny", device=device, dtype=dtype)
    logits, ssm = _prefill(model)
    launches = lab._KERNEL.launches
    with lab.prologue_norms():
        logits2, ssm2 = _prefill(model)
    assert lab._KERNEL.launches - launches == FORWARDS * (3 * len(model.layers) - 1)
    assert rel_err(logits2, logits) <= tol and rel_err(ssm2, ssm) <= tol
    _restored(model)
    assert torch.equal(_prefill(model)[0], logits)


@interpreted
def test_the_model_is_restored_after_an_error():
    model = build_model("tiny", device="cpu")
    with pytest.raises(RuntimeError, match="inside"), lab.prologue_norms():
        _prefill(model)
        raise RuntimeError("inside")
    _restored(model)
