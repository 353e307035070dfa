"""Allowed syncs, answered: what a run on real tensors read to the host, for the data-less run.

Where an exercise allows syncs (notebook 06's naive track write reads the mask; notebook 07's
``prepare`` may ask the device twice), the data-less run of :mod:`mamba_edu.profiling.fake_device`
cannot stop at the first read. So the answer first runs on real tensors under :func:`recording`,
which writes down, line by line, every value that run read to the host: a Python scalar
(``item``, ``bool``, ``if t:``, ``tolist``, ``torch.equal``), the size of a data-dependent output
(``nonzero``, a boolean mask, ``repeat_interleave``), a host copy (``.cpu()``, ``.to("cpu")``,
``copy_``, ``numpy``). The data-less run then answers each of its reads with the value the real
run read at the same line (the answer is deterministic, so it takes the same path), and refuses,
as before, whatever has no such value. A copy the sync sniffer cannot see on a CPU
(``.to("cpu")``, ``copy_`` into a host tensor: there both tensors are host tensors) counts as a
sync where the data-less run needs it, since there its source was device data.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from mamba_edu.profiling.syncs import BOOL_INDEX_OPS, REPEAT_INTERLEAVE

aten = torch.ops.aten
#: Ops whose result is a Python scalar the host reads.
SCALARS = (aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default)
#: Where the instruments' own frames are (torch, this folder): a read's line is the first outside them.
_OWN = (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)))


def call_site() -> tuple[str, int]:
    """``(file, line)`` of the first frame outside torch, this folder and ``contextlib``: the line
    of the function under test that asked for the value."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith(_OWN)
                                 or frame.f_code.co_filename.endswith("contextlib.py")):
        frame = frame.f_back
    return (frame.f_code.co_filename, frame.f_lineno) if frame is not None else ("?", 0)


@dataclass
class Read:
    """One value read to the host: ``kind`` ``"scalar"`` (a Python number or bool), ``"size"``
    (the leading size of a data-dependent output) or ``"copy"`` (a host tensor); ``counted``: the
    sync sniffer counted it (not a ``.to``/``copy_`` between two host tensors)."""

    site: tuple[str, int]
    kind: str
    value: object
    counted: bool
    used: bool = False


class Reads:
    """The values a run on real tensors read to the host, in order (see :func:`recording`)."""

    def __init__(self):
        self.log: list[Read] = []

    def add(self, kind: str, value, counted: bool = True) -> None:
        self.log.append(Read(call_site(), kind, value, counted))

    def take(self, kind: str, fits=lambda value: True) -> Read | None:
        """The first unused read of ``kind`` made at the caller's line whose value ``fits``
        (marked used), or None."""
        site = call_site()
        for read in self.log:
            if not read.used and read.kind == kind and read.site == site and fits(read.value):
                read.used = True
                return read
        return None


class _Ops(TorchDispatchMode):
    def __init__(self, reads: Reads):
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in SCALARS:
            self.reads.add("scalar", out)
        elif func is aten.nonzero.default or (func in REPEAT_INTERLEAVE and kwargs.get("output_size") is None):
            self.reads.add("size", out.shape[0])
        elif func is aten.masked_select.default:
            self.reads.add("size", out.numel())
        elif func in BOOL_INDEX_OPS:  # the data-less run asks nonzero of the mask
            for index in args[1] if len(args) > 1 else kwargs.get("indices", ()):
                if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8):
                    self.reads.add("size", int(index.count_nonzero()))
        return out


class _Methods(TorchFunctionMode):
    def __init__(self, reads: Reads):
        super().__init__()
        self.reads = reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.Tensor.tolist:  # the data-less run reads it element by element
            for value in torch.tensor(out).flatten().tolist() if isinstance(out, list) else [out]:
                self.reads.add("scalar", value)
        elif func in (torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.__array__):
            self.reads.add("copy", torch.as_tensor(out).clone())
        elif func is torch.Tensor.to and isinstance(out, torch.Tensor):
            self.reads.add("copy", out.detach().clone(), counted=False)
        elif func is torch.Tensor.copy_ and len(args) > 1 and isinstance(args[1], torch.Tensor):
            self.reads.add("copy", args[1].detach().clone(), counted=False)
        return out


@contextlib.contextmanager
def recording():
    """Write down every value the block reads to the host; yields the :class:`Reads`."""
    reads = Reads()
    with _Methods(reads), _Ops(reads):
        yield reads
