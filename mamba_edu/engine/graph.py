"""A captured bucket: one capture of the prefill forward over a :class:`~mamba_edu.engine.bucket.StaticBucket`,
replayed for every prepared batch that fits.

``engine.capture_prefill(bucket, mode)`` makes a :class:`CapturedBucket`; ``captured.replay(batch)``
is ``engine.forward_prefill(batch, captured)``: an engine call like the others (checked at the
boundary, refused on a stopped or busy engine). Three ways to cut the forward
(:data:`CAPTURE_MODES`, :mod:`mamba_edu.serving.breakable`):

* ``"breakable"``: SGLang's default today: graph pieces, every attention core (GDN and full
  attention) an eager break reading the live batch, the LM head an eager tail; every strategy.
* ``"gdn_inside"``: the same, but the GDN layers run inside the pieces on the bucket's
  fixed-capacity metadata (SGLang's open issue #35851); ``sync_free``/``fused`` only.
* ``"graph"``: the whole forward in one graph, attention included (over the bucket's static
  prefix KV); ``sync_free``/``fused`` only.

Before its capture (or with ``graphs=False``) a replay runs the same static-buffer
forward eagerly, cut the same way: what each replay computes, on a CPU too.
"""

from __future__ import annotations

import os

import torch

from mamba_edu.engine.bucket import Bucket, StaticBucket, empty_batch
from mamba_edu.serving.batch import ForwardBatch
from mamba_edu.serving.breakable import CudaGraphPieces, Pieces, run_in_pieces

CAPTURE_MODES = ("breakable", "gdn_inside", "graph")


def capture_bytes(bucket: Bucket, config, dtype: torch.dtype, prefix_in_graph: bool) -> int:
    """A lower bound of the bytes a capture of ``bucket`` allocates: its int64 and int32 index
    buffers (about 4 per token and 20 per row), the static prefix KV (mode ``graph``) and two
    ``[max_tokens, hidden]`` activations of one forward."""
    prefix = bucket.max_prefix_tokens if prefix_in_graph else 0
    item = torch.empty(0, dtype=dtype).element_size()
    index = 8 * (4 * bucket.max_tokens + 2 * prefix + 20 * bucket.rows) + 4 * 2 * bucket.chunk_capacity
    kv = 2 * prefix * config.attn_kv_heads * config.attn_head_dim * len(config.attn_layers) * item
    return index + kv + 2 * bucket.max_tokens * config.hidden * item


