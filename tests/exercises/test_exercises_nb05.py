"""Notebook 05's checks reject plausible wrong answers (stubs: test_exercise_stubs.py).

Every answer is judged through the grader's own path (:func:`exercise_judge.judge_answer`: the
judge that makes forbidden functions absent, then the check), so a wrong answer rejected
here is rejected by ``python -m mamba_edu grade`` for the same reason.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
from exercise_judge import judge_answer

from mamba_edu.serving import plan_tracking
from mamba_edu.serving.prefix_cache import RadixCache

from mamba_edu.exercises import nb05
from mamba_edu.exercises.core import FAIL, PASS

NB = nb05.NOTEBOOK


# --- exercise 1: the host plan of one request -------------------------------------------------

def plan(strict=False, checkpoint_up=False, absolute=False, no_round=False, chunk_units=False):
    """A host plan; each flag makes it wrong in one plausible way."""
    def my_plan(P, E, Cc):
        tracked = E > Cc if strict else E >= Cc
        A = (E if no_round else (E // Cc) * Cc) if tracked else 0
        checkpoint = -(-E // 64) if checkpoint_up else (A // Cc if chunk_units else A // 64)
        return tracked, P + A if absolute and tracked else A, tracked and A == E, checkpoint
    return my_plan


def plan_by_the_package(P, E, Cc):
    from mamba_edu.serving import plan_tracking
    p = plan_tracking(P, E, Cc, 1)
    return p.tracked, p.aligned, p.from_final, p.checkpoint


def plan_in_a_thread(P, E, Cc):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(plan_by_the_package, P, E, Cc).result()


renamed_plan = plan_tracking  # the package's function under another name


def plan_renamed(P, E, Cc):
    p = renamed_plan(P, E, Cc, 1)
    return p.tracked, p.aligned, p.from_final, p.checkpoint


def plan_with(**change):
    """The right plan with one field replaced by a function of (P, E, Cc, right plan)."""
    def my_plan(P, E, Cc):
        got = list(plan()(P, E, Cc))
        for i, name in enumerate(("tracked", "A", "from_final", "checkpoint")):
            if name in change:
                got[i] = change[name](P, E, Cc, got)
        return tuple(got)
    return my_plan


def plan_from_a_table():
    """A table of the forbidden function's answers, filled where it is allowed (a notebook cell),
    over the sizes the edge cases use: it knows no request past them."""
    table = {(P, E, Cc): (r.tracked, r.aligned, r.from_final, r.checkpoint)
             for Cc in (64, 128, 256) for P in (0, 64, 100) for E in range(1, 1025)
             for r in [plan_tracking(P, E, Cc, track_slot=1)]}
    return lambda P, E, Cc: table[P, E, Cc]


WRONG_1 = {
    "a table filled in a cell with plan_tracking (the edge cases only)": plan_from_a_table(),
    "A as a float (E / Cc floored in float)": plan_with(A=lambda P, E, Cc, p: float(p[1])),
    "A aligned on P + E, not on E": plan_with(A=lambda P, E, Cc, p: ((P + E) // Cc) * Cc - P if p[0] else 0),
    "from_final when E is a multiple of 64": plan_with(from_final=lambda P, E, Cc, p: p[0] and E % 64 == 0),
    "checkpoint (A - 1) // 64": plan_with(checkpoint=lambda P, E, Cc, p: (p[1] - 1) // 64 if p[1] else 0),
    "the forbidden call in a worker thread": plan_in_a_thread,
    "the forbidden call renamed": plan_renamed,
    "E > Cc: a request of exactly Cc tokens is tracked": plan(strict=True),
    "checkpoint ceil(E/64): the last chunk, not A's": plan(checkpoint_up=True),
    "P + A where A is asked for": plan(absolute=True),
    "A = E: not rounded down to the cache chunk": plan(no_round=True),
    "checkpoint in cache chunks (A // Cc), not in 64-token chunks": plan(chunk_units=True),
    "the forbidden call: plan_tracking": plan_by_the_package,
    "flags as 0 and 1 (1 == True would pass a value check)": lambda P, E, Cc: tuple(
        int(x) if isinstance(x, bool) else x for x in plan()(P, E, Cc)),
}


def test_plan_accepts_the_right_answer():
    verdict = judge_answer(NB, 1, plan())
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_1))
def test_plan_rejects(mistake):
    verdict = judge_answer(NB, 1, WRONG_1[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_plan_messages_name_the_mistake():
    assert "E=64, Cc=64" in judge_answer(NB, 1, plan(strict=True)).message
    assert "plan_tracking" in judge_answer(NB, 1, plan_by_the_package).message


# --- exercise 2: how far a prefix hit can go -------------------------------------------------

def match(need_snapshot=True, respect_limit=True, deepest=True, limit_shift=0, partial_edge=False):
    """A radix-tree lookup; each flag makes it wrong in one plausible way."""
    def my_match(root, tokens, max_length):
        limit = min(max_length + limit_shift, len(tokens)) if respect_limit else len(tokens)
        node, depth, best = root, 0, (0, None)
        while depth < limit:
            child = node.children.get(tokens[depth])
            if child is None or (depth + len(child.tokens) > limit and not partial_edge):
                break
            if tuple(tokens[depth:depth + len(child.tokens)]) != child.tokens:
                if not partial_edge:
                    break
            node, depth = child, depth + len(child.tokens)
            if child.slot is not None or not need_snapshot:
                best = (depth, child.slot)
                if not deepest:
                    break
        return best
    return my_match


def match_by_the_package(root, tokens, max_length):
    from mamba_edu.serving.prefix_cache import RadixCache
    cache = RadixCache.__new__(RadixCache)
    cache.root = root
    m = RadixCache.match(cache, tokens, max_length=max_length, touch=False)
    return m.length, m.slot


def match_stops_at_a_path_node(root, tokens, max_length):
    """Ends the walk at the first node without a snapshot instead of walking through it."""
    limit, node, depth, best = min(max_length, len(tokens)), root, 0, (0, None)
    while depth < limit:
        child = node.children.get(tokens[depth])
        if child is None or depth + len(child.tokens) > limit or tuple(tokens[depth:depth + len(child.tokens)]) != child.tokens:
            break
        node, depth = child, depth + len(child.tokens)
        if child.slot is None:
            break
        best = (depth, child.slot)
    return best


def match_list_against_tuple(root, tokens, max_length):
    """Compares a list slice with the edge's tuple: never equal, so every prompt misses."""
    limit, node, depth, best = min(max_length, len(tokens)), root, 0, (0, None)
    while depth < limit:
        child = node.children.get(tokens[depth])
        if child is None or depth + len(child.tokens) > limit or tokens[depth:depth + len(child.tokens)] != child.tokens:
            break
        node, depth = child, depth + len(child.tokens)
        if child.slot is not None:
            best = (depth, child.slot)
    return best


