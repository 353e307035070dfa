"""The four operations without their checks: for callers whose arguments are checked already.

:mod:`.api` (``mamba_edu.kernels.gdn_prefill`` and the others) checks every argument of a call,
then calls the function of the same name here: each operation has this one implementation. The
serving engine calls these directly. It checks a batch once, where the batch enters (the
scheduler's lists, the :class:`~mamba_edu.kernels.ChunkMeta` and index tensors it builds from
them, the pool it owns), and every layer passes the same metadata and indices again: checking
them per layer and per kernel only cost host time (about a quarter of the eager host time).
Nothing here validates, so a wrong argument gives a wrong result or a crash, not a clear error:
learners call :mod:`mamba_edu.kernels`.

The arguments are :mod:`.api`'s, except that index arguments (``state_indices``,
``track_slots``, ``track_chunks``) are int tensors that remember their host values
(:func:`~mamba_edu.kernels.upload_indices`, :func:`~mamba_edu.kernels.build_chunk_meta_with_indices`):
the torch path reads those values, the kernels the tensors' private twins
(:func:`~mamba_edu.kernels.metadata.kernel_copy`); neither is checked again here. ``impl``:
``"auto"`` (Triton on CUDA, torch elsewhere), ``"triton"`` or ``"torch"``.
"""

from __future__ import annotations

from mamba_edu.gdn import gdn_gating
from mamba_edu.kernels.conv import conv1d_prefill_triton, conv1d_update_triton
from mamba_edu.kernels.decode import decode_triton
from mamba_edu.kernels.metadata import kernel_copy, remembered
from mamba_edu.kernels.prefill import apply_output_norm, prefill_triton
from mamba_edu.kernels.torch_path import (conv1d_decode_torch, conv1d_prefill_torch, decode_torch,
                                          prefill_torch)
from mamba_edu.kernels.validation import runs_torch


def _track_targets(track_slots, track_chunks) -> list[tuple[int, int, int]]:
    """``(row, slot, chunk)`` of every tracked row (``track_chunks[row] >= 0``): the torch path's
    form of the ``fused`` tracking request."""
    if track_slots is None:
        return []
    pairs = zip(remembered(track_slots), remembered(track_chunks))
    return [(n, slot, chunk) for n, (slot, chunk) in enumerate(pairs) if chunk >= 0]


def gdn_prefill(q, k, v, g=None, beta=None, *, a=None, b=None, A_log=None, dt_bias=None,
                state_pool, state_indices, meta, scale=None, use_qk_l2norm=True,
                output_checkpoints=False, track_slots=None, track_chunks=None, output_norm=None,
                impl="auto"):
    """:func:`mamba_edu.kernels.gdn_prefill` on checked arguments: ``(o, checkpoints or None)``.
    The gating runs inside when ``a`` is given (then ``A_log``, ``dt_bias`` too)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if runs_torch(impl, q.device):
        if a is not None:
            g, beta = gdn_gating(A_log, a, b, dt_bias)
        o, ckpt = prefill_torch(q, k, v, g, beta, state_pool, remembered(state_indices), meta, scale,
                                use_qk_l2norm, output_checkpoints,
                                _track_targets(track_slots, track_chunks))
        return apply_output_norm(o, output_norm, impl="torch"), ckpt
    gating = None
    if a is not None:
        g, beta, gating = a, b, (A_log, dt_bias)
    return prefill_triton(q, k, v, g, beta, state_pool, kernel_copy(state_indices),
                          meta.kernel_view(), scale, use_qk_l2norm, output_checkpoints,
                          kernel_copy(track_slots), kernel_copy(track_chunks), gating,
                          output_norm)


def gdn_decode(q, k, v, a, b, A_log, dt_bias, *, state_pool, state_indices, scale=None,
               use_qk_l2norm=True, impl="auto"):
    """:func:`mamba_edu.kernels.gdn_decode` on checked arguments: ``o [N, HV, V]``."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if runs_torch(impl, q.device):
        return decode_torch(q, k, v, a, b, A_log, dt_bias, state_pool, remembered(state_indices),
                            scale, use_qk_l2norm)
    return decode_triton(q, k, v, a, b, A_log, dt_bias, state_pool, kernel_copy(state_indices),
                         scale, use_qk_l2norm)


def conv1d_prefill(x, weight, bias=None, *, conv_pool, state_indices, meta, activation="silu",
                   track_slots=None, track_chunks=None, impl="auto"):
    """:func:`mamba_edu.kernels.conv1d_prefill` on checked arguments: ``y [T, D]``."""
    if runs_torch(impl, x.device):
        return conv1d_prefill_torch(x, weight, bias, conv_pool, remembered(state_indices), meta,
                                    activation, _track_targets(track_slots, track_chunks))
    return conv1d_prefill_triton(x, weight, bias, conv_pool, kernel_copy(state_indices),
                                 meta.kernel_view(), activation == "silu",
                                 kernel_copy(track_slots), kernel_copy(track_chunks))


def conv1d_decode(x, weight, bias=None, *, conv_pool, state_indices, activation="silu",
                  impl="auto"):
    """:func:`mamba_edu.kernels.conv1d_decode` on checked arguments: ``y [N, D]``."""
    if runs_torch(impl, x.device):
        return conv1d_decode_torch(x, weight, bias, conv_pool, remembered(state_indices), activation)
    return conv1d_update_triton(x, weight, bias, conv_pool, kernel_copy(state_indices),
                                activation == "silu")
