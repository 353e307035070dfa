"""Count the host syncs a piece of code would make on a GPU, even when it runs on a CPU.

A CUDA kernel launch returns at once; the CPU runs ahead and queues more work. Any op whose
*result the host needs* (a Python bool, an int, a data-dependent shape, a copy to host memory)
makes the CPU wait until the GPU has drained its queue: a device-to-host (D2H) sync. On a CPU
nothing waits, so the sniffer below watches the ops themselves:

* :func:`count_syncs` — a ``TorchDispatchMode`` (every aten op passes through it) plus a
  ``TorchFunctionMode`` (for ``.tolist()``/``.cpu()``/``.numpy()``, which on a CPU tensor never
  reach the dispatcher). Each would-be sync is recorded with the Python line that caused it.
* :func:`cuda_sync_guard` — on a GPU, ``torch.cuda.set_sync_debug_mode("error")``: the real
  check, raising at the first synchronizing call.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from mamba_edu.probes import in_host_only_block

aten = torch.ops.aten

#: Ops that always need a value on the host: a Python scalar or a data-dependent output size.
ALWAYS_SYNC = {
    aten._local_scalar_dense.default: "item/bool/int (_local_scalar_dense)",
    aten.is_nonzero.default: "bool(t) (is_nonzero)",
    aten.nonzero.default: "nonzero",
    aten.masked_select.default: "masked_select",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique_consecutive",
    aten.equal.default: "torch.equal",
    aten.allclose.default: "allclose",
}
#: Indexing ops: a boolean index among their indices makes the output size depend on values.
BOOL_INDEX_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                  aten._index_put_impl_.default}
#: ``repeat_interleave`` with a tensor of repeats: without ``output_size`` its size depends on values.
REPEAT_INTERLEAVE = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}
_COPIES = {aten._to_copy.default, aten.copy_.default}
#: Tensor methods that read a tensor into host memory without reaching the dispatcher on a CPU.
_HOST_READS = {torch.Tensor.tolist: "tolist", torch.Tensor.cpu: "cpu()", torch.Tensor.numpy: "numpy",
               torch.Tensor.__array__: "np.asarray/np.array (__array__)", torch.Tensor.__dlpack__: "__dlpack__",
               torch.Tensor.untyped_storage: "untyped_storage()", torch.Tensor.storage: "storage()",
               torch.Tensor.__repr__: "repr/print", torch.Tensor.__str__: "str/print",
               torch.Tensor.__format__: "format/print", torch.Tensor.__reduce_ex__: "pickle"}

_TORCH_DIR = os.path.dirname(torch.__file__)
_THIS_FILE = os.path.abspath(__file__)
_OWN = (_TORCH_DIR, os.path.dirname(_THIS_FILE) + os.sep)
_HANDLERS = ("__torch_dispatch__", "__torch_function__")
_PACKAGE_DIR = os.path.dirname(os.path.dirname(_THIS_FILE)) + os.sep
_EXERCISES_DIR = os.path.join(_PACKAGE_DIR, "exercises") + os.sep


def _excused(strict: bool, filename: str) -> bool:
    """Whether a would-be sync at ``filename`` sits in a :func:`host_only` block that counts. In
    ``strict`` mode (the exercise checks) only the package's own code is excused: a block the
    learner opens does not switch the sniffer off."""
    if not in_host_only_block():
        return False
    return not strict or (filename.startswith(_PACKAGE_DIR) and not filename.startswith(_EXERCISES_DIR))


@dataclass(frozen=True)
class SyncEvent:
    """One would-be sync: the op and the first Python frame outside torch that caused it."""

    op: str
    filename: str
    lineno: int
    function: str

    @property
    def site(self) -> str:
        """``"file.py:123"`` with the file's base name."""
        return f"{os.path.basename(self.filename)}:{self.lineno}"


@dataclass
class SyncReport:
    """What :func:`count_syncs` saw. Filled in while the ``with`` block runs."""

    events: list[SyncEvent] = field(default_factory=list)

    @property
    def count(self) -> int:
        """Total number of would-be syncs."""
        return len(self.events)

    @property
    def by_op(self) -> Counter:
        """``Counter`` op name → number of syncs."""
        return Counter(e.op for e in self.events)

    @property
    def sites(self) -> Counter:
        """``Counter`` ``"file.py:line in function"`` → number of syncs, in first-seen order."""
        return Counter(f"{e.site} in {e.function}" for e in self.events)

    def in_function(self, name: str) -> int:
        """Number of syncs whose call site lies in a function called ``name``."""
        return sum(e.function == name for e in self.events)

    def summary(self) -> str:
        """A few lines for a notebook: the total, then each call site with its count."""
        lines = [f"{self.count} would-be host syncs"]
        lines += [f"  {n:4d} × {site}" for site, n in self.sites.items()]
        return "\n".join(lines)


def first_outside(frame):
    """The first frame from ``frame`` outwards that is not an instrument's: not in torch, in this
    folder (the sniffer, the read recorder, the data-less run) or ``contextlib``, and not a torch
    mode's handler (an op recorder stacked on the sniffer); None if there is none."""
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not (name.startswith(_OWN) or "contextlib" in name or frame.f_code.co_name in _HANDLERS):
            return frame
        frame = frame.f_back
    return None


