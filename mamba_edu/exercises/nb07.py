"""Checks of notebook 07 (indices precomputed once per forward, SGLang after PR #20522).

1. ``my_hoist`` — the PR's idea as a question: for each expression a GDN layer might evaluate,
   is its result the same in every layer of a forward (computed once, before layer 1) or not,
   and does it sync? Judged by construction: the expression runs on two layers of one forward
   (same batch, different layer tensors) under the sniffer.
2. ``my_prepare`` — ``PrecomputedTracking.prepare`` of your own: the PR's gate and tracked rows
   (its two syncs, no more), then a sync-free build of the five index tensors (notebook 06's
   exercises 1 and 2, with notebook 06's final-row contract); checked by the sniffer and by an
   engine that runs with it and must end with every pool slot and logit equal to the package's
   ``precomputed`` engine.
3. ``my_masked_copy`` — the per-layer copy of the tracked rows only, with the mask applied on the
   device (no ``if mask.any()``, no ``nonzero``, no boolean index): what makes notebook 08's
   forward sync-free.
4. ``my_precomputed_sync_prediction`` — predict-then-measure: the tracking syncs of one
   ``precomputed`` forward for ``L`` GDN layers, tracked or not, written before the notebook
   measures them (a count: tolerance 0).
"""

from __future__ import annotations

import random

import numpy as np
import torch

from mamba_edu.exercises.core import check_seed, checker, exercise, observe
from mamba_edu.exercises.nb06 import check_prediction, check_sources_contract, toy_batch
from mamba_edu.profiling import count_syncs
from mamba_edu.serving import SCRATCH_SLOT
from mamba_edu.serving.tracking import TrackIndices, TrackingStrategy, sglang_track_metadata

NOTEBOOK = "07_precomputed_indices"
check = checker(NOTEBOOK)

_NAMES = ("dst", "conv_positions", "working", "checkpoint", "from_final")


#: The expressions of exercise 1. Names: the batch's device tensors ``mask`` (track_mask_t),
#: ``cu`` (cu_seqlens), ``slots`` (track_slots_t), ``working`` (working_slots_t); the tracked rows
#: ``rows`` and their ``positions`` (conv windows) and ``checkpoint`` (rows of h), found once; and
#: one layer's tensors ``mixed_qkv [T, D]``, ``h [NT, HV, K, V]`` (its checkpoints), ``ssm``
#: (its SSM pool), plus ``torch``.
HOIST_QUIZ = (
    "mask.any()",
    "bool(mask.any())",
    "mask.nonzero()[:, 0]",
    "slots[rows]",
    "cu[1:] - cu[:-1]",
    "int(cu[-1])",
    "mixed_qkv[positions]",
    "ssm[working[rows]]",
    "h[checkpoint]",
    "h.shape[0] - 1",
    "h[checkpoint].abs().max().item()",
    "torch.where(mask, slots, 0)",
)

#: The codes of exercise 1's first answer.
PLACES = ("forward", "layer")


