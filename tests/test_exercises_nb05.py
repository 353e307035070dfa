"""Notebook 05's checks reject plausible wrong answers (stubs: test_exercise_stubs.py).

Every answer is judged through the grader's own path (:func:`exercise_judge.remote_judge`: the
harness's forbidden-call tracer, sniffer and refusals, then the check), so a wrong answer rejected
here is rejected by ``python -m mamba_edu grade`` for the same reason.
"""

import pytest
from exercise_judge import remote_judge

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


WRONG_1 = {
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
    verdict = remote_judge(NB, 1, plan())
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_1))
def test_plan_rejects(mistake):
    verdict = remote_judge(NB, 1, WRONG_1[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_plan_messages_name_the_mistake():
    assert "E=64, Cc=64" in remote_judge(NB, 1, plan(strict=True)).message
    assert "plan_tracking" in remote_judge(NB, 1, plan_by_the_package).message


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


WRONG_2 = {
    "a node without a snapshot taken as a hit": match(need_snapshot=False),
    "max_length ignored": match(respect_limit=False),
    "the first snapshot on the path, not the deepest": match(deepest=False),
    "off by one: max_length + 1 tokens from the cache": match(limit_shift=1),
    "an edge counted when only its start matches": match(partial_edge=True),
    "the forbidden call: RadixCache.match": match_by_the_package,
}


def test_match_accepts_the_right_answer():
    verdict = remote_judge(NB, 2, match())
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_2))
def test_match_rejects(mistake):
    verdict = remote_judge(NB, 2, WRONG_2[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_match_refuses_the_package_lookup():
    assert "RadixCache.match" in remote_judge(NB, 2, match_by_the_package).message
