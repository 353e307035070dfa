"""Input checks run before any launch: a bad argument raises ``ValueError`` naming it and what
was expected, and an out-of-range slot index never reaches a kernel.

Index *ranges* are checked on host copies only (:func:`mamba_edu.kernels.metadata.host_values`):
a list of ints or a CPU tensor is read directly; a CUDA index tensor must come from
:func:`~mamba_edu.kernels.metadata.upload_indices`, which remembers the host list it uploaded.
Reading a foreign CUDA tensor's values would be a device-to-host sync, so it is refused. The
kernels get a private copy of the values that were checked, never the caller's tensor.

These checks run once per call of the public API (:mod:`mamba_edu.kernels.api`); the serving
engine, which checks its batch where it enters, calls :mod:`mamba_edu.kernels.launch` directly.

Scalars and flags are checked one way everywhere: :func:`check_float` (finite, not a bool),
:func:`check_flag` (a real bool).
"""

from __future__ import annotations

import math

import torch

from mamba_edu._runtime import triton_available, triton_interpreted
from mamba_edu.kernels.metadata import (ChunkMeta, check_unchanged, host_values, remembers_values,
                                        upload_indices)

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
INTS = (torch.int32, torch.int64)
MAX_HEAD_DIM = 256  # K and V are held whole in registers by the Triton kernels


def _packed_strides(shape) -> tuple[int, ...]:
    """Strides of a contiguous tensor of ``shape`` (row-major)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _is_packed(shape, strides) -> bool:
    """Whether a tensor with these sizes and strides is contiguous (size-1 dims may stride anyhow)."""
    return all(size == 1 or got == want
               for size, got, want in zip(shape, strides, _packed_strides(shape)))


def check_tensor(name: str, t, shape: tuple, *, device: torch.device, dtypes=FLOATS,
                 rows: bool = False) -> None:
    """``t`` is a contiguous tensor of exactly ``shape`` (``None`` = any size) on ``device``.
    With ``rows``, only each row (``t[i]``) must be contiguous: a column slice of a wider matrix,
    which the kernels read with its row stride instead of copying it out. (Plain integer
    arithmetic on sizes and strides: this runs for every argument of every layer.)"""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
        want = ", ".join("*" if s is None else str(s) for s in shape)
        raise ValueError(f"{name} must have shape [{want}]; got {list(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}; got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device} like the other inputs; got {t.device}")
    if rows and t.dim() > 1:
        n, row_shape, strides = t.shape[0], t.shape[1:], t.stride()
        row_numel = math.prod(row_shape)
        if n and not (_is_packed(row_shape, strides[1:]) and (n == 1 or strides[0] >= row_numel)):
            raise ValueError(f"{name} must be contiguous within each row (any row stride >= "
                             f"{row_numel}); got strides {strides}; call .contiguous() first")
    elif not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous; call .contiguous() first")


def device_of(name: str, t) -> torch.device:
    """The device of the first tensor argument (the one the others must match)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    return t.device


def default_impl(device: torch.device) -> str:
    """``impl="auto"``: the Triton kernels on CUDA, the torch reference path elsewhere."""
    return "torch" if runs_torch("auto", device) else "triton"


def runs_torch(impl: str, device: torch.device) -> bool:
    """Whether a call with a checked ``impl`` takes the torch path: ``"torch"``, or ``"auto"`` off
    CUDA: the rule that :func:`default_impl` names, in one frame (it runs before every launch)."""
    return impl == "torch" or (impl == "auto" and device.type != "cuda")


def resolve_impl(impl: str, device: torch.device, dtype: torch.dtype, name: str = "q") -> str:
    """``impl`` checked and ``"auto"`` resolved (:func:`default_impl`); a forced Triton run on CPU
    must be able to work (``name``: the argument whose dtype decides, for the error message)."""
    if impl not in ("auto", "triton", "torch"):
        raise ValueError(f"impl must be 'auto', 'triton' or 'torch'; got {impl!r}")
    if impl == "auto":
        return default_impl(device)
    if impl == "triton" and device.type != "cuda":
        if not triton_available():
            raise ValueError("impl='triton' needs Triton, which is not installed here; use "
                             "impl='torch' (docs/install.md says where Triton installs)")
        if not triton_interpreted():
            raise ValueError("impl='triton' on CPU needs TRITON_INTERPRET=1, set before "
                             "mamba_edu.kernels is imported")
        if dtype == torch.bfloat16:
            raise ValueError(f"{name} has dtype bfloat16, which the Triton interpreter computes "
                             "wrongly; use float32 or float16 on CPU")
    return impl


def check_eps(eps, name: str = "eps") -> float:
    """A norm's eps: a finite non-negative Python number (not a bool, not a tensor), returned as
    a float; the error names it ``name``."""
    return check_float(name, eps)


def check_head_dims(K: int, V: int) -> None:
    for name, d in (("K", K), ("V", V)):
        if d > MAX_HEAD_DIM:
            raise ValueError(f"head dim {name}={d} is too large for the Triton kernels "
                             f"(expected <= {MAX_HEAD_DIM}); use impl='torch'")


def check_meta(meta, T: int, device: torch.device) -> None:
    """``meta`` is a :class:`ChunkMeta` of these ``T`` tokens on ``device``, unchanged since it
    was built."""
    if not isinstance(meta, ChunkMeta):
        raise ValueError(f"meta must be a ChunkMeta from build_chunk_meta; got {type(meta).__name__}")
    if meta.T != T:
        raise ValueError(f"meta describes T={meta.T} tokens; the inputs have T={T}")
    if meta.cu_seqlens.device != device:
        raise ValueError(f"meta was built for {meta.cu_seqlens.device}; the inputs are on {device}")
    # Every tensor of the meta is a view of one buffer: one version counter covers them all.
    check_unchanged("meta (its cu_seqlens, chunk_indices or chunk_offsets)", meta.cu_seqlens)


