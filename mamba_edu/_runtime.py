"""Where the course runs: pick the device, make Triton usable without a GPU, and keep the package
importable where Triton cannot be installed.

Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` decorates a kernel, so it must be set
before :mod:`mamba_edu.kernels` is imported. ``import mamba_edu`` does it for you: with no CUDA
device and no explicit setting, kernels run in the Triton interpreter (slow, tiny shapes only).
The check costs no torch import where no NVIDIA device exists (so ``mamba-edu --version`` stays
fast); elsewhere torch decides, when :mod:`mamba_edu.kernels` is imported or a function below
is called.

**Without Triton** (macOS, Windows: it has no wheels there) ``import triton`` would fail in
every kernel module. A stand-in module (:class:`_TritonStandIn`) is registered instead, so the
package imports and every torch path runs (on a CPU the layers use the torch reference path
anyway); launching a Triton kernel raises :class:`TritonUnavailable`, whose message says where
to run it. Notebook cells that need Triton call :func:`needs_triton` first::

    from mamba_edu._runtime import needs_triton
    if needs_triton("the Triton prefill kernel"):
        ...  # the cell's Triton work
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from pathlib import Path

TRITON_HELP = ("docs/install.md#without-triton: run it on Linux: WSL2 on Windows, the Linux "
               "container recipe, or a cloud notebook")


def _no_nvidia_device() -> bool:
    """True when this machine certainly has no CUDA device, decided without importing torch:
    macOS, or Linux without the NVIDIA driver's device node (WSL2's GPU is /dev/dxg)."""
    if sys.platform == "darwin":
        return True
    if sys.platform.startswith("linux"):
        return not (os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/dxg"))
    return False


_interpreter_selected = False


def select_triton_mode() -> None:
    """Set ``TRITON_INTERPRET=1`` (unless already set) when torch sees no CUDA device. Cheap
    after the first call; :mod:`mamba_edu.kernels` calls it before any ``@triton.jit``."""
    global _interpreter_selected
    if _interpreter_selected:
        return
    _interpreter_selected = True
    if "TRITON_INTERPRET" in os.environ:
        return
    if _no_nvidia_device():
        os.environ["TRITON_INTERPRET"] = "1"
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


if _no_nvidia_device() or "torch" in sys.modules:
    select_triton_mode()


def default_device():
    """``cuda`` when a GPU is present, else ``cpu``."""
    import torch

    select_triton_mode()
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def synchronize() -> None:
    """Wait for the GPU's queued work (``torch.cuda.synchronize``); nothing on a CPU."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def triton_interpreted() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``, and Triton is
    installed: without it nothing runs them, see :func:`triton_available`)."""
    select_triton_mode()
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") and triton_available()


def data_dir() -> Path:
    """The repository's ``data/`` folder (H200 traces and benchmark results), wherever the
    notebook runs from. It is absent from an installed wheel: callers check ``exists()``."""
    return Path(__file__).resolve().parent.parent / "data"


@contextlib.contextmanager
def overriding(namespace: dict, name: str, value):
    """Within the block, the module global ``name`` (``namespace`` = that module's ``globals()``)
    is ``value``; the old value comes back afterwards, also after an exception."""
    saved, namespace[name] = namespace[name], value
    try:
        yield
    finally:
        namespace[name] = saved


# --- Without Triton ----------------------------------------------------------------------------

class TritonUnavailable(RuntimeError):
    """A Triton kernel was launched where Triton is not installed (macOS, Windows)."""


def triton_missing_message(what: str = "this") -> str:
    """The one line shown where Triton is needed but absent."""
    return (f"{what} needs Triton, which is not installed here (Triton has no macOS or Windows "
            f"wheels); everything else runs. To run it: {TRITON_HELP}.")


def triton_available() -> bool:
    """True when the real Triton package is installed (the stand-in does not count)."""
    module = sys.modules.get("triton")
    if module is not None:
        return not isinstance(module, _TritonStandIn)
    return _real_triton_spec() is not None


def needs_triton(what: str = "this cell") -> bool:
    """For a notebook cell (or any code) that needs Triton: True when it is installed; otherwise
    print one line that says so and where to run it, and return False (the cell skips its work)."""
    if triton_available():
        return True
    print(triton_missing_message(what), flush=True)
    return False


def _real_triton_spec():
    finders = [f for f in sys.meta_path if not isinstance(f, _TritonStandInFinder)]
    for finder in finders:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec("triton", None)
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            return spec
    return None


class _Launch:
    """What ``kernel[grid]`` and a kernel call give without Triton: an error that says why."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise TritonUnavailable(triton_missing_message(f"the Triton kernel {self.name}"))


class _Kernel(_Launch):
    """``@triton.jit`` (and ``autotune``/``heuristics``) on a function without Triton."""

    def __init__(self, fn):
        super().__init__(getattr(fn, "__name__", "kernel"))
        self.fn = fn
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__name__ = self.name

    def __getitem__(self, grid):
        return _Launch(self.name)


class _Absent:
    """Any other attribute of the stand-in: usable at import time (decorator factories, configs,
    type annotations, dtype tables), an error only when a kernel is launched."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Absent(f"{self._name}.{name}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            fn = args[0]
            return fn if isinstance(fn, _Kernel) else _Kernel(fn)
        return _Absent(f"{self._name}(...)")

    def __repr__(self) -> str:
        return f"<{self._name}: Triton is not installed>"


class _Constexpr:
    """``tl.constexpr``: an annotation, and a wrapper of a compile-time value."""

    def __init__(self, value=None):
        self.value = value

    def __repr__(self) -> str:
        return f"constexpr[{self.value!r}]"


def _jit(fn=None, **kwargs):
    if fn is None:
        return lambda f: _Kernel(f)
    return _Kernel(fn)


def _cdiv(x: int, y: int) -> int:
    return (x + y - 1) // y


def _next_power_of_2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


class _TritonStandIn(types.ModuleType):
    """The module registered as ``triton`` (and its submodules) when Triton is not installed."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Absent(f"{self.__name__}.{name}")


class _TritonStandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on ``sys.meta_path``: answers ``import triton...`` only when no real Triton is found."""

    _priming = False

    def find_spec(self, fullname, path=None, target=None):
        if self._priming or (fullname != "triton" and not fullname.startswith("triton.")):
            return None
        if fullname == "triton":
            self._prime_torch()
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    @classmethod
    def _prime_torch(cls) -> None:
        """Let torch record "no Triton" (its cached check) before the stand-in exists, so that
        torch.compile and friends do not take the stand-in for the real thing."""
        cls._priming = True
        try:
            with contextlib.suppress(Exception):
                from torch.utils._triton import has_triton_package

                has_triton_package()
        finally:
            cls._priming = False

    def create_module(self, spec):
        module = _TritonStandIn(spec.name, "stand-in for Triton (not installed): mamba_edu._runtime")
        module.__path__ = []
        module.__version__ = "0.0.0+absent"
        if spec.name == "triton":
            module.jit = _jit
            module.cdiv = _cdiv
            module.next_power_of_2 = _next_power_of_2
        elif spec.name == "triton.language":
            module.constexpr = _Constexpr
            module.cdiv = _cdiv
        return module

    def exec_module(self, module):
        parent, _, child = module.__name__.rpartition(".")
        if parent and parent in sys.modules:
            setattr(sys.modules[parent], child, module)


def install_triton_stand_in() -> bool:
    """Register the stand-in when Triton is not installed; True when it is (now) in use."""
    if any(isinstance(f, _TritonStandInFinder) for f in sys.meta_path):
        return True
    if _real_triton_spec() is not None:
        return False
    sys.meta_path.append(_TritonStandInFinder())
    return True


install_triton_stand_in()


def free_memory_bytes(device) -> int | None:
    """Memory free for new tensors on ``device``: the GPU's free memory, or the host's available
    memory (``MemAvailable`` of ``/proc/meminfo``); None where it cannot be read."""
    import torch
    if torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info(torch.device(device))[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
