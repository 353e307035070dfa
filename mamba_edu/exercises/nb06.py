"""Checks of notebook 06 (naive tracking, SGLang before PR #20522).

1. ``my_conv_positions`` — the tracked rows' conv windows (rows of ``mixed_qkv``), built on the
   device from the batch's tensors with no host sync (SGLang's version syncs twice for them).
2. ``my_ssm_sources`` — each tracked row's SSM source: the checkpoint row of ``h`` and whether
   the final state is taken instead, on the device, with no host sync (SGLang's version copies
   six tensors to the host for them).
3. ``my_naive_track`` — one GDN layer's two track copies (conv windows, SSM states) into the
   tracked rows' track slots, found on the device as SGLang did before the PR.
4. ``my_sync_prediction`` — predict-then-measure: the tracking syncs of one naive prefill forward
   for ``L`` GDN layers, tracked or not, written before the notebook measures them; the check
   measures them with the sniffer and accepts no difference (a count: tolerance 0).

:data:`FINAL_ROW_CONTRACT` is the one statement, shared with notebook 07, of what a tracked row
whose snapshot is the final state gets as its checkpoint; :func:`check_sources_contract` enforces it
in both notebooks' checks.

Exercises 1 and 2 are the two halves of the index build that notebook 07's strategy uses.
The helpers :func:`toy_batch`, :func:`random_tracked_batches` and :func:`strategy_syncs` are shared
with notebooks 07 and 08.
"""

from __future__ import annotations

import numbers
import random

import numpy as np
import torch

from mamba_edu.exercises.core import check_seed, checker, exercise, observe
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
    md = ForwardMetadata(batch, conv_width)
    with count_syncs() as syncs:
        s.prepare(md)
        for _ in range(n_layers):
            s.ssm_indices(md, s.conv_indices(md))
    return syncs


def random_tracked_batches(seed: int, n: int = 25):
    """``(batch, rows, what)`` for random batches with at least one tracked row: tracked at a
    checkpoint and at the final state (the last request included), untracked rows between them,
    prefixes of 0, 64 and 128 tokens, cache chunks of 64 and 128. ``rows`` (the tracked rows) is
    found outside any sniffer."""
    rng = random.Random(check_seed(seed))
    fixed = [([0, 0, 64], [130, 40, 64], 64), ([0], [128], 64), ([128, 0], [200, 10], 128),
             ([0, 64, 0], [64, 129, 256], 128)]
    cases = list(fixed)
    while len(cases) < n:
        size = rng.randint(1, 5)
        cases.append(([rng.choice([0, 64, 128]) for _ in range(size)],
                      [rng.choice([5, 63, 64, 65, 128, 150, 192, 256]) for _ in range(size)], rng.choice([64, 128])))
    out = []
    for trial, (prefix, extend, cc) in enumerate(cases):
        batch = toy_batch(prefix, extend, cache_chunk=cc, seed=trial)
        if not any(batch.track_mask):
            continue
        rows = torch.tensor([i for i, m in enumerate(batch.track_mask) if m])
        out.append((batch, rows, f"(prefix_lens {prefix}, extend_lens {extend}, cache chunk {cc})"))
    return out


def host_fields(batch) -> dict:
    """Copies of the batch's host fields (all but its device tensors: lists of ints, bools, ranges
    and frozen plans, so a copy of each list is a copy of its values), for
    :func:`check_host_fields` to compare after the answer ran."""
    return {name: list(value) if isinstance(value, list) else value
            for name, value in ((name, getattr(batch, name)) for name in batch.__dataclass_fields__)
            if not isinstance(value, torch.Tensor)}


def check_host_fields(batch, before: dict, what: str) -> None:
    """Raise if the answer changed a host field of ``batch`` since :func:`host_fields` copied them
    (:func:`~mamba_edu.exercises.core.observe` compares its device tensors): the engine reads them
    again after the answer, so an answer must leave them as they were."""
    changed = [name for name, value in before.items() if getattr(batch, name) != value]
    if changed:
        raise AssertionError(f"the answer changed the batch's {', '.join(changed)} {what}: the engine reads "
                             "the batch again after it; leave its host lists as they were")


