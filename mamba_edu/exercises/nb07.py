"""Checks of notebook 07 (indices precomputed once per forward, SGLang after PR #20522).

1. ``my_precomputed_indices`` — every index of the two track copies, for the tracked rows, from
   the batch's device tensors, without a host sync.
2. ``my_checkpoint_row`` — the row of the packed checkpoint tensor ``h`` that holds the state
   after ``A`` tokens of request ``i``.
3. ``my_precomputed_syncs`` — the host syncs left per forward with the ``precomputed`` strategy.
"""

from __future__ import annotations

import random

import torch

from mamba_edu.exercises.core import checker, exercise, observe
from mamba_edu.exercises.nb02 import packed_checkpoints
from mamba_edu.exercises.nb06 import strategy_syncs, toy_batch
from mamba_edu.gdn import recurrent_gated_delta_rule
from mamba_edu.serving.tracking import sglang_track_metadata

NOTEBOOK = "07_precomputed_indices"
check = checker(NOTEBOOK)

_NAMES = ("dst", "conv_positions", "working", "checkpoint", "from_final")


@exercise(NOTEBOOK, 1, "precomputed indices without a sync", "my_precomputed_indices",
          forbidden=("mamba_edu.serving.tracking",))
def check_precomputed_indices(fn) -> str:
    """Random batches; ``rows`` found outside the sniffer; ``fn`` must not sync and must match
    the indices the package builds (SGLang's per-forward metadata)."""
    rng = random.Random(7)
    n = 0
    for trial in range(25):
        size = rng.randint(1, 5)
        extend = [rng.choice([5, 63, 64, 65, 128, 150, 192]) for _ in range(size)]
        prefix = [rng.choice([0, 64]) for _ in range(size)]
        batch = toy_batch(prefix, extend, seed=trial)
        rows = batch.track_mask_t.nonzero()[:, 0]
        if rows.numel() == 0:
            continue
        ref = sglang_track_metadata(batch, 4)
        seen = observe(fn, batch, rows, 4)
        got = seen.result
        if seen.sync_count:
            raise AssertionError(f"the index build made {seen.sync_count} would-be host syncs "
                                 f"({', '.join(sorted(seen.by_op))}); only gathers and arithmetic are needed")
        if not isinstance(got, (tuple, list)) or len(got) != 5:
            raise AssertionError("return a tuple of 5 tensors: (dst, conv_positions, working, checkpoint, from_final)")
        for name, g, w in zip(_NAMES, got, (ref.dst, ref.conv_positions, ref.working, ref.checkpoint,
                                            ref.from_final)):
            if not isinstance(g, torch.Tensor) or g.shape != w.shape or not torch.equal(g.to(w.dtype), w):
                shown = g.tolist() if isinstance(g, torch.Tensor) else g
                raise AssertionError(f"{name} = {shown}; expected {w.tolist()} "
                                     f"(extend_lens {extend}, prefix_lens {prefix})")
        n += 1
    return f"{n} random batches match the package's indices, 0 syncs"


@exercise(NOTEBOOK, 2, "which checkpoint row", "my_checkpoint_row",
          forbidden=("mamba_edu.gdn.varlen.checkpoint_offsets",))
def check_checkpoint_row(fn) -> str:
    """Run the chunked GDN with checkpoints on a packed batch and compare the row ``fn`` names
    with the token-by-token state after ``aligned`` tokens of that request."""
    lengths = [70, 200, 64, 129, 1, 128]
    (q, k, v, g, beta), cu, h = packed_checkpoints(lengths, 1, 2, 8, 8, seed=8)
    n = 0
    for i, length in enumerate(lengths):
        for aligned in range(64, length, 64):
            s = int(cu[i])
            want = recurrent_gated_delta_rule(q[s:s + aligned], k[s:s + aligned], v[s:s + aligned],
                                              g[s:s + aligned], beta[s:s + aligned],
                                              use_qk_l2norm=True).final_state[0]
            row = fn(list(lengths), i, aligned)
            if not (isinstance(row, int) and 0 <= row < h.shape[0]) or not torch.allclose(h[row], want, atol=1e-4):
                hint = ""
                if isinstance(row, int) and 0 <= row + 1 < h.shape[0] and torch.allclose(h[row + 1], want, atol=1e-4):
                    hint = " (one chunk too early)"
                elif isinstance(row, int) and 0 <= row - 1 < h.shape[0] and torch.allclose(h[row - 1], want, atol=1e-4):
                    hint = " (one chunk too late)"
                raise AssertionError(f"checkpoint_row({lengths}, i={i}, aligned={aligned}) = {row!r}: that row "
                                     f"is not the state after {aligned} tokens of request {i}{hint}")
            n += 1
    return f"{n} rows of h hold the recurrence's state after A tokens"


@exercise(NOTEBOOK, 3, "precomputed syncs per forward", "my_precomputed_syncs",
          forbidden=("mamba_edu.profiling.syncs",))
def check_precomputed_syncs(fn) -> str:
    """Count the precomputed strategy's syncs with the sniffer, tracked or not, 1 to 45 layers."""
    cases = {True: ([0, 0], [130, 40]), False: ([0, 64], [40, 10])}
    for tracked, (prefix, extend) in cases.items():
        batch = toy_batch(prefix, extend)
        for n_layers in (1, 3, 45):
            want = strategy_syncs(batch, "precomputed", n_layers).count
            got = fn(n_layers, tracked)
            if got != want:
                raise AssertionError(f"precomputed_syncs({n_layers}, any_tracked={tracked}) = {got!r}; "
                                     f"the sniffer counts {want}")
    return "matches the sniffer for 1, 3 and 45 GDN layers, tracked and untracked"
