"""Breakable CUDA graphs: the forward captured in pieces, with eager *breaks* between them.

This is SGLang's default prefill capture on CUDA today (``--cuda-graph-backend-prefill
breakable``, ``PrefillCudaGraphRunner``, since its PR #29458): one capture per padded token
bucket, cut at **every attention core**, full attention and GDN alike, each core run eagerly in a
break that reads the live batch's metadata; the LM head and the logits run as an eager **tail**
after the last piece. With ``G`` GDN and ``A`` attention layers a forward is ``G + A + 1`` pieces
and ``G + A`` breaks::

    piece 0 │ core 0 │ piece 1 │ … │ core G+A-1 │ piece G+A │ tail
    embed … in-projection │ GDN or attention core │ out-projection, MLP, … │ … │ final norm, LM head

Why the GDN cores break in SGLang (its open issue #35851): their launch grids and index tensors
depend on the batch (the host-built chunk table, the conv's per-sequence grid, index tensors of
data-dependent size), so a graph captured for one batch cannot replay another. A bucket's
fixed-capacity metadata (:mod:`mamba_edu.engine.bucket`) removes that reason: with
``break_gdn=False`` the GDN layers run inside the pieces and only the attention cores break.

How it is cut, without touching the model: during capture the model gets a
:class:`BreakingBackend` in place of the real backend. Its ``forward`` (a GDN core), ``attend``
(an attention core) and ``logits`` (the tail) close the current piece, run the real call eagerly
and open the next piece. On replay a break's inputs are the tensors its piece wrote at capture (a
graph writes to the same addresses every replay), and its output is copied into the tensor the
next piece was captured reading.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch


class Pieces:
    """The forward cut at its breaks: ``breaks[i] = (call, output)`` is the eager call between
    piece ``i`` and piece ``i + 1`` and the tensor it returned at capture; ``tail`` the eager
    call after the last piece (None: the last piece holds the whole end). This base class records
    the cut only (pieces run eagerly); :class:`CudaGraphPieces` captures each piece in a graph.
    ``begin_piece``/``end_piece`` bracket each piece's work; subclasses hook ``_begin``/``_end``."""

    def __init__(self):
        self.n_pieces, self.open = 0, False
        self.breaks: list[tuple[Callable[[], torch.Tensor], torch.Tensor]] = []
        self.tail: Callable[[], torch.Tensor] | None = None

    def begin_piece(self) -> None:
        self.n_pieces, self.open = self.n_pieces + 1, True
        self._begin()

    def end_piece(self) -> None:
        if self.open:  # closed already when a break failed, or by the tail
            self.open = False
            self._end()

    def _begin(self) -> None:
        pass

    def _end(self) -> None:
        pass


class CudaGraphPieces(Pieces):
    """Each piece captured in its own ``torch.cuda.CUDAGraph``, all in one memory pool;
    :meth:`replay` runs piece 0, break 0, piece 1, …, then the tail, on the current stream, and
    returns the tail's result (None without a tail)."""

    def __init__(self):
        super().__init__()
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self._pool = torch.cuda.graph_pool_handle()
        self._capturing = None

    def _begin(self) -> None:
        self.graphs.append(torch.cuda.CUDAGraph())
        self._capturing = torch.cuda.graph(self.graphs[-1], pool=self._pool)
        self._capturing.__enter__()

    def _end(self) -> None:
        self._capturing.__exit__(None, None, None)

    def replay(self) -> torch.Tensor | None:
        for graph, brk in itertools.zip_longest(self.graphs, self.breaks):
            graph.replay()
            if brk is not None:
                call, output = brk
                output.copy_(call())
        return None if self.tail is None else self.tail()


class BreakingBackend:
    """The backend as the model sees it during a capture: the three hooks the model calls
    (:class:`~mamba_edu.serving.seam.GDNBackend`'s ``forward``, ``attend``, ``logits``), each
    running the real backend's. ``attend`` (an attention core) is a break between two pieces,
    ``forward`` (a GDN core) too when ``break_gdn``, and ``logits`` the eager tail."""

    def __init__(self, backend, pieces: Pieces, break_gdn: bool):
        self._backend, self._pieces, self._break_gdn = backend, pieces, break_gdn

    def _break(self, call: Callable[[], torch.Tensor]) -> torch.Tensor:
        self._pieces.end_piece()
        output = call()
        self._pieces.breaks.append((call, output))
        self._pieces.begin_piece()
        return output

    def forward(self, layer, mixed_qkv, a, b, batch, z=None) -> torch.Tensor:
        def core():
            return self._backend.forward(layer, mixed_qkv, a, b, batch, z=z)
        return self._break(core) if self._break_gdn else core()

    def attend(self, layer, q, k, v, batch):
        # The KV the model hands on is the core's input (k, v): static tensors of a piece.
        o = self._break(lambda: self._backend.attend(layer, q, k, v, batch)[0])
        return o, (k, v)

    def logits(self, lm_head) -> torch.Tensor:
        self._pieces.end_piece()
        self._pieces.tail = lm_head
        return lm_head()


def run_in_pieces(model, batch, backend, pieces: Pieces, break_gdn: bool = True):
    """One forward of ``model`` on ``batch`` cut into ``pieces`` (captured, if they capture);
    returns the model's :class:`~mamba_edu.model.hybrid.ModelOutput` (its logits the tail's at
    capture). An exception closes the open piece before it propagates."""
    if batch.bucket is None:
        raise ValueError("a breakable forward runs a bucket's batch (its attention cores return "
                         "the bucket's whole (k, v)); fill a StaticBucket first")
    pieces.begin_piece()
    try:
        out = model(batch, BreakingBackend(backend, pieces, break_gdn))
    finally:
        pieces.end_piece()
    return out
