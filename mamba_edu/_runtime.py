"""Where the course runs: pick the device and make Triton usable without a GPU.

Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` decorates a kernel, so it must be set
before :mod:`mamba_edu.kernels` is imported. ``import mamba_edu`` does it for you: with no CUDA
device and no explicit setting, kernels run in the Triton interpreter (slow, tiny shapes only).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def default_device() -> torch.device:
    """``cuda`` when a GPU is present, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def synchronize() -> None:
    """Wait for the GPU's queued work (``torch.cuda.synchronize``); nothing on a CPU."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def triton_interpreted() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


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
