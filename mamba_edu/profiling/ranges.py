"""Named profiler ranges that cost nothing when no profiler records.

``torch.profiler.record_function`` spends several µs of host time per range even with no profiler
running (about as much as launching a small kernel); a forward with two or four ranges per layer
pays that hundreds of times. :func:`profile_range` opens the range only while a profiler records.
"""

from __future__ import annotations

import contextlib

import torch
from torch.profiler import record_function

FORWARD_RANGE = "prefill_forward"  # the range :func:`mamba_edu.profiling.record_trace` opens around a forward


def profile_range(name: str):
    """``record_function(name)`` while a profiler is recording, else a no-op context manager."""
    return record_function(name) if torch.autograd._profiler_enabled() else contextlib.nullcontext()
