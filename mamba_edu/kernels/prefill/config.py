"""Launch configurations of the three prefill kernels: plain integers, fixed per batch shape.

The choices were measured on the H200 (K = V = 128, bf16; data/benchmarks/stage_sweep.md and
scan_tile_sweep.md), not autotuned: an autotuner keyed on the head dims would reuse the choice of
whichever batch ran first. A whole sequence's chunks are one serial chain, so when few (sequence,
value head) pairs exist the scan takes narrower V-tiles: more programs, shorter steps.

:func:`prefill_plan` computes a batch shape's grids and tiles once and caches them: the host work
of a layer's launches is then one dictionary lookup (plain integer arithmetic throughout, no
``triton.cdiv`` or ``triton.next_power_of_2`` per call).
"""

import functools
from typing import NamedTuple

import torch

from mamba_edu.kernels.tiles import cdiv, next_power_of_2

SCAN_PROGRAMS = 128      # the scan narrows its V-tile (64, 32, 16) until it has this many programs
PREPARE_WARPS = 4        # 8 warps were slower at every shape measured
OUTPUT_WARPS = 4


def head_block(d: int) -> int:
    """A head dim as one power-of-two tile, at least 64 wide (masked past d): Triton 3.6
    miscompiled the H200 products whose right operand was 16 or 32 wide at 4 warps
    (data/benchmarks/small_head_dims.md), and ``tl.dot`` needs ≥ 16 anyway."""
    return max(64, next_power_of_2(d))


def scan_config(n_chains: int, V: int) -> tuple[int, int, int]:
    """``(BV, num_warps, num_stages)`` of the scan (``n_chains`` = N·HV): the widest V-tile of 64,
    32 and 16 that gives :data:`SCAN_PROGRAMS` programs (else 16), with a deeper load pipeline
    below 64 (each program walks many chunks)."""
    bv = 16
    for wide in (64, 32):
        if n_chains * cdiv(V, wide) >= SCAN_PROGRAMS:
            bv = wide
            break
    bv = min(bv, head_block(V))
    return bv, 4, 2 if bv == 64 else 3


def output_block_v(n_tiles: int, V: int) -> int:
    """V-tile of the output kernel: the whole head (q K̂ᵀ computed once per chunk), or 64 wide
    when whole heads would give fewer than two programs per SM of an H200."""
    if head_block(V) > 64 and n_tiles < 2 * 132:
        return 64
    return head_block(V)


class PrefillPlan(NamedTuple):
    """Grids and tiles of the three launches for one batch shape (:func:`prefill_plan`)."""
    BK: int                       # K as one tile (every stage)
    BV: int                       # V as one tile (prepare; the output where it keeps whole heads)
    prepare_grid: tuple[int, int]
    scan_grid: tuple[int, int, int]
    scan_bv: int
    scan_warps: int
    scan_stages: int
    output_grid: tuple[int, int, int]
    output_bv: int


@functools.lru_cache(maxsize=4096)
def prefill_plan(N: int, NT: int, HV: int, K: int, V: int) -> PrefillPlan:
    """The launch configuration of a batch of ``N`` sequences in ``NT`` chunks, ``HV`` value
    heads, head dims ``K``, ``V`` (cached: a serving loop sees few distinct shapes)."""
    scan_bv, warps, stages = scan_config(N * HV, V)
    output_bv = output_block_v(NT * HV, V)
    return PrefillPlan(head_block(K), head_block(V), (NT, HV), (cdiv(V, scan_bv), N, HV),
                       scan_bv, warps, stages, (cdiv(V, output_bv), NT, HV), output_bv)


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Storage dtype of the intermediates W, U, Ṽ (and of h without checkpoints)."""
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.float32


def fp16_inverse(use_qk_l2norm: bool, work: torch.dtype) -> bool:
    """Whether the inverse's products take fp16 operands: with 16-bit storage and keys normalised
    in the kernel (unit keys bound L and T, :func:`~.tiles.invert_unit_lower`). fp16 runs at
    twice tf32's rate on tensor cores, with the same mantissa."""
    return use_qk_l2norm and work != torch.float32
