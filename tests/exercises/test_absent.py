"""Forbidden means absent, also for copies: ``absent`` refuses a function rebuilt from a forbidden
one's code, an ``exec`` of its source, a copy run in a thread; numpy's names are absent when named;
everything is back after the block."""

import inspect
import sys
import threading
import types

import numpy as np
import pytest

from mamba_edu.exercises.absent import absent, fingerprint
from mamba_edu.gdn import varlen
from mamba_edu.serving import planning
from mamba_edu.serving.planning import plan_tracking

FORBIDDEN = ["mamba_edu.serving.planning.plan_tracking"]
ARGS = (0, 200, 64, 3)  # prefix_len, extend_len, cache_chunk, track_slot
REFUSED = "mamba_edu.serving.planning.plan_tracking (a copy)"


def function_type_copy():
    return types.FunctionType(plan_tracking.__code__, planning.__dict__, "mine", plan_tracking.__defaults__)


def exec_copy():
    namespace = dict(vars(planning))
    exec(inspect.getsource(plan_tracking), namespace)  # noqa: S102 - the cheat under test
    return namespace["plan_tracking"]


@pytest.mark.parametrize("make", [function_type_copy, exec_copy])
def test_a_copy_of_a_forbidden_function_is_refused(make):
    copy = make()  # made before the block, as a notebook cell would
    assert copy is not plan_tracking and fingerprint(copy.__code__) == fingerprint(plan_tracking.__code__)
    with absent(FORBIDDEN) as called:
        copy(*ARGS)
    assert called == [REFUSED]


def test_a_copy_called_in_a_thread_started_in_the_block_is_refused():
    copy = function_type_copy()
    with absent(FORBIDDEN) as called:
        worker = threading.Thread(target=copy, args=ARGS)
        worker.start()
        worker.join()
    assert called == [REFUSED]


def test_a_right_answer_that_calls_other_package_functions_is_not_refused():
    with absent(FORBIDDEN) as called:
        assert planning.check_cache_chunk(64) == 64 and varlen.checkpoint_offsets([70, 64]) == [0, 2, 3]
    assert called == []


def test_removing_the_hook_is_recorded():
    with absent(FORBIDDEN) as called:
        sys.setprofile(None)
    assert called == ["sys.setprofile (the judge's hook)"]


def test_numpy_names_are_absent_when_named():
    inv, dot = np.linalg.inv, np.dot  # references taken before the block
    eye = np.eye(2)
    with absent(["numpy.linalg.inv", "numpy.dot"]) as called:
        for call in (lambda: np.linalg.inv(eye), lambda: inv(eye), lambda: np.dot(eye, eye)):
            with pytest.raises(RuntimeError, match="not available in this exercise"):
                call()
        assert dot(eye, eye) is not None  # a C function taken before the block escapes (documented)
    assert called == ["numpy.linalg.inv", "numpy.linalg.inv", "numpy.dot"]


def test_everything_is_back_after_the_block():
    copy, before = function_type_copy(), sys.getprofile()
    with absent(FORBIDDEN + ["numpy.linalg.inv", "numpy.dot"]):
        pass
    with absent(FORBIDDEN) as called:
        pass
    assert plan_tracking(*ARGS) == copy(*ARGS) and called == []
    np.testing.assert_allclose(np.linalg.inv(2 * np.eye(2)), np.eye(2) / 2)
    assert np.dot(np.eye(2), np.ones(2)).tolist() == [1.0, 1.0] and sys.getprofile() is before
