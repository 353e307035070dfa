"""The answer modules of notebooks 05–08: each check passes on the answer and fails on a wrong one."""

import pytest

from mamba_edu.exercises import nb05, nb06, nb07, nb08

CASES = [
    (nb05.check_plan, nb05.plan, lambda P, E, Cc: (E > Cc, (E // Cc) * Cc, False, E // 64)),
    (nb05.check_usable_prefix, nb05.usable_prefix, lambda lengths, common, m: max(lengths)),
    (nb06.check_naive_syncs, nb06.naive_syncs, lambda L, tracked: 2 * L),
    (nb06.check_conv_window, nb06.conv_window, lambda start, A, W: [start + A - W + j for j in range(W - 1)]),
    (nb07.check_precomputed_indices, nb07.precomputed_indices,
     lambda batch, rows, W: tuple(x if i != 3 else x + 1 for i, x in enumerate(nb07.precomputed_indices(batch, rows, W)))),
    (nb07.check_checkpoint_row, nb07.checkpoint_row, lambda lengths, i, A: i + A // 64),
    (nb08.check_scratch_destinations, nb08.scratch_destinations, lambda mask, slots: list(slots)),
    (nb08.check_checkpoint_bytes, nb08.checkpoint_bytes, lambda lengths, HV, K, V: sum(lengths) * HV * K * V * 4),
]


@pytest.mark.parametrize("check,answer,wrong", CASES, ids=[c[0].__name__ for c in CASES])
def test_check_accepts_answer_rejects_wrong(check, answer, wrong, capsys):
    check(answer)
    assert "PASS" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="FAIL"):
        check(wrong)


def test_precomputed_check_rejects_a_syncing_answer():
    def syncing(batch, rows, W):
        out = nb07.precomputed_indices(batch, rows, W)
        bool(out[0].any())  # an extra host sync
        return out
    with pytest.raises(AssertionError, match="would-be syncs"):
        nb07.check_precomputed_indices(syncing)
