"""The checks of notebook 05 reject plausible wrong answers and call a stub "not done"."""

from mamba_edu.exercises import nb05
from mamba_edu.exercises.core import FAIL, NOT_DONE, PASS, judge, lookup


def stub(*args):
    raise NotImplementedError("hint: …")


def plan(P, E, Cc, strict=False, checkpoint_up=False):
    tracked = E > Cc if strict else E >= Cc
    A = (E // Cc) * Cc if tracked else 0
    checkpoint = -(-A // 64) if not checkpoint_up else -(-E // 64)
    return tracked, A, tracked and A == E, checkpoint


def test_plan():
    ex = lookup(nb05.NOTEBOOK, 1)
    assert judge(ex, plan).status == PASS
    assert judge(ex, stub).status == NOT_DONE
    strict = judge(ex, lambda P, E, Cc: plan(P, E, Cc, strict=True))   # E > Cc instead of E ≥ Cc
    assert strict.status == FAIL and "E=64, Cc=64" in strict.message
    assert judge(ex, lambda P, E, Cc: plan(P, E, Cc, checkpoint_up=True)).status == FAIL
    # the tracked position P + A where A is asked for
    assert judge(ex, lambda P, E, Cc: (lambda t: (t[0], P + t[1] if t[0] else 0, *t[2:]))(plan(P, E, Cc))).status == FAIL


def match(root, tokens, max_length, need_snapshot=True, respect_limit=True, deepest=True):
    limit = min(max_length, len(tokens)) if respect_limit else len(tokens)
    node, depth, best = root, 0, (0, None)
    while depth < limit:
        child = node.children.get(tokens[depth])
        if child is None or depth + len(child.tokens) > limit:
            break
        if tuple(tokens[depth:depth + len(child.tokens)]) != child.tokens:
            break
        node, depth = child, depth + len(child.tokens)
        if child.slot is not None or not need_snapshot:
            best = (depth, child.slot)
            if not deepest:
                break
    return best


def test_match():
    ex = lookup(nb05.NOTEBOOK, 2)
    assert judge(ex, match).status == PASS
    assert judge(ex, stub).status == NOT_DONE
    # a node without a snapshot is only a path: resuming there is impossible
    assert judge(ex, lambda r, t, m: match(r, t, m, need_snapshot=False)).status == FAIL
    # at least one token must be computed: max_length caps the hit
    assert judge(ex, lambda r, t, m: match(r, t, m, respect_limit=False)).status == FAIL
    # the first snapshot on the path is not the deepest
    assert judge(ex, lambda r, t, m: match(r, t, m, deepest=False)).status == FAIL
