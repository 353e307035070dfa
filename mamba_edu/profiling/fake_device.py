"""Sync-free by construction: run a function on ``cuda`` tensors that have no data.

A device-to-host sync is the host waiting for device data. :func:`data_read` runs a function once
on data-less copies of its tensor arguments: ``FakeTensor``\\ s on a fake ``cuda`` device (shape,
dtype, strides, no values; a CPU-only torch runs them as ``meta``). Whatever needs the values on
the host is refused there (the answer gets an error) and written down, whichever op, thread or
mode asks, however the answer handles the error:

* a read: ``.item()``, ``.tolist()``, ``bool()``, ``int()``, ``nonzero``, a boolean mask,
  ``unique``, ``repeat_interleave`` without ``output_size`` (``DataDependentOutputException``);
* a copy to the host: ``.cpu()``, ``.to("cpu")``, ``copy_`` into a host tensor, any op that takes
  device data and gives a host tensor, and the methods that hand data or its address over without
  an op: ``numpy``, ``__array__``, ``__dlpack__``, ``data_ptr``, ``apply_``, ``map_``, ``map2_``,
  and printing it (``repr``, ``str``, ``f"{t}"``);
* a host tensor (not 0-dim) mixed with device data, which fails on a GPU: make it with ``device=``;
* a result that holds a host tensor (not 0-dim) where a ``device`` was asked for, made without
  ``device=``;
* a call of :data:`GUARDED`, :data:`TO_HOST` or :data:`READS` on device data with torch's Python
  dispatch switched off (``torch._C._DisableTorchDispatch``), which no mode sees.

Host values stay real: Python ints and lists, and every tensor the function makes on the host, so
host computation reads its values as freely as on a GPU. The function's ``device`` argument, if
any (a ``torch.device``), becomes the fake device. Ops whose output shape needs no values
(``cumsum``, ``gather``, ``scatter``, ``nonzero_static``, ``repeat_interleave(output_size=…)``)
run.

A CPU-only torch has no ``cuda`` device guard, which the Python bindings of a few ``Tensor``
methods open before any op runs (:data:`GUARDED`: indexing, ``int()``, ``float()``, ``copy_``,
``new_tensor`` …). For such a call the fake tensors report ``meta`` and the results it makes get
the fake device back.

Where syncs are allowed, :class:`DataLess` answers each read with the value the real run read at
the same line (:mod:`mamba_edu.profiling.replay`), so the run goes on past the allowed reads and
still refuses a host tensor mixed with device data; the reads it answered are the syncs, counted
by construction (a ``.to("cpu")`` that is a no-op on a CPU too).

The run is in a forked child (where ``os.fork`` exists), so that an answer that crashes there
(``ctypes`` reading a data-less buffer) costs its exercise, not the notebook: the child sends
its verdict back through a pipe. The values themselves are checked on real tensors, separately;
:func:`mamba_edu.profiling.count_syncs` stays the instrument that counts syncs where they happen.
Like any check that runs Python, an answer that looks at its arguments' types can tell this run
from the real one, and one that switches torch's dispatch off and then calls a method not in the
lists above gets an error but no verdict; the judge catches sync-making code, not a program
written to fool it. ``docs/judging.md`` tells the whole story.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import faulthandler
import functools
import json
import logging
import os
import pickle
import select
import signal
import sys
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

#: The device the data-less tensors are on.
DEVICE = torch.device("cuda", 0)
#: Where torch's own code is: its calls with the dispatch switched off are the mode's, not the answer's.
TORCH_DIR = os.path.dirname(torch.__file__)
#: Tensor methods whose C++ binding opens a device guard for their tensor (no ``cuda`` one in a
#: CPU-only torch): they run with the fake tensors reporting ``meta``.
GUARDED = ("__getitem__", "__setitem__", "__int__", "__float__", "__index__", "__complex__",
           "__invert__", "copy_", "new", "new_tensor", "nonzero")
#: Tensor methods that give the host device data, or its address, without an op (``__repr__`` and
#: ``__format__``: printing, ``str()`` and ``f"{t}"``, which on a GPU copy the values first; torch's
#: own messages print the data-less tensor).
TO_HOST = ("numpy", "__array__", "__dlpack__", "data_ptr", "apply_", "map_", "map2_", "__repr__", "__format__")
SHOWN = ("__repr__", "__format__")  # printing: torch's own code may print the data-less tensor
#: The other Tensor methods that bring device data to the host (through an op, which torch's
#: dispatch switched off would hide from the mode).
READS = ("item", "__bool__", "cpu", "to")
#: The longest verdict the forked run sends back, and how long it may take.
VERDICT_BYTES, TIMEOUT_S = 1000, 120


class HostCopy(RuntimeError):
    """Device data refused to the host (the answer sees this error; the verdict is kept)."""


def fake_copy(obj, mode):
    """``obj`` with every tensor inside it (also in lists, tuples, dicts and dataclasses)
    replaced by a tensor of ``mode`` on :data:`DEVICE` (same shape, dtype and strides, no data),
    and every ``torch.device`` by :data:`DEVICE`. Everything else is returned as it is."""
    if isinstance(obj, torch.device):
        return DEVICE
    if isinstance(obj, torch.Tensor):
        with mode:
            return torch.empty_strided(obj.shape, obj.stride(), dtype=obj.dtype, device=DEVICE)
    if isinstance(obj, (list, tuple)):
        out = [fake_copy(x, mode) for x in obj]
        return type(obj)(*out) if hasattr(obj, "_fields") else type(obj)(out)
    if isinstance(obj, dict):
        return {k: fake_copy(v, mode) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: fake_copy(getattr(obj, f.name), mode)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def _on_device(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(t, FakeTensor) and t.fake_device.type != "cpu"


def _read_recorder(reads=None):
    """A ``FakeTensorMode`` that runs host ops for real and writes down every refusal, from any
    thread: a fake tensor dispatches to its own mode wherever it is used, so an answer that
    catches the error (or reads in a worker thread) is still seen. With ``reads`` (a
    :class:`mamba_edu.profiling.replay.Reads` of the real run) a read is answered with the value
    the real run read at the same line, and refused only where there is none."""
    from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                               FakeTensor, FakeTensorDeviceMismatchError, FakeTensorMode)
    from torch.utils._pytree import arg_tree_leaves, tree_leaves

    from mamba_edu.profiling.replay import SCALARS, SHAPED, op_reads, signature

    class ReadRecorder(FakeTensorMode):
        avoid_device_init = True  # with a CUDA torch too: the forked run must not touch the GPU

        def __init__(self):
            super().__init__(allow_non_fake_inputs=True)  # host tensors, a tensor kept in a global
            self.syncs: list[str] = []
            self.reads, self.answered = reads, {}  # answered: the real run's calls taken, one sync each

        def refuse(self, verdict: str, error: type = HostCopy):
            self.syncs.append(verdict)
            raise error(verdict)

        def answer(self, kind: str, verdict: str, source, error: type = HostCopy):
            """The real run's value of this read of ``source``, or its refusal; a sync if
            ``source`` is device data (a host tensor turned fake inside an op with device data,
            a host mask indexing device data, say, is read on the host)."""
            read = self.reads.take(kind, signature(source)) if self.reads is not None else None
            if read is None:
                self.refuse(verdict, error)
            if _on_device(source):
                self.answered[read.call] = read.op
            return read.value

        def device_tensor(self, shape, dtype):
            with self:
                return torch.empty(shape, dtype=dtype, device=DEVICE)

        def dispatch(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            inputs = arg_tree_leaves(*args, **kwargs)
            op, device_data = str(func.overloadpacket), any(map(_on_device, inputs))
            to = torch.device(kwargs.get("device") or "cpu").type
            if to == "cpu" and not any(isinstance(t, FakeTensor) for t in inputs):
                out = func(*args, **kwargs)  # host data: real, as on a GPU
                for kind, source, *_ in op_reads(func, args, kwargs, out) if self.reads is not None else ():
                    self.reads.take(kind, signature(source))  # a host read: its record used, in step
                return out
            copied = f"a copy of device data to the host ({op})"
            if device_data and kwargs.get("device") is not None and to == "cpu":
                return self.answer("copy", copied, args[0]).to(kwargs.get("dtype") or args[0].dtype)
            if func is torch.ops.aten.copy_.default and not isinstance(args[0], FakeTensor) and _on_device(args[1]):
                return args[0].copy_(self.answer("copy", copied, args[1]))
            read = f"a read of device data to the host ({op}: a value, or a size that depends on values)"
            try:
                out = super().dispatch(func, types, args, kwargs)
            except DataDependentOutputException as err:
                if func not in SCALARS:
                    self.refuse(read, type(err))
                return self.answer("scalar", read, args[0], type(err))
            except DynamicOutputShapeException as err:
                if func not in SHAPED:
                    self.refuse(read, type(err))
                outs = [self.device_tensor(shape, dtype) for shape, dtype in
                        self.answer(f"shapes:{func}", read, args[0], type(err))]
                return outs[0] if len(outs) == 1 else tuple(outs)
            except FakeTensorDeviceMismatchError:
                self.refuse(f"a host tensor mixed with device data ({op}): on a GPU that is an error; "
                            "make it with device=", RuntimeError)
            if device_data and any(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in tree_leaves(out)):
                self.refuse(copied)
            return out
    return ReadRecorder()


def call_on_meta(method, self, args, kwargs):
    """``method(self, *args, **kwargs)`` (a :data:`GUARDED` ``Tensor`` method) with the fake device
    tensors among its arguments reporting ``meta`` for the call, since a CPU-only torch has no
    ``cuda`` device guard; the fake tensors it returns get the fake device back."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._pytree import tree_leaves

    moved = [t for t in tree_leaves((self, args, kwargs)) if _on_device(t)]
    for t in moved:
        t.fake_device = torch.device("meta")
    try:
        out = method(self, *args, **kwargs)
    finally:
        for t in moved:
            t.fake_device = DEVICE
    for t in tree_leaves(out) if moved else ():
        if isinstance(t, FakeTensor) and t.fake_device.type == "meta":
            t.fake_device = DEVICE
    return out


