"""Checks of notebook 06 (naive tracking, SGLang before PR #20522).

1. ``my_naive_syncs`` — the host syncs of one prefill forward with the ``naive`` strategy.
2. ``my_conv_window`` — the packed rows of ``mixed_qkv`` that form the conv state at ``A``.
3. ``my_naive_track`` — one GDN layer's two track copies (conv windows, SSM states) into the
   tracked rows' track slots, found on the device as SGLang did before the PR.

The helpers :func:`toy_batch` and :func:`strategy_syncs` are shared with notebooks 07 and 08.
"""

from __future__ import annotations

import random

import torch

from mamba_edu.exercises.core import checker, exercise
from mamba_edu.profiling import count_syncs
from mamba_edu.serving import LinearAttentionBackend, build_batch, get_strategy, plan_tracking
from mamba_edu.serving.tracking import ForwardMetadata, sglang_track_metadata

NOTEBOOK = "06_naive_tracking"
check = checker(NOTEBOOK)


def toy_batch(prefix_lens, extend_lens, cache_chunk: int = 64, device="cpu", seed: int = 0):
    """A prefill :class:`~mamba_edu.serving.ForwardBatch` with no attention layers: request ``i``
    works in slot ``1 + i`` and tracks into slot ``1 + N + i``; random token ids (vocab 100)."""
    gen = random.Random(seed)
    n = len(extend_lens)
    plans = [plan_tracking(p, e, cache_chunk, 1 + n + i) for i, (p, e) in enumerate(zip(prefix_lens, extend_lens))]
    tokens = [[gen.randrange(100) for _ in range(e)] for e in extend_lens]
    return build_batch("extend", list(range(n)), tokens, list(prefix_lens), [1 + i for i in range(n)],
                       plans, [None] * n, device)


def strategy_syncs(batch, strategy: str, n_layers: int, conv_width: int = 4):
    """The sniffer's report for what a strategy does in one prefill forward of ``n_layers`` GDN
    layers: ``prepare`` once, then per layer ``conv_indices`` and ``ssm_indices`` (the backend's
    calls; the kernels between them do not sync, so they are left out)."""
    s = get_strategy(strategy)
    md = ForwardMetadata(batch, conv_width, chunk_meta=None)
    with count_syncs() as syncs:
        s.prepare(md)
        for _ in range(n_layers):
            s.ssm_indices(md, s.conv_indices(md))
    return syncs


@exercise(NOTEBOOK, 1, "naive syncs per forward", "my_naive_syncs",
          forbidden=("mamba_edu.profiling.syncs",))
def check_naive_syncs(fn) -> str:
    """Count the naive strategy's syncs with the sniffer, tracked or not, up to 45 GDN layers."""
    cases = {True: ([0, 0], [130, 40]), False: ([0, 64], [40, 10])}
    for tracked, (prefix, extend) in cases.items():
        batch = toy_batch(prefix, extend)
        for n_layers in (1, 3, 36, 45):
            want = strategy_syncs(batch, "naive", n_layers).count
            got = fn(n_layers, tracked)
            if got != want:
                per_layer = strategy_syncs(batch, "naive", 1).count - strategy_syncs(batch, "naive", 0).count
                raise AssertionError(
                    f"naive_syncs({n_layers}, any_tracked={tracked}) = {got!r}; the sniffer counts {want} "
                    f"({per_layer} per GDN layer plus {want - per_layer * n_layers} per forward, before layer 1)")
    return "matches the sniffer for 1, 3, 36 and 45 GDN layers, tracked and untracked"


@exercise(NOTEBOOK, 2, "conv window rows", "my_conv_window",
          forbidden=("mamba_edu.serving.tracking.sglang_track_metadata",))
def check_conv_window(fn) -> str:
    """Compare with the package's conv positions on random batches, W = 2…5."""
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
            got = [int(x) for x in fn(start, plan.aligned, width)]
            if got != want:
                raise AssertionError(f"conv_window(start={start}, aligned={plan.aligned}, conv_width={width}) "
                                     f"= {got}; expected {want}")
            n += 1
    return f"{n} tracked rows match the package's conv positions"


