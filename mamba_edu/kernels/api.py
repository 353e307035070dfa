"""Pool-based GDN prefill/decode, causal conv1d, the model's fused ops and its causal attention:
the checks, then the unchecked function of the same name (:mod:`.launch`, :mod:`.fused_ops`,
:mod:`.attention`).

``impl="auto"`` runs Triton on CUDA tensors and the torch reference path elsewhere;
``"triton"`` forces the kernels (the interpreter on CPU: fp32/fp16 inputs, tiny shapes);
``"torch"`` forces the reference path. Both implementations have the same signature and results.

Activations (q, k, v, the gates, the conv input) may be *row-strided*: column slices of one
wider matrix, each row contiguous, as a model's fused projection produces them. The kernels read
them with their row stride, so the serving path copies nothing out.

Every call checks its arguments once, here at the boundary, before any launch: the
:class:`~mamba_edu.kernels.ChunkMeta` is the batch layout only, and the slot and tracking indices
are explicit arguments (a list of ints, a CPU tensor, or an :func:`~mamba_edu.kernels.upload_indices`
tensor), range-checked on their host values every call (N integers: no device work). The kernels
get a private copy of exactly the values that were checked. Each function here is its checks
followed by the function of the same name in :mod:`.launch`, which the serving engine calls
directly (it checks its batch once, where the batch enters).
"""

from __future__ import annotations

import math

import torch

from mamba_edu.kernels import attention, fused_ops, launch
from mamba_edu.kernels.validation import (FLOATS, check_eps, check_flag, check_float,
                                          check_head_dims, check_meta, check_tensor, device_of,
                                          resolve_impl, slot_indices, track_indices)


def _check_pool(name, pool, shape, device):
    check_tensor(name, pool, (None, *shape), device=device,
                 dtypes=(torch.float32,) if name == "state_pool" else FLOATS)
    return pool.shape[0]


def _check_scale(scale, K):
    """``None`` (= ``K ** -0.5``) or a finite Python float > 0 (not a bool, not a tensor)."""
    if scale is None:
        return K ** -0.5
    return check_float("scale", scale, strict=True)


def _check_activation(activation):
    if activation not in ("silu", None):
        raise ValueError(f"activation must be 'silu' or None; got {activation!r}")


def _check_qkv(q, k, v):
    """q, k ``[rows, H, K]`` and v ``[rows, HV, V]`` (row-strided allowed) on one device, one
    dtype, ``HV % H == 0``. Returns ``(device, (rows, H, K, HV, V))``."""
    dev = device_of("q", q)
    check_tensor("q", q, (None, None, None), device=dev, rows=True)
    rows, H, K = q.shape
    check_tensor("k", k, (rows, H, K), device=dev, dtypes=(q.dtype,), rows=True)
    check_tensor("v", v, (rows, None, None), device=dev, dtypes=(q.dtype,), rows=True)
    HV, V = v.shape[1:]
    if HV % H != 0:
        raise ValueError(f"v's heads HV={HV} must be a multiple of q's heads H={H}")
    return dev, (rows, H, K, HV, V)


def _check_raw_gates(a, b, A_log, dt_bias, rows, HV, dev):
    """The gating inputs: projections ``a, b [rows, HV]`` (row-strided allowed) and the learned
    ``A_log, dt_bias [HV]``."""
    for name, t in (("a", a), ("b", b)):
        check_tensor(name, t, (rows, HV), device=dev, rows=True)
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        check_tensor(name, t, (HV,), device=dev)


def _check_gates(g, beta, raw, T, HV, dev, dtype):
    """Either ``g, beta [T, HV]`` or ``raw = (a, b, A_log, dt_bias)``, never both."""
    given = [name for name, t in zip(("a", "b", "A_log", "dt_bias"), raw) if t is not None]
    if given and (g is not None or beta is not None):
        raise ValueError("give either g and beta, or a, b, A_log and dt_bias (not both)")
    if given:
        if len(given) < 4:
            missing = sorted({"a", "b", "A_log", "dt_bias"} - set(given))
            raise ValueError(f"the raw gating needs a, b, A_log and dt_bias; missing {missing}")
        _check_raw_gates(*raw, T, HV, dev)
    elif g is None or beta is None:
        raise ValueError("g and beta are required (or a, b, A_log and dt_bias)")
    else:
        for name, t in (("g", g), ("beta", beta)):
            check_tensor(name, t, (T, HV), device=dev, dtypes=(torch.float32, dtype), rows=True)


