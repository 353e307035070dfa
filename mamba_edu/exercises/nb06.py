"""Notebook 06 (naive tracking): reference answers and their checks.

Exercise 1: ``naive_syncs`` — how many host syncs the naive strategy makes in one prefill forward.
Exercise 2: ``conv_window`` — which packed rows of ``mixed_qkv`` form the conv state at the
tracked position.
The checks run the package's ``naive`` strategy on small batches (no model: the strategy's index
code on its own) and compare.
"""

from __future__ import annotations

import random

import torch

from mamba_edu.profiling import count_syncs
from mamba_edu.serving import build_batch, get_strategy, plan_tracking
from mamba_edu.serving.tracking import ForwardMetadata, sglang_track_metadata


def toy_batch(prefix_lens, extend_lens, cache_chunk: int = 64, device="cpu", seed: int = 0):
    """A prefill :class:`~mamba_edu.serving.ForwardBatch` with no attention layers: request ``i``
    works in slot ``1 + i`` and tracks into slot ``1 + N + i``; random token ids (vocab 100)."""
    gen = random.Random(seed)
    n = len(extend_lens)
    plans = [plan_tracking(p, e, cache_chunk, 1 + n + i) for i, (p, e) in enumerate(zip(prefix_lens, extend_lens))]
    tokens = [[gen.randrange(100) for _ in range(e)] for e in extend_lens]
    return build_batch("extend", list(range(n)), tokens, list(prefix_lens), [1 + i for i in range(n)],
                       plans, [None] * n, 0, device)


def naive_syncs(n_gdn_layers: int, any_tracked: bool) -> int:
    """Per GDN layer: ``if mask.any()`` (1), then when tracking ``mask.nonzero()`` (2), then after
    the kernel ``if mask.any()`` again (3)."""
    return n_gdn_layers * (3 if any_tracked else 2)


def _naive_forward_syncs(batch, n_layers: int, conv_width: int = 4) -> int:
    strategy = get_strategy("naive")
    md = ForwardMetadata(batch, conv_width, chunk_meta=None)
    with count_syncs() as syncs:
        strategy.prepare(md)
        for _ in range(n_layers):  # what the backend asks the strategy in every GDN layer
            track = strategy.conv_indices(md)
            strategy.ssm_indices(md, track)
    return syncs.count


def check_naive_syncs(fn) -> None:
    """Count the naive strategy's syncs with the sniffer for 1–6 layers, tracked or not."""
    cases = {True: ([0, 0], [130, 40]), False: ([0, 64], [40, 10])}
    for tracked, (prefix, extend) in cases.items():
        batch = toy_batch(prefix, extend)
        assert any(batch.track_mask) == tracked
        for n_layers in (1, 3, 6):
            want = _naive_forward_syncs(batch, n_layers)
            got = fn(n_layers, tracked)
            if got != want:
                raise AssertionError(f"FAIL exercise 1 naive_syncs({n_layers}, any_tracked={tracked}) = {got!r}; "
                                     f"the sniffer counts {want}")
    print("PASS exercise 1 naive_syncs: matches the sniffer for 1, 3, 6 layers, tracked and untracked")


def conv_window(start: int, aligned: int, conv_width: int) -> list[int]:
    """Packed rows ``[start + A − (W−1), start + A)``: the last W−1 raw inputs before position A
    of a sequence whose extend begins at packed row ``start``."""
    return [start + aligned - (conv_width - 1) + j for j in range(conv_width - 1)]


def check_conv_window(fn) -> None:
    """Compare ``fn`` with the package's device-side indices on random batches, W = 2…5."""
    rng = random.Random(6)
    n = 0
    for trial in range(30):
        size = rng.randint(1, 4)
        extend = [rng.choice([1, 30, 63, 64, 65, 128, 129, 200]) for _ in range(size)]
        prefix = [rng.choice([0, 64, 128]) for _ in range(size)]
        batch = toy_batch(prefix, extend, cache_chunk=rng.choice([64, 128]), seed=trial)
        rows = [i for i, m in enumerate(batch.track_mask) if m]
        if not rows:
            continue
        width = rng.randint(2, 5)
        ref = sglang_track_metadata(batch, width).conv_positions.tolist()
        for r, want in zip(rows, ref):
            start, plan = batch.token_ranges[r][0], batch.plans[r]
            got = list(fn(start, plan.aligned, width))
            if got != want:
                raise AssertionError(f"FAIL exercise 2 conv_window(start={start}, aligned={plan.aligned}, "
                                     f"conv_width={width}) = {got}; expected {want}")
            n += 1
    print(f"PASS exercise 2 conv_window: {n} tracked rows match the package's conv_positions")