def check_flag(name: str, value) -> bool:
    """A flag is a real ``bool`` (not 0/1, not a string, not a tensor)."""
    if type(value) is not bool:
        raise ValueError(f"{name} must be True or False; got {value!r}")
    return value


def check_float(name: str, value, *, minimum: float = 0.0, strict: bool = False) -> float:
    """A finite Python ``int``/``float`` (not a bool, not a tensor) ``>= minimum`` (``>`` with
    ``strict``), returned as a float."""
    if type(value) not in (int, float) or not math.isfinite(value) or value < minimum or (
            strict and value == minimum):
        want = (f"> {minimum}" if strict else ">= 0") if minimum == 0 else f">= {minimum}"
        kind = "non-negative Python float" if (minimum == 0 and not strict) else f"Python float {want}"
        raise ValueError(f"{name} must be a {kind} (finite, not a bool or a tensor); got {value!r}")
    return float(value)


def index_arg(name: str, t, n: int, device: torch.device) -> tuple[tuple[int, ...], torch.Tensor]:
    """An ``[n]`` index argument: its host values and a tensor that remembers them, for
    :mod:`~mamba_edu.kernels.launch`.

    ``t`` is a list of ``n`` Python ints or a CPU int tensor (read and uploaded here, once: the
    kernels get a copy of exactly the values checked, never ``t`` itself), or a tensor made by
    :func:`~mamba_edu.kernels.upload_indices`, passed on as it is (the kernels read its private
    twin: :func:`~mamba_edu.kernels.metadata.kernel_copy`)."""
    if isinstance(t, (list, tuple)):
        values = tuple(t)
        if len(values) != n or any(type(v) is not int for v in values):
            raise ValueError(f"{name} must be a list of N={n} Python ints (or an index tensor); "
                             f"got {list(values)!r}")
        if any(not -(2 ** 31) <= v < 2 ** 31 for v in values):
            raise ValueError(f"{name} must fit in int32; got {list(values)!r}")
        return values, upload_indices(list(values), device)
    check_tensor(name, t, (n,), device=device, dtypes=INTS)
    values = host_values(t, name)
    if values is None:
        raise ValueError(f"{name} is a {t.device} tensor whose values are unknown on the host; "
                         f"pass a list of ints or upload_indices(...) so its range can be checked "
                         "without a device-to-host sync")
    if not remembers_values(t):  # the caller's CPU tensor: the kernels get a copy of what was read
        t = upload_indices(list(values), device)
    return values, t


def slot_indices(name: str, t, n: int, slots: int, device: torch.device, *,
                 allow_padding: bool) -> tuple[tuple[int, ...], torch.Tensor]:
    """Validate an ``[n]`` index argument of pool slots: its host values and the tensor to pass
    on (:func:`index_arg`).

    Slots must lie in ``[0, slots)`` and be distinct; with ``allow_padding`` a negative value
    marks a padded row (no read, no write).
    """
    values, tensor = index_arg(name, t, n, device)
    bad = [i for i, s in enumerate(values) if s >= slots or (s < 0 and not allow_padding)]
    if bad:
        want = f"< {slots} (negative = padded row)" if allow_padding else f"in [0, {slots})"
        raise ValueError(f"{name}[{bad[0]}]={values[bad[0]]} is out of range; expected {want}")
    used = [s for s in values if s >= 0]
    if len(set(used)) != len(used):
        raise ValueError(f"{name} must not repeat a slot (two sequences would race on it); "
                         f"got {list(values)}")
    return values, tensor


def track_indices(track_slots, track_chunks, meta: ChunkMeta, slots: int, state_slots,
                  device: torch.device):
    """Validate the ``fused`` tracking request; return the two index tensors to pass on
    (:func:`index_arg`), ``(None, None)`` when neither is given.

    ``track_chunks[n]`` in ``[0, ⌈L_n/64⌉]`` saves the state after ``64·track_chunks[n]`` tokens
    (the top value = the final state); negative = no write, and then ``track_slots[n]`` may be
    negative too. Every slot a kernel could see is ``< slots``.
    """
    if (track_slots is None) != (track_chunks is None):
        raise ValueError("track_slots and track_chunks must be given together (or neither)")
    if track_slots is None:
        return None, None
    targets_slots, slots_t = index_arg("track_slots", track_slots, meta.N, device)
    chunks, chunks_t = index_arg("track_chunks", track_chunks, meta.N, device)
    rows = [n for n, c in enumerate(chunks) if c >= 0]
    for n, (slot, chunk) in enumerate(zip(targets_slots, chunks)):
        if chunk > meta.counts[n]:
            raise ValueError(f"track_chunks[{n}]={chunk} is out of range; expected <= "
                             f"ceil(L/64)={meta.counts[n]} for a sequence of {meta.lengths[n]} tokens")
        lo = 0 if chunk >= 0 else -(2 ** 31)  # an untracked row may name no slot (negative)
        if not lo <= slot < slots:
            want = f"in [0, {slots})" if chunk >= 0 else f"< {slots} (negative = none)"
            raise ValueError(f"track_slots[{n}]={slot} is out of range; expected {want}")
    dests = [targets_slots[n] for n in rows]
    if len(set(dests)) != len(dests) or set(dests) & set(state_slots):
        raise ValueError("track_slots of tracked rows must be distinct and differ from every "
                         f"state_indices slot; got track_slots={[targets_slots[n] for n in rows]}, "
                         f"state_indices={list(state_slots)}")
    return slots_t, chunks_t