def match_in_a_thread(root, tokens, max_length):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(match_by_the_package, root, tokens, max_length).result()


renamed_match = RadixCache.match


def match_renamed(root, tokens, max_length):
    cache = RadixCache.__new__(RadixCache)
    cache.root = root
    m = renamed_match(cache, tokens, max_length=max_length, touch=False)
    return m.length, m.slot


def match_and_lock(root, tokens, max_length):
    """The right hit, but its node is locked (a lock nobody releases: the snapshot is never evicted)."""
    length, slot = match()(root, tokens, max_length)
    node, depth = root, 0
    while depth < length:
        node = node.children[tokens[depth]]
        depth += len(node.tokens)
    if slot is not None:
        node.holders.append("my_match")
    return length, slot


WRONG_2 = {
    "the hit's node locked and never released": match_and_lock,
    "the walk ends at the first node without a snapshot": match_stops_at_a_path_node,
    "a list slice compared with the edge's tuple": match_list_against_tuple,
    "max_length ignored in favour of len(prompt) - 1": lambda root, tokens, max_length: match()(root, tokens, len(tokens) - 1),
    "the forbidden call in a worker thread": match_in_a_thread,
    "the forbidden call renamed": match_renamed,
    "a node without a snapshot taken as a hit": match(need_snapshot=False),
    "max_length ignored": match(respect_limit=False),
    "the first snapshot on the path, not the deepest": match(deepest=False),
    "off by one: max_length + 1 tokens from the cache": match(limit_shift=1),
    "an edge counted when only its start matches": match(partial_edge=True),
    "the forbidden call: RadixCache.match": match_by_the_package,
}


def test_match_accepts_the_right_answer():
    verdict = judge_answer(NB, 2, match())
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_2))
def test_match_rejects(mistake):
    verdict = judge_answer(NB, 2, WRONG_2[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_match_says_a_lock_was_left():
    assert "lock(s) held" in judge_answer(NB, 2, match_and_lock).message


def test_match_refuses_the_package_lookup():
    assert "RadixCache.match" in judge_answer(NB, 2, match_by_the_package).message


# --- exercise 3: predict a prefix hit's length ----------------------------------------------------

def hit(first, second, Cc):
    A = (first // Cc) * Cc if first >= Cc else 0      # the one snapshot the first request leaves
    return A if 0 < A <= second - 1 else 0             # at least one token is computed


WRONG_3 = {
    "a KV-cache hit: min(first, second - 1)": lambda first, second, Cc: min(first, second - 1),
    "a snapshot at every multiple of Cc": lambda first, second, Cc: (min(first, second - 1) // Cc) * Cc,
    "the whole second prompt may hit (limit second, not second - 1)":
        lambda first, second, Cc: ((first // Cc) * Cc if first >= Cc else 0) if (first // Cc) * Cc <= second else 0,
    "the snapshot's length whatever the second prompt": lambda first, second, Cc: (first // Cc) * Cc,
    "snapshots at multiples of 64, the kernel chunk": lambda first, second, Cc: hit(first, second, 64),
    "tracked only when first > Cc": lambda first, second, Cc: hit(first, second, Cc) if first > Cc else 0,
    "the tokens computed, not the hit": lambda first, second, Cc: second - hit(first, second, Cc),
    "the first request's length rounded up to Cc": lambda first, second, Cc: min(-(-first // Cc) * Cc, (second - 1) // Cc * Cc),
    "a float": lambda first, second, Cc: float(hit(first, second, Cc)),
    "the prefix computed with the package's plan (forbidden)":
        lambda first, second, Cc: hit_by_the_plan(first, second, Cc),
}


def hit_by_the_plan(first, second, Cc):
    p = plan_tracking(0, first, Cc, 1)
    return p.track_len if p.tracked and p.track_len < second else 0


def test_hit_prediction_accepts_the_right_answer():
    verdict = judge_answer(NB, 3, hit)
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_3))
def test_hit_prediction_rejects(mistake):
    verdict = judge_answer(NB, 3, WRONG_3[mistake])
    assert verdict.status == FAIL, verdict.line()
