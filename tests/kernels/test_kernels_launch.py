"""The unchecked entry points (:mod:`mamba_edu.kernels.launch`) against the checked API: the same
results on random inputs, no checks on the way, and the checked API still refusing bad input."""

import pytest
import torch

from mamba_edu import triton_interpreted
from mamba_edu.kernels import (build_chunk_meta_with_indices, conv1d_decode, conv1d_prefill,
                               gdn_decode, gdn_prefill, launch, validation)
from mamba_edu.kernels.inputs import random_pool, random_prefill_inputs

IMPLS = [pytest.param("triton", marks=pytest.mark.skipif(
    not triton_interpreted(), reason="Triton on CPU tensors needs TRITON_INTERPRET=1")), "torch"]
LENGTHS = [70, 1, 130]
H, HV, K, V, W = 1, 2, 16, 32, 4


def _batch(seed):
    """A random batch as the engine holds it: raw gate projections, an output norm, the meta and
    uploaded indices (row 1 padded, rows 0 and 2 tracked), pools and conv weights."""
    gen = torch.Generator().manual_seed(seed)
    T, N = sum(LENGTHS), len(LENGTHS)
    x = random_prefill_inputs(LENGTHS, H, HV, K, V, seed=seed)
    raw = dict(a=x.pop("g"), b=x.pop("beta"), A_log=torch.rand(HV, generator=gen) * 2,
               dt_bias=torch.randn(HV, generator=gen))
    norm = (torch.randn(T, HV * V, generator=gen), torch.rand(V, generator=gen), 1e-6)
    meta, idx = build_chunk_meta_with_indices(LENGTHS, "cpu", state_indices=[0, -1, 2],
                                              track_slots=[3, -1, 4], track_chunks=[1, -1, 3])
    D = 2 * H * K + HV * V
    conv = dict(x=torch.randn(T, D, generator=gen), weight=torch.randn(D, W, generator=gen),
                bias=torch.randn(D, generator=gen))
    pools = (random_pool(2 * N, HV, K, V, seed=seed), torch.randn(2 * N, D, W - 1, generator=gen))
    return x, raw, norm, meta, idx, conv, pools


def _same(a, b):
    for got, want in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        assert (got is None and want is None) or torch.equal(got, want)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seed", [0, 1])
def test_unchecked_prefill_equals_checked(impl, seed):
    """Bit for bit: the checked function is its checks followed by the unchecked one."""
    runs = []
    for fns in ((conv1d_prefill, gdn_prefill), (launch.conv1d_prefill, launch.gdn_prefill)):
        x, raw, norm, meta, idx, conv, (ssm_pool, conv_pool) = _batch(seed)
        y = fns[0](conv.pop("x"), **conv, conv_pool=conv_pool, meta=meta, impl=impl, **idx)
        o, ckpt = fns[1](**x, **raw, state_pool=ssm_pool, meta=meta, output_norm=norm,
                         output_checkpoints=True, impl=impl, **idx)
        runs.append((y, o, ckpt, ssm_pool, conv_pool))
    _same(runs[0], runs[1])


@pytest.mark.parametrize("impl", IMPLS)
def test_unchecked_decode_equals_checked(impl):
    gen = torch.Generator().manual_seed(3)
    N, D = 3, 2 * H * K + HV * V
    q, k = (torch.randn(N, H, K, generator=gen) for _ in range(2))
    v = torch.randn(N, HV, V, generator=gen)
    a, b = (torch.randn(N, HV, generator=gen) for _ in range(2))
    A_log, dt_bias = torch.rand(HV, generator=gen), torch.randn(HV, generator=gen)
    x, weight = torch.randn(N, D, generator=gen), torch.randn(D, W, generator=gen)
    _, idx = build_chunk_meta_with_indices([1] * N, "cpu", state_indices=[2, -1, 0])
    runs = []
    for conv_fn, gdn_fn in ((conv1d_decode, gdn_decode), (launch.conv1d_decode, launch.gdn_decode)):
        ssm_pool, conv_pool = random_pool(4, HV, K, V), torch.ones(4, D, W - 1)
        y = conv_fn(x, weight, conv_pool=conv_pool, impl=impl, **idx)
        o = gdn_fn(q, k, v, a, b, A_log, dt_bias, state_pool=ssm_pool, impl=impl, **idx)
        runs.append((y, o, ssm_pool, conv_pool))
    _same(runs[0], runs[1])


def test_unchecked_path_runs_no_checks(monkeypatch):
    """The engine's per-layer calls check nothing; a direct call checks its indices once."""
    calls = []
    for name in ("slot_indices", "track_indices", "check_tensor", "check_meta"):
        real = getattr(validation, name)
        monkeypatch.setattr(validation, name, lambda *a, _real=real, _name=name, **kw:
                            calls.append(_name) or _real(*a, **kw))
    x, raw, norm, meta, idx, conv, (ssm_pool, conv_pool) = _batch(0)
    launch.conv1d_prefill(conv.pop("x"), **conv, conv_pool=conv_pool, meta=meta, **idx)
    launch.gdn_prefill(**x, **raw, state_pool=ssm_pool, meta=meta, output_norm=norm, **idx)
    assert calls == []


@pytest.mark.parametrize("bad, match", [
    (dict(impl="cuda"), "impl must be"),
    (dict(state_indices=[0, 1, 9]), "out of range"),
    (dict(state_indices=[0, 0, 2]), "must not repeat"),
    (dict(track_chunks=[1, -1, 9]), "track_chunks"),
    (dict(track_slots=[0, -1, 4]), "track_slots"),
    (dict(scale=-1.0), "scale"),
])
def test_the_checked_api_still_refuses_bad_input(bad, match):
    x, raw, norm, meta, idx, conv, (ssm_pool, conv_pool) = _batch(0)
    with pytest.raises(ValueError, match=match):
        gdn_prefill(**x, **raw, state_pool=ssm_pool, meta=meta, **{**idx, **bad})
    if "scale" not in bad:
        with pytest.raises(ValueError, match=match):
            conv1d_prefill(conv.pop("x"), **conv, conv_pool=conv_pool, meta=meta, **{**idx, **bad})


def test_backend_is_no_longer_a_kernel_argument():
    """``impl=`` picks Triton or torch; ``backend`` means the serving backend only."""
    x, raw, norm, meta, idx, conv, (ssm_pool, _) = _batch(0)
    with pytest.raises(TypeError, match="backend"):
        gdn_prefill(**x, **raw, state_pool=ssm_pool, meta=meta, backend="torch", **idx)