def _check_output_norm(output_norm, T, HV, V, dev, dtype):
    """``output_norm = (z [T, HV·V] (row-strided allowed), weight [V], eps)``, z and weight in q's
    dtype; returns it with eps as a float, or None when not given."""
    if output_norm is None:
        return None
    if not isinstance(output_norm, (tuple, list)) or len(output_norm) != 3:
        got = (f"{len(output_norm)} items" if isinstance(output_norm, (tuple, list))
               else type(output_norm).__name__)
        raise ValueError(f"output_norm must be a tuple (z, weight, eps) or None; got {got}")
    z, weight, eps = output_norm
    check_tensor("output_norm z", z, (T, HV * V), device=dev, dtypes=(dtype,), rows=True)
    check_tensor("output_norm weight", weight, (V,), device=dev, dtypes=(dtype,))
    return z, weight, check_eps(eps, "output_norm eps")


def _check_prefill_indices(state_indices, track_slots, track_chunks, meta, slots, dev):
    """The working slots and the tracking writes, checked, as :mod:`.launch` takes them:
    ``{"state_indices": …, "track_slots": …, "track_chunks": …}``."""
    if state_indices is None:
        raise ValueError("state_indices is required: the [N] slots the sequences work in")
    state_slots, state_t = slot_indices("state_indices", state_indices, meta.N, slots, dev,
                                        allow_padding=True)
    track_slots, track_chunks = track_indices(track_slots, track_chunks, meta, slots, state_slots, dev)
    return dict(state_indices=state_t, track_slots=track_slots, track_chunks=track_chunks)


def gdn_prefill(q, k, v, g=None, beta=None, *, a=None, b=None, A_log=None, dt_bias=None,
                state_pool, state_indices, meta, scale=None, use_qk_l2norm=True,
                output_checkpoints=False, track_slots=None, track_chunks=None, output_norm=None,
                impl="auto"):
    """Chunked GDN over a packed batch whose states live in a pool (updated in place).

    Args:
        q, k: ``[T, H, K]``; v: ``[T, HV, V]`` (one dtype: fp32, fp16 or bf16);
        g, beta: ``[T, HV]`` (log-decay and write strength, fp32 or v's dtype); or instead
        a, b: ``[T, HV]`` raw gate projections with A_log, dt_bias ``[HV]``: the gating of
            :func:`~mamba_edu.gdn.gdn_gating` is then computed inside the first kernel.
        state_pool: ``[slots, HV, K, V]`` fp32. Sequence n starts from
            ``state_pool[state_indices[n]]`` and its final state is written back there.
        state_indices: ``[N]`` ints, distinct, ``< slots`` (a list, a CPU tensor or
            :func:`~mamba_edu.kernels.upload_indices`); negative = a padded row: it starts from
            zeros and no state is written back (a bucket's padding, :mod:`mamba_edu.engine.bucket`).
        meta: :class:`~mamba_edu.kernels.ChunkMeta` of the batch (its layout).
        scale: ``None`` (``K**-0.5``) or a finite float > 0; use_qk_l2norm: a bool.
        output_checkpoints: also return ``[NT, HV, K, V]`` fp32, the state at every chunk start.
        track_slots, track_chunks: ``[N]`` int (the ``fused`` strategy): write the state after
            ``64·track_chunks[n]`` tokens into ``state_pool[track_slots[n]]`` (``⌈L/64⌉`` = the
            final state, negative = nothing). Both or neither.
        output_norm: ``(z, weight, eps)``: return the layer's normed output
            ``gated_rms_norm(o, z, weight, eps)`` (:mod:`~mamba_edu.kernels.fused_ops`:
            ``rms_norm(o)·weight·silu(z)`` per value head, over V) instead of o. ``z [T, HV·V]``
            (row-strided allowed: a column slice of the in-projection) and ``weight [V]`` in q's
            dtype, ``eps`` a non-negative float. The torch path gives exactly that; the Triton
            output kernel norms o before rounding it (agreeing to that rounding).
    Returns:
        ``(o [T, HV, V] in q's dtype, checkpoints or None)``.
    """
    dev, (T, H, K, HV, V) = _check_qkv(q, k, v)
    _check_gates(g, beta, (a, b, A_log, dt_bias), T, HV, dev, v.dtype)
    output_norm = _check_output_norm(output_norm, T, HV, V, dev, q.dtype)
    impl = resolve_impl(impl, dev, q.dtype)
    check_meta(meta, T, dev)
    slots = _check_pool("state_pool", state_pool, (HV, K, V), dev)
    indices = _check_prefill_indices(state_indices, track_slots, track_chunks, meta, slots, dev)
    if impl == "triton":
        check_head_dims(K, V)
    return launch.gdn_prefill(
        q, k, v, g, beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state_pool=state_pool,
        meta=meta, scale=_check_scale(scale, K),
        use_qk_l2norm=check_flag("use_qk_l2norm", use_qk_l2norm),
        output_checkpoints=check_flag("output_checkpoints", output_checkpoints),
        output_norm=output_norm, impl=impl, **indices)


