"""Timing prefills: fresh batches on an engine, synchronized wall and host times.

Shared by the TTFT benchmark (:mod:`mamba_edu.benchmarks.ttft`) and the demo
(:mod:`mamba_edu.demo`): every timed forward starts from the same pool state on a freshly
prepared batch, and the GPU is synchronized around it.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Callable

import torch

from mamba_edu._runtime import synchronize


class Prefills:
    """Fresh prefills of one case on one engine, so that every forward starts from the same state.

    :meth:`next` finishes and releases the previous batch, then prepares one of new random
    prompts: new request ids and tokens, so no prefix hit, and freshly zeroed slots; ``lengths``
    is a tuple, or a function drawing each batch's lengths from ``gen``. The tokens come from a
    generator of their own, so re-seeding ``gen`` repeats the lengths with new tokens (a prompt
    seen before would hit the prefix cache). :meth:`forward` is the timed part,
    ``engine.forward_prefill``.
    """

    def __init__(self, engine, lengths, seed: int):
        self.engine, self.lengths = engine, lengths  # a tuple, or a function gen -> a tuple
        self.gen = torch.Generator().manual_seed(seed)
        self.tokens = torch.Generator().manual_seed(seed + 1)
        self.batch, self.logits, self.count = None, None, 0

    def next(self):
        from mamba_edu.engine import Request

        self.close()
        vocab = self.engine.config.vocab
        self.count += 1
        requests = [Request((self.count, i), torch.randint(vocab, (n,), generator=self.tokens).tolist())
                    for i, n in enumerate(self.lengths(self.gen) if callable(self.lengths) else self.lengths)]
        self.batch = self.engine.prepare_prefill(requests)
        return self.batch

    def forward(self, batch, replay=None):
        """The timed forward of ``batch``: ``engine.forward_prefill``, or ``replay`` (a captured
        bucket's, which refills its buffers from the batch first)."""
        self.logits = (self.engine.forward_prefill if replay is None else replay)(batch)
        return self.logits

    def close(self) -> None:
        """Finish and release the current batch; one that has no logits (never run, or its
        forward failed) is aborted instead, so no slot leaks and no lock stays."""
        if self.batch is not None and self.logits is not None:
            self.engine.finish_prefill(self.batch, self.logits)
            self.engine.release(self.batch.rids)
        elif self.batch is not None:
            self.engine.abort_prefill(self.batch)
        self.batch, self.logits = None, None


def timed_calls(fn: Callable[..., object], setup: Callable[[], object],
                repeats: int) -> tuple[list[float], list[float]]:
    """``repeats`` synchronized calls ``fn(setup())``: their wall times and their host times (until
    ``fn`` returned, before the synchronize), in milliseconds.

    Python's garbage collector is paused while ``fn`` runs (as :mod:`timeit` does): a full
    collection of a process holding torch, Triton and matplotlib takes tens of milliseconds, and
    one landing inside a timed forward would be noise as large as the effects measured here.
    """
    times, host = [], []
    for _ in range(repeats):
        arg = setup()
        synchronize()
        gc.disable()
        try:
            t0 = time.perf_counter()
            fn(arg)
            host.append((time.perf_counter() - t0) * 1e3)
            synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        finally:
            gc.enable()
    return times, host


def median_ms(fn: Callable[..., object], setup: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` synchronized calls ``fn(setup())``, in milliseconds."""
    times, _ = timed_calls(fn, setup, repeats)
    return statistics.median(times)
