"""mamba_edu.testing: the relative-error metric and the check() helper the notebooks use."""

import math

import pytest
import torch

from mamba_edu.testing import check, rel_err


def test_rel_err_is_norm_of_difference_over_norm_of_expected():
    expected = torch.tensor([3.0, 4.0])          # norm 5
    actual = torch.tensor([3.0, 4.5])            # difference norm 0.5
    assert rel_err(actual, expected) == pytest.approx(0.1)
    assert rel_err(expected, actual) == pytest.approx(0.5 / math.hypot(3, 4.5))  # not symmetric


def test_rel_err_special_cases():
    zero = torch.zeros(3)
    assert rel_err(zero, zero) == 0.0
    assert rel_err(torch.ones(3), zero) == float("inf")
    assert math.isnan(rel_err(torch.tensor([1.0, float("nan")]), torch.ones(2)))
    assert rel_err(torch.ones(2, dtype=torch.float16), torch.ones(2, dtype=torch.float64)) == 0.0


def test_check_passes_prints_one_line_and_returns_the_error(capsys):
    expected = torch.ones(100, dtype=torch.float64)
    err = check(expected + 1e-7, expected, name="tiny")
    line = capsys.readouterr().out
    assert line.startswith("PASS tiny: relative error") and line.count("\n") == 1
    assert err == pytest.approx(1e-7, rel=1e-2)


def test_check_quiet_prints_nothing(capsys):
    check(torch.ones(3), torch.ones(3), quiet=True)
    assert capsys.readouterr().out == ""


def test_check_fails_above_tolerance():
    expected = torch.ones(4)
    with pytest.raises(AssertionError, match="FAIL close: relative error 1.00e-04 > tol 1e-05"):
        check(expected * (1 + 1e-4), expected, tol=1e-5, name="close")
    assert check(expected * (1 + 1e-4), expected, tol=1e-3, quiet=True) < 1e-3


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_check_fails_on_nan_and_inf(bad):
    actual = torch.ones(4)
    actual[2] = bad
    with pytest.raises(AssertionError, match="FAIL"):
        check(actual, torch.ones(4), tol=1e30)
    with pytest.raises(AssertionError, match="FAIL"):
        check(torch.ones(4), actual, tol=1e30)


def test_check_fails_on_shape_mismatch_even_when_broadcastable():
    with pytest.raises(AssertionError, match=r"shape \(1, 3\) != expected \(3,\)"):
        check(torch.ones(1, 3), torch.ones(3))


class ZeroDifference(torch.Tensor):
    """A subclass whose difference with anything is zero: it would match every expected value."""

    def __sub__(self, other):
        return torch.zeros_like(torch.Tensor.as_subclass(self, torch.Tensor))


@pytest.mark.parametrize("compare", [lambda a, b: check(a, b, name="sub"), rel_err])
def test_a_tensor_subclass_is_refused_before_it_is_compared(compare):
    cheat = torch.ones(3).as_subclass(ZeroDifference)
    with pytest.raises(AssertionError, match="is a ZeroDifference, not a torch.Tensor"):
        compare(cheat, torch.zeros(3))
    with pytest.raises(AssertionError, match="FAIL sub: the result is a list, not a torch.Tensor"):
        check([0.0, 0.0, 0.0], torch.zeros(3), name="sub")


def test_a_parameter_is_a_tensor():
    assert check(torch.nn.Parameter(torch.ones(2)), torch.ones(2), quiet=True) == 0.0
