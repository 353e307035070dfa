"""Checks of notebook 05 (the state pool and the prefix cache).

1. ``my_plan`` — the host plan of one request: tracked?, the aligned length A, whether the SSM
   snapshot is the final state, and which checkpoint ``h[c]`` it is otherwise.
2. ``my_match`` — how far a prefix hit can go: walk the radix tree along a prompt and return the
   deepest usable snapshot, as :meth:`mamba_edu.serving.RadixCache.match` does.
3. ``my_hit_prediction`` — predict-then-measure: an engine with cache chunk ``Cc`` prefills the
   first ``first`` tokens of a prompt and releases the request; a second request brings the first
   ``second`` tokens of the same prompt. How many of them come from the cache? The check measures
   it on a small engine (a count of tokens: tolerance 0).
"""

from __future__ import annotations

import random

from mamba_edu.exercises.core import check_seed, checker, exercise
from mamba_edu.serving import RadixCache, StatePool, plan_tracking

_MODEL = None

NOTEBOOK = "05_state_pool_and_prefix_cache"
check = checker(NOTEBOOK)


@exercise(NOTEBOOK, 1, "the host plan of one request", "my_plan",
          forbidden=("mamba_edu.serving.planning.plan_tracking",))
def check_plan(fn) -> str:
    """Compare ``fn(P, E, Cc)`` with :func:`plan_tracking` on both sides of every boundary, and on
    requests drawn from the grading seed up to 10⁵ tokens (no table fits them)."""
    rng = random.Random(check_seed(51))
    edges = [(prefix, extend, cc) for cc in (64, 128, 256) for prefix in (0, 64, 100)
             for extend in (1, 63, 64, 65, 127, 128, 129, 191, 192, 255, 256, 257, 300, 512, 700)]
    drawn = [(rng.randrange(10**5), rng.randrange(1, 10**5), 64 * rng.randint(1, 16)) for _ in range(60)]
    n = 0
    for prefix, extend, cc in edges + drawn:
        got = fn(prefix, extend, cc)
        ref = plan_tracking(prefix, extend, cc, track_slot=1)
        want = (ref.tracked, ref.aligned, ref.from_final, ref.checkpoint)
        if not (isinstance(got, tuple | list) and len(got) == 4):
            raise AssertionError("return a tuple (tracked, A, from_final, checkpoint)")
        if any(w is not None and type(g) is not type(w) for g, w in zip(got, want)):
            raise AssertionError(  # 1 == True: without this an int would pass for a flag
                f"plan(P={prefix}, E={extend}, Cc={cc}) returned types "
                f"({', '.join(type(g).__name__ for g in got)}); expected "
                f"({', '.join(type(w).__name__ for w in want)}): flags are bools, not 0 and 1")
        if tuple(got) != want:
            raise AssertionError(
                f"plan(P={prefix}, E={extend}, Cc={cc}) = {tuple(got)}; expected "
                f"(tracked, A, from_final, checkpoint) = {want}")
        n += 1
    return f"{n} requests planned as plan_tracking does (Cc from 64 to 1024)"


def _random_cache(rng: random.Random, pool: StatePool) -> tuple[RadixCache, list[int], list[int]]:
    """A cache over a 3-token alphabet: prompts that share prefixes, so edges split and some
    nodes are paths without a snapshot."""
    cache = RadixCache(pool)
    base = [rng.randrange(3) for _ in range(40)]
    slots = []
    for _ in range(rng.randint(1, 5)):
        length = rng.randint(1, 40)
        cut = rng.randint(0, length)  # diverge from `base` after `cut` tokens
        tokens = base[:cut] + [rng.randrange(3) for _ in range(length - cut)]
        slot = pool.alloc(1)
        if cache.insert(tokens, slot[0], []):
            slots += slot
        else:
            pool.free(slot)
    return cache, base, slots


def _tree(root) -> list[tuple]:
    """Every node of the tree below ``root`` with what a lookup must leave as it was: its edge, its
    snapshot slot, its children and its locks (recency aside: a lookup may touch the path)."""
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        out.append((node, node.tokens, node.slot, dict(node.children), list(node.holders)))
        stack.extend(node.children.values())
    return out


@exercise(NOTEBOOK, 2, "how far a prefix hit can go", "my_match",
          forbidden=("mamba_edu.serving.prefix_cache.RadixCache.match",))
