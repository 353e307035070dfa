"""Packed variable-length batches: sequence lengths, chunk counts, checkpoint offsets, validation.

Everything here works on host integers. Reading a CUDA ``cu_seqlens`` into a list is a
device-to-host sync; the references accept that, the serving path never does it (it gets the
lengths from the scheduler as CPU lists).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

import torch

from mamba_edu.probes import host_only

CHUNK = 64  # chunk size of the chunked form and of the checkpoints h[c]


def seq_lengths(cu_seqlens: torch.Tensor | Sequence[int] | None, total: int) -> list[int]:
    """Validate ``cu_seqlens`` ``[N+1]`` against ``total`` tokens and return the N lengths.

    ``None`` means one sequence of ``total`` tokens. Raises ``ValueError`` (naming
    ``cu_seqlens``) unless it is 1-D, integer, starts at 0, strictly increases and ends at ``total``.
    """
    if cu_seqlens is None:
        if total < 1:
            raise ValueError(f"q has T={total} tokens; expected at least 1")
        return [total]
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dim() != 1:
            raise ValueError(f"cu_seqlens must be 1-D [N+1]; got shape {tuple(cu_seqlens.shape)}")
        if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex or cu_seqlens.dtype == torch.bool:
            raise ValueError(f"cu_seqlens must be an integer tensor (int32/int64); got {cu_seqlens.dtype}")
        cu = cu_seqlens.tolist()
    else:
        cu = list(cu_seqlens)
        if not all(isinstance(c, int) and not isinstance(c, bool) for c in cu):
            raise ValueError(f"cu_seqlens must hold integers (ints, not bools); got {cu}")
    if len(cu) < 2:
        raise ValueError(f"cu_seqlens must have N+1 >= 2 entries; got {len(cu)}")
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0; got {cu[0]}")
    lengths = [b - a for a, b in zip(cu[:-1], cu[1:])]
    if any(n <= 0 for n in lengths):
        bad = next(i for i, n in enumerate(lengths) if n <= 0)
        raise ValueError(f"cu_seqlens must be strictly increasing (every sequence >= 1 token); "
                         f"cu_seqlens[{bad}]={cu[bad]} >= cu_seqlens[{bad + 1}]={cu[bad + 1]}")
    if cu[-1] != total:
        raise ValueError(f"cu_seqlens must end at T={total}; got cu_seqlens[-1]={cu[-1]}")
    return lengths


def _check_lengths(lengths: Sequence[int], chunk: int | None = None) -> list[int]:
    """``lengths`` read once into a list of ints >= 0 (``type(n) is int``: no bools, floats or
    numpy ints); ``chunk`` (if given) an int >= 1."""
    if chunk is not None and (type(chunk) is not int or chunk < 1):
        raise ValueError(f"chunk must be an int >= 1; got {chunk!r}")
    if isinstance(lengths, (str, bytes, torch.Tensor)) or not isinstance(lengths, Iterable):
        raise ValueError(f"lengths must be a list of ints; got {type(lengths).__name__}")
    lengths = list(lengths)
    for n in lengths:
        if type(n) is not int or n < 0:
            raise ValueError(f"lengths must be ints >= 0 (not bools); got {n!r} in {lengths}")
    return lengths


def chunk_counts(lengths: Sequence[int], chunk: int = CHUNK) -> list[int]:
    """Number of chunks ``⌈L/chunk⌉`` of each sequence (= its number of checkpoints);
    ``lengths`` may be any iterable of ints (read once)."""
    return [-(-n // chunk) for n in _check_lengths(lengths, chunk)]


def cu_offsets(lengths: Sequence[int]) -> list[int]:
    """``[0, L₀, L₀+L₁, …]``: the ``[N+1]`` exclusive cumsum of ``lengths`` as host ints (the
    ``cu_seqlens`` of sequences of these lengths; ``torch.tensor(cu_offsets(lengths))`` makes the
    tensor without any device work)."""
    return [0, *itertools.accumulate(_check_lengths(lengths))]


def check_floating(name: str, t, *, optional: bool = False) -> None:
    """``t`` is a floating-point tensor (the math needs real numbers: an integer input would be
    truncated), or None when ``optional``."""
    if t is None and optional:
        return
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating tensor (float32, float16, bfloat16, float64); "
                         f"got {t.dtype}")


def check_flag(name: str, value) -> bool:
    """A flag is a real ``bool`` (not 0/1, not a string)."""
    if type(value) is not bool:
        raise ValueError(f"{name} must be True or False; got {value!r}")
    return value


def check_scale(scale, K: int) -> float:
    """``None`` (= ``K**-0.5``) or a finite Python float > 0 (not a bool, not a tensor)."""
    if scale is None:
        return K ** -0.5
    if type(scale) not in (int, float) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be None or a finite Python float > 0 (not a bool or a tensor); "
                         f"got {scale!r}")
    return float(scale)


def check_log_decay(g: torch.Tensor) -> None:
    """The references need a decay: ``g <= 0`` (−inf allowed, NaN not). A growing gate
    ``g > 0`` makes the chunked form's ``exp(Γ_r − Γ_s)`` overflow where the recurrence does not,
    so the two forms would disagree. It reads the values: a sync on a GPU, as the references
    may; on a CPU a plain host read, kept out of the sync counter (the kernels' torch path, which
    stands in for the GPU kernels on a CPU, runs through here)."""
    if g.device.type == "cpu":
        with host_only():
            bad = bool((g > 0).any()) or bool(g.isnan().any())
    else:
        bad = bool((g > 0).any()) or bool(g.isnan().any())
    if bad:
        raise ValueError("g must be a log-decay <= 0 everywhere (no NaN): a growing gate g > 0 "
                         "makes the chunked and recurrent forms disagree; compute it with gdn_gating")


def checkpoint_offsets(lengths: Sequence[int], chunk: int = CHUNK) -> list[int]:
    """``[N+1]`` exclusive cumsum of the chunk counts: sequence n's checkpoints are rows
    ``offsets[n] : offsets[n+1]`` of the checkpoint tensor."""
    return cu_offsets(chunk_counts(lengths, chunk))


def validate_gdn_inputs(q, k, v, g, beta, cu_seqlens, initial_state) -> list[int]:
    """Check shapes of a packed GDN call (docs/conventions.md) and return the sequence lengths.

    Raises ``ValueError`` naming the offending argument and the expected shape.
    """
    for name, t, rank in (("q", q, 3), ("k", k, 3), ("v", v, 3), ("g", g, 2), ("beta", beta, 2)):
        check_floating(name, t)
        if t.dim() != rank:
            raise ValueError(f"{name} must have {rank} dims; got shape {tuple(t.shape)}")
    check_floating("initial_state", initial_state, optional=True)
    T, H, K = q.shape
    for name, value in (("H (q.shape[1])", H), ("K (q.shape[2])", K), ("HV (v.shape[1])", v.shape[1]),
                        ("V (v.shape[2])", v.shape[2])):
        if value < 1:
            raise ValueError(f"{name} must be >= 1 (q, k: [T, H, K], v: [T, HV, V]); got {value}")
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape [T, H, K]={tuple(q.shape)}; got {tuple(k.shape)}")
    Tv, HV, V = v.shape
    if Tv != T:
        raise ValueError(f"v must have T={T} tokens like q; got {Tv}")
    if HV % H != 0:
        raise ValueError(f"v's heads HV={HV} must be a multiple of q's heads H={H}")
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != (T, HV):
            raise ValueError(f"{name} must have shape [T, HV]=({T}, {HV}); got {tuple(t.shape)}")
    devices = {t.device for t in (q, k, v, g, beta)}
    if len(devices) != 1:
        raise ValueError(f"q, k, v, g, beta must be on one device; got {sorted(map(str, devices))}")
    lengths = seq_lengths(cu_seqlens, T)
    if initial_state is not None:
        expected = (len(lengths), HV, K, V)
        if tuple(initial_state.shape) != expected:
            raise ValueError(f"initial_state must have shape [N, HV, K, V]={expected}; "
                             f"got {tuple(initial_state.shape)}")
        if initial_state.device != q.device:
            raise ValueError(f"initial_state must be on {q.device} like q; got {initial_state.device}")
    check_log_decay(g)
    return lengths
