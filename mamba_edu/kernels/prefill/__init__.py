"""The chunked GDN prefill in three Triton kernels (docs/conventions.md, chunk C = 64).

1. :mod:`.prepare`, grid ``(NT, HV)``: per (chunk, value head), all in parallel, Γ, k̂, the
   inverse ``T = (I+L)⁻¹``, ``W = T(β e^Γ K̂)`` and ``U = T(β V)``;
2. :mod:`.scan`, grid ``(⌈V/BV⌉, N, HV)``: per (V-tile, sequence, value head), the serial pass
   over the sequence's chunks: ``h[c] = S``, ``Ṽ = U − W S``, ``S ← e^{Γ_C} S + K̂ᵀ(e^{Γ_C−Γ} ⊙ Ṽ)``,
   from and back to the pool slot;
3. :mod:`.output`, grid ``(⌈V/BV⌉, NT, HV)``: per (V-tile, chunk, value head), all in parallel
   again, ``O = scale·[(Q̂ e^Γ) h[c] + (Q̂ K̂ᵀ ⊙ e^{Γr−Γs} ⊙ [s≤r]) Ṽ]``, normed with the gate
   when given.

Each stage's file holds its kernel and, under it, its launcher; :mod:`.tiles` the device helpers
they share (and the lab borrows), :mod:`.config` the launch configurations, and
:func:`prefill_triton` below runs the three. The reference they are tested against is the
chunked torch form, :func:`mamba_edu.gdn.chunk_gated_delta_rule` (the ``impl="torch"`` path).

Why a separate output kernel: a chunk's output needs that chunk's start state, but nothing later
needs the output. Computing it inside the serial pass makes every chunk step longer and leaves
only ``(V/BV)·N·HV`` programs for all of that work. Writing ``h`` and ``Ṽ`` to memory costs
bandwidth but lets the output run over every (chunk, head, tile) at once. (Folding the output
into the scan, and running all three stages in one launch, were tried and measured slower on
the H200: notebook 10, the appendix, shows them and their data.) ``h`` is stored in the input dtype
(bf16 on a GPU), or in fp32 when checkpoints are requested: then the checkpoints *are* ``h``.

The inverse is a block doubling of the 64×64 tile (:func:`~.tiles.invert_unit_lower`): every
intermediate is an entry of T or of L, so it stays bounded (a power series in L would not: its
terms can reach 1e13 for correlated keys), and all of it runs on tensor cores.

Precision on a GPU: ``tl.dot`` on fp32 operands uses tf32 tensor cores; with 16-bit inputs the
inverse's products take fp16 operands instead (tf32's mantissa at twice its rate; bf16 would cost
accuracy there). T, W, U, k̂, Ṽ and h (unless checkpoints are requested) are stored or cast to
the input dtype (bf16), and the dots that read them take operands in that dtype with fp32
accumulation, like flash-linear-attention. The state S stays fp32 in registers. Under the
interpreter dots are plain fp32 (or fp16) matmuls.

Tiles over a head dim are at least 64 wide (:func:`~.config.head_block`, masked past K or V):
Triton 3.6 miscompiled, on the H200, products whose right operand was 16 or 32 wide at 4 warps,
the form the prepare kernel's ``T · X`` takes at small head dims
(data/benchmarks/small_head_dims.md). The scan's V-tile may be 16 or 32 wide.
"""

import torch

from mamba_edu.kernels.prefill.config import (PREPARE_WARPS, SCAN_PROGRAMS, fp16_inverse, head_block,
                                              output_block_v, prefill_plan, scan_config, work_dtype)
from mamba_edu.kernels.prefill.output import (apply_output_norm, chunk_output_kernel, launch_output,
                                              output_chunk)
from mamba_edu.kernels.prefill.prepare import (chunk_prepare_kernel, launch_prepare, prepare_chunk,
                                               prepare_outputs)
from mamba_edu.kernels.prefill.scan import chunk_scan_kernel, launch_scan, scan_sequence
from mamba_edu.kernels.prefill.tiles import (CHUNK, advance_state, chunk_gates, chunk_inverse,
                                             invert_unit_lower, output_tile)


def prefill_triton(q, k, v, g, beta, state_pool, state_indices, meta, scale, use_qk_l2norm,
                   output_checkpoints, track_slots, track_chunks, gating=None, output_norm=None):
    """The three kernels on checked inputs (see :func:`mamba_edu.kernels.gdn_prefill`): ``meta``
    the kernels' view of the layout, the index arguments the kernels' int tensors. Returns
    ``(o, checkpoints or None)``. With ``output_norm`` the output kernel norms ``o``."""
    T, H, K = q.shape
    HV, V = v.shape[1:]
    gamma, k_hat, w, u = launch_prepare(k, v, g, beta, meta, use_qk_l2norm, gating)
    ckpt = (torch.empty(meta.NT, HV, K, V, device=q.device, dtype=torch.float32)
            if output_checkpoints else None)
    v_new, h = launch_scan(k_hat, w, u, gamma, state_pool, state_indices, meta, ckpt,
                           track_slots, track_chunks)
    return launch_output(q, k_hat, v_new, h, gamma, meta, scale, use_qk_l2norm,
                         output_norm), ckpt


__all__ = ["CHUNK", "PREPARE_WARPS", "SCAN_PROGRAMS", "advance_state", "apply_output_norm",
           "chunk_gates", "chunk_inverse", "chunk_output_kernel", "chunk_prepare_kernel",
           "chunk_scan_kernel", "fp16_inverse", "head_block", "invert_unit_lower", "launch_output",
           "launch_prepare", "launch_scan", "output_block_v", "output_chunk", "output_tile",
           "prefill_plan", "prefill_triton", "prepare_chunk", "prepare_outputs", "scan_config",
           "scan_sequence", "work_dtype"]