class _FunctionForms(TorchFunctionMode):
    """``torch.nonzero(t, …)`` of a fake device tensor as ``t.nonzero(…)``: the function's binding
    opens the same ``cuda`` device guard as the :data:`GUARDED` method."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nonzero and args and _on_device(args[0]):
            return args[0].nonzero(*args[1:], **kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def _device_methods(mode):
    """While the block runs, the :data:`GUARDED`, :data:`TO_HOST` and :data:`READS` methods of fake
    tensors are wrapped: on a device tensor a :data:`TO_HOST` one is refused, so is any of them
    with torch's Python dispatch switched off, and a :data:`GUARDED` one runs with the fake
    tensors of its arguments on ``meta`` (its results get the fake device back)."""
    from torch._subclasses.fake_tensor import FakeTensor

    def wrapped(name):
        method = FakeTensor.__repr__ if name == "__repr__" else getattr(torch.Tensor, name)

        @functools.wraps(method)
        def call(self, *args, **kwargs):
            torch_own = sys._getframe(1).f_code.co_filename.startswith(TORCH_DIR)  # the mode's, or a message
            if (_on_device(self) and torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.Python)
                    and not torch_own):
                mode.refuse(f"device data read with torch's dispatch switched off (Tensor.{name})")
            if _on_device(self) and name in TO_HOST and not (name in SHOWN and torch_own):
                verdict = f"a copy of device data to the host (Tensor.{name})"
                if name in SHOWN:  # printing, where syncs are allowed: the real run's text
                    return mode.answer("text", verdict, self)
                mode.refuse(verdict)
            return call_on_meta(method, self, args, kwargs) if name in GUARDED else method(self, *args, **kwargs)
        return call

    names = GUARDED + TO_HOST + READS
    saved = {name: FakeTensor.__dict__.get(name) for name in names}
    for name in names:
        setattr(FakeTensor, name, wrapped(name))
    try:
        yield
    finally:
        for name, method in saved.items():
            if method is None:
                delattr(FakeTensor, name)
            else:
                setattr(FakeTensor, name, method)


def _tensors_in(obj) -> list:
    """The tensors of a result: itself, or inside its lists, tuples, dicts and dataclasses."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    if isinstance(obj, dict):
        obj = list(obj.values())
    return [t for x in obj for t in _tensors_in(x)] if isinstance(obj, (list, tuple)) else []


