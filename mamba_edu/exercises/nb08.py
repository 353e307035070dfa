"""Notebook 08 (zero syncs, CUDA graphs, fused tracking): reference answers and their checks.

Exercise 1: ``scratch_destinations`` — fixed-size destinations: untracked rows write the scratch slot.
Exercise 2: ``checkpoint_bytes`` — the memory of one layer's checkpoint tensor ``h``, which the
fused strategy never allocates.
"""

from __future__ import annotations

import random

import torch

from mamba_edu.exercises.nb06 import toy_batch
from mamba_edu.kernels import build_chunk_meta, gdn_prefill
from mamba_edu.serving import SCRATCH_SLOT
from mamba_edu.serving.tracking import host_track_plan


def scratch_destinations(track_mask: list[bool], track_slots: list[int], scratch: int = SCRATCH_SLOT) -> list[int]:
    """One destination per row, from host lists: the track slot if tracked, else the scratch slot."""
    return [slot if tracked else scratch for tracked, slot in zip(track_mask, track_slots)]


def check_scratch_destinations(fn) -> None:
    """Compare ``fn(batch.track_mask, batch.track_slots)`` with the package's host plan."""
    rng = random.Random(9)
    for trial in range(30):
        size = rng.randint(1, 6)
        extend = [rng.choice([1, 40, 63, 64, 100, 128, 300]) for _ in range(size)]
        batch = toy_batch([0] * size, extend, cache_chunk=rng.choice([64, 128]), seed=trial)
        want = host_track_plan(batch, 4).dst
        got = fn(list(batch.track_mask), list(batch.track_slots))
        if list(got) != want:
            raise AssertionError(f"FAIL exercise 1 scratch_destinations(track_mask={batch.track_mask}, "
                                 f"track_slots={batch.track_slots}) = {got}; expected {want}")
    print("PASS exercise 1 scratch_destinations: 30 random batches match host_track_plan(...).dst")


def checkpoint_bytes(extend_lens: list[int], value_heads: int, key_dim: int, value_dim: int) -> int:
    """Bytes of ``h [Σ⌈E/64⌉, HV, K, V]`` fp32 (4 bytes an entry), for one GDN layer."""
    return sum((e + 63) // 64 for e in extend_lens) * value_heads * key_dim * value_dim * 4


def check_checkpoint_bytes(fn) -> None:
    """Run ``gdn_prefill(output_checkpoints=True)`` on small batches and compare ``h.nbytes``."""
    gen = torch.Generator().manual_seed(10)
    H, HV, K, V = 1, 2, 8, 16
    for lengths in ([1], [64], [65, 3], [130, 64, 200]):
        T = sum(lengths)
        q, k = torch.randn(2, T, H, K, generator=gen)
        v = torch.randn(T, HV, V, generator=gen)
        g, beta = -torch.rand(T, HV, generator=gen), torch.rand(T, HV, generator=gen)
        pool = torch.zeros(len(lengths) + 1, HV, K, V)
        meta = build_chunk_meta(lengths, "cpu", state_indices=list(range(1, len(lengths) + 1)))
        _, h = gdn_prefill(q, k, v, g, beta, state_pool=pool, meta=meta, output_checkpoints=True,
                           backend="torch")
        got = fn(lengths, HV, K, V)
        if got != h.nbytes:
            raise AssertionError(f"FAIL exercise 2 checkpoint_bytes({lengths}, HV={HV}, K={K}, V={V}) = {got!r}; "
                                 f"h {tuple(h.shape)} {h.dtype} takes {h.nbytes} bytes")
    print("PASS exercise 2 checkpoint_bytes: matches h.nbytes of the chunked prefill")
