"""Sync-free by construction: run a function on CUDA tensors that have no data.

A device-to-host sync is a read of data the host does not have. Under PyTorch's
``FakeTensorMode`` a tensor on a fake ``cuda`` device has a shape, a dtype and strides but no
values, and the mode runs on a CPU-only torch. Every read of its values fails: ``.item()``,
``.tolist()``, ``bool()``, ``int()``, ``.to("cpu")`` followed by a read, ``nonzero``, boolean
masks, ``allclose``, ``bincount``, ``unique``, ``repeat_interleave`` without ``output_size``. It
fails in another thread too, and with torch's dispatch modes switched off, because the tensor
itself has nothing to give. Ops whose output shape is known without the data (``cumsum``,
``gather``, ``scatter``, ``nonzero_static``, ``repeat_interleave(output_size=…)``) run.

So "``fn`` makes no sync" becomes "``fn`` runs without its data" (what ``torch.compile`` calls
data-independent): :func:`data_read` runs ``fn`` once on fake copies of its tensor arguments
(the course's device tensors: on a CPU they stand in for the GPU's) and reports the first read,
or ``None``. Host values (Python ints and lists, a batch's CPU mirrors) stay real; tensors the
function makes are fake too, so a tensor built from host values must stay host values (a Python
list) to be read. (A fake ``cuda`` device would also work, but a CPU-only torch cannot index
tensors on it.) The values themselves are then checked on real tensors, separately.

:func:`mamba_edu.profiling.count_syncs` stays the instrument that counts syncs where they happen;
this is the judge that cannot be walked around.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable

import torch

def fake_copy(obj, mode):
    """``obj`` with every tensor inside it (also in lists, tuples, dicts and dataclasses)
    replaced by a tensor of ``mode``: same device, shape, dtype and strides, no data.
    Everything else is returned as it is."""
    if isinstance(obj, torch.Tensor):
        with mode:
            return torch.empty_strided(obj.shape, obj.stride(), dtype=obj.dtype, device=obj.device)
    if isinstance(obj, (list, tuple)):
        out = [fake_copy(x, mode) for x in obj]
        return type(obj)(*out) if hasattr(obj, "_fields") else type(obj)(out)
    if isinstance(obj, dict):
        return {k: fake_copy(v, mode) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: fake_copy(getattr(obj, f.name), mode)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def _read_recorder():
    """A ``FakeTensorMode`` that also writes down every read it refuses, from any thread: a
    fake tensor dispatches to its own mode wherever it is used, so an answer that catches the
    error (or reads in a worker thread) is still seen."""
    from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                               DynamicOutputShapeException, FakeTensorMode)

    class ReadRecorder(FakeTensorMode):
        def __init__(self):
            super().__init__(allow_non_fake_inputs=True)  # a tensor the answer keeps in a global
            self.reads: list[str] = []

        def dispatch(self, func, types, args=(), kwargs=None):
            try:
                return super().dispatch(func, types, args, kwargs)
            except (DataDependentOutputException, DynamicOutputShapeException):
                self.reads.append(str(func))
                raise
    return ReadRecorder()


def data_read(fn: Callable[..., object], *args) -> str | None:
    """Run ``fn(*args)`` with every tensor argument replaced by one without data. Returns
    ``None`` if it read nothing, else what it read, e.g. ``"aten._local_scalar_dense.default (a
    value or a data-dependent size read to the host)"``. An error that is not a read (a shape
    mismatch, say) propagates."""
    mode = _read_recorder()
    fake = [fake_copy(a, mode) for a in args]
    error = None
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level, log.level = log.level, logging.CRITICAL  # it logs each refused op as an error
    try:
        with mode:  # what the function creates is fake too: no real buffer to copy a value into
            fn(*fake)
    except Exception as exc:  # noqa: BLE001 - a read is the verdict; any other error is re-raised
        error = exc
    finally:
        log.setLevel(level)
    if mode.reads:
        return f"{mode.reads[0]} (a value or a data-dependent size read to the host)"
    if error is not None:
        raise error
    return None


def would_be_sync(fn: Callable[..., object], args) -> str | None:
    """:func:`data_read` for the exercise checks: the read as a would-be sync (one line), or
    None. An error the data-less run meets that is not a read is left to the real run, which
    meets it too (a genuine bug) or not (an op without a data-less form: not a read)."""
    try:
        read = data_read(fn, *args)
    except Exception:  # noqa: BLE001 - see the docstring
        return None
    return None if read is None else f"a read of device data: {read}"
