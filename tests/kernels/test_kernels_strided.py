"""The kernels read column slices of one projection in place, and the prefill computes the gating.

The serving path hands the kernels views: the conv input and the gates ``a, b`` are columns of the
in-projection, q/k/v are columns of the conv output. Every result must equal the same call on
contiguous copies (with the gating done by :func:`gdn_gating` first), and nothing outside the
owned pool slots may change.
"""

import pytest
import torch

from mamba_edu import triton_interpreted
from mamba_edu.gdn import gdn_gating
from mamba_edu.kernels import build_chunk_meta, build_chunk_meta_with_indices, conv1d_decode, conv1d_prefill, gdn_decode, gdn_prefill
from mamba_edu.kernels.inputs import random_pool
from mamba_edu.testing import rel_err

IMPLS = [pytest.param("triton", marks=pytest.mark.skipif(
    not triton_interpreted(), reason="Triton on CPU tensors needs TRITON_INTERPRET=1")), "torch"]
H, HV, K, V = 2, 4, 16, 32


def _projection(T, seed, device="cpu", dtype=torch.float32, dims=(H, HV, K, V)):
    """``[T, 2HK + HV·V + 2HV + 3]`` (3 spare columns, so no slice is at the row's end) and its
    column views ``q, k [T, H, K]``, ``v [T, HV, V]``, ``a, b [T, HV]``, plus ``A_log, dt_bias``."""
    H, HV, K, V = dims
    gen = torch.Generator().manual_seed(seed)
    widths = [H * K, H * K, HV * V, HV, HV, 3]
    proj = torch.randn(T, sum(widths), generator=gen)
    # Scale a so that some a + dt_bias cross softplus's threshold of 20.
    proj[:, sum(widths[:3]):sum(widths[:4])] *= 12
    q, k, v, a, b, _ = proj.to(device, dtype).split(widths, dim=-1)
    views = dict(q=q.view(T, H, K), k=k.view(T, H, K), v=v.view(T, HV, V), a=a, b=b)
    A_log = torch.empty(HV).uniform_(0.0, 2.77, generator=gen)
    dt_bias = torch.randn(HV, generator=gen)
    return views, A_log.to(device), dt_bias.to(device)


@pytest.mark.parametrize("impl", IMPLS)
def test_prefill_on_views_with_gating_inside(impl):
    lengths, slots = [1, 64, 90], [4, 0, 2]
    views, A_log, dt_bias = _projection(sum(lengths), seed=0)
    assert not views["q"].is_contiguous() and not views["a"].is_contiguous()
    meta, idx = build_chunk_meta_with_indices(lengths, "cpu", state_indices=slots)
    pool = random_pool(6, HV, K, V)
    pool_ref = pool.clone()

    o, _ = gdn_prefill(**views, A_log=A_log, dt_bias=dt_bias, state_pool=pool, meta=meta, **idx,
                       impl=impl)
    g, beta = gdn_gating(A_log, views["a"], views["b"], dt_bias)
    copies = {name: views[name].contiguous() for name in "qkv"}
    o_ref, _ = gdn_prefill(**copies, g=g, beta=beta, state_pool=pool_ref, meta=meta, **idx,
                           impl="torch")
    assert rel_err(o, o_ref) <= 1e-4
    assert rel_err(pool[slots], pool_ref[slots]) <= 1e-4
    assert torch.equal(pool[[1, 3, 5]], pool_ref[[1, 3, 5]])


@pytest.mark.parametrize("impl", IMPLS)
def test_decode_on_views(impl):
    slots = [3, -1, 0]
    views, A_log, dt_bias = _projection(3, seed=1)
    pool = random_pool(5, HV, K, V)
    pool_ref = pool.clone()
    o = gdn_decode(*views.values(), A_log, dt_bias, state_pool=pool,
                   state_indices=torch.tensor(slots), impl=impl)
    copies = [t.contiguous() for t in views.values()]
    o_ref = gdn_decode(*copies, A_log, dt_bias, state_pool=pool_ref,
                       state_indices=torch.tensor(slots), impl="torch")
    assert rel_err(o, o_ref) <= 1e-4
    assert rel_err(pool, pool_ref) <= 1e-4


@pytest.mark.parametrize("impl", IMPLS)
def test_conv_on_column_slices(impl):
    lengths, slots, D, W = [2, 70], [1, 3], 24, 4
    gen = torch.Generator().manual_seed(2)
    wide = torch.randn(sum(lengths), D + 5, generator=gen)
    x = wide[:, 2:2 + D]  # neither the first nor the last columns
    weight, bias = torch.randn(D, W, generator=gen), torch.randn(D, generator=gen)
    pool = torch.randn(4, D, W - 1, generator=gen)
    pool_ref = pool.clone()
    meta, idx = build_chunk_meta_with_indices(lengths, "cpu", state_indices=slots)
    y = conv1d_prefill(x, weight, bias, conv_pool=pool, meta=meta, **idx, impl=impl)
    y_ref = conv1d_prefill(x.contiguous(), weight, bias, conv_pool=pool_ref, meta=meta, **idx,
                           impl="torch")
    assert y.is_contiguous() and rel_err(y, y_ref) <= 1e-5
    assert rel_err(pool, pool_ref) <= 1e-5

    step = wide[:2, 2:2 + D]
    y = conv1d_decode(step, weight, bias, conv_pool=pool, state_indices=torch.tensor(slots),
                      impl=impl)
    y_ref = conv1d_decode(step.contiguous(), weight, bias, conv_pool=pool_ref,
                          state_indices=torch.tensor(slots), impl="torch")
    assert rel_err(y, y_ref) <= 1e-5
    assert rel_err(pool, pool_ref) <= 1e-5


