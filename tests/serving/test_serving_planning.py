"""Where to track (docs/conventions.md): E ≥ Cc, A = ⌊E/Cc⌋·Cc, final state iff A == E."""

import pytest

from mamba_edu.serving import plan_tracking


@pytest.mark.parametrize("prefix, extend, cc, tracked, aligned, final, checkpoint", [
    (0, 63, 64, False, 0, False, 0),
    (0, 64, 64, True, 64, True, 1),
    (0, 65, 64, True, 64, False, 1),
    (64, 127, 64, True, 64, False, 1),
    (64, 128, 64, True, 128, True, 2),
    (0, 129, 64, True, 128, False, 2),
    (0, 127, 128, False, 0, False, 0),
    (128, 255, 128, True, 128, False, 2),
    (0, 256, 128, True, 256, True, 4),
])
def test_plan(prefix, extend, cc, tracked, aligned, final, checkpoint):
    plan = plan_tracking(prefix, extend, cc, track_slot=7)
    assert (plan.tracked, plan.aligned, plan.from_final) == (tracked, aligned, final)
    assert plan.track_len == (prefix + aligned if tracked else -1)
    if tracked:
        assert plan.checkpoint == checkpoint


@pytest.mark.parametrize("args, needle", [
    ((0, 10, 96), "cache_chunk"), ((0, 10, 32), "cache_chunk"), ((-1, 10, 64), "prefix_len"),
    ((0, 0, 64), "extend_len"),
])
def test_bad_plan_arguments(args, needle):
    with pytest.raises(ValueError, match=needle):
        plan_tracking(*args, track_slot=1)