def _hoist_namespaces(seed: int) -> list[dict]:
    """Two layers of one forward: the same batch and indices, different random layer tensors."""
    batch = toy_batch([0, 0, 64], [130, 40, 64], seed=seed)
    ref = sglang_track_metadata(batch, 4)
    rows = batch.track_mask_t.nonzero()[:, 0]
    T = int(batch.cu_seqlens[-1])
    NT = sum((e + 63) // 64 for e in batch.extend_lens)
    gen = torch.Generator().manual_seed(check_seed(seed))
    shared = dict(torch=torch, mask=batch.track_mask_t, cu=batch.cu_seqlens, slots=batch.track_slots_t,
                  working=batch.working_slots_t, rows=rows, positions=ref.conv_positions,
                  checkpoint=ref.checkpoint)
    return [dict(shared, mixed_qkv=torch.randn(T, 5, generator=gen), h=torch.randn(NT, 2, 3, 3, generator=gen),
                 ssm=torch.randn(1 + 2 * len(batch.extend_lens), 2, 3, 3, generator=gen)) for _ in range(2)]


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and torch.equal(a, b)
    return type(a) is type(b) and a == b


def _measured_hoist(expression: str, seed: int = 70) -> tuple[str, bool]:
    """Where the expression belongs (the same result in both layers: ``forward``) and whether the
    sniffer counts a sync for it."""
    results, syncs = [], 0
    for namespace in _hoist_namespaces(seed):
        with count_syncs() as seen:
            results.append(eval(expression, namespace))  # noqa: S307 - this module's constants
        syncs += seen.count
    return ("forward" if _same(*results) else "layer"), syncs > 0


@exercise(NOTEBOOK, 1, "what the PR can hoist", "my_hoist",
          forbidden=("mamba_edu.serving.tracking", "mamba_edu.profiling.syncs"))
def check_hoist(fn) -> str:
    """Ask ``fn`` about every quiz expression: ``(place, syncs)``; both are measured here, by
    running the expression on two layers of one forward under the sniffer."""
    wrong = []
    for expression in HOIST_QUIZ:
        said = fn(expression)
        if not (isinstance(said, (tuple, list)) and len(said) == 2):
            raise AssertionError(f"my_hoist({expression!r}) returned {said!r}; expected a pair "
                                 "(\"forward\" or \"layer\", True or False)")
        place, syncs = said
        if place not in PLACES:
            raise AssertionError(f"my_hoist({expression!r}) gave the place {place!r}; expected \"forward\" "
                                 "(the same in every layer: computed once) or \"layer\"")
        if not isinstance(syncs, bool | np.bool_):
            raise AssertionError(f"my_hoist({expression!r}) gave the sync verdict {syncs!r}; expected True or False")
        want_place, want_syncs = _measured_hoist(expression)
        if place != want_place:
            wrong.append(f"{expression} (you said {place!r}: "
                         + ("its result is the same in every layer of the forward)" if want_place == "forward"
                            else "two layers of one forward give different results)"))
        elif bool(syncs) != want_syncs:
            wrong.append(f"{expression} ({'a' if want_syncs else 'no'} would-be sync, you said {syncs})")
    if wrong:
        raise AssertionError(f"{len(wrong)} of {len(HOIST_QUIZ)} wrong: " + "; ".join(wrong))
    return (f"all {len(HOIST_QUIZ)} expressions placed and classified as two layers of one forward "
            "and the sniffer show")


class _LearnerPrecomputed(TrackingStrategy):
    """``precomputed`` with the learner's ``prepare``: every forward calls ``fn(batch, W)`` under
    the instruments and hands what it returns to the layers' two copies."""

    name = "your_precomputed"

    def __init__(self, fn):
        self.fn, self.seen = fn, []

    def prepare(self, md):
        batch = md.batch
        seen = observe(self.fn, batch, md.conv_width, may_sync=True)
        self.seen.append(seen)
        got = seen.result
        tracked = sum(batch.track_mask)
        what = f"(extend_lens {batch.extend_lens}, prefix_lens {batch.prefix_lens}, track_mask {batch.track_mask})"
        if seen.sync_count > 2:
            raise AssertionError(f"prepare made {seen.sync_count} would-be host syncs ({', '.join(sorted(seen.by_op))}); "
                                 f"the PR needs two at most (has_mamba_track_mask and the rows), the index "
                                 f"build none {what}")
        if got is None:
            md.track = None
            return
        if not (isinstance(got, (tuple, list)) and len(got) == 5 and all(isinstance(t, torch.Tensor) for t in got)):
            raise AssertionError("return None or a tuple of 5 tensors: (dst, conv_positions, working, "
                                 "checkpoint, from_final)")
        dst, conv, working, checkpoint, final = got
        n = dst.shape[0] if dst.dim() == 1 else -1
        shapes = [tuple(t.shape) for t in got]
        if n < 0 or shapes != [(n,), (n, md.conv_width - 1), (n,), (n,), (n,)]:
            raise AssertionError(f"shapes {shapes}; expected [n], [n, W-1], [n], [n], [n] for n rows {what}")
        if n != tracked:
            raise AssertionError(f"{n} rows of indices for {tracked} tracked rows {what}: only the tracked "
                                 "rows are copied (untracked rows' track slots must stay as they are)")
        for name, t in zip(("dst", "conv_positions", "working", "checkpoint", "from_final"), got):
            flag = name == "from_final"  # checked before the copy below converts anything
            if (t.dtype != torch.bool) if flag else t.dtype not in (torch.int32, torch.int64):
                want = "torch.bool (the copy selects with it)" if flag else "an integer dtype (the copy indexes with it)"
                raise AssertionError(f"{name} has dtype {t.dtype}; expected {want} {what}")
        if tracked:  # notebook 06's final-row contract, with notebook 06's words
            ref = sglang_track_metadata(batch, md.conv_width)
            n_rows_h = sum((e + 63) // 64 for e in batch.extend_lens)
            rows = [i for i, m in enumerate(batch.track_mask) if m]
            check_sources_contract(checkpoint.long(), final.bool(), ref, rows, n_rows_h, what)
        md.track = TrackIndices(dst.long(), conv.long(), working.long(), checkpoint.long(), final.bool())


def _engine_workload(prompt, rng: random.Random):
    """Four prefills over ``prompt`` (600 tokens), their lengths drawn from ``rng``: a request whose
    length is not a multiple of 64 before a tracked one (whose checkpoint row is then off by one
    with floor(E/64) rows per request), a prefix hit tracked at its end (a final row last in its
    batch: o_i + A/64 is past h), a batch with nothing tracked, and a final row before a hit
    tracked at a checkpoint and an untracked row."""
    from mamba_edu.engine import Request

    def odd(lo: int, hi: int) -> int:  # a length in [lo, hi] that is not a multiple of 64
        return rng.choice([n for n in range(lo, hi + 1) if n % 64])

    a = odd(129, 190)
    return ([Request("b", prompt[300:300 + odd(1, 100)]), Request("a", prompt[:a])],   # b ragged, a tracked
            [Request("c", prompt[:64 * rng.randint(3, 4)])],                          # a hit at 128, final
            [Request("d", prompt[300:300 + odd(1, 63)]), Request("e", prompt[:rng.randint(1, 63)])],  # none tracked
            [Request("f", prompt[440:440 + 64 * rng.randint(1, 2)]),                   # f final at its end
             Request("g", prompt[:odd(192, 300)]), Request("h", prompt[400:400 + odd(1, 40)])])


@exercise(NOTEBOOK, 2, "your PrecomputedTracking in the engine", "my_prepare",
          forbidden=("mamba_edu.serving.tracking", "mamba_edu.serving.backend"))
def check_prepare(fn) -> str:
    """Two engines on the same tiny model run the same prefills: the package's ``precomputed`` and
    one whose strategy's ``prepare`` is ``fn``. After every forward, every slot of both pools
    (conv and SSM, every layer) and the logits must be bit-identical; ``fn`` may sync at most twice."""
    from mamba_edu.engine import Engine
    from mamba_edu.model import build_model

    torch.manual_seed(check_seed(0))
    model = build_model("tiny", device="cpu")
    prompt = torch.randint(0, model.config.vocab, (600,), generator=torch.Generator().manual_seed(check_seed(7))).tolist()
    theirs = Engine(model, strategy="precomputed", max_requests=3)
    mine = Engine(model, strategy="precomputed", max_requests=3)
    strategy = _LearnerPrecomputed(fn)
    mine.backend.strategy = strategy
    forwards = 0
    for reqs in _engine_workload(prompt, random.Random(check_seed(72))):
        outs = []
        for engine in (theirs, mine):
            batch = engine.prepare_prefill(reqs)
            out = engine.forward_prefill(batch)
            engine.finish_prefill(batch, out)
            engine.release(batch.rids)
            outs.append(out)
        fb = batch.forward_batch
        what = (f"after the forward of {[r.rid for r in reqs]} (extend_lens {fb.extend_lens}, prefix_lens "
                f"{fb.prefix_lens}, tracked {fb.track_mask})")
        for name in ("conv", "ssm"):
            a, b = getattr(theirs.pool, name), getattr(mine.pool, name)
            wrong = sorted({int(s) for s in (a != b).flatten(2).any(-1).any(0).nonzero()[:, 0]})
            if wrong:
                raise AssertionError(f"{name} pool differs from the precomputed engine's in slots {wrong} {what}")
        if not torch.equal(outs[0], outs[1]):
            raise AssertionError(f"logits differ from the precomputed engine's {what}")
        forwards += 1
    counts = [s.sync_count for s in strategy.seen]
    return f"{forwards} forwards (prefix hits, untracked batches): pools and logits identical; syncs per prepare {counts}"


@exercise(NOTEBOOK, 3, "a masked copy without a sync", "my_masked_copy")
def check_masked_copy(fn) -> str:
    """Random pools, 3-D (a conv pool ``[slots, D, W-1]``) and 4-D (an SSM pool ``[slots, HV, K,
    V]``) in turn: ``fn(pool, src, dst, mask)`` must leave ``pool[dst[i]] = src[i]`` for every row
    with ``mask[i]`` and every other slot but the scratch slot as it was, with no sync."""
    gen = torch.Generator().manual_seed(check_seed(73))
    rng = random.Random(check_seed(73))
    cases = [[True, False, True], [False, False], [True], [False, True, False, False, True]]
    cases += [[rng.random() < 0.5 for _ in range(rng.randint(1, 6))] for _ in range(8)]
    for case, mask_list in enumerate(cases):
        n = len(mask_list)
        slots = 2 * n + 3                                  # scratch, rows' slots, slots nobody names
        dst = torch.tensor(rng.sample(range(1, slots - 1), n))
        inner = (2, 3) if case % 2 else (2, 3, 4)
        pool = torch.randn(slots, *inner, generator=gen)
        src = torch.randn(n, *inner, generator=gen)
        mask = torch.tensor(mask_list, dtype=torch.bool)
        got = pool.clone()
        seen = observe(fn, got, src.clone(), dst.clone(), mask.clone(), fake=True, writes=(0,))
        want = pool.clone()
        for i in range(n):
            if mask_list[i]:
                want[int(dst[i])] = src[i]
        what = f"(mask {mask_list}, dst {dst.tolist()}, {slots} slots of shape {list(inner)})"
        if seen.sync_count:
            raise AssertionError(f"the copy made {seen.sync_count} would-be host syncs ({', '.join(sorted(seen.by_op))}) "
                                 f"{what}: the host must not look at the mask")
        wrong = [s for s in range(1, slots) if not torch.equal(got[s], want[s])]
        if wrong:
            s = wrong[0]
            rows = [i for i in range(n) if int(dst[i]) == s]
            role = (f"the destination of tracked row {rows[0]}" if rows and mask_list[rows[0]] else
                    f"the destination of untracked row {rows[0]} (leave it alone)" if rows else
                    "a slot no row names (leave it alone)")
            raise AssertionError(f"slot {s}, {role}, is wrong {what}; only the scratch slot {SCRATCH_SLOT} "
                                 "may take the untracked rows' writes")
    return f"{len(cases)} random pools: tracked rows copied, every other slot but the scratch slot kept, 0 syncs"


@exercise(NOTEBOOK, 4, "predict the precomputed forward's syncs", "my_precomputed_sync_prediction",
          forbidden=("mamba_edu.profiling.syncs", "mamba_edu.serving.tracking", "mamba_edu.engine"))
def check_precomputed_sync_prediction(fn) -> str:
    """``fn(L, tracked)`` must equal the precomputed strategy's measured syncs exactly."""
    return check_prediction(fn, "precomputed")
