"""Chunk metadata for packed varlen batches, built on the host and uploaded with one copy.

Every chunk-parallel kernel runs one program per 64-token chunk and must know which sequence and
which chunk of it that program handles. Building that table on the GPU (``repeat_interleave``,
``.tolist()``) would make the CPU wait for the GPU. The scheduler already knows every length as a
CPU list, so we build the table in Python and send it in **one pinned, non-blocking host-to-device
copy**: no device-to-host sync, and the same :class:`ChunkMeta` serves every layer of the forward.

Index tensors (slot indices, track slots, track chunks) are integers that the kernels turn into
addresses. Their ranges must be checked before a launch, and checking a CUDA tensor's values
would sync. So every index tensor made here *remembers the host list it was built from*
(:func:`host_values`); the validation reads that list instead of the device. The kernels never
read the tensor the caller holds: each upload also makes a private twin on the device, and the
kernels are given that twin (:func:`kernel_copy`). Writing into the caller's tensor, even
through ``.data`` or ``.numpy()`` which no version counter sees, cannot change what a kernel
reads; an in-place write that the version counter does see is refused where the tensor enters
(:func:`check_unchanged`, called by :func:`host_values`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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


def remembers_values(t: torch.Tensor) -> bool:
    """Whether ``t`` was made here (or refilled by its owner) and remembers its host values."""
    return getattr(t, _HOST_ATTR, None) is not None


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


_PRIVATE_ATTR = "_mamba_edu_kernel_copy"


def _upload(parts: Sequence[Sequence[int]], device) -> list[torch.Tensor]:
    """:func:`upload_host_lists` as int32, each view remembering its host list
    (:func:`host_values`) and holding a private twin (same values, its own buffer) that only
    :func:`kernel_copy` hands out: one upload carries both."""
    host = [tuple(int(x) for x in part) for part in parts]
    views = upload_host_lists(host + host, device, torch.int32)
    public, private = views[:len(host)], views[len(host):]
    for view, twin, values in zip(public, private, host):
        setattr(view, _HOST_ATTR, values)
        setattr(view, _VERSION_ATTR, _version(view))
        setattr(view, _PRIVATE_ATTR, twin)
    return public


def _int_list(name: str, values) -> list[int]:
    """``values`` materialised once as a list of ints (``type(v) is int``: no bools, floats,
    numpy ints); ``ValueError`` naming ``name`` otherwise."""
    if isinstance(values, (str, bytes, torch.Tensor)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a list of ints; got {type(values).__name__}")
    values = list(values)
    bad = next((v for v in values if type(v) is not int), None)
    if bad is not None:
        raise ValueError(f"{name} must hold Python ints (not bools, floats or numpy ints); "
                         f"got {bad!r} in {values!r}")
    return values


def upload_indices(values: Sequence[int], device) -> torch.Tensor:
    """An int32 index tensor on ``device`` (one pinned non-blocking copy) that remembers ``values``
    on the host, so that its range can be validated without a sync (e.g. decode slot indices)."""
    values = _int_list("values", values)
    if any(not -(2 ** 31) <= v < 2 ** 31 for v in values):
        raise ValueError(f"values must fit in int32; got {values!r}")
    return _upload([values], device)[0]


def kernel_copy(t: torch.Tensor | None) -> torch.Tensor | None:
    """The private twin of an index tensor made here, unchecked (None stays None): for callers
    whose arguments were checked where they entered (:func:`host_values` checks)."""
    return None if t is None else getattr(t, _PRIVATE_ATTR)


def remembered(t: torch.Tensor | None) -> tuple[int, ...] | None:
    """The host values an index tensor made here remembers, unchecked (None stays None)."""
    return None if t is None else getattr(t, _HOST_ATTR)


@dataclass(frozen=True, eq=False)
class ChunkMeta:
    """The layout of a packed batch of N sequences, T tokens in total: what every
    chunk-parallel kernel needs to know, and nothing else (the slots each sequence reads and
    writes, and what to track, are arguments of each kernel call).

    Host fields: ``lengths`` (N ints), ``counts`` = ⌈L/64⌉ per sequence, ``offsets`` [N+1]
    (exclusive cumsum of ``counts``: sequence n's checkpoints are rows ``offsets[n]:offsets[n+1]``),
    ``N``, ``T``, ``NT`` = Σ counts.

    Device int32 tensors (views of one uploaded buffer):
        cu_seqlens:     ``[N+1]`` token offsets of the sequences.
        chunk_indices:  ``[NT, 2]`` row i = (sequence id, chunk id within the sequence) of program i.
        chunk_offsets:  ``[N+1]`` = ``offsets`` on the device.

    These three are for reading; the kernels read a private twin of them (``kernel_view()``),
    uploaded in the same copy, so a write into them cannot reach a launch.
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
    _kernel: ChunkMeta | None = field(default=None, repr=False)

    def kernel_view(self) -> ChunkMeta:
        """The same layout with the private device tensors: what the API gives the kernels."""
        return self if self._kernel is None else self._kernel


def build_chunk_meta(lengths: Sequence[int], device) -> ChunkMeta:
    """Build the layout of a packed batch from CPU lengths (no device work besides one copy).

    Args:
        lengths: N sequence lengths (Python ints ≥ 1), in packing order (any iterable, read once).
        device: where the kernels run.
    """
    return build_chunk_meta_with_indices(lengths, device)[0]


def remember_host_values(t: torch.Tensor, values: Sequence[int]) -> None:
    """Mark ``t``, a static buffer its owner has just refilled from ``values``, as holding them:
    validation reads ``values`` (no sync), and the kernels read ``t`` itself, since a captured
    graph reads the buffers it was captured with (:mod:`mamba_edu.engine.bucket`)."""
    setattr(t, _HOST_ATTR, tuple(values))
    setattr(t, _VERSION_ATTR, _version(t))
    setattr(t, _PRIVATE_ATTR, t)


#: The chunk id of a chunk table's unused rows (:func:`chunk_table`): 64 times it lies past any
#: batch, so a program given such a row finds no token and loads and stores nothing.
EMPTY_CHUNK = 1 << 20


def chunk_table(lengths: Sequence[int], capacity: int | None = None) -> list[int]:
    """The flat ``[NT, 2]`` table of (sequence, chunk) rows; with ``capacity`` it is padded to that
    many rows with ``(N − 1, EMPTY_CHUNK)``: a fixed grid for any batch of a bucket."""
    counts = chunk_counts(lengths, CHUNK)
    table = [x for seq, count in enumerate(counts) for c in range(count) for x in (seq, c)]
    if capacity is not None:
        if len(table) > 2 * capacity:
            raise ValueError(f"the batch has {len(table) // 2} chunks, more than the capacity {capacity}")
        table += [len(counts) - 1, EMPTY_CHUNK] * (capacity - len(table) // 2)
    return table


def build_chunk_meta_with_indices(lengths: Sequence[int], device, *, allow_empty: bool = False,
                                  **indices: Sequence[int]) -> tuple[ChunkMeta, dict[str, torch.Tensor]]:
    """:func:`build_chunk_meta` plus index tensors of N ints each (e.g. ``state_indices=[…]``)
    in the same one copy: ``(meta, {name: tensor})``, each tensor as :func:`upload_indices` makes
    it. The meta stays the layout only: the indices are the caller's to pass to each kernel.
    ``allow_empty``: rows of no tokens are allowed (a bucket's padding rows)."""
    lengths = _int_list("lengths", lengths)
    if not lengths or min(lengths) < (0 if allow_empty else 1) or not sum(lengths):
        raise ValueError(f"lengths must be a non-empty list of ints >= 1; got {lengths!r}")
    lists = {name: _int_list(name, values) for name, values in indices.items()}
    for name, values in lists.items():
        if len(values) != len(lengths) or any(not -(2 ** 31) <= v < 2 ** 31 for v in values):
            raise ValueError(f"{name} must be a list of N={len(lengths)} int32 values; got {values!r}")
    counts = chunk_counts(lengths, CHUNK)
    offsets = checkpoint_offsets(lengths, CHUNK)
    cu = cu_offsets(lengths)
    if cu[-1] >= 2 ** 31:
        raise ValueError(f"lengths must add up to fewer than 2**31 tokens; got {cu[-1]}")
    table = chunk_table(lengths)
    cu_t, table_t, offsets_t, *index_t = _upload([cu, table, offsets, *lists.values()], device)
    host = dict(lengths=tuple(lengths), counts=tuple(counts), offsets=tuple(offsets), N=len(lengths),
                T=cu[-1], NT=offsets[-1])
    private = ChunkMeta(**host, cu_seqlens=getattr(cu_t, _PRIVATE_ATTR),
                        chunk_indices=getattr(table_t, _PRIVATE_ATTR).view(-1, 2),
                        chunk_offsets=getattr(offsets_t, _PRIVATE_ATTR))
    meta = ChunkMeta(**host, cu_seqlens=cu_t, chunk_indices=table_t.view(-1, 2),
                     chunk_offsets=offsets_t, _kernel=private)
    return meta, dict(zip(lists, index_t))
