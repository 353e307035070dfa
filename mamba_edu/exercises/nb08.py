"""Checks of notebook 08 (zero syncs, CUDA graphs, tracking fused into the kernel).

1. ``my_host_plan`` — ``sync_free``'s host plan: one entry per row from the scheduler's host
   lists, untracked rows sent to the scratch slot; no device tensor read.
2. ``my_fill_static`` — make the copies capture-ready: write one batch's plan into fixed-size
   device buffers (one row per slot of the graph's batch, unused rows to the scratch slot), in
   place, with no sync; checked by "replaying" the copies built once over those buffers with
   batches of different sizes, against ``sync_free``'s copies of each batch.
3. ``my_fused_scan`` — a chunk-by-chunk state scan that writes each tracked state straight into
   its track slot when it passes it (what the ``fused`` kernel does), instead of returning ``h``;
   asking for checkpoints (``output_checkpoints=True``: compute ``h``, then copy) is refused, and
   ``recurrent_gated_delta_rule`` is metered: it must scan each new token exactly once.
"""

from __future__ import annotations

import random

import torch

from mamba_edu.exercises.core import check_seed, checker, exercise, observe
from mamba_edu.exercises.nb06 import FINAL_ROW_CONTRACT, check_host_fields, host_fields, toy_batch
from mamba_edu.kernels import build_chunk_meta, gdn_prefill
from mamba_edu.serving import SCRATCH_SLOT, LinearAttentionBackend
from mamba_edu.serving.tracking import TrackIndices, host_track_indices, track_indices_on_host
from mamba_edu.testing import check as compare

NOTEBOOK = "08_zero_syncs_and_graphs"
check = checker(NOTEBOOK)

_FIELDS = ("dst", "conv_positions", "checkpoint", "from_final", "chunks")


@exercise(NOTEBOOK, 1, "the host plan of sync_free", "my_host_plan",
          forbidden=("mamba_edu.serving.tracking",))
