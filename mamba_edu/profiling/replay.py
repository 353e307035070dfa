"""Allowed syncs, answered: what a run on real tensors read to the host, for the data-less run.

Where an exercise allows syncs (notebook 06's naive track write reads the mask; notebook 07's
``prepare`` may ask the device twice), the data-less run of :mod:`mamba_edu.profiling.fake_device`
cannot stop at the first read. So the answer also runs on real tensors under :func:`recording`,
which writes down, line by line, every value that run read to the host, with the shape and dtype
of the tensor it came from: a Python scalar (``item``, ``bool``, ``if t:``, ``tolist``,
``torch.equal``, ``allclose``), the shapes of a data-dependent output (``nonzero``, a boolean mask,
``masked_select``, ``unique``, ``repeat_interleave``), a host copy (``.cpu()``, ``.to("cpu")``,
``copy_``, ``host[:] = t``, ``torch.as_tensor``, ``.type``), a printed text. The data-less run then
answers each of its reads with the value read at the same line from a tensor of the same shape
and dtype (the answer is deterministic, so it takes the same path), and refuses whatever has no
such value. The calls whose values it took are the syncs, counted by construction: a host copy
the sniffer cannot see on a CPU (``.to("cpu")``, ``copy_``: there both tensors are host tensors)
is one, and a read of a tensor the answer made on the host (which the sniffer, on a CPU, counts)
is none.
"""

from __future__ import annotations

import collections
import contextlib
import sys
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from mamba_edu.profiling.syncs import ALWAYS_SYNC, BOOL_INDEX_OPS, first_outside

aten = torch.ops.aten
#: Ops whose result is a Python scalar the host reads.
SCALARS = (aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default, aten.allclose.default)
#: Ops whose output shapes depend on values: the data-less run is answered with the real shapes.
SHAPED = (aten.nonzero.default, aten.masked_select.default, aten._unique2.default, aten.unique_dim.default,
          aten.unique_consecutive.default, aten.repeat_interleave.Tensor)
#: Calls that copy their source tensor to the host (on a GPU; on a CPU most are no-ops), by name.
_COPIES = {torch.Tensor.cpu: "cpu()", torch.Tensor.to: ".to(the host)", torch.Tensor.copy_: "copy_ into a host tensor",
           torch.Tensor.__setitem__: "host[...] = device data", torch.as_tensor: "torch.as_tensor(device=the host)",
           torch.Tensor.type: ".type(a host type)"}
_TEXTS = (torch.Tensor.__repr__, torch.Tensor.__str__, torch.Tensor.__format__)


def call_site() -> tuple[str, int]:
    """``(file, line)`` of the function under test that asked for a value (the first frame that is
    not an instrument's: :func:`mamba_edu.profiling.syncs.first_outside`)."""
    frame = first_outside(sys._getframe(1))
    return (frame.f_code.co_filename, frame.f_lineno) if frame is not None else ("?", 0)


def signature(t) -> tuple:
    """What a read is matched on besides its line: the source tensor's shape and dtype (``t``
    itself if it is already a signature)."""
    return (tuple(t.shape), str(t.dtype)) if isinstance(t, torch.Tensor) else t


@dataclass
class Read:
    """One value read to the host: ``value`` (a number or bool; the ``(shape, dtype)`` of each
    output of a data-dependent op; a host tensor; a printed text), by the call ``op`` (one sync:
    the elements of a ``tolist`` share their ``call``, a number)."""

    value: object
    op: str
    call: int


class Reads:
    """The values a run on real tensors read to the host (see :func:`recording`), queued by
    (line, ``kind``, source tensor's shape and dtype), in the order they were read: ``kind`` is
    ``"scalar"``, ``"shapes:<op>"``, ``"copy"`` or ``"text"``."""

    def __init__(self):
        self.unused: dict[tuple, collections.deque] = {}
        self.calls = 0

    def add(self, kind: str, source: tuple, value, op: str, new_call: bool = True) -> None:
        self.calls += new_call
        self.unused.setdefault((call_site(), kind, source), collections.deque()).append(Read(value, op, self.calls))

    def take(self, kind: str, source: tuple) -> Read | None:
        """The first unused read of ``kind`` from a tensor of signature ``source`` made at the
        caller's line (used up), or None."""
        queue = self.unused.get((call_site(), kind, source))
        return queue.popleft() if queue else None