def gdn_decode(q, k, v, a, b, A_log, dt_bias, *, state_pool, state_indices, scale=None,
               use_qk_l2norm=True, impl="auto"):
    """One decode token per sequence, gating and L2 norm in-kernel, states in the pool.

    Args:
        q, k: ``[N, H, K]``; v: ``[N, HV, V]``; a, b: ``[N, HV]`` (gate projections);
        A_log, dt_bias: ``[HV]``; state_pool: ``[slots, HV, K, V]`` fp32;
        state_indices: ``[N]`` int, distinct, ``< slots``; negative = padded row (no read/write).
    Returns:
        ``o [N, HV, V]`` in q's dtype.
    """
    dev, (N, H, K, HV, V) = _check_qkv(q, k, v)
    _check_raw_gates(a, b, A_log, dt_bias, N, HV, dev)
    impl = resolve_impl(impl, dev, q.dtype)
    slots = _check_pool("state_pool", state_pool, (HV, K, V), dev)
    _, state_t = slot_indices("state_indices", state_indices, N, slots, dev, allow_padding=True)
    if impl == "triton":
        check_head_dims(K, V)
    return launch.gdn_decode(q, k, v, a, b, A_log, dt_bias, state_pool=state_pool,
                             state_indices=state_t, scale=_check_scale(scale, K),
                             use_qk_l2norm=check_flag("use_qk_l2norm", use_qk_l2norm), impl=impl)


def _check_conv(x, weight, bias, conv_pool):
    check_tensor("x", x, (None, None), device=device_of("x", x), rows=True)
    D = x.shape[1]
    check_tensor("weight", weight, (D, None), device=x.device)
    if weight.shape[1] < 2:
        raise ValueError(f"weight must be [D, W] with W >= 2; got {list(weight.shape)}")
    if bias is not None:
        check_tensor("bias", bias, (D,), device=x.device)
    return _check_pool("conv_pool", conv_pool, (D, weight.shape[1] - 1), x.device)


def conv1d_prefill(x, weight, bias=None, *, conv_pool, state_indices, meta,
                   activation="silu", track_slots=None, track_chunks=None, impl="auto"):
    """Causal depthwise conv1d over a packed batch, conv states in a pool (updated in place).

    Args:
        x: ``[T, D]`` raw inputs (row-strided allowed); weight: ``[D, W]``; bias: ``[D]`` or None.
        conv_pool: ``[slots, D, W−1]``; sequence n reads its previous inputs from
            ``conv_pool[state_indices[n]]`` (zeros for a fresh slot) and leaves its last ``W−1``.
        state_indices: ``[N]`` ints, distinct, ``< slots``, negative = padded row (as in
            :func:`gdn_prefill`).
        track_slots, track_chunks: ``[N]`` int (the ``fused`` strategy), as in
            :func:`gdn_prefill`: save the conv state after ``min(64·track_chunks[n], L)`` tokens
            (the ``W−1`` inputs before that point) into ``conv_pool[track_slots[n]]``
            (negative chunk = nothing). Both or neither.
    Returns:
        ``y [T, D]`` in x's dtype.
    """
    slots = _check_conv(x, weight, bias, conv_pool)
    _check_activation(activation)
    impl = resolve_impl(impl, x.device, x.dtype, "x")
    check_meta(meta, x.shape[0], x.device)
    indices = _check_prefill_indices(state_indices, track_slots, track_chunks, meta, slots, x.device)
    return launch.conv1d_prefill(x, weight, bias, conv_pool=conv_pool, meta=meta,
                                 activation=activation, impl=impl, **indices)


