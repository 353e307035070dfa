"""Chunk metadata on the host, and bad inputs rejected with a ValueError naming the argument."""

import pytest
import torch

from mamba_edu.kernels import (build_chunk_meta, build_chunk_meta_with_indices, conv1d_decode,
                               conv1d_prefill, gdn_decode, gdn_prefill, host_values, upload_indices)
from mamba_edu import triton_interpreted
from mamba_edu.kernels.inputs import random_pool, random_prefill_inputs


def test_chunk_meta_tables():
    meta, idx = build_chunk_meta_with_indices([1, 64, 65], "cpu", state_indices=[2, 0, 1])
    assert meta.counts == (1, 1, 2) and meta.offsets == (0, 1, 2, 4)
    assert (meta.N, meta.T, meta.NT) == (3, 130, 4)
    assert meta.cu_seqlens.tolist() == [0, 1, 65, 130]
    assert meta.chunk_indices.tolist() == [[0, 0], [1, 0], [2, 0], [2, 1]]
    assert meta.chunk_offsets.tolist() == [0, 1, 2, 4]
    # one buffer, one copy: every table is a view of the same storage
    base = meta.cu_seqlens.untyped_storage().data_ptr()
    for t in (meta.chunk_indices, meta.chunk_offsets, idx["state_indices"]):
        assert t.untyped_storage().data_ptr() == base
    assert host_values(idx["state_indices"]) == (2, 0, 1)
    assert not hasattr(meta, "state_indices") and not hasattr(meta, "verdicts"), "the layout only"


def test_uploaded_indices_remember_host_values():
    t = upload_indices([5, -1, 2], "cpu")
    assert t.dtype == torch.int32 and t.tolist() == [5, -1, 2]
    assert host_values(t) == (5, -1, 2)


@pytest.mark.parametrize("field", ["state_indices", "track_slots", "track_chunks", "cu_seqlens",
                                   "chunk_indices"])
def test_meta_changed_in_place_after_build_chunk_meta_is_refused(field):
    """B6: the checks read the host lists the meta and its indices were built from; a tensor
    written in place afterwards (even after a first layer passed) is refused before any state
    changes."""
    x = random_prefill_inputs(LENGTHS, 1, 2, 16, 16, seed=0)
    meta, idx = build_chunk_meta_with_indices(LENGTHS, "cpu", state_indices=[1, 0], track_slots=[2, 3],
                                              track_chunks=[1, 2])
    pool = random_pool(4, 2, 16, 16)
    gdn_prefill(**x, state_pool=pool, meta=meta, **idx, impl="torch")
    before = pool.clone()
    (idx[field] if field in idx else getattr(meta, field)).view(-1)[0] = 3
    for impl in ("torch", "triton") if triton_interpreted() else ("torch",):
        with pytest.raises(ValueError, match="was changed in place after"):
            gdn_prefill(**x, state_pool=pool, meta=meta, **idx, impl=impl)
        with pytest.raises(ValueError, match="was changed in place"):
            conv1d_prefill(torch.zeros(sum(LENGTHS), 8), torch.zeros(8, 4),
                           conv_pool=torch.zeros(4, 8, 3), meta=meta, **idx, impl=impl)
    assert torch.equal(pool, before)


@pytest.mark.parametrize("write", ["data", "numpy"])
def test_writes_around_the_version_counter_never_reach_a_kernel(write):
    """Writing an uploaded index tensor through ``.data`` or ``.numpy()`` bumps no version
    counter; the kernels read their private copy of the checked values, so nothing changes."""
    x = random_prefill_inputs(LENGTHS, 1, 2, 16, 16, seed=0)
    meta, idx = build_chunk_meta_with_indices(LENGTHS, "cpu", state_indices=[1, 0])
    pool = random_pool(4, 2, 16, 16)
    expected = pool.clone()
    gdn_prefill(**x, state_pool=expected, meta=meta, state_indices=[1, 0], impl="torch")
    for t in (idx["state_indices"], meta.chunk_indices, meta.cu_seqlens):
        if write == "data":
            t.data.fill_(1000)
        else:
            t.numpy()[...] = 1000
    for impl in ("torch", "triton") if triton_interpreted() else ("torch",):
        out = pool.clone()
        gdn_prefill(**x, state_pool=out, meta=meta, **idx, impl=impl)
        assert torch.allclose(out, expected, atol=2e-3), impl


def test_uploaded_indices_changed_in_place_are_refused():
    t = upload_indices([0, 1], "cpu")
    t[1] = 7
    with pytest.raises(ValueError, match="state_indices was changed in place"):
        conv1d_decode(torch.zeros(2, 8), torch.zeros(8, 4), conv_pool=torch.zeros(3, 8, 3),
                      state_indices=t)
    assert torch.equal(t, torch.tensor([0, 7], dtype=torch.int32))  # plain tensors: read as they are
    assert host_values(torch.tensor([0, 7])) == (0, 7)


