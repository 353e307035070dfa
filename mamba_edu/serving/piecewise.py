"""Piecewise capture: the forward in CUDA-graph pieces, each GDN layer's core run eagerly between.

This is how SGLang captures a hybrid model's prefill today (piecewise CUDA graphs since PR
#13081; breakable graphs since #19102): everything between two GDN layers (norms, projections,
attention, MLPs, the LM head) is replayed from a graph, while each GDN layer's core, the linear
attention backend's call (conv, gating, chunked prefill, state tracking), runs eagerly in a
*break* between two pieces. The breaks may sync and may read metadata that changes from batch to
batch, so every tracking strategy works; the price is one host round trip per GDN layer, the idle
time SGLang's issue #35851 measures.

How it is cut, without touching the model: during capture the model is given a
:class:`BreakingBackend` in place of the real backend. Its ``forward`` (the one call a GDN layer
makes into the backend) closes the current piece, runs the real call eagerly and opens the next
piece. A forward of a model with ``G`` GDN layers is therefore ``G + 1`` pieces and ``G`` breaks::

    piece 0 │ break 0 │ piece 1 │ … │ break G-1 │ piece G
    embed … layer's in-projection │ GDN core │ out-projection, MLP, … │ … │ … LM head

On replay a break's inputs are the tensors its piece wrote at capture (a graph writes to the same
addresses every replay), and its output is copied into the tensor the next piece was captured
reading: one small copy per GDN layer (SGLang's split ops write into a preallocated output).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch


class Pieces:
    """The forward cut at its GDN cores: ``breaks[i] = (call, output)`` is the eager call between
    piece ``i`` and piece ``i + 1`` and the tensor it returned at capture. This base class records
    the cut only (pieces run eagerly); :class:`CudaGraphPieces` captures each piece in a graph.
    ``begin_piece``/``end_piece`` bracket each piece's work; subclasses hook ``_begin``/``_end``."""

    def __init__(self):
        self.n_pieces, self.open = 0, False
        self.breaks: list[tuple[Callable[[], torch.Tensor], torch.Tensor]] = []

    def begin_piece(self) -> None:
        self.n_pieces, self.open = self.n_pieces + 1, True
        self._begin()

    def end_piece(self) -> None:
        if self.open:  # closed already when a break failed
            self.open = False
            self._end()

    def _begin(self) -> None:
        pass

    def _end(self) -> None:
        pass


class CudaGraphPieces(Pieces):
    """Each piece captured in its own ``torch.cuda.CUDAGraph``, all in one memory pool;
    :meth:`replay` runs piece 0, break 0, piece 1, … on the current stream."""

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

    def replay(self) -> None:
        for graph, brk in itertools.zip_longest(self.graphs, self.breaks):
            graph.replay()
            if brk is not None:
                call, output = brk
                output.copy_(call())


class BreakingBackend:
    """The backend as a capture sees it: ``forward`` (a GDN layer's core) is a break between two
    pieces of ``pieces``; every other attribute is the real backend's."""

    def __init__(self, backend, pieces: Pieces):
        self._backend, self._pieces = backend, pieces

    def forward(self, layer, mixed_qkv, a, b, batch, z=None) -> torch.Tensor:
        def call():
            return self._backend.forward(layer, mixed_qkv, a, b, batch, z=z)
        self._pieces.end_piece()
        output = call()
        self._pieces.breaks.append((call, output))
        self._pieces.begin_piece()
        return output

    def __getattr__(self, name):
        return getattr(self._backend, name)


def run_in_pieces(model, batch, backend, pieces: Pieces):
    """One forward of ``model`` on ``batch`` cut into ``pieces`` (captured, if they capture);
    returns the model's :class:`~mamba_edu.model.hybrid.ModelOutput` (static tensors of the last
    piece, when captured). An exception closes the open piece before it propagates."""
    pieces.begin_piece()
    try:
        out = model(batch, BreakingBackend(backend, pieces))
    finally:
        pieces.end_piece()
    return out