def check_match(fn) -> str:
    """Random radix caches; ``fn(cache.root, prompt, max_length)`` must return the
    ``(length, slot)`` of :meth:`RadixCache.match` (``(0, None)`` on a miss), asked after the
    answer, and leave the tree as it was (no lock left held, no edge, slot or child changed)."""
    rng = random.Random(check_seed(5))
    pool = StatePool(1, 64, conv_dim=2, conv_width=2, value_heads=1, key_dim=1, value_dim=1)
    n = 0
    for _ in range(40):
        cache, base, slots = _random_cache(rng, pool)
        for _ in range(6):
            common = rng.randint(0, 40)
            prompt = base[:common] + [rng.randrange(3) for _ in range(rng.randint(1, 6))]
            max_length = rng.choice([len(prompt) - 1, rng.randint(0, len(prompt))])
            before = _tree(cache.root)
            got = fn(cache.root, list(prompt), max_length)
            after = _tree(cache.root)
            if after != before:
                locks = sum(len(holders) for *_, holders in after) - sum(len(holders) for *_, holders in before)
                raise AssertionError(f"prompt {prompt} with max_length={max_length}: the lookup changed the tree"
                                     + (f" (it left {locks} lock(s) held: a lookup locks nothing, or releases "
                                        "what it locks)" if locks else " (edges, slots or children)")
                                     + "; the cache is shared by every request: leave it as it was")
            ref = cache.match(prompt, max_length=max_length)
            if not (isinstance(got, tuple | list) and len(got) == 2):
                raise AssertionError("return a tuple (length, slot)")
            if tuple(got) != (ref.length, ref.slot):
                raise AssertionError(
                    f"prompt {prompt} with max_length={max_length}: got (length, slot) = "
                    f"{tuple(got)}; the radix cache matches {(ref.length, ref.slot)}")
            n += 1
        cache.evict(cache.evictable_slots())  # the cache owns its snapshots: it gives them back
    return f"{n} prompts on 40 random caches match RadixCache.match"


# ---------------------------------------------------------------------------------------------
# Exercise 3: predict, then measure
# ---------------------------------------------------------------------------------------------

def hit_cases() -> list[tuple[int, int, int]]:
    """The twelve (first, second, Cc) of exercise 3's check: a prompt exactly its snapshot's
    length, one token longer, an untracked first request, one exactly ``Cc`` long, then eight
    drawn per grading run (cache
    chunks 64, 128 and 256; first requests on and off their boundaries; second ones shorter,
    equal, one token longer and longer; at most 520 tokens)."""
    rng = random.Random(check_seed(53))
    cases = [(128, 128, 64), (128, 129, 64), (63, 200, 64), (64, 100, 64)]
    for _ in range(8):
        cc = rng.choice([64, 128, 256])
        first = max(1, cc * rng.randint(0, 500 // cc) + rng.choice([-1, 0, 1, rng.randint(2, cc - 2)]))
        second = max(1, first + rng.choice([-rng.randint(1, 100), 0, 1, rng.randint(2, 520 - first)]))
        cases.append((first, second, cc))
    return cases


def _small_model():
    global _MODEL
    if _MODEL is None:
        from mamba_edu.model import build_model
        _MODEL = build_model("tiny", device="cpu", hidden=32, vocab=64, mlp_width=32, gdn_key_heads=1,
                             gdn_value_heads=1, gdn_key_dim=16, gdn_value_dim=16, attn_heads=1,
                             attn_kv_heads=1, attn_head_dim=16)
    return _MODEL


def measured_hit(first: int, second: int, cache_chunk: int) -> int:
    """Prefill the first ``first`` tokens of a prompt on a fresh engine with ``cache_chunk``, release
    it, prefill the first ``second`` tokens: the tokens the second request took from the cache."""
    import torch

    from mamba_edu.engine import Engine, Request
    prompt = torch.randint(0, 64, (max(first, second),), generator=torch.Generator().manual_seed(5)).tolist()
    engine = Engine(_small_model(), strategy="sync_free", max_requests=1, cache_chunk=cache_chunk)
    engine.prefill([Request("first", prompt[:first])])
    engine.release(["first"])
    return int(engine.prefill([Request("second", prompt[:second])]).prefix_lens[0])


@exercise(NOTEBOOK, 3, "predict a prefix hit's length", "my_hit_prediction",
          forbidden=("mamba_edu.serving", "mamba_edu.engine"))
def check_hit_prediction(fn) -> str:
    """``fn(first, second, Cc)`` must equal the measured hit exactly, for every case of :func:`hit_cases`."""
    cases = hit_cases()
    for first, second, cc in cases:
        said = fn(first, second, cc)
        if isinstance(said, bool) or not isinstance(said, int):
            raise AssertionError(f"the prediction for first = {first}, second = {second}, Cc = {cc} is "
                                 f"{said!r:.60}; expected a whole number of tokens (an int)")
        got = measured_hit(first, second, cc)
        if said != got:
            raise AssertionError(f"first request {first} tokens, second {second} tokens of the same prompt, "
                                 f"Cc = {cc}: you predicted a hit of {said} tokens, the engine takes {got} from "
                                 "the cache (tolerance 0)")
    return f"your prediction equals the measured hit for {len(cases)} (first, second, Cc) (tolerance 0)"