def test_chunk_meta_rejects_bad_lengths():
    with pytest.raises(ValueError, match="lengths"):
        build_chunk_meta([3, 0], "cpu")
    with pytest.raises(ValueError, match="state_indices"):
        build_chunk_meta_with_indices([3, 4], "cpu", state_indices=[1])
    with pytest.raises(TypeError):
        build_chunk_meta([3, 4], "cpu", state_indices=[1, 0])  # the layout only: slots go to the kernels
    assert build_chunk_meta((n for n in [3, 4]), "cpu").lengths == (3, 4), "an iterable is read once"


LENGTHS = [5, 70]


@pytest.fixture
def case():
    inputs = random_prefill_inputs(LENGTHS, 1, 2, 16, 16)
    pool = random_pool(4, 2, 16, 16)
    meta = build_chunk_meta(LENGTHS, "cpu")
    return inputs, pool, meta


def _call(inputs, pool, meta, **over):
    return gdn_prefill(**{**inputs, "state_pool": pool, "meta": meta, "state_indices": [0, 1],
                          "impl": "torch", **over})


@pytest.mark.parametrize("name, value, message", [
    ("k", torch.zeros(75, 1, 8), "k must have shape"),
    ("v", torch.zeros(75, 2, 16, dtype=torch.float16), "v must have dtype"),
    ("g", torch.zeros(75, 3), "g must have shape"),
    ("beta", torch.zeros(75, 2, dtype=torch.float64), "beta must have dtype"),
    ("q", torch.zeros(16, 75, 1).transpose(0, 2), "q must be contiguous"),
    ("state_pool", torch.zeros(4, 2, 16, 16, dtype=torch.float16), "state_pool must have dtype"),
    ("state_pool", torch.zeros(4, 2, 8, 16), "state_pool must have shape"),
    ("state_indices", torch.tensor([0, 4]), r"state_indices\[1\]=4 is out of range"),
    ("state_indices", torch.tensor([1, 1]), "must not repeat"),
    ("state_indices", torch.tensor([0, 1, 2]), "state_indices must have shape"),
    ("state_indices", torch.tensor([0.0, 1.0]), "state_indices must have dtype"),
    ("meta", build_chunk_meta([75], "cpu"), "state_indices must be a list of N=1"),
    ("meta", build_chunk_meta([5, 71], "cpu"), "meta describes T=76"),
    ("impl", "cuda", "impl must be"),
    ("scale", torch.tensor(0.5), "scale must be a Python float"),
])
def test_prefill_rejects(case, name, value, message):
    inputs, pool, meta = case
    over = {name: value}
    with pytest.raises(ValueError, match=message):
        _call(inputs, pool, **{"meta": meta, **over})


def _norm(z=None, weight=None, eps=1e-6):
    """An ``output_norm`` for the case (T = 75, HV = 2, V = 16), with good defaults."""
    return (torch.zeros(75, 32) if z is None else z, torch.ones(16) if weight is None else weight,
            eps)


@pytest.mark.parametrize("output_norm, message", [
    (_norm(z=torch.zeros(75, 31)), r"output_norm z must have shape \[75, 32\]"),
    (_norm(z=torch.zeros(75, 32, dtype=torch.float16)), "output_norm z must have dtype"),
    (_norm(z=torch.zeros(75, 32, device="meta")), "output_norm z must be on cpu"),
    (_norm(z=torch.zeros(32, 75).t()), "output_norm z must be contiguous within each row"),
    (_norm(weight=torch.ones(15)), r"output_norm weight must have shape \[16\]"),
    (_norm(weight=torch.ones(16, dtype=torch.float16)), "output_norm weight must have dtype"),
    (_norm(eps=-1e-6), "output_norm eps must be a non-negative Python float"),
    (_norm(eps=torch.tensor(1e-6)), "output_norm eps must be a non-negative Python float"),
    (_norm()[:2], r"output_norm must be a tuple \(z, weight, eps\)"),
])
def test_prefill_rejects_bad_output_norm(case, output_norm, message):
    inputs, pool, meta = case
    before = pool.clone()
    with pytest.raises(ValueError, match=message):
        _call(inputs, pool, meta, output_norm=output_norm)
    assert torch.equal(pool, before)


BAD_TRACKING = [
    ([2, 3], [0], "track_chunks must have shape"),
    ([2, 4], [0, 1], r"track_slots\[1\]=4 is out of range"),
    ([2, 3], [0, 3], r"track_chunks\[1\]=3 is out of range"),
    ([2, 2], [0, 1], "must be distinct"),
    ([2, 1], [0, 1], "differ from every state_indices slot"),
]


@pytest.mark.parametrize("slots, chunks, message", BAD_TRACKING)
def test_prefill_rejects_bad_tracking(case, slots, chunks, message):
    inputs, pool, meta = case
    with pytest.raises(ValueError, match=message):
        _call(inputs, pool, meta, track_slots=torch.tensor(slots), track_chunks=torch.tensor(chunks))


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=pytest.mark.skipif(
    not triton_interpreted(), reason="Triton on CPU tensors needs TRITON_INTERPRET=1"))])
