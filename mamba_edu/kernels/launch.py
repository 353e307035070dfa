"""Programmatic dependent launch (PDL): a kernel is scheduled while the one before it finishes.

Between two kernels of a stream the GPU normally drains the first grid, then launches the next:
a gap of about half a microsecond even inside a CUDA graph. On Hopper GPUs (the H200) a kernel
launched with ``launch_pdl=True`` may be scheduled as soon as every block of the kernel before
it has run ``griddepcontrol.launch_dependents``; its blocks then sit at ``griddepcontrol.wait``,
which returns once that kernel has finished and its writes are visible. A CUDA graph captured
from such launches keeps these programmatic edges.

Every kernel of the package begins with :func:`await_previous_kernel`: wait first, then let the
next kernel launch. Waiting before any load keeps it safe whatever the kernel reads: each
kernel's predecessor has itself waited for its own, so everything earlier has finished too.
cuBLAS GEMMs between our kernels are ordinary launches and keep their usual ordering.

It is **off by default**: measured on the H200 (``data/benchmarks/pdl_ab.md``), it shortened
chains of our own kernels (the conv alone, replayed: 5.17 → 4.82 µs) but not the prefill
forward (1 × 512 ``fused`` replay: 6.98 → 7.08 ms TTFT). A likely reason: half of our kernels
follow a cuBLAS GEMM, and a kernel that does not signal early releases its successor only when
it ends (whether cuBLAS's kernels signal was not checked). Blocks parked at the wait also count
as GPU busy time in a profile, so busy and idle fractions are not comparable between the two.
``MAMBA_EDU_PDL=1`` in the environment (read at import) or :func:`programmatic_launch` switches
it on; it stays off under the interpreter and on GPUs older than Hopper.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra import cuda as tl_cuda

from mamba_edu._runtime import overriding, triton_interpreted

ENABLED = os.environ.get("MAMBA_EDU_PDL", "0") == "1"


@triton.jit
def await_previous_kernel(USE_PDL: tl.constexpr, RELEASE_NEXT: tl.constexpr = True):
    """First statement of every kernel: with ``USE_PDL``, wait until the previous kernel has
    finished, then allow the next one to be scheduled (unless not ``RELEASE_NEXT``: then it is
    scheduled when this one ends)."""
    if USE_PDL:
        tl_cuda.gdc_wait()
        if RELEASE_NEXT:
            tl_cuda.gdc_launch_dependents()


def pdl_options(device: torch.device) -> dict:
    """Launch keyword arguments: ``USE_PDL`` (the kernels' constexpr) and, when on,
    ``launch_pdl``."""
    on = ENABLED and device.type == "cuda" and not triton_interpreted() and _hopper(device.index)
    return {"USE_PDL": True, "launch_pdl": True} if on else {"USE_PDL": False}


@functools.cache
def _hopper(index: int | None) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def programmatic_launch(enabled: bool):
    """Within the block, kernels are launched with PDL (``enabled``, where the GPU has it) or
    without: for the benchmark, which compares the two."""
    return overriding(globals(), "ENABLED", enabled)