def check_host_plan(fn) -> str:
    """Random batches (tracked at a checkpoint or the final state, untracked, after a prefix);
    compare with ``host_track_indices`` field by field, but for a final row's checkpoint, which
    may be any row of h (notebooks 06 and 07's final-row contract); reading a device tensor is a
    sync."""
    rng = random.Random(check_seed(9))
    for trial in range(30):
        size = rng.randint(1, 6)
        extend = [rng.choice([1, 40, 63, 64, 100, 128, 300]) for _ in range(size)]
        prefix = [rng.choice([0, 0, 64]) for _ in range(size)]
        W = rng.randint(2, 5)
        batch = toy_batch(prefix, extend, cache_chunk=rng.choice([64, 128]), seed=trial)
        before = host_fields(batch)
        seen = observe(fn, batch, W, fake=True)
        got = seen.result
        what = f"(extend_lens {extend}, prefix_lens {prefix}, track_mask {batch.track_mask}, W {W})"
        check_host_fields(batch, before, what)
        want = host_track_indices(batch, W)
        if seen.sync_count:
            raise AssertionError(f"the plan made {seen.sync_count} would-be host syncs "
                                 f"({', '.join(sorted(seen.by_op))}): build it from the batch's host lists "
                                 "(extend_lens, token_ranges, plans), not from its device tensors")
        if not isinstance(got, (tuple, list)) or len(got) != 5:
            raise AssertionError("return a tuple of 5 lists: (dst, conv_positions, checkpoint, from_final, chunks)")
        n_rows_h = sum((e + 63) // 64 for e in extend)
        for name, g in zip(_FIELDS, got):
            w = getattr(want, name)
            g = [[int(x) for x in row] for row in g] if name == "conv_positions" else [int(x) for x in g]
            if len(g) != len(w):
                raise AssertionError(f"{name} has {len(g)} entries; expected one per row ({len(w)}): untracked "
                                     f"rows keep their place and write the scratch slot {SCRATCH_SLOT} {what}")
            if name == "checkpoint":  # a final row may name any row of h
                final = [bool(f) and tracked for f, tracked in zip(want.from_final, batch.track_mask)]
                if any(f and not 0 <= c < n_rows_h for c, f in zip(g, final)):
                    raise AssertionError(f"checkpoint = {g}: a final row's checkpoint is not a row of h "
                                         f"({n_rows_h} rows). The final-row contract: {FINAL_ROW_CONTRACT} {what}")
                g = [w_c if f else c for c, w_c, f in zip(g, w, final)]
            if g != w:
                raise AssertionError(f"{name} = {g}; expected {w} {what}")
    return "30 random batches match host_track_indices, one entry per row, 0 syncs"


#: The fixed sizes of exercise 2's "graph": rows, packed tokens and checkpoint rows it was built for.
STATIC_ROWS, STATIC_TOKENS, STATIC_CHECKPOINTS = 4, 640, 12
#: Batches run one after another in the same buffers: (prefix_lens, extend_lens, cache chunk, W = 4).
STATIC_BATCHES = [([0, 0, 64, 0], [130, 40, 128, 200], 64),   # every kind of row, the buffers full
                  ([0, 0], [65, 100], 64),                     # fewer rows: the last two must not write
                  ([64, 0, 0], [10, 256, 64], 128),            # an untracked row first, a final state
                  ([0], [300], 64),                            # one row
                  ([0, 64, 0, 0], [64, 64, 30, 129], 64)]      # full again


BUFFER_NAMES = ("dst", "conv_positions", "working", "checkpoint", "from_final")


def _static_buffers(W: int) -> list[torch.Tensor]:
    return [torch.zeros(STATIC_ROWS, dtype=torch.long), torch.zeros(STATIC_ROWS, W - 1, dtype=torch.long),
            torch.zeros(STATIC_ROWS, dtype=torch.long), torch.zeros(STATIC_ROWS, dtype=torch.long),
            torch.zeros(STATIC_ROWS, dtype=torch.bool)]


@exercise(NOTEBOOK, 2, "capture-ready copies: fixed buffers", "my_fill_static",
          forbidden=("mamba_edu.serving.tracking", "mamba_edu.serving.backend"))
def check_fill_static(fn) -> str:
    """Build the two copies once over fixed buffers (what a CUDA graph records), then for each of
    several batches of different sizes: ``fn`` fills the buffers in place (0 syncs), the copies are
    replayed on static inputs, and every pool slot but the scratch slot must equal ``sync_free``'s
    copies of that batch alone (computed after ``fn`` returned). A row past the batch may read its
    state from slot −1 (notebook 12's slot for padding rows): only its destination must be the
    scratch slot."""
    W, D, HV, K, V = 4, 3, 2, 3, 3
    gen = torch.Generator().manual_seed(check_seed(82))
    buffers = _static_buffers(W)
    mixed_qkv = torch.zeros(STATIC_TOKENS, D)                      # the graph's static inputs
    h = torch.zeros(STATIC_CHECKPOINTS, HV, K, V)
    slots = 1 + 2 * STATIC_ROWS
    conv = torch.randn(slots, D, W - 1, generator=gen)
    ssm = torch.randn(slots, HV, K, V, generator=gen)
    graph = TrackIndices(*buffers)                                 # "captured" once: these tensors, forever

    def replay():
        LinearAttentionBackend._track_conv(conv, mixed_qkv, graph)
        LinearAttentionBackend._track_ssm(ssm, h, graph)

    for trial, (prefix, extend, cc) in enumerate(STATIC_BATCHES):
        batch = toy_batch(prefix, extend, cache_chunk=cc, seed=trial)
        T, NT = sum(extend), sum((e + 63) // 64 for e in extend)
        mixed_qkv.copy_(torch.randn(STATIC_TOKENS, D, generator=gen))
        h.copy_(torch.randn(STATIC_CHECKPOINTS, HV, K, V, generator=gen))
        ssm[1:1 + len(extend)] = torch.randn(len(extend), HV, K, V, generator=gen)  # the "final states"
        before = host_fields(batch)
        seen = observe(fn, batch, W, *buffers, fake=True, writes=(2, 3, 4, 5, 6))
        what = f"(batch {trial + 1}: extend_lens {extend}, prefix_lens {prefix}, track_mask {batch.track_mask})"
        check_host_fields(batch, before, what)
        want_conv, want_ssm = conv.clone(), ssm.clone()
        ref = track_indices_on_host(batch, host_track_indices(batch, W), "cpu")
        LinearAttentionBackend._track_conv(want_conv, mixed_qkv[:T], ref)
        LinearAttentionBackend._track_ssm(want_ssm, h[:NT], ref)
        if seen.sync_count:
            raise AssertionError(f"filling the buffers made {seen.sync_count} would-be host syncs "
                                 f"({', '.join(sorted(seen.by_op))}) {what}: a sync cannot be captured; "
                                 "plan from the batch's host lists")
        if seen.rebound:
            names = ", ".join(BUFFER_NAMES[i - 2] for i in seen.rebound)
            raise AssertionError(f"{names} came back on new memory {what}: a captured graph keeps reading "
                                 "the memory it recorded, so write into the buffers (copy_, slice "
                                 "assignment) and never rebind them (.data =, set_, resize_)")
        if not (0 <= int(buffers[1].min()) and int(buffers[1].max()) < STATIC_TOKENS
                and 0 <= int(buffers[3].min()) and int(buffers[3].max()) < STATIC_CHECKPOINTS
                and 0 <= int(buffers[0].min()) and int(buffers[0].max()) < slots
                and 0 <= int(buffers[2][:len(extend)].min()) and -1 <= int(buffers[2].min())
                and int(buffers[2].max()) < slots):
            raise AssertionError(f"an index in the buffers is outside the static inputs or the pool {what}: "
                                 f"dst {buffers[0].tolist()}, conv_positions {buffers[1].tolist()}, working "
                                 f"{buffers[2].tolist()}, checkpoint {buffers[3].tolist()}")
        replay()
        for name, got, want in (("conv", conv, want_conv), ("ssm", ssm, want_ssm)):
            wrong = [s for s in range(1, slots) if not torch.equal(got[s], want[s])]
            if wrong:
                raise AssertionError(
                    f"after the replay, {name} slots {wrong} differ from sync_free's copies {what}; the "
                    f"buffers held dst {buffers[0].tolist()}, from_final {buffers[4].long().tolist()}, checkpoint "
                    f"{buffers[3].tolist()} (rows past the batch's {len(extend)} are replayed too)")
        conv[SCRATCH_SLOT], ssm[SCRATCH_SLOT] = want_conv[SCRATCH_SLOT], want_ssm[SCRATCH_SLOT]
    return (f"{len(STATIC_BATCHES)} batches of 1 to {STATIC_ROWS} rows replayed in the same buffers: every slot "
            "but the scratch slot equals sync_free's copies, 0 syncs")


#: The scan exercise 3 advances with; every call is metered (the rows of its ``q``: its tokens).
SCAN = "mamba_edu.gdn.recurrent.recurrent_gated_delta_rule"


def _scanned_once(rows: list, T: int, what: str) -> None:
    """The fused write's cost: the recurrence scans each of the batch's ``T`` new tokens once
    (``rows``: the tokens of each of its calls); a tracked state is stored as the scan passes it."""
    scanned = sum(rows)
    if scanned > T:
        raise AssertionError(f"recurrent_gated_delta_rule scanned {scanned} tokens in {len(rows)} calls for a "
                             f"batch of {T} new tokens {what}: scanning a token again is the cost the fused "
                             "write removes; store each tracked state as the one scan passes it")
    if scanned < T:
        raise AssertionError(f"recurrent_gated_delta_rule scanned {scanned} of the batch's {T} new tokens {what}: "
                             "advance every chunk with it, as the statement asks (the check counts its tokens)")


@exercise(NOTEBOOK, 3, "the fused tracking write", "my_fused_scan",
          forbidden=("mamba_edu.kernels", "mamba_edu.serving", "mamba_edu.gdn.chunked",
                     "mamba_edu.gdn.varlen.checkpoint_offsets"))
def check_fused_scan(fn) -> str:
    """Packed batches with rows tracked at a checkpoint, at the final state, and untracked
    (chunk −1, destination the scratch slot); compare every pool slot with ``gdn_prefill``'s
    in-kernel tracking (torch path, run after the answer), require that nothing but None is returned, and that
    ``recurrent_gated_delta_rule`` scanned each token once (every call counted, any thread)."""
    gen = torch.Generator().manual_seed(check_seed(12))
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
        got = pool.clone()
        seen = observe(fn, q, k, v, g, beta, got, list(lengths), list(working), list(track), list(chunks),
                       writes=(5,), metered=(SCAN,))  # the pool, in place; the inputs come back unchanged
        want = pool.clone()
        meta = build_chunk_meta(lengths, "cpu")
        gdn_prefill(q, k, v, g, beta, state_pool=want, meta=meta, state_indices=working,
                    track_slots=torch.tensor(track),
                    track_chunks=torch.tensor(chunks), impl="torch")
        out = seen.result
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
        _scanned_once(seen.metered_rows, T, what)
    return "3 batches: every slot (working, track, scratch) equals gdn_prefill's fused tracking"