@pytest.mark.parametrize("slots, chunks, message", BAD_TRACKING)
def test_conv_prefill_rejects_bad_tracking_and_writes_nothing(slots, chunks, message, impl):
    """The conv takes the same tracking lists as the prefill: refused the same way, pool intact."""
    x, weight = torch.randn(sum(LENGTHS), 8), torch.randn(8, 4)
    pool = torch.randn(4, 8, 3)
    before = pool.clone()
    meta = build_chunk_meta(LENGTHS, "cpu")
    with pytest.raises(ValueError, match=message):
        conv1d_prefill(x, weight, conv_pool=pool, meta=meta, state_indices=[0, 1], track_slots=torch.tensor(slots),
                       track_chunks=torch.tensor(chunks), impl=impl)
    assert torch.equal(pool, before)


def test_prefill_track_needs_both(case):
    inputs, pool, meta = case
    with pytest.raises(ValueError, match="given together"):
        _call(inputs, pool, meta, track_slots=torch.tensor([2, 3]))


def test_untracked_rows_may_name_no_slot(case):
    inputs, pool, meta = case
    _call(inputs, pool, meta, track_slots=torch.tensor([-7, -1]), track_chunks=torch.tensor([-1, -1]))
    with pytest.raises(ValueError, match=r"track_slots\[1\]=99 is out of range"):
        _call(inputs, pool, meta, track_slots=torch.tensor([-1, 99]), track_chunks=torch.tensor([-1, -1]))


@pytest.mark.skipif(not triton_interpreted(), reason="checks the interpreter path")
def test_interpreter_rejects_bf16(case):
    inputs, pool, meta = case
    bf = {n: t.bfloat16() if n in "qkv" else t for n, t in inputs.items()}
    with pytest.raises(ValueError, match="bfloat16"):
        _call(bf, pool, meta, impl="triton")


def test_decode_rejects_bad_inputs():
    q = k = torch.zeros(2, 1, 16)
    v = torch.zeros(2, 2, 16)
    a = b = torch.zeros(2, 2)
    A_log = dt_bias = torch.zeros(2)
    pool = torch.zeros(3, 2, 16, 16)
    with pytest.raises(ValueError, match=r"state_indices\[0\]=3 is out of range"):
        gdn_decode(q, k, v, a, b, A_log, dt_bias, state_pool=pool, state_indices=torch.tensor([3, 0]))
    with pytest.raises(ValueError, match="A_log must have shape"):
        gdn_decode(q, k, v, a, b, torch.zeros(3), dt_bias, state_pool=pool,
                   state_indices=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="a must have shape"):
        gdn_decode(q, k, v, torch.zeros(3, 2), b, A_log, dt_bias, state_pool=pool,
                   state_indices=torch.tensor([0, 1]))


def test_conv_rejects_bad_inputs():
    x = torch.zeros(10, 8)
    w = torch.zeros(8, 4)
    meta = build_chunk_meta([10], "cpu")
    with pytest.raises(ValueError, match="conv_pool must have shape"):
        conv1d_prefill(x, w, conv_pool=torch.zeros(2, 8, 4), meta=meta, state_indices=[0])
    with pytest.raises(ValueError, match="weight must have shape"):
        conv1d_prefill(x, torch.zeros(7, 4), conv_pool=torch.zeros(2, 8, 3), meta=meta, state_indices=[0])
    with pytest.raises(ValueError, match="activation"):
        conv1d_prefill(x, w, conv_pool=torch.zeros(2, 8, 3), meta=meta, state_indices=[0],
                       activation="relu")
    with pytest.raises(ValueError, match=r"state_indices\[1\]=2 is out of range"):
        conv1d_decode(torch.zeros(2, 8), w, conv_pool=torch.zeros(2, 8, 3),
                      state_indices=torch.tensor([0, 2]))


@pytest.mark.gpu
def test_foreign_cuda_index_tensor_is_refused(case):
    inputs, _, _ = case
    cuda = {n: t.cuda() for n, t in inputs.items()}
    meta = build_chunk_meta(LENGTHS, "cuda")
    with pytest.raises(ValueError, match="unknown on the host"):
        gdn_prefill(**cuda, state_pool=random_pool(4, 2, 16, 16, device="cuda"), meta=meta,
                    state_indices=torch.tensor([0, 1], device="cuda"))


def test_every_call_checks_its_indices(monkeypatch):
    """No verdict is remembered anywhere: every call checks the indices it is given (N host
    integers), so a fresh list, another pool or a bad index is judged on its own."""
    from mamba_edu.kernels import api, validation
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[0])
        return validation.slot_indices(*args, **kwargs)
    monkeypatch.setattr(api, "slot_indices", counting)
    x = random_prefill_inputs(LENGTHS, 1, 2, 16, 16, seed=0)
    meta, idx = build_chunk_meta_with_indices(LENGTHS, "cpu", state_indices=[1, 0], track_slots=[2, 3],
                                              track_chunks=[1, 2])
    pool = random_pool(4, 2, 16, 16)
    for _ in range(3):  # three layers of one forward
        gdn_prefill(**x, state_pool=pool, meta=meta, **idx, impl="torch")
    assert calls == ["state_indices"] * 3
    with pytest.raises(ValueError, match="out of range"):
        gdn_prefill(**x, state_pool=pool, meta=meta, state_indices=[1, 4], impl="torch")