def conv1d_decode(x, weight, bias=None, *, conv_pool, state_indices, activation="silu",
                  impl="auto"):
    """One token per sequence: ``x [N, D]`` → ``y [N, D]``, conv states shifted in the pool.
    ``state_indices [N]``: negative = padded row (zeros, no write)."""
    slots = _check_conv(x, weight, bias, conv_pool)
    _check_activation(activation)
    impl = resolve_impl(impl, x.device, x.dtype, "x")
    _, state_t = slot_indices("state_indices", state_indices, x.shape[0], slots, x.device,
                              allow_padding=True)
    return launch.conv1d_decode(x, weight, bias, conv_pool=conv_pool, state_indices=state_t,
                                activation=activation, impl=impl)


def _check_norm(x, weight, eps):
    """``x [T, D]`` (row-strided allowed) and ``weight [D]`` in x's dtype; returns eps."""
    check_tensor("x", x, (None, None), device=device_of("x", x), rows=True)
    check_tensor("weight", weight, (x.shape[1],), device=x.device, dtypes=(x.dtype,))
    return check_eps(eps)


def rms_norm(x, weight, eps, *, impl="auto"):
    """``x · rsqrt(mean(x²) + eps) · weight`` per row.

    Args:
        x: ``[T, D]`` (row-strided allowed); weight: ``[D]`` in x's dtype.
    Returns:
        ``[T, D]`` in x's dtype.
    """
    eps = _check_norm(x, weight, eps)
    return fused_ops.rms_norm(x, weight, eps, resolve_impl(impl, x.device, x.dtype, "x"))


def add_rms_norm(x, delta, weight, eps, *, impl="auto"):
    """The pre-norm residual step: ``s = x + delta`` (rounded to x's dtype), then ``rms_norm(s)``.

    Args:
        x, delta: ``[T, D]`` (row-strided allowed, one dtype); weight: ``[D]`` in x's dtype.
    Returns:
        ``(s, n)``: the new residual stream and its norm, both ``[T, D]`` in x's dtype.
    """
    eps = _check_norm(x, weight, eps)
    check_tensor("delta", delta, tuple(x.shape), device=x.device, dtypes=(x.dtype,), rows=True)
    return fused_ops.add_rms_norm(x, delta, weight, eps, resolve_impl(impl, x.device, x.dtype, "x"))


def gated_rms_norm(o, z, weight, eps, *, impl="auto"):
    """The GDN output norm: ``rms_norm(o) · weight · silu(z)`` per head, normalised over V.

    Args:
        o: ``[T, HV, V]`` contiguous; z: ``[T, HV·V]`` in o's dtype (row-strided allowed: a
            column slice of the input projection); weight: ``[V]`` in o's dtype.
    Returns:
        ``[T, HV, V]`` in o's dtype.
    """
    check_tensor("o", o, (None, None, None), device=device_of("o", o))
    T, HV, V = o.shape
    check_tensor("z", z, (T, HV * V), device=o.device, dtypes=(o.dtype,), rows=True)
    check_tensor("weight", weight, (V,), device=o.device, dtypes=(o.dtype,))
    return fused_ops.gated_rms_norm(o, z, weight, check_eps(eps), resolve_impl(impl, o.device, o.dtype, "o"))


def silu_mul(gate_up, *, impl="auto"):
    """The SwiGLU product ``silu(gate) · up`` of the MLP's fused projection.

    Args:
        gate_up: ``[T, 2F]``, the gate and up halves side by side (row-strided allowed).
    Returns:
        ``[T, F]`` in gate_up's dtype.
    """
    check_tensor("gate_up", gate_up, (None, None), device=device_of("gate_up", gate_up), rows=True)
    if gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must have an even last dim (gate and up halves); got {gate_up.shape[1]}")
    return fused_ops.silu_mul(gate_up, resolve_impl(impl, gate_up.device, gate_up.dtype, "gate_up"))