def is_count(said) -> bool:
    """A whole number, Python's or numpy's, and not a bool (``True == 1``)."""
    return isinstance(said, numbers.Integral) and not isinstance(said, bool | np.bool_)


def _no_syncs(seen, what: str) -> None:
    if seen.sync_count:
        raise AssertionError(f"{what} made {seen.sync_count} would-be host syncs "
                             f"({', '.join(sorted(seen.by_op))}): gathers and arithmetic on the "
                             "batch's device tensors need none")


def _tensor(got, name: str, shape, what: str) -> torch.Tensor:
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{name} is a {type(got).__name__}; return a tensor (on the batch's device)")
    if tuple(got.shape) != tuple(shape):
        raise AssertionError(f"{name} has shape {tuple(got.shape)}; expected {tuple(shape)} {what}")
    return got


@exercise(NOTEBOOK, 1, "the conv windows, without a sync", "my_conv_positions",
          forbidden=("mamba_edu.serving.tracking", "mamba_edu.serving.backend"))
def check_conv_positions(fn) -> str:
    """Random batches: ``fn(batch, rows, W)`` must equal SGLang's conv positions, with no sync,
    and its windows copied into a conv pool must be what the naive strategy copies."""
    gen = torch.Generator().manual_seed(check_seed(60))
    n = 0
    for batch, rows, what in random_tracked_batches(6):
        for width in (2, 4, 5):
            before = host_fields(batch)
            seen = observe(fn, batch, rows.clone(), width, fake=True)
            check_host_fields(batch, before, what)
            _no_syncs(seen, "the window build")
            ref = sglang_track_metadata(batch, width)
            got = _tensor(seen.result, "conv_positions", ref.conv_positions.shape, what)
            if got.dtype != torch.int64:
                raise AssertionError(f"conv_positions has dtype {got.dtype}; expected torch.int64 (a packed "
                                     "batch of a long prompt has more rows than int16 or int32 can count)")
            if not torch.equal(got, ref.conv_positions):
                raise AssertionError(f"conv_positions = {got.tolist()}; expected {ref.conv_positions.tolist()} "
                                     f"for W = {width} {what}")
            T = int(batch.cu_seqlens[-1])
            mixed_qkv, pool = torch.randn(T, 3, generator=gen), torch.randn(1 + 2 * len(batch.extend_lens), 3, width - 1)
            mine, theirs = pool.clone(), pool.clone()
            LinearAttentionBackend._track_conv(mine, mixed_qkv, type(ref)(ref.dst, got, ref.working,
                                                                          ref.checkpoint, ref.from_final))
            LinearAttentionBackend._track_conv(theirs, mixed_qkv, ref)
            assert torch.equal(mine, theirs), "the copies differ although the indices agree"
            n += 1
    return f"{n} batches × widths: the same windows as SGLang's, 0 syncs"


#: Which tracked row is "final" and what its checkpoint may be: the same words in notebooks 06
#: (exercise 2) and 07 (exercise 2), enforced by :func:`check_sources_contract`.
FINAL_ROW_CONTRACT = (
    "a tracked row is final when A = E: its snapshot is the final state in its working slot and "
    "from_final is true; its checkpoint may be any row of h (0 <= checkpoint < the rows of h), since "
    "the copy gathers h[checkpoint] for every row before torch.where keeps the final state. Every "
    "other tracked row has from_final false and checkpoint = o_i + A_i / 64 exactly")


def check_sources_contract(checkpoint, final, ref, rows, n_rows_h: int, what: str) -> None:
    """Raise unless ``(checkpoint, final)`` keep :data:`FINAL_ROW_CONTRACT` against SGLang's
    sources ``ref`` (a :class:`~mamba_edu.serving.tracking.TrackIndices`) for the tracked ``rows``."""
    if not torch.equal(final, ref.from_final):
        raise AssertionError(f"from_final = {final.tolist()}; expected {ref.from_final.tolist()} "
                             f"(the final-row contract: a row is final exactly when A = E) {what}")
    for j, (c, want, is_final) in enumerate(zip(checkpoint.tolist(), ref.checkpoint.tolist(), final.tolist())):
        if is_final and not 0 <= c < n_rows_h:
            raise AssertionError(f"tracked row {int(rows[j])} is final, but its checkpoint {c} is not a row "
                                 f"of h (h has {n_rows_h} rows). The final-row contract: {FINAL_ROW_CONTRACT} {what}")
        if not is_final and c != want:
            off = " (one chunk late)" if c == want + 1 else " (one chunk early)" if c == want - 1 else ""
            raise AssertionError(f"tracked row {int(rows[j])}: checkpoint {c}, expected h row {want}{off}: "
                                 f"checkpoint = {checkpoint.tolist()}, expected {ref.checkpoint.tolist()} {what}")


@exercise(NOTEBOOK, 2, "the SSM sources, without a sync", "my_ssm_sources",
          forbidden=("mamba_edu.serving.tracking", "mamba_edu.serving.backend", "mamba_edu.gdn.varlen"))
def check_ssm_sources(fn) -> str:
    """Random batches: ``fn(batch, rows) -> (checkpoint, from_final)`` with no sync, an int64 and
    a bool tensor (as the statement asks: no conversion here), keeping :data:`FINAL_ROW_CONTRACT`;
    the SSM copy with them must equal naive's."""
    gen = torch.Generator().manual_seed(check_seed(61))
    n = 0
    for batch, rows, what in random_tracked_batches(7):
        before = host_fields(batch)
        seen = observe(fn, batch, rows.clone(), fake=True)
        check_host_fields(batch, before, what)
        _no_syncs(seen, "the source build")
        ref = sglang_track_metadata(batch, 4)
        n_rows_h = sum((e + 63) // 64 for e in batch.extend_lens)
        got = seen.result
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise AssertionError("return a tuple of 2 tensors: (checkpoint, from_final)")
        checkpoint = _tensor(got[0], "checkpoint", ref.checkpoint.shape, what)
        final = _tensor(got[1], "from_final", ref.from_final.shape, what)
        for name, t, dtype in (("checkpoint", checkpoint, torch.int64), ("from_final", final, torch.bool)):
            if t.dtype != dtype:
                raise AssertionError(f"{name} has dtype {t.dtype}; expected {dtype} (the statement's: the "
                                     f"copy indexes with checkpoint and selects with from_final) {what}")
        check_sources_contract(checkpoint, final, ref, rows, n_rows_h, what)
        h = torch.randn(n_rows_h, 2, 3, 3, generator=gen)
        pool = torch.randn(1 + 2 * len(batch.extend_lens), 2, 3, 3, generator=gen)
        mine, theirs = pool.clone(), pool.clone()
        LinearAttentionBackend._track_ssm(mine, h, type(ref)(ref.dst, ref.conv_positions, ref.working, checkpoint, final))
        LinearAttentionBackend._track_ssm(theirs, h, ref)
        if not torch.equal(mine, theirs):
            raise AssertionError(f"the SSM copy with your sources differs from naive's {what}")
        n += 1
    return f"{n} random batches: the same SSM sources as SGLang's, 0 syncs"


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
    """Random batches (tracked at a checkpoint, at the final state, untracked, after a prefix;
    cache chunks 64 and 128, E = 192 and 200 at 128): run ``fn`` and the package's naive strategy
    + backend copies on equal pools, compare every slot."""
    gen = torch.Generator().manual_seed(check_seed(61))
    rng = random.Random(check_seed(62))
    D, HV, K, V = 5, 2, 3, 3
    # cache chunk 128 leaves up to 127 tokens after A: E = 192 ends one whole chunk after A = 128,
    # and E = 200 puts A's checkpoint before the request's last one
    shapes = [([0, 0, 64], [130, 40, 64], 64, 4), ([0], [64], 64, 4), ([64, 0], [200, 10], 64, 3),
              ([0, 128, 0], [129, 256, 63], 128, 5), ([0, 0, 128], [192, 200, 192], 128, 4)]
    for _ in range(6):
        size = rng.randint(1, 4)
        shapes.append(([rng.choice([0, 64]) for _ in range(size)],
                       [rng.choice([1, 40, 64, 65, 127, 128, 190]) for _ in range(size)], 64, rng.randint(2, 5)))
    tracked_rows = 0
    for case, (prefix, extend, cc, W) in enumerate(shapes):
        batch = toy_batch(prefix, extend, cache_chunk=cc, seed=case)
        mixed_qkv, h, conv, ssm = _toy_layer(batch, W, D, HV, K, V, gen)
        got_conv, got_ssm, before = conv.clone(), ssm.clone(), host_fields(batch)
        observe(fn, got_conv, got_ssm, mixed_qkv, h, batch, W, may_sync=True, writes=(0, 1))  # the pools, in place
        what = f"(prefix_lens {prefix}, extend_lens {extend}, cache chunk {cc}, W {W})"
        check_host_fields(batch, before, what)
        want_conv, want_ssm = conv.clone(), ssm.clone()
        naive = get_strategy("naive")
        md = ForwardMetadata(batch, W)
        naive.prepare(md)
        track = naive.conv_indices(md)
        if track is not None:
            LinearAttentionBackend._track_conv(want_conv, mixed_qkv, track)
        track = naive.ssm_indices(md, track)
        if track is not None:
            LinearAttentionBackend._track_ssm(want_ssm, h, track)
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


# ---------------------------------------------------------------------------------------------
# Exercise 4: predict, then measure
# ---------------------------------------------------------------------------------------------

def _sync_batches() -> dict:
    """A batch with tracked rows (at a checkpoint and at a final state, beside an untracked row)
    and one with none, as :func:`toy_batch` builds them."""
    return {True: toy_batch([0, 0, 64], [130, 40, 64]), False: toy_batch([0, 0], [40, 10])}


def measured_syncs(strategy: str, n_layers: int, tracked: bool) -> int:
    """The tracking syncs the sniffer counts for one prefill forward of ``strategy`` with
    ``n_layers`` GDN layers, on a batch with (``tracked``) or without a tracked row."""
    return strategy_syncs(_sync_batches()[tracked], strategy, n_layers).count


def check_prediction(fn, strategy: str, layers=(1, 3, 36, 45)) -> str:
    """Compare ``fn(L, tracked)`` with the sniffer's count for every ``L`` of ``layers``, tracked
    and not: a count of syncs, so the tolerance is 0."""
    for tracked in (True, False):
        for L in layers:
            said = fn(L, tracked)
            if not is_count(said):
                raise AssertionError(f"the prediction for L = {L}, tracked = {tracked} is {said!r}; "
                                     "expected a whole number of syncs (an int)")
            got = measured_syncs(strategy, L, tracked)
            if said != got:
                raise AssertionError(f"L = {L} GDN layers, {'a row tracked' if tracked else 'nothing tracked'}: "
                                     f"you predicted {said}, the sniffer measures {got} ({strategy} strategy, "
                                     "tolerance 0)")
    return (f"your prediction equals the measured {strategy} sync counts for L = "
            f"{', '.join(map(str, layers))}, tracked and untracked (tolerance 0)")


@exercise(NOTEBOOK, 4, "predict the naive forward's syncs", "my_sync_prediction",
          forbidden=("mamba_edu.profiling.syncs", "mamba_edu.serving.tracking", "mamba_edu.engine"))
def check_sync_prediction(fn) -> str:
    """``fn(L, tracked)`` must equal the naive strategy's measured syncs exactly."""
    return check_prediction(fn, "naive")
