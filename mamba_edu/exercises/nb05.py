"""Notebook 05 (the state pool and the prefix cache): reference answers and their checks.

Exercise 1: ``plan`` — where the scheduler tracks a request (tracked?, A, final or checkpoint).
Exercise 2: ``usable_prefix`` — how far a prefix hit can go when only some lengths have snapshots.
The checks compare your function with the package on a grid of cases.
"""

from __future__ import annotations

import random

from mamba_edu.serving import RadixCache, StatePool, plan_tracking


def plan(prefix_len: int, extend_len: int, cache_chunk: int) -> tuple[bool, int, bool, int]:
    """DESIGN.md §4 for one request: ``(tracked, A, from_final, checkpoint)``.

    tracked iff ``E ≥ Cc``; ``A = ⌊E/Cc⌋·Cc`` (0 when untracked); the SSM snapshot is the final
    state iff ``A == E``; otherwise it is checkpoint ``h[A/64]`` (``checkpoint = A // 64``).
    """
    tracked = extend_len >= cache_chunk
    aligned = (extend_len // cache_chunk) * cache_chunk if tracked else 0
    return tracked, aligned, tracked and aligned == extend_len, aligned // 64


def check_plan(fn) -> None:
    """Compare ``fn(P, E, Cc)`` with :func:`mamba_edu.serving.plan_tracking` around every boundary."""
    n = 0
    for cc in (64, 128, 256):
        for prefix in (0, 64, 100):
            for extend in sorted({1, 63, 64, 65, 127, 128, 129, 191, 192, 255, 256, 257, 300, 512, 700}):
                ref = plan_tracking(prefix, extend, cc, track_slot=1)
                want = (ref.tracked, ref.aligned, ref.from_final, ref.checkpoint)
                got = fn(prefix, extend, cc)
                if tuple(got) != want:
                    raise AssertionError(
                        f"FAIL exercise 1 plan(P={prefix}, E={extend}, Cc={cc}) = {tuple(got)}; "
                        f"expected (tracked, A, from_final, checkpoint) = {want}")
                n += 1
    print(f"PASS exercise 1 plan: {n} cases match plan_tracking (Cc = 64, 128, 256)")


def usable_prefix(snapshot_lengths: list[int], common_len: int, max_length: int) -> int:
    """The longest prefix a request can resume from.

    ``snapshot_lengths``: the lengths of the cached prefixes of this request's path that hold a
    snapshot; ``common_len``: how many leading tokens the request shares with the cache;
    ``max_length``: the most tokens that may come from the cache (``len(prompt) − 1``, so that
    at least one token is computed and gives the logits). 0 means a miss.
    """
    ok = [n for n in snapshot_lengths if n <= min(common_len, max_length)]
    return max(ok, default=0)


def check_usable_prefix(fn) -> None:
    """Build random radix caches; compare ``fn`` with :meth:`RadixCache.match` on random prompts."""
    rng = random.Random(5)
    pool = StatePool(1, 64, conv_dim=2, conv_width=2, value_heads=1, key_dim=1, value_dim=1)
    n = 0
    for _ in range(40):
        cache = RadixCache(pool)
        base = [rng.randrange(3) for _ in range(40)]
        lengths = sorted(rng.sample(range(1, 41), rng.randint(1, 4)))
        slots = pool.alloc(len(lengths))
        for length, slot in zip(lengths, slots):
            cache.insert(base[:length], slot, [])
        for _ in range(5):
            common = rng.randint(0, 40)
            prompt = base[:common] + [3] + [rng.randrange(3) for _ in range(rng.randint(0, 5))]
            max_length = rng.randint(0, len(prompt))
            want = cache.match(prompt, max_length=max_length).length
            got = fn(lengths, common, max_length)
            if got != want:
                raise AssertionError(
                    f"FAIL exercise 2 usable_prefix(snapshot_lengths={lengths}, common_len={common}, "
                    f"max_length={max_length}) = {got!r}; the radix cache matches {want}")
            n += 1
        pool.free(slots)
    print(f"PASS exercise 2 usable_prefix: {n} random prompts match RadixCache.match")
