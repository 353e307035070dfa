"""Checks of notebook 08 (zero syncs, CUDA graphs, tracking fused into the kernel).

1. ``my_host_plan`` — ``sync_free``'s host plan: one entry per row from the scheduler's host
   lists, untracked rows sent to the scratch slot; no device tensor read.
2. ``my_checkpoint_bytes`` — the bytes of one layer's checkpoint tensor ``h`` that fusing saves.
3. ``my_fused_scan`` — a chunk-by-chunk state scan that writes each tracked state straight into
   its track slot when it passes it (what the ``fused`` kernel does), instead of returning ``h``.
"""

from __future__ import annotations

import random

import torch

from mamba_edu.exercises.core import checker, exercise, observe
from mamba_edu.exercises.nb06 import toy_batch
from mamba_edu.kernels import build_chunk_meta, gdn_prefill
from mamba_edu.serving import SCRATCH_SLOT
from mamba_edu.serving.tracking import host_track_indices
from mamba_edu.testing import check as compare

NOTEBOOK = "08_zero_syncs_and_graphs"
check = checker(NOTEBOOK)

_FIELDS = ("dst", "conv_positions", "checkpoint", "from_final", "chunks")


@exercise(NOTEBOOK, 1, "the host plan of sync_free", "my_host_plan",
          forbidden=("mamba_edu.serving.tracking",))
def check_host_plan(fn) -> str:
    """Random batches (tracked at a checkpoint or the final state, untracked, after a prefix);
    compare with ``host_track_indices`` field by field; reading a device tensor is a sync."""
    rng = random.Random(9)
    for trial in range(30):
        size = rng.randint(1, 6)
        extend = [rng.choice([1, 40, 63, 64, 100, 128, 300]) for _ in range(size)]
        prefix = [rng.choice([0, 0, 64]) for _ in range(size)]
        W = rng.randint(2, 5)
        batch = toy_batch(prefix, extend, cache_chunk=rng.choice([64, 128]), seed=trial)
        want = host_track_indices(batch, W)
        seen = observe(fn, batch, W)
        got = seen.result
        if seen.sync_count:
            raise AssertionError(f"the plan made {seen.sync_count} would-be host syncs "
                                 f"({', '.join(sorted(seen.by_op))}): build it from the batch's host lists "
                                 "(extend_lens, token_ranges, plans), not from its device tensors")
        if not isinstance(got, (tuple, list)) or len(got) != 5:
            raise AssertionError("return a tuple of 5 lists: (dst, conv_positions, checkpoint, from_final, chunks)")
        what = f"(extend_lens {extend}, prefix_lens {prefix}, track_mask {batch.track_mask}, W {W})"
        for name, g in zip(_FIELDS, got):
            w = getattr(want, name)
            g = [[int(x) for x in row] for row in g] if name == "conv_positions" else [int(x) for x in g]
            if len(g) != len(w):
                raise AssertionError(f"{name} has {len(g)} entries; expected one per row ({len(w)}): untracked "
                                     f"rows keep their place and write the scratch slot {SCRATCH_SLOT} {what}")
            if g != w:
                raise AssertionError(f"{name} = {g}; expected {w} {what}")
    return "30 random batches match host_track_indices, one entry per row, 0 syncs"


@exercise(NOTEBOOK, 2, "checkpoint bytes saved by fusing", "my_checkpoint_bytes",
          forbidden=("mamba_edu.kernels",))
def check_checkpoint_bytes(fn) -> str:
    """Run ``gdn_prefill(output_checkpoints=True)`` on small batches and compare ``h.nbytes``."""
    gen = torch.Generator().manual_seed(10)
    H, HV, K, V = 1, 2, 8, 16
    for lengths in ([1], [64], [65, 3], [130, 64, 200]):
        T = sum(lengths)
        q, k = torch.randn(2, T, H, K, generator=gen)
        v = torch.randn(T, HV, V, generator=gen)
        g, beta = -torch.rand(T, HV, generator=gen), torch.rand(T, HV, generator=gen)
        pool = torch.zeros(len(lengths) + 1, HV, K, V)
        meta = build_chunk_meta(lengths, "cpu")
        _, h = gdn_prefill(q, k, v, g, beta, state_pool=pool, meta=meta,
                           state_indices=list(range(1, len(lengths) + 1)), output_checkpoints=True,
                           backend="torch")
        got = fn(list(lengths), HV, K, V)
        if got != h.nbytes:
            raise AssertionError(f"checkpoint_bytes({lengths}, HV={HV}, K={K}, V={V}) = {got!r}; "
                                 f"h {tuple(h.shape)} {h.dtype} takes {h.nbytes} bytes")
    return "matches h.nbytes of the chunked prefill"


@exercise(NOTEBOOK, 3, "the fused tracking write", "my_fused_scan",
          forbidden=("mamba_edu.kernels", "mamba_edu.serving"))
def check_fused_scan(fn) -> str:
    """Packed batches with rows tracked at a checkpoint, at the final state, and untracked
    (chunk −1, destination the scratch slot); compare every pool slot with ``gdn_prefill``'s
    in-kernel tracking (torch path), and require that nothing but None is returned."""
    gen = torch.Generator().manual_seed(12)
    H, HV, K, V = 1, 2, 8, 8
    cases = [([130, 40, 128], [1, 2, 3], [4, SCRATCH_SLOT, 5], [2, -1, 2]),   # h[2] of row 0; row 2 final
             ([65, 200], [2, 1], [3, 4], [1, 3]),                            # A = 64 < 65; A = 192 < 200
             ([64, 10, 190], [3, 1, 2], [5, SCRATCH_SLOT, 4], [1, -1, 2])]   # row 0 final (64 = one chunk)
    for lengths, working, track, chunks in cases:
        T = sum(lengths)
        q, k = torch.randn(2, T, H, K, generator=gen)
        v = torch.randn(T, HV, V, generator=gen)
        g, beta = -torch.rand(T, HV, generator=gen) * 0.2, torch.rand(T, HV, generator=gen)
        pool = torch.randn(6, HV, K, V, generator=gen)
        want = pool.clone()
        meta = build_chunk_meta(lengths, "cpu")
        gdn_prefill(q, k, v, g, beta, state_pool=want, meta=meta, state_indices=working,
                    track_slots=torch.tensor(track),
                    track_chunks=torch.tensor(chunks), backend="torch")
        got = pool.clone()
        out = fn(q, k, v, g, beta, got, list(lengths), list(working), list(track), list(chunks))
        if out is not None:
            raise AssertionError(f"returned {type(out).__name__}: the fused write returns nothing (no h)")
        what = f"(lengths {lengths}, working {working}, track_slots {track}, track_chunks {chunks})"
        for s in range(pool.shape[0]):
            role = ("scratch slot" if s == SCRATCH_SLOT else
                    f"working slot of row {working.index(s)}" if s in working else
                    f"track slot of row {track.index(s)} (chunk {chunks[track.index(s)]})" if s in track else
                    "an unused slot")
            try:
                compare(got[s], want[s], tol=1e-4, name=f"slot {s}", quiet=True)
            except AssertionError:
                raise AssertionError(f"slot {s}, the {role}, differs from the fused kernel's {what}") from None
    return "3 batches: every slot (working, track, scratch) equals gdn_prefill's fused tracking"