def _toy_layer(batch, W: int, D: int, HV: int, K: int, V: int, gen: torch.Generator):
    """One GDN layer's inputs for ``batch``: mixed_qkv, checkpoints h, and a pool whose every
    slot holds random values (so an unwanted write anywhere shows)."""
    T = int(batch.cu_seqlens[-1])
    n_ckpt = sum((e + 63) // 64 for e in batch.extend_lens)
    slots = 1 + 2 * len(batch.extend_lens)  # scratch, working slots, track slots (the pool's layout)
    conv = torch.randn(slots, D, W - 1, generator=gen)
    ssm = torch.randn(slots, HV, K, V, generator=gen)
    return torch.randn(T, D, generator=gen), torch.randn(n_ckpt, HV, K, V, generator=gen), conv, ssm


@exercise(NOTEBOOK, 3, "the naive per-layer track write", "my_naive_track",
          forbidden=("mamba_edu.serving.backend", "mamba_edu.serving.tracking"))
def check_naive_track(fn) -> str:
    """Random batches (tracked at a checkpoint, at the final state, untracked, after a prefix):
    run ``fn`` and the package's naive strategy + backend copies on equal pools, compare every slot."""
    gen = torch.Generator().manual_seed(61)
    rng = random.Random(62)
    D, HV, K, V = 5, 2, 3, 3
    shapes = [([0, 0, 64], [130, 40, 64], 64, 4), ([0], [64], 64, 4), ([64, 0], [200, 10], 64, 3),
              ([0, 128, 0], [129, 256, 63], 128, 5)]
    for _ in range(6):
        size = rng.randint(1, 4)
        shapes.append(([rng.choice([0, 64]) for _ in range(size)],
                       [rng.choice([1, 40, 64, 65, 127, 128, 190]) for _ in range(size)], 64, rng.randint(2, 5)))
    tracked_rows = 0
    for case, (prefix, extend, cc, W) in enumerate(shapes):
        batch = toy_batch(prefix, extend, cache_chunk=cc, seed=case)
        mixed_qkv, h, conv, ssm = _toy_layer(batch, W, D, HV, K, V, gen)
        want_conv, want_ssm = conv.clone(), ssm.clone()
        naive = get_strategy("naive")
        md = ForwardMetadata(batch, W, chunk_meta=None)
        naive.prepare(md)
        track = naive.conv_indices(md)
        if track is not None:
            LinearAttentionBackend._track_conv(want_conv, mixed_qkv, track)
        track = naive.ssm_indices(md, track)
        if track is not None:
            LinearAttentionBackend._track_ssm(want_ssm, h, track)
        got_conv, got_ssm = conv.clone(), ssm.clone()
        fn(got_conv, got_ssm, mixed_qkv, h, batch, W)
        what = f"(prefix_lens {prefix}, extend_lens {extend}, cache chunk {cc}, W {W})"
        for name, got, want in (("conv", got_conv, want_conv), ("ssm", got_ssm, want_ssm)):
            wrong = [s for s in range(got.shape[0]) if not torch.equal(got[s], want[s])]
            if wrong:
                s = wrong[0]
                owner = [i for i, t in enumerate(batch.track_slots) if t == s]
                why = ""
                if owner and not batch.track_mask[owner[0]]:
                    why = f": it is the track slot of row {owner[0]}, which is not tracked (leave it alone)"
                elif owner:
                    why = f": the track slot of tracked row {owner[0]} (A = {batch.plans[owner[0]].aligned})"
                raise AssertionError(f"{name} pool differs from the package in slots {wrong}{why} {what}")
        tracked_rows += sum(batch.track_mask)
    return f"{len(shapes)} batches, {tracked_rows} tracked rows: every conv and SSM slot equals the package's"
