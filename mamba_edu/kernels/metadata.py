"""Chunk metadata for packed varlen batches, built on the host and uploaded with one copy.

Every chunk-parallel kernel runs one program per 64-token chunk and must know which sequence and
which chunk of it that program handles. Building that table on the GPU (``repeat_interleave``,
``.tolist()``) would make the CPU wait for the GPU. The scheduler already knows every length as a
CPU list, so we build the table in Python and send it in **one pinned, non-blocking host-to-device
copy**: no device-to-host sync, and the same :class:`ChunkMeta` serves every layer of the forward.

Index tensors (slot indices, track slots, track chunks) are integers that the kernels turn into
addresses. Their ranges must be checked before a launch, and checking a CUDA tensor's values
would sync. So every index tensor made here *remembers the host list it was built from*
(:func:`host_values`); the validation reads that list instead of the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from mamba_edu.gdn.varlen import CHUNK, checkpoint_offsets, chunk_counts, cu_offsets

_HOST_ATTR = "_mamba_edu_host_values"
_VERSION_ATTR = "_mamba_edu_host_version"


def _version(t: torch.Tensor) -> int | None:
    """``t._version``: PyTorch's count of in-place writes to ``t`` and every view of its buffer,
    kept on the host (reading it is no sync). ``None`` for inference tensors, which keep none."""
    try:
        return t._version
    except RuntimeError:
        return None


def check_unchanged(name: str, t: torch.Tensor) -> None:
    """Raise ``ValueError`` naming ``name`` if ``t`` remembers host values (:func:`host_values`)
    but was written in place since it was uploaded: the remembered values, which the checks read,
    may no longer be the ones the kernels would read."""
    if getattr(t, _HOST_ATTR, None) is not None and _version(t) != getattr(t, _VERSION_ATTR, None):
        raise ValueError(f"{name} was changed in place after it was uploaded by build_chunk_meta or "
                         "upload_indices (the views of one upload share one buffer), so its "
                         "remembered host values are stale; build new metadata or upload new "
                         "indices instead of writing into them")


def host_values(t: torch.Tensor, name: str = "the index tensor") -> tuple[int, ...] | None:
    """The host copy of an index tensor's values: the list it was uploaded from for tensors made
    by this module, a CPU tensor's own values, else ``None`` (unknown without a sync).

    The host copy is what gets validated, so a tensor made here must not be written in place
    afterwards: that is detected from its version counter (host-side, no sync) and raises
    ``ValueError`` naming ``name`` (:func:`check_unchanged`).
    """
    remembered = getattr(t, _HOST_ATTR, None)
    if remembered is not None:
        check_unchanged(name, t)
        return remembered
    if t.device.type != "cpu":
        return None
    return tuple(t.tolist())


def upload_host_lists(parts: Sequence[Sequence[int]], device,
                      dtype: torch.dtype = torch.int64) -> list[torch.Tensor]:
    """Copy int lists to ``device`` as ``dtype`` in **one** pinned, non-blocking copy; returns
    views, one per list.

    Pinned (page-locked) memory is what makes ``non_blocking=True`` truly asynchronous; from
    ordinary pageable memory the host would wait for the copy.
    """
    flat = torch.tensor([int(x) for part in parts for x in part], dtype=dtype)
    if torch.device(device).type == "cuda":
        flat = flat.pin_memory()
    flat = flat.to(device, non_blocking=True)
    return list(flat.split([len(p) for p in parts]))


def _upload(parts: Sequence[Sequence[int]], device) -> list[torch.Tensor]:
    """:func:`upload_host_lists` as int32, each view remembering its host list
    (:func:`host_values`)."""
    views = upload_host_lists(parts, device, torch.int32)
    for view, part in zip(views, parts):
        setattr(view, _HOST_ATTR, tuple(int(x) for x in part))
        setattr(view, _VERSION_ATTR, _version(view))
    return views


def upload_indices(values: Sequence[int], device) -> torch.Tensor:
    """An int32 index tensor on ``device`` (one pinned non-blocking copy) that remembers ``values``
    on the host, so that its range can be validated without a sync (e.g. decode slot indices)."""
    return _upload([list(values)], device)[0]


@dataclass(frozen=True, eq=False)
class ChunkMeta:
    """What the kernels need to know about a packed batch of N sequences, T tokens in total.

    Host fields: ``lengths`` (N ints), ``counts`` = ⌈L/64⌉ per sequence, ``offsets`` [N+1]
    (exclusive cumsum of ``counts``: sequence n's checkpoints are rows ``offsets[n]:offsets[n+1]``),
    ``N``, ``T``, ``NT`` = Σ counts.

    Device int32 tensors (views of one uploaded buffer):
        cu_seqlens:     ``[N+1]`` token offsets of the sequences.
        chunk_indices:  ``[NT, 2]`` row i = (sequence id, chunk id within the sequence) of program i.
        chunk_offsets:  ``[N+1]`` = ``offsets`` on the device.
        state_indices, track_slots, track_chunks: ``[N]`` or ``None``, when given to
            :func:`build_chunk_meta` (they remember their host values, see :func:`host_values`).
        workspace:      ``[2 + 2N]`` zeros: the counters of the one-launch prefill
            (:mod:`mamba_edu.kernels.chained`), which leaves them zero again.

    ``verdicts`` holds what the input checks concluded about these index tensors for a pool of a
    given size: every layer of a forward passes the same ones, so only the first layer's call
    checks them (:func:`mamba_edu.kernels.validation.checked_once`).
    """

    lengths: tuple[int, ...]
    counts: tuple[int, ...]
    offsets: tuple[int, ...]
    N: int
    T: int
    NT: int
    cu_seqlens: torch.Tensor
    chunk_indices: torch.Tensor
    chunk_offsets: torch.Tensor
    workspace: torch.Tensor
    state_indices: torch.Tensor | None = None
    track_slots: torch.Tensor | None = None
    track_chunks: torch.Tensor | None = None
    verdicts: dict = field(default_factory=dict, repr=False)


def _check_host_list(name: str, values, n: int) -> list[int]:
    values = list(values)
    if len(values) != n or not all(isinstance(v, int) for v in values):
        raise ValueError(f"{name} must be a list of N={n} ints; got {values!r}")
    return values


def build_chunk_meta(lengths: Sequence[int], device, *, state_indices: Sequence[int] | None = None,
                     track_slots: Sequence[int] | None = None,
                     track_chunks: Sequence[int] | None = None) -> ChunkMeta:
    """Build the metadata of a packed batch from CPU lengths (no device work besides one copy).

    Args:
        lengths: N sequence lengths (each ≥ 1), in packing order.
        device: where the kernels run.
        state_indices, track_slots, track_chunks: optional host lists of N ints, uploaded in the
            same copy (the slot each sequence works in; where and after how many chunks the
            ``fused`` strategy saves a state, −1 = none).
    """
    lengths = list(lengths)
    if not lengths or not all(isinstance(n, int) and n >= 1 for n in lengths):
        raise ValueError(f"lengths must be a non-empty list of ints >= 1; got {lengths!r}")
    counts = chunk_counts(lengths, CHUNK)
    offsets = checkpoint_offsets(lengths, CHUNK)
    cu = cu_offsets(lengths)
    table = [x for seq, count in enumerate(counts) for c in range(count) for x in (seq, c)]
    extras = {name: _check_host_list(name, vals, len(lengths))
              for name, vals in (("state_indices", state_indices), ("track_slots", track_slots),
                                 ("track_chunks", track_chunks)) if vals is not None}
    views = _upload([cu, table, offsets, [0] * (2 + 2 * len(lengths)), *extras.values()], device)
    cu_t, table_t, offsets_t, workspace = views[:4]
    uploaded = dict(zip(extras, views[4:]))
    return ChunkMeta(
        lengths=tuple(lengths), counts=tuple(counts), offsets=tuple(offsets), N=len(lengths),
        T=cu[-1], NT=offsets[-1], cu_seqlens=cu_t, chunk_indices=table_t.view(-1, 2),
        chunk_offsets=offsets_t, workspace=workspace, **uploaded)