def data_read(fn: Callable[..., object], *args) -> str | None:
    """Run ``fn(*args)`` with every tensor argument replaced by one without data on the fake
    device, here, in this process. Returns ``None`` if it kept device data on the device, else
    the first refusal, e.g. ``"a copy of device data to the host (aten._to_copy)"``. Any other
    error (a shape mismatch, say) propagates."""
    return _run(fn, args)[0]


def _run(fn, args, reads=None) -> tuple[str | None, list[str]]:
    """:func:`data_read`, its reads answered from ``reads`` if given: ``(the first refusal or
    None, the real run's calls whose values it took: the syncs, one name each)``."""
    from mamba_edu.profiling.replay import Methods
    mode = _read_recorder(reads)
    fake = [fake_copy(a, mode) for a in args]
    error = None
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level, log.level = log.level, logging.CRITICAL  # it logs each refused op as an error
    try:
        with _device_methods(mode), mode, _FunctionForms(), \
                Methods(reads, consume=True) if reads is not None else contextlib.nullcontext():
            out = fn(*fake)  # what the function creates on the device is fake too
        # a host plan may return host tensors; asked for a device, or feeding device work, it may not
        asked = reads is not None or any(isinstance(a, torch.device) for a in args)
        if asked and any(t.dim() and not _on_device(t) for t in _tensors_in(out)):
            mode.syncs.append("a result left on the host: on a GPU it is not on the device; make it "
                              "with device=")
    except Exception as exc:  # noqa: BLE001 - a refusal is the verdict; any other error is re-raised
        error = exc
    finally:
        log.setLevel(level)
    if mode.syncs:
        return mode.syncs[0], list(mode.answered.values())
    if error is not None:
        raise error
    return None, list(mode.answered.values())


