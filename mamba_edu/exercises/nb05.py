"""Checks of notebook 05 (the state pool and the prefix cache).

1. ``my_plan`` — the host plan of one request: tracked?, the aligned length A, whether the SSM
   snapshot is the final state, and which checkpoint ``h[c]`` it is otherwise.
2. ``my_match`` — how far a prefix hit can go: walk the radix tree along a prompt and return the
   deepest usable snapshot, as :meth:`mamba_edu.serving.RadixCache.match` does.
"""

from __future__ import annotations

import random

from mamba_edu.exercises.core import check_seed, checker, exercise
from mamba_edu.serving import RadixCache, StatePool, plan_tracking

NOTEBOOK = "05_state_pool_and_prefix_cache"
check = checker(NOTEBOOK)


@exercise(NOTEBOOK, 1, "the host plan of one request", "my_plan",
          forbidden=("mamba_edu.serving.planning.plan_tracking",))
def check_plan(fn) -> str:
    """Compare ``fn(P, E, Cc)`` with :func:`plan_tracking` on both sides of every boundary."""
    n = 0
    for cc in (64, 128, 256):
        for prefix in (0, 64, 100):
            for extend in (1, 63, 64, 65, 127, 128, 129, 191, 192, 255, 256, 257, 300, 512, 700):
                ref = plan_tracking(prefix, extend, cc, track_slot=1)
                want = (ref.tracked, ref.aligned, ref.from_final, ref.checkpoint)
                got = fn(prefix, extend, cc)
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
    return f"{n} requests planned as plan_tracking does (Cc = 64, 128, 256)"


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


@exercise(NOTEBOOK, 2, "how far a prefix hit can go", "my_match",
          forbidden=("mamba_edu.serving.prefix_cache.RadixCache.match",))
def check_match(fn) -> str:
    """Random radix caches; ``fn(cache.root, prompt, max_length)`` must return the
    ``(length, slot)`` of :meth:`RadixCache.match` (``(0, None)`` on a miss)."""
    rng = random.Random(check_seed(5))
    pool = StatePool(1, 64, conv_dim=2, conv_width=2, value_heads=1, key_dim=1, value_dim=1)
    n = 0
    for _ in range(40):
        cache, base, slots = _random_cache(rng, pool)
        for _ in range(6):
            common = rng.randint(0, 40)
            prompt = base[:common] + [rng.randrange(3) for _ in range(rng.randint(1, 6))]
            max_length = rng.choice([len(prompt) - 1, rng.randint(0, len(prompt))])
            ref = cache.match(prompt, max_length=max_length)
            got = fn(cache.root, list(prompt), max_length)
            if not (isinstance(got, tuple | list) and len(got) == 2):
                raise AssertionError("return a tuple (length, slot)")
            if tuple(got) != (ref.length, ref.slot):
                raise AssertionError(
                    f"prompt {prompt} with max_length={max_length}: got (length, slot) = "
                    f"{tuple(got)}; the radix cache matches {(ref.length, ref.slot)}")
            n += 1
        cache.evict(cache.evictable_slots())  # the cache owns its snapshots: it gives them back
    return f"{n} prompts on 40 random caches match RadixCache.match"