def test_gates_are_given_one_way():
    lengths = [10]
    views, A_log, dt_bias = _projection(10, seed=3)
    q, k, v = views["q"], views["k"], views["v"]
    meta, idx = build_chunk_meta_with_indices(lengths, "cpu", state_indices=[0])
    pool = random_pool(1, HV, K, V)
    g, beta = gdn_gating(A_log, views["a"], views["b"], dt_bias)
    call = dict(state_pool=pool, meta=meta, **idx, impl="torch")
    with pytest.raises(ValueError, match="not both"):
        gdn_prefill(q, k, v, g, beta, a=views["a"], b=views["b"], A_log=A_log, dt_bias=dt_bias,
                    **call)
    with pytest.raises(ValueError, match=r"missing \['dt_bias'\]"):
        gdn_prefill(q, k, v, a=views["a"], b=views["b"], A_log=A_log, **call)
    with pytest.raises(ValueError, match="g and beta are required"):
        gdn_prefill(q, k, v, g, **call)
    with pytest.raises(ValueError, match=r"A_log must have shape \[4\]"):
        gdn_prefill(q, k, v, a=views["a"], b=views["b"], A_log=A_log[:2], dt_bias=dt_bias, **call)
    torch.testing.assert_close(pool, random_pool(1, HV, K, V))  # nothing ran


def test_rows_must_be_contiguous_inside():
    """A row-strided view is fine; a view whose rows are not contiguous is refused by name."""
    views, A_log, dt_bias = _projection(10, seed=4)
    meta, idx = build_chunk_meta_with_indices([10], "cpu", state_indices=[0])
    pool = random_pool(1, HV, K, V)
    every_other = views["v"].transpose(1, 2).contiguous().transpose(1, 2)  # [T, HV, V], V strided
    with pytest.raises(ValueError, match="v must be contiguous within each row"):
        gdn_prefill(views["q"], views["k"], every_other, a=views["a"], b=views["b"], A_log=A_log,
                    dt_bias=dt_bias, state_pool=pool, meta=meta, **idx, impl="torch")
    overlapping = views["a"][:, :1].expand(10, HV)  # row stride 0 < HV
    with pytest.raises(ValueError, match="a must be contiguous within each row"):
        gdn_prefill(views["q"], views["k"], views["v"], a=overlapping, b=views["b"], A_log=A_log,
                    dt_bias=dt_bias, state_pool=pool, meta=meta, **idx, impl="torch")


@pytest.mark.gpu
@pytest.mark.parametrize("gating_inside", [True, False])
@pytest.mark.parametrize("dims", [(2, 4, 16, 32), (2, 4, 32, 32), (2, 4, 128, 128)])
def test_prefill_on_views_gpu_bf16(dims, gating_inside):
    """The serving call on the GPU: bf16 views of one projection, the gating inside the kernel or
    done first, against the fp32 torch path on contiguous copies (bf16 tolerance, docs/conventions.md)."""
    lengths, slots = [100, 1, 300], [1, 2, 0]
    views, A_log, dt_bias = _projection(sum(lengths), seed=5, device="cuda", dtype=torch.bfloat16,
                                        dims=dims)
    pool = random_pool(4, *dims[1:], device="cuda")
    pool_ref = pool.clone()
    g, beta = gdn_gating(A_log, views["a"], views["b"], dt_bias)
    gates = dict(a=views["a"], b=views["b"], A_log=A_log, dt_bias=dt_bias) if gating_inside else \
        dict(g=g, beta=beta)
    o, _ = gdn_prefill(views["q"], views["k"], views["v"], **gates, state_pool=pool,
                       meta=build_chunk_meta(lengths, "cuda"), state_indices=slots)
    o_ref, _ = gdn_prefill(**{n: views[n].float().contiguous() for n in "qkv"}, g=g, beta=beta,
                           state_pool=pool_ref, impl="torch",
                           meta=build_chunk_meta(lengths, "cuda"), state_indices=slots)
    assert rel_err(o.float(), o_ref) <= 5e-3
    assert rel_err(pool[slots], pool_ref[slots]) <= 5e-3
    assert torch.equal(pool[3], pool_ref[3])


def test_head_dims_above_the_register_budget_are_refused():
    from mamba_edu.kernels.validation import check_head_dims
    check_head_dims(16, 32)
    with pytest.raises(ValueError, match="K=512 is too large"):
        check_head_dims(512, 128)
