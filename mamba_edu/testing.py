"""The notebooks' and tests' check helper: one relative-error metric, one clear line."""

from __future__ import annotations

import torch


def plain(t, name: str = "check") -> torch.Tensor:
    """``t`` if it is a ``torch.Tensor`` (or ``Parameter``) exactly, detached; else
    ``AssertionError``: a subclass may redefine what comparing it means (``__sub__`` returning
    zeros), so it is refused before any of its methods runs."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        raise AssertionError(f"FAIL {name}: the result is a {type(t).__name__}, not a torch.Tensor")
    return t.detach()


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖actual − expected‖ / ‖expected‖ over all elements, computed in float64.

    Returns 0.0 when both are exactly zero, ``inf`` when only ``expected`` is, ``nan`` when
    either holds a NaN. Anything but a plain tensor is refused (:func:`plain`).
    """
    a = plain(actual, "rel_err").to("cpu", torch.float64)
    b = plain(expected, "rel_err").to("cpu", torch.float64)
    num = torch.linalg.vector_norm(a - b).item()
    den = torch.linalg.vector_norm(b).item()
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def check(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-5, name: str = "check",
          quiet: bool = False) -> float:
    """Compare two tensors by relative error; print one pass line, raise ``AssertionError`` if not.

    Both must be plain tensors (:func:`plain`); shapes must match exactly; NaN never passes.
    Returns the relative error.
    """
    actual, expected = plain(actual, name), plain(expected, name)
    if tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(f"FAIL {name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    err = rel_err(actual, expected)
    ok = err <= tol  # False for NaN
    line = f"{'PASS' if ok else 'FAIL'} {name}: relative error {err:.2e} {'<=' if ok else '>'} tol {tol:.0e}"
    if not ok:
        raise AssertionError(line)
    if not quiet:
        print(line)
    return err
