"""The lab's reused intermediates (mamba_edu/lab/workspace.py): forwards through one workspace
give the package's bits, layer after layer and forward after forward, and leave the package's
allocations as they were."""

import pytest
import torch

from mamba_edu import triton_interpreted
from mamba_edu.kernels import build_chunk_meta_with_indices
from mamba_edu.kernels.inputs import random_pool, random_prefill_inputs
from mamba_edu.kernels.prefill import prefill_triton, prepare, scan
from mamba_edu.lab.workspace import reused_intermediates

interpreted = pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")


def _layers(lengths, checkpoints, device="cpu", dtype=torch.float16, n_layers=3):
    """``n_layers`` prefills of one batch, each with its own inputs and pool (a forward's GDN
    layers): their outputs, checkpoints and pools."""
    N = len(lengths)
    meta, idx = build_chunk_meta_with_indices(lengths, device, state_indices=list(range(N)),
                                              track_slots=list(range(N, 2 * N)), track_chunks=[0] * N)
    out = []
    for layer in range(n_layers):
        x = random_prefill_inputs(lengths, 2, 4, 16, 32, dtype=dtype, device=device, seed=layer)
        pool = random_pool(2 * N + 1, 4, 16, 32, device=device, seed=layer)
        o, ckpt = prefill_triton(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, idx["state_indices"],
                                 meta, 0.25, True, checkpoints, idx["track_slots"], idx["track_chunks"])
        out += [o, pool] + ([ckpt] if checkpoints else [])
    return out


@pytest.mark.parametrize("device, dtype", [
    pytest.param("cpu", torch.float16, marks=interpreted),
    pytest.param("cuda", torch.bfloat16, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("checkpoints", [False, True])
def test_reused_intermediates_give_the_packages_bits(checkpoints, device, dtype):
    """Layer after layer and batch after batch (a longer one between), with fp32 checkpoints (Ṽ
    alone reused) and without (all six): every output, checkpoint and pool slot equals the
    package's, and the later layers really got the first one's tensors back."""
    batches = [[70, 1, 130], [200], [70, 1, 130]]
    plain = [_layers(b, checkpoints, device, dtype) for b in batches]
    with reused_intermediates() as ws:
        reused = [_layers(b, checkpoints, device, dtype) for b in batches]
    assert ws.allocations == 4 and ws.reuses == 3 * 3 * 2 - 4
    for x, y in zip(sum(plain, []), sum(reused, [])):
        assert torch.equal(x, y)


def test_a_new_shape_or_dtype_gets_new_tensors_and_the_allocators_come_back():
    """The key holds everything the tensors' shapes and dtypes come from: a longer batch or
    another dtype never gets tensors of the wrong size; on exit, even by an error, the
    package's allocators are back."""
    plain_prepare, plain_scan = prepare.prepare_outputs, scan.scan_outputs
    k, v = torch.zeros(64, 1, 16), torch.zeros(64, 2, 32)
    with pytest.raises(RuntimeError, match="inside"), reused_intermediates() as ws:
        first = prepare.prepare_outputs(k, v)
        assert prepare.prepare_outputs(k, v)[2] is first[2]
        longer = prepare.prepare_outputs(torch.zeros(128, 1, 16), torch.zeros(128, 2, 32))
        halves = prepare.prepare_outputs(k, v.half())
        assert longer[2].shape[0] == 128 and halves[2].dtype == torch.float16 and ws.allocations == 3
        v_new, h = scan.scan_outputs(first[3], 1, 16)
        ckpt = torch.zeros(1, 2, 16, 32)
        v_new2, h2 = scan.scan_outputs(first[3], 1, 16, ckpt)
        assert h2 is ckpt and h is not ckpt and v_new2 is not v_new and h.shape == (1, 2, 16, 32)
        raise RuntimeError("inside")
    assert (prepare.prepare_outputs, scan.scan_outputs) == (plain_prepare, plain_scan)