def _flat(values) -> list:
    return [v for x in values for v in _flat(x)] if isinstance(values, list) else [values]


def _shapes(out) -> list:
    return [(tuple(t.shape), t.dtype) for t in (out if isinstance(out, (tuple, list)) else [out])]


def op_reads(func, args, kwargs, out) -> list[tuple]:
    """The host reads of one aten op ``func(*args, **kwargs) -> out``, as ``(kind, source tensor,
    value, op name, a new call)``: what the data-less run would ask for if the source were device
    data (a boolean index: the nonzero it asks)."""
    if func in SCALARS:
        return [("scalar", args[0], out, ALWAYS_SYNC[func], True)]
    if func in SHAPED:
        return [(f"shapes:{func}", args[0], _shapes(out), ALWAYS_SYNC.get(func, str(func.overloadpacket)), True)]
    if func is aten.repeat_interleave.self_Tensor and kwargs.get("output_size") is None:
        # the data-less run asks repeat_interleave.Tensor of the repeats for the size
        return [(f"shapes:{aten.repeat_interleave.Tensor}", args[1], [((out.shape[0],), torch.long)],
                 "repeat_interleave", True)]
    if func in BOOL_INDEX_OPS:
        masks = [i for i in (args[1] if len(args) > 1 else kwargs.get("indices", ()))
                 if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)]
        with _disable_current_modes():  # not reads of the answer's
            counts = [int(m.count_nonzero()) for m in masks]
        return [(f"shapes:{aten.nonzero.default}", m, [((n, m.dim()), torch.long)], "boolean-mask indexing", True)
                for m, n in zip(masks, counts)]
    return []


#: Where the source tensor of a copy is: (position, keyword).
_SOURCE = {torch.Tensor.copy_: (1, "src"), torch.Tensor.__setitem__: (2, "value"), torch.as_tensor: (0, "data")}


def method_reads(func, args, kwargs, out) -> list[tuple]:
    """The host reads of one Tensor method or torch function call, as in :func:`op_reads`: those
    that do not reach the dispatcher on a CPU (``tolist``, printing, host copies)."""
    if not (func is torch.Tensor.tolist or func in _TEXTS or func in _COPIES):
        return []
    at, name = _SOURCE.get(func, (0, "self"))
    source = args[at] if len(args) > at else kwargs.get(name)
    if not isinstance(source, torch.Tensor):
        return []
    if func is torch.Tensor.tolist:  # the data-less run reads it element by element: one call
        element = ((), str(source.dtype))
        return [("scalar", element, value, "tolist", i == 0) for i, value in enumerate(_flat(out))]
    if func in _TEXTS:
        return [("text", source, out, "repr/print", True)]
    if func is not torch.Tensor.to or _to_a_device(args, kwargs):
        return [("copy", source, source, _COPIES[func], True)]  # the recorder keeps a copy
    return []


class _Ops(TorchDispatchMode):
    def __init__(self, reads: Reads):
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        for kind, source, value, op, new_call in op_reads(func, args, kwargs, out):
            self.reads.add(kind, signature(source), value, op, new_call)
        return out


class Methods(TorchFunctionMode):
    """Records the reads of :func:`method_reads` (the real run), or, with ``consume``, marks
    those of host tensors used (the data-less run: a host tensor's read there is real and needs
    no answer, and taking its record keeps the two runs in step)."""

    def __init__(self, reads: Reads, consume: bool = False):
        super().__init__()
        self.reads, self.consume = reads, consume

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        for kind, source, value, op, new_call in method_reads(func, args, kwargs, out):
            if not self.consume:
                value = value.detach().clone() if kind == "copy" else value
                self.reads.add(kind, signature(source), value, op, new_call)
            elif not _is_fake(source):
                self.reads.take(kind, signature(source))
        return out


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(t, FakeTensor)


def _to_a_device(args, kwargs) -> bool:
    """Whether a ``Tensor.to`` call names a device (a dtype alone stays where it is)."""
    return "device" in kwargs or any(isinstance(a, (str, torch.device, torch.Tensor)) for a in args[1:])


@contextlib.contextmanager
def recording():
    """Write down every value the block reads to the host; yields the :class:`Reads`. Enter it
    before the sync sniffer, so the sniffer sees the answer's calls and not the recorder's."""
    reads = Reads()
    with Methods(reads), _Ops(reads):
        yield reads
