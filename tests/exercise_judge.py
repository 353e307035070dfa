"""Judge a test's answer through the grader's own path, without starting a Jupyter kernel.

The grader (``mamba_edu.exercises.grader.grade_one``) hands each check
:class:`~mamba_edu.exercises.remote.RemoteFunction` proxies of the learner's functions; a call
goes to :mod:`mamba_edu.exercises._harness` in the learner's kernel, which refuses the package's
own functions, answers that call a forbidden function, stand-ins for Triton kernels, and code
that is not in the notebook, and measures syncs, aten ops and Triton launches; then
:func:`mamba_edu.exercises.core.judge` gives the verdict. :func:`remote_judge` does exactly that,
with the harness run in this process instead of in a kernel: the test module plays the notebook
(its folder is the "cell folder", its source the notebook's cells). So a wrong answer rejected
here is rejected by the grader for the same reason, including the forbidden call.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import torch

from mamba_edu.exercises import _harness
from mamba_edu.exercises.core import Verdict, judge, lookup
from mamba_edu.exercises.remote import KernelSession, _fresh_digests

_DIGESTS = None


class InProcessSession(KernelSession):
    """A :class:`KernelSession` whose "kernel" is this process: requests go straight to the
    harness, replies make the same round trip through ``torch.save``/``torch.load(weights_only=True)``."""

    def __init__(self, namespace: dict, cell_dir: str):  # noqa: D107 - no kernel to start
        global _DIGESTS
        if _DIGESTS is None:
            _DIGESTS = _fresh_digests()
        self.namespace, self.cell_dir = namespace, cell_dir
        self.own_file = "<mamba_edu-grader-in-process>"
        self.digests, self.timeout = _DIGESTS, 600

    def request(self, payload: dict) -> dict:
        payload = {**payload, "namespace": self.namespace, "cell_dir": self.cell_dir}
        try:
            reply = _harness._serve(payload, self.own_file)
        except Exception as err:  # as serve() reports it
            reply = {"error": {"type": type(err).__name__, "message": str(err)[:2000],
                               "not_done": _harness._not_done(err), "base": False,
                               "where": _harness._where(err)}}
        try:
            _harness._plain(reply)
        except TypeError as err:
            reply = {"refused": f"the answer returned {err}; expected plain torch.Tensor, numbers, "
                                "strings, lists, tuples or dicts"}
        buffer = io.BytesIO()
        torch.save(reply, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=True)

    def shutdown(self) -> None:
        pass


def remote_judge(notebook: str, number: int, *functions) -> Verdict:
    """The verdict the grader gives exercise ``number`` of ``notebook`` for ``functions``, each
    defined in a test module (which stands for the notebook's cells)."""
    ex = lookup(notebook, number)
    proxies = []
    for name, fn in zip(ex.names, functions, strict=True):
        inner = getattr(fn, "fn", fn)
        path = getattr(getattr(inner, "__code__", None), "co_filename", __file__)
        session = InProcessSession({name: fn}, os.path.dirname(os.path.abspath(path)))
        sources = [Path(path).read_text()] if os.path.isfile(path) else []
        proxy = session.function(name, ex.forbidden, sources)
        assert proxy is not None
        proxies.append(proxy)
    return judge(ex, *proxies)