def rope(x, cos, sin, *, impl="auto"):
    """Rotary position embedding, rotate-half form.

    Args:
        x: ``[T, heads, D]`` (row-strided allowed: each ``x[t]`` contiguous), D even;
        cos, sin: ``[T, 1, D/2]`` fp32, from :func:`mamba_edu.model.layers.rope_tables`.
    Returns:
        ``[T, heads, D]`` in x's dtype.
    """
    check_tensor("x", x, (None, None, None), device=device_of("x", x), rows=True)
    T, heads, D = x.shape
    if D % 2:
        raise ValueError(f"x must have an even last dim (RoPE rotates two halves); got {D}")
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(name, t, (T, 1, D // 2), device=x.device, dtypes=(torch.float32,))
    return fused_ops.rope(x, cos, sin, resolve_impl(impl, x.device, x.dtype, "x"))


def _check_attention(q, k, v, n_seqs, scale) -> None:
    """Shapes, dtypes and devices of ``q [n_seqs·Lq, Hq, D]``, ``k, v [n_seqs·Lk, Hkv, D]``."""
    check_tensor("q", q, (None, None, None), device=device_of("q", q), rows=True)
    check_tensor("k", k, (None, None, q.shape[2]), device=q.device, dtypes=(q.dtype,), rows=True)
    check_tensor("v", v, tuple(k.shape), device=q.device, dtypes=(q.dtype,), rows=True)
    if isinstance(n_seqs, bool) or not isinstance(n_seqs, int) or n_seqs < 1:
        raise ValueError(f"n_seqs must be a positive int; got {n_seqs!r}")
    for name, t in (("q", q), ("k", k)):
        if t.shape[0] % n_seqs:
            raise ValueError(f"{name} must have a multiple of n_seqs={n_seqs} rows (sequences of "
                             f"equal length); got {t.shape[0]}")
    Lq, Lk = q.shape[0] // n_seqs, k.shape[0] // n_seqs
    if Lk < Lq:
        raise ValueError(f"k must have at least Lq={Lq} rows per sequence (its prefix, then the "
                         f"queries' own keys); got Lk={Lk}")
    Hq, Hkv = q.shape[1], k.shape[1]
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"k must have a number of heads that divides q's {Hq}; got {Hkv}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale)):
        raise ValueError(f"scale must be a finite Python float or None; got {scale!r}")


def causal_attention(q, k, v, n_seqs=1, scale=None, *, impl="auto"):
    """Causal attention of ``n_seqs`` sequences of equal length, with GQA, bottom-right aligned.

    Args:
        q: ``[n_seqs·Lq, Hq, D]``; k, v: ``[n_seqs·Lk, Hkv, D]`` in q's dtype, ``Lk ≥ Lq`` (the
            first ``Lk − Lq`` keys of each sequence are its cached prefix), ``Hq % Hkv == 0``:
            query head ``h`` reads KV head ``h // (Hq // Hkv)``. Rows may be strided (each
            ``q[t]``, ``k[t]``, ``v[t]`` packed ``[H, D]``, e.g. column slices of one wider
            projection). The Triton kernel takes ``D`` in
            :data:`~mamba_edu.kernels.attention.HEAD_DIMS`.
        n_seqs: the number of sequences. scale: the score scale, ``D ** -0.5`` when None.
        impl: ``"auto"`` takes the kernel on CUDA only where it measured faster than SDPA
            (:mod:`~mamba_edu.kernels.attention`).
    Returns:
        ``o [n_seqs·Lq, Hq, D]``, contiguous, in q's dtype: query ``i`` of a sequence attends
        to its keys ``j ≤ i + Lk − Lq``.
    """
    _check_attention(q, k, v, n_seqs, scale)
    resolve_impl(impl, q.device, q.dtype, "q")  # checked; "auto" goes on: it depends on Lq there
    return attention.causal_attention(q, k, v, n_seqs, scale, impl=impl)
