"""Notebook 03 (Triton kernels): reference answers and their checks.

Exercise 1: ``l2norm_triton`` — a Triton kernel that L2-normalises every row of ``[T, H, K]``
(the normalisation our prefill kernels fuse into their loads).
Exercise 2: ``program_counts`` — how many programs each prefill kernel launches for a batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mamba_edu.gdn import l2norm
from mamba_edu.testing import check


@triton.jit
def l2norm_kernel(x_ptr, y_ptr, n_rows, D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr):
    """Rows ``ROWS·pid .. ROWS·pid + ROWS`` of a row-major ``[n_rows, D]`` matrix."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BD)
    mask = (rows < n_rows)[:, None] & (cols < D)[None, :]
    offs = rows[:, None] * D + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, 1) + 1e-6)[:, None]
    tl.store(y_ptr + offs, y, mask=mask)


def l2norm_triton(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(Σx² + 1e-6)`` over the last dim of a contiguous ``[..., D]`` tensor, fp32 out."""
    D = x.shape[-1]
    rows = x.numel() // D
    y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    l2norm_kernel[(triton.cdiv(rows, 16),)](x, y, rows, D, triton.next_power_of_2(D), 16)
    return y


def check_l2norm_triton(fn) -> None:
    """Run ``fn`` on ``[T, H, K]`` inputs (T not a multiple of the tile, K not a power of 2)."""
    gen = torch.Generator().manual_seed(5)
    for shape in ((37, 2, 16), (5, 3, 24)):
        x = torch.randn(*shape, generator=gen)
        check(fn(x), l2norm(x), tol=1e-6, name=f"exercise 1 shape {shape}", quiet=True)
    print("PASS exercise 1 l2norm_triton: rows normalised like mamba_edu.gdn.l2norm")


def program_counts(lengths: list[int], HV: int, V: int, BV: int) -> dict:
    """Programs launched by the prefill kernels for a packed batch.

    ``prepare``: one per (chunk, value head) = ``Σ⌈L/64⌉ · HV``; ``scan``: one per (V-tile,
    sequence, value head) = ``⌈V/BV⌉ · N · HV``; ``scan_steps``: the longest serial chain,
    ``max ⌈L/64⌉`` chunks.
    """
    chunks = [-(-n // 64) for n in lengths]
    return dict(prepare=sum(chunks) * HV, scan=-(-V // BV) * len(lengths) * HV,
                scan_steps=max(chunks))


def check_program_counts(fn) -> None:
    cases = [([8192], 32, 128, 32), ([1024] * 8, 32, 128, 64), ([1, 63, 64, 65, 150], 4, 32, 32)]
    for case in cases:
        got, want = fn(*case), program_counts(*case)
        if got != want:
            raise AssertionError(f"FAIL exercise 2 for lengths={case[0][:3]}…, HV={case[1]}, "
                                 f"V={case[2]}, BV={case[3]}: got {got}, expected {want}")
    print("PASS exercise 2 program_counts: prepare, scan and the serial chain length")