def _call_site() -> tuple[str, int, str]:
    frame = first_outside(sys._getframe(2))
    if frame is None:
        return "<unknown>", 0, "<unknown>"
    return os.path.abspath(frame.f_code.co_filename), frame.f_lineno, frame.f_code.co_name


def _is_device(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type != "cpu"


def _sync_reason(func, args, kwargs) -> str | None:
    """Why ``func(*args, **kwargs)`` would block the host on a GPU, or None if it would not."""
    if func in ALWAYS_SYNC:
        return ALWAYS_SYNC[func]
    if func in BOOL_INDEX_OPS:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
            return "boolean-mask indexing"
    if func in REPEAT_INTERLEAVE and kwargs.get("output_size") is None:
        return "repeat_interleave without output_size"
    if func in _COPIES:
        src = args[0] if func is aten._to_copy.default else args[1]
        dst_device = kwargs.get("device") if func is aten._to_copy.default else args[0].device
        if _is_device(src) and dst_device is not None and torch.device(dst_device).type == "cpu":
            return "device-to-host copy"
        if (isinstance(src, torch.Tensor) and src.device.type == "cpu" and not src.is_pinned()
                and dst_device is not None and torch.device(dst_device).type != "cpu"):
            return "host-to-device copy from pageable memory"
    return None


class _DispatchSniffer(TorchDispatchMode):
    def __init__(self, report: SyncReport, strict: bool = False):
        super().__init__()
        self.report, self.strict = report, strict

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        reason = _sync_reason(func, args, kwargs)
        if reason is not None:
            site = _call_site()
            if not _excused(self.strict, site[0]):
                self.report.events.append(SyncEvent(reason, *site))
        return func(*args, **kwargs)


def _remembers_host_values(t: torch.Tensor) -> bool:
    """Index tensors uploaded by :func:`mamba_edu.kernels.build_chunk_meta` keep their host list;
    on a GPU it is read instead of the device, so reading them here is not a sync."""
    return getattr(t, "_mamba_edu_host_values", None) is not None


class _HostReadSniffer(TorchFunctionMode):
    """``.tolist()``/``.cpu()``/``.numpy()`` of a CPU tensor, which stands in for a device tensor.

    On a GPU these reach the dispatcher as a device-to-host ``_to_copy`` and are counted there,
    so here only CPU tensors count (no double counting).
    """

    def __init__(self, report: SyncReport, strict: bool = False):
        super().__init__()
        self.report, self.strict = report, strict

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _HOST_READS.get(func)
        t = args[0] if args else None
        if (name is not None and isinstance(t, torch.Tensor) and not _is_device(t)
                and not _remembers_host_values(t)):
            site = _call_site()
            if not _excused(self.strict, site[0]):
                self.report.events.append(SyncEvent(name, *site))
        return func(*args, **kwargs)


@contextlib.contextmanager
def count_syncs(host_reads: bool = True, strict: bool = False):
    """Record every op inside the block that would make the host wait for a GPU.

    Counted: ``.item()``/``bool(t)``/``int(t)``/``if t:`` (``_local_scalar_dense``,
    ``is_nonzero``), ``nonzero``/``argwhere``/``torch.where(mask)``, boolean-mask indexing
    ``x[mask]`` and ``x[mask] = …``, ``masked_select``, ``unique``, ``torch.equal``,
    ``repeat_interleave`` with a tensor of repeats and no ``output_size``, device-to-host copies,
    host-to-device copies from pageable memory, and (``host_reads=True``) ``.tolist()``,
    ``.cpu()``, ``.numpy()``, ``np.asarray(t)``, storage reads, printing and pickling of CPU
    tensors, which would be device tensors on a GPU. Not counted:
    ``nonzero_static``, index tensors of integers, anything computed from Python lists.

    Usage::

        with count_syncs() as syncs:
            engine.forward_prefill(batch)
        print(syncs.count, syncs.by_op, syncs.summary())

    A :func:`~mamba_edu.probes.host_only` block is not counted; with ``strict=True`` (what the
    exercise checks use) only the package's own blocks are excused, so learner code cannot switch
    the sniffer off by opening one.

    Yields a :class:`SyncReport` that fills in while the block runs.
    """
    report = SyncReport()
    with contextlib.ExitStack() as stack:
        if host_reads:
            stack.enter_context(_HostReadSniffer(report, strict))
        stack.enter_context(_DispatchSniffer(report, strict))
        yield report


@dataclass
class SyncGuardResult:
    """Outcome of :func:`cuda_sync_guard`: ``active`` is False when no GPU was there to check."""

    active: bool
    passed: bool | None = None
    error: str | None = None


@contextlib.contextmanager
def cuda_sync_guard(raise_on_sync: bool = True):
    """Run the block under ``torch.cuda.set_sync_debug_mode("error")`` (the real GPU check).

    Any synchronizing CUDA call inside the block raises ``RuntimeError``. With
    ``raise_on_sync=False`` the error is caught and recorded in the yielded
    :class:`SyncGuardResult` instead. Without CUDA the block just runs and ``result.active`` is
    False (use :func:`count_syncs` there).
    """
    result = SyncGuardResult(active=torch.cuda.is_available())
    if not result.active:
        yield result
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield result
        torch.cuda.set_sync_debug_mode(previous)  # before the synchronize below
        torch.cuda.synchronize()
        result.passed = True
    except RuntimeError as err:
        result.passed, result.error = False, str(err)
        if raise_on_sync:
            raise
    finally:
        torch.cuda.set_sync_debug_mode(previous)
