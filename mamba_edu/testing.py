"""The notebooks' and tests' check helper: one relative-error metric, one clear line."""

from __future__ import annotations

import torch


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖actual − expected‖ / ‖expected‖ over all elements, computed in float64.

    Returns 0.0 when both are exactly zero, ``inf`` when only ``expected`` is, ``nan`` when
    either holds a NaN.
    """
    a = actual.detach().to("cpu", torch.float64)
    b = expected.detach().to("cpu", torch.float64)
    num = torch.linalg.vector_norm(a - b).item()
    den = torch.linalg.vector_norm(b).item()
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def check(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-5, name: str = "check",
          quiet: bool = False) -> float:
    """Compare two tensors by relative error; print one pass line, raise ``AssertionError`` if not.

    Shapes must match exactly; NaN never passes. Returns the relative error.
    """
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
