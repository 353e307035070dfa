"""One workspace for the prefill's intermediates instead of fresh tensors in every GDN layer.

Each GDN layer's prefill allocates six tensors that die before the layer returns: Γ, k̂, W, U
(:func:`~mamba_edu.kernels.prefill.prepare.prepare_outputs`), Ṽ and, without checkpoints, ``h``
(:func:`~mamba_edu.kernels.prefill.scan.scan_outputs`). Every GDN layer of a forward has the same
shapes, and the layers run one after another on one stream, so one set can serve them all: with
:func:`reused_intermediates`, the first call of each shape allocates and every later call gets the
same tensors back (about 270 fewer allocations per forward of ``qwen3.5-tp8``). The output and
the fp32 checkpoints, which outlive the layer, are still allocated per layer.

Whether that is worth it is a host-time question: a cached allocation through torch's caching
allocator is a few microseconds, and the lookup here costs Python too. Measured by
:mod:`.bench_lab_eager` (arm ``workspace``).
"""

import contextlib

from mamba_edu.kernels.prefill import prepare, scan


class Workspace:
    """The tensors handed out so far, by ``(what, shapes, dtypes, device)``."""

    def __init__(self):
        self.tensors = {}
        self.allocations = self.reuses = 0

    def get(self, key, allocate):
        """The tensors kept under ``key``, made by ``allocate()`` the first time."""
        if key in self.tensors:
            self.reuses += 1
        else:
            self.tensors[key] = allocate()
            self.allocations += 1
        return self.tensors[key]


@contextlib.contextmanager
def reused_intermediates():
    """Inside, the prefill's per-layer intermediates come from one :class:`Workspace` (yielded),
    restored on exit."""
    ws = Workspace()
    plain_prepare, plain_scan = prepare.prepare_outputs, scan.scan_outputs

    def prepare_outputs(k, v):
        return ws.get(("prepare", k.shape, v.shape, v.dtype, k.device), lambda: plain_prepare(k, v))

    def scan_outputs(u, NT, K, h=None):
        if h is not None:  # the checkpoints outlive the layer: Ṽ alone is reused
            return ws.get(("v_new", u.shape, u.dtype, u.device), lambda: plain_scan(u, NT, K, h)[0]), h
        return ws.get(("scan", u.shape, u.dtype, u.device, NT, K), lambda: plain_scan(u, NT, K))

    prepare.prepare_outputs, scan.scan_outputs = prepare_outputs, scan_outputs
    try:
        yield ws
    finally:
        prepare.prepare_outputs, scan.scan_outputs = plain_prepare, plain_scan