def _verdict(fn, args, reads) -> tuple[str | None, list[str]]:
    """:func:`_run`. An error that is not a refusal counts as none where every read is refused
    (see :func:`would_be_sync`); where the reads are answered it is a refusal, since the real run
    went through: an op the judge cannot run without data, or a path the real run did not take."""
    try:
        return _run(fn, args, reads)
    except BaseException as exc:  # noqa: BLE001 - see above
        if reads is None:
            return None, []
        return (f"the answer raised {type(exc).__name__} on device tensors with no data ({str(exc)[:200]}): "
                f"an op the judge cannot run without data, or a path the real run did not take"), []


def _profile_hooks_kept_not_run() -> None:
    """In the forked child: the profile API keeps the hooks it is given without running them. A
    judge's hook runs at every call and slows the data-less run several times over, and what it
    would find here never reaches the parent, which watched the real run."""
    import threading
    kept = {sys: sys.getprofile(), threading: threading.getprofile()}
    sys.setprofile(None)
    threading.setprofile(None)
    for module in kept:
        module.setprofile = lambda hook, module=module: kept.__setitem__(module, hook)
        module.getprofile = lambda module=module: kept[module]


class DataLess:
    """The data-less run of ``fn(*args)``, in a child forked when this is made (where ``os.fork``
    exists), so that a crash there costs the exercise, not the notebook, and so that what a real
    run made afterwards leaves in memory (a memo, a cache) is not there. The child waits for
    :meth:`verdict`. Use it as a context manager: leaving it ends a child still waiting."""

    def __init__(self, fn: Callable[..., object], args):
        self.fn, self.args, self.pid = fn, args, None
        if not hasattr(os, "fork"):
            return  # Windows: the run happens in this process, in verdict()
        (self.reads_in, self.reads_out), (self.back_in, self.back_out) = os.pipe(), os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never back into the caller's code, never flush the parent's buffers
            try:
                os.close(self.reads_out)
                os.close(self.back_in)
                import resource
                faulthandler.disable()  # a crash is the parent's verdict, not a traceback on stderr
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
                torch.set_num_threads(1)  # the parent's thread pool did not survive the fork
                sys.stdout = sys.stderr = open(os.devnull, "w")  # the real run printed already
                _profile_hooks_kept_not_run()
                with os.fdopen(self.reads_in, "rb") as pipe:
                    reads = pickle.load(pipe)
                refused, syncs = _verdict(fn, args, reads)
                sent = json.dumps([(refused or "")[:VERDICT_BYTES // 2], collections.Counter(syncs)])
                os.write(self.back_out, ("=" + sent).encode()[:VERDICT_BYTES])
            finally:
                os._exit(0)
        os.close(self.reads_in)
        os.close(self.back_out)

    def verdict(self, reads) -> tuple[str | None, list[str]]:
        """Send the child the real run's ``reads`` (None: every read refused) and return ``(the
        first refusal or None, the syncs: the real run's calls whose values it took)``; a child
        that dies or does not finish within :data:`TIMEOUT_S` is a refusal too."""
        if self.pid is None:
            return _verdict(self.fn, self.args, reads)
        try:
            with os.fdopen(self.reads_out, "wb") as pipe:
                pickle.dump(reads, pipe)
        except BrokenPipeError:
            pass  # the child is gone: its status says how
        with os.fdopen(self.back_in, "rb") as pipe:
            done = select.select([pipe], [], [], TIMEOUT_S)[0]
            sent = pipe.read(VERDICT_BYTES).decode(errors="replace") if done else None
        if sent is None:
            os.kill(self.pid, signal.SIGKILL)
        status = os.waitpid(self.pid, 0)[1]
        self.pid = None
        if sent is None:
            return f"the answer did not finish on device tensors within {TIMEOUT_S} s", []
        if sent.startswith("=") and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            try:
                refused, syncs = json.loads(sent[1:])
                return refused or None, [op for op, n in syncs.items() for _ in range(n)]
            except ValueError:
                return "the answer's verdict on device tensors did not fit its pipe", []
        how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
               else f"exit status {os.WEXITSTATUS(status)}")
        return f"the answer crashed on device tensors ({how})", []

    def __enter__(self) -> DataLess:
        return self

    def __exit__(self, *exc) -> None:
        if self.pid is not None:  # never asked (the real run failed): end the waiting child
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            for fd in (self.reads_out, self.back_in):
                with contextlib.suppress(OSError):
                    os.close(fd)


def would_be_sync(fn: Callable[..., object], args) -> str | None:
    """:func:`data_read` for the exercise checks, in a forked child where the platform has
    ``os.fork`` (:class:`DataLess`): the first would-be sync (one line), or None. An error the
    data-less run meets that is not a refusal is left to the real run, which meets it too (a
    genuine bug) or not (an op without a data-less form: not a sync). A crash of the child is a
    verdict: "the answer crashed on device tensors (signal 11)"."""
    with DataLess(fn, args) as run:
        return run.verdict(None)[0]
