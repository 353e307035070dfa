"""Probes the forward carries: named profiler ranges and the host-only marker.

They sit below :mod:`mamba_edu.model` and :mod:`mamba_edu.serving`, which open them inside the
forward, and below :mod:`mamba_edu.profiling`, which reads what they mark (traces, the sync
counter); they import nothing of the package.

- :func:`profile_range`: ``torch.profiler.record_function`` spends several µs of host time per
  range even with no profiler running (about as much as launching a small kernel); a forward with
  two or four ranges per layer pays that hundreds of times, so the range opens only while a
  profiler records.
- :func:`host_only`: marks a block that only touches host copies, so that
  :func:`mamba_edu.profiling.count_syncs` skips it (:func:`in_host_only_block`).
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
from torch.profiler import record_function

FORWARD_RANGE = "prefill_forward"  # the range mamba_edu.profiling.record_trace opens around a forward

_HOST_ONLY = contextvars.ContextVar("mamba_edu_host_only", default=False)


def profile_range(name: str):
    """``record_function(name)`` while a profiler is recording, else a no-op context manager."""
    return record_function(name) if torch.autograd._profiler_enabled() else contextlib.nullcontext()


@contextlib.contextmanager
def host_only():
    """Mark a block that only touches host copies (what ``.cpu()`` returned, Python lists).

    On a GPU such a block cannot sync. On a CPU every tensor is a host tensor, so the sync counter
    cannot tell these copies from the tensors that stand in for device ones: it skips the block.
    """
    token = _HOST_ONLY.set(True)
    try:
        yield
    finally:
        _HOST_ONLY.reset(token)


def in_host_only_block() -> bool:
    """Whether the caller runs inside a :func:`host_only` block."""
    return _HOST_ONLY.get()