def available_bytes(device: torch.device) -> int:
    """Free GPU memory on a CUDA device; the host's physical memory otherwise."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_capture(bucket, mode, graphs, strategy, model, prefill_kernel: str = "triton") -> None:
    """The arguments of ``Engine.capture_prefill``, checked before anything is allocated: a
    :class:`Bucket`, a mode the ``strategy`` and the ``prefill_kernel`` can capture, ``graphs`` a
    bool (True needs CUDA), and buffers that fit the device (:func:`capture_bytes`)."""
    if not isinstance(bucket, Bucket):
        raise TypeError(f"bucket must be a Bucket(max_tokens, max_requests[, max_prefix_tokens]); "
                        f"got {type(bucket).__name__}")
    if mode not in CAPTURE_MODES:
        raise ValueError(f"mode must be one of {list(CAPTURE_MODES)}; got {mode!r}")
    if type(graphs) is not bool:
        raise TypeError(f"graphs must be a bool; got {graphs!r}")
    if mode != "breakable" and not strategy.capturable:
        raise ValueError(f"mode {mode!r} runs the GDN layers inside a graph, which needs a strategy "
                         f"that never syncs (sync_free or fused); engine strategy is {strategy.name!r}")
    if mode != "breakable" and prefill_kernel != "triton":
        raise ValueError(f"mode {mode!r} runs the GDN layers inside a graph on the bucket's fixed-capacity "
                         f"chunk table, which only our kernels read; with prefill_kernel={prefill_kernel!r} "
                         "capture 'breakable' (the GDN layers run eagerly between the pieces)")
    if graphs and model.device.type != "cuda":
        raise RuntimeError(f"capture_prefill needs a CUDA device; the model is on {model.device} "
                           "(graphs=False runs the same forward without graphs)")
    need = capture_bytes(bucket, model.config, model.dtype, mode == "graph")
    have = available_bytes(model.device)
    if need > have:
        raise ValueError(f"bucket {bucket} needs at least {need / 2**30:.1f} GiB (static buffers and "
                         f"one forward), more than the {have / 2**30:.1f} GiB of {model.device}")


def check_replay(captured, engine, batch: ForwardBatch) -> None:
    """``captured`` is a :class:`CapturedBucket` of ``engine`` that can run ``batch`` now."""
    if not isinstance(captured, CapturedBucket) or captured.engine is not engine:
        raise ValueError(f"captured must be a CapturedBucket of this engine (its capture_prefill); "
                         f"got {type(captured).__name__}")
    reason = captured.refusal(batch)
    if reason:
        raise ValueError(f"replay: {reason}")


class CapturedBucket:
    """A bucket's prefill forward, captured (or, before its capture, run eagerly the same way) for
    ``engine``, with the model's weights of that moment (a graph reads them where they were).
    Its public call is :meth:`replay`, an engine call; the engine runs ``_capture`` and ``_run``
    inside its own calls (never by anyone else: they skip the engine's claim and checks).

    ``mode``: one of :data:`CAPTURE_MODES`; ``static`` the :class:`StaticBucket`; ``pieces`` the
    recorded cut (the eager breaks, for the breakable modes); ``graph`` a ``CUDAGraph`` or
    :class:`~mamba_edu.serving.breakable.CudaGraphPieces` once captured, else None."""

    def __init__(self, engine, bucket: Bucket, mode: str):
        model = engine.model
        self.engine, self.mode, self.dtype, self.device = engine, mode, model.dtype, model.device
        self._params = list(model.parameters())
        self._addresses = list(map(torch.Tensor.data_ptr, self._params))
        self.static = StaticBucket(bucket, model, engine.config.conv_width, fixed=mode != "breakable",
                                   prefix_in_graph=mode == "graph")
        self.graph, self.pieces, self._out = None, None, None

    @property
    def bucket(self) -> Bucket:
        return self.static.bucket

    def refusal(self, batch: ForwardBatch) -> str | None:
        """Why this capture cannot run ``batch`` now (it does not fit, or a weight of the model was
        cast, moved or given new storage since the capture, in part too), or None. (A module
        swapped for another is not seen: its parameters are new objects.)"""
        model = self.engine.model
        if ((model.dtype, model.device) != (self.dtype, self.device)
                or list(map(torch.Tensor.data_ptr, self._params)) != self._addresses):  # ~20 µs / 500 weights
            return (f"the model's weights were cast, moved or replaced since the capture ({self.dtype} on "
                    f"{self.device}; now {model.dtype} on {model.device}): capture the bucket again")
        reason = self.bucket.refusal(batch, self.static.prefix_in_graph)
        return reason and f"the batch does not fit the captured bucket: {reason}"

    def _capture(self) -> None:
        """Capture the forward on padding only (the dummy request's tokens: no request's slot is
        touched), after two warm-up forwards on a side stream (lazy inits and autotuning happen
        outside the capture)."""
        model, backend, static = self.engine.model, self.engine.backend, self.static
        static.fill(empty_batch(model.device))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                backend.init_forward_metadata_capture(static)
                model(static.batch, backend)
        torch.cuda.current_stream().wait_stream(stream)
        backend.init_forward_metadata_capture(static)
        if self.mode == "graph":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._out = model(static.batch, backend)
        else:
            graph = CudaGraphPieces()
            self._out = run_in_pieces(model, static.batch, backend, graph, break_gdn=self.mode == "breakable")
        self.graph = self.pieces = graph

    def replay(self, batch) -> torch.Tensor:
        """Run the prepared ``batch`` (a live batch of this bucket's engine, not yet forwarded):
        ``engine.forward_prefill(batch, self)``, which returns ``logits [N, vocab]``."""
        return self.engine.forward_prefill(batch, self)

    def _run(self, live: ForwardBatch) -> tuple[torch.Tensor, list]:
        """The engine's side of a replay: refill the static buffers from ``live`` (checked to fit
        by the engine), replay (or run eagerly), and cut out the live requests' ``(logits, kv)``."""
        static, backend, model = self.static, self.engine.backend, self.engine.model
        static.fill(live)
        if self.graph is None:  # eager: the same static-buffer forward, cut the same way
            backend.init_forward_metadata_capture(static)
            if self.mode == "graph":
                out = model(static.batch, backend)
            else:
                self.pieces = Pieces()
                out = run_in_pieces(model, static.batch, backend, self.pieces, break_gdn=self.mode == "breakable")
            return static.results(out.logits, out.kv)
        backend.init_forward_metadata_replay(static)
        if self.mode == "graph":
            self.graph.replay()
            logits = self._out.logits
        else:
            logits = self.graph.replay()
        return static.results(logits, self._out.kv)
