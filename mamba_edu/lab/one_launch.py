"""The three prefill stages in one launch: an experiment for small batches, measured slower.

At a small batch (one 512-token prompt on one GPU of a tensor-parallel-8 Qwen3.5: 8 chunks × 8
value heads) each of the three kernels of :mod:`mamba_edu.kernels.prefill` is a few microseconds
of latency-bound work, and the GPU spends a launch gap and a ramp-up between them.
:func:`chained_prefill_kernel` runs the same program bodies (:func:`prepare_chunk`,
:func:`scan_sequence`, :func:`output_chunk`) as *roles* of one grid, and replaces the kernel
boundaries by counters in a workspace (int32 ``[2 + 2N]``, zeros between launches):

- word 0 hands out **tickets** in arrival order: the first ``NT·HV`` programs to start prepare,
  the next ``⌈V/BVₛ⌉·N·HV`` scan, the rest compute outputs. A program only ever waits for
  programs with smaller tickets, which are already running, so the wait cannot deadlock however
  the GPU schedules the grid (role by ``program_id`` could: a waiting program may occupy the
  slot its producer needs);
- words ``2 + n``: prepare programs of sequence n that are done; its scans start at
  ``chunks(n)·HV``;
- words ``2 + N + n``: scan programs of sequence n that are done; its outputs start at
  ``⌈V/BVₛ⌉·HV``;
- word 1 counts finished programs; the last one zeroes the workspace for the next launch.

A signal is a barrier, so every thread's stores are issued, then an atomic add with release
semantics; a wait spins on an atomic read with acquire semantics, so what the producer stored is
visible after it. Counting per sequence rather than per chunk keeps those atomics off the scan's
serial path: each program signals once and waits once.

Measured on the H200, graph-replayed, it was **slower** than the three kernels at every batch
tried (``ours_graph_ms_other_launch_path`` in data/benchmarks/kernels.json), so the package runs
the three kernels. The likely reason (not verified with a profile of the kernel): inside a CUDA
graph the next kernel starts about half a microsecond after the previous one ends, while a
hand-off here takes a fence and an atomic round trip to L2 to signal, polling to see it, and a
ticket and a retirement atomic in every program. The Triton interpreter runs programs one after
another in grid order, so there every wait is already satisfied when it is reached.
"""

import torch
import triton
import triton.language as tl

from mamba_edu.kernels.prefill import apply_output_norm, output_chunk, prepare_chunk, scan_sequence
from mamba_edu.kernels.prefill.config import PREPARE_WARPS, fp16_inverse, prefill_plan, work_dtype
from mamba_edu.kernels.prefill.prepare import prepare_outputs


@triton.jit
def _signal(counter_ptr):
    """Count this program as done with its stage, after all of its threads' stores."""
    tl.debug_barrier()
    tl.atomic_add(counter_ptr, 1, sem="release")


@triton.jit
def _wait_for(counter_ptr, target):
    """Spin until the counter reaches ``target``."""
    while tl.atomic_add(counter_ptr, 0, sem="acquire") < target:
        pass


@triton.jit
def _retire(ws_ptr, n_programs, n_words):
    """Count this program as finished; the last one zeroes the workspace's ``n_words``."""
    tl.debug_barrier()
    if tl.atomic_add(ws_ptr + 1, 1, sem="acq_rel") == n_programs - 1:
        for start in range(0, n_words, 128):
            offs = start + tl.arange(0, 128)
            tl.store(ws_ptr + offs, tl.zeros_like(offs), mask=offs < n_words)


@triton.jit
def chained_prefill_kernel(
        q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr,
        gamma_ptr, k_hat_ptr, w_ptr, u_ptr, v_new_ptr, h_ptr, o_ptr, pool_ptr,
        cu_ptr, chunk_idx_ptr, chunk_off_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr,
        ws_ptr, scale, stride_q, stride_k, stride_v, stride_g, stride_beta, N, NT,
        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
        BK: tl.constexpr, BV: tl.constexpr, BV_SCAN: tl.constexpr, BV_OUT: tl.constexpr,
        USE_L2NORM: tl.constexpr, GATED: tl.constexpr, FP16_INVERSE: tl.constexpr,
        TRACK: tl.constexpr):
    """Grid ``(NT·HV + ⌈V/BV_SCAN⌉·N·HV + ⌈V/BV_OUT⌉·NT·HV,)``: one program per program of the
    three kernels, its role given by its ticket (module docstring). Writes what they write:
    Γ, k̂, W, U, h, Ṽ, o ``[T, HV, V]``, the pool's final and tracked states."""
    n_scan_tiles = tl.cdiv(V, BV_SCAN)
    n_prepare = NT * HV
    n_scan = n_scan_tiles * N * HV
    n_programs = n_prepare + n_scan + tl.cdiv(V, BV_OUT) * NT * HV
    prepared = ws_ptr + 2       # [N] prepare programs done, per sequence
    scanned = ws_ptr + 2 + N    # [N] scan programs done, per sequence
    ticket = tl.atomic_add(ws_ptr, 1)
    if ticket < n_prepare:
        seq = prepare_chunk(
            ticket // HV, ticket % HV, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr,
            gamma_ptr, k_hat_ptr, w_ptr, u_ptr, cu_ptr, chunk_idx_ptr, stride_k, stride_v,
            stride_g, stride_beta, H, HV, K, V, BK, BV, USE_L2NORM, GATED, FP16_INVERSE)
        _signal(prepared + seq)
    elif ticket < n_prepare + n_scan:
        t = ticket - n_prepare
        seq = (t // n_scan_tiles) % N
        chunks = tl.load(chunk_off_ptr + seq + 1) - tl.load(chunk_off_ptr + seq)
        _wait_for(prepared + seq, chunks * HV)
        scan_sequence(
            t % n_scan_tiles, seq, t // (n_scan_tiles * N), k_hat_ptr, w_ptr, u_ptr, gamma_ptr,
            v_new_ptr, h_ptr, pool_ptr, cu_ptr, chunk_off_ptr, state_idx_ptr, track_slot_ptr,
            track_chunk_ptr, H, HV, K, V, BK, BV_SCAN, TRACK)
        _signal(scanned + seq)
    else:
        t = ticket - n_prepare - n_scan
        n_out_tiles = tl.cdiv(V, BV_OUT)
        i_chunk = (t // n_out_tiles) % NT
        _wait_for(scanned + tl.load(chunk_idx_ptr + 2 * i_chunk), n_scan_tiles * HV)
        # No output norm here: it follows as its own kernel (prefill_one_launch).
        output_chunk(
            t % n_out_tiles, i_chunk, t // (n_out_tiles * NT), q_ptr, k_hat_ptr, v_new_ptr,
            h_ptr, gamma_ptr, o_ptr, None, None, cu_ptr, chunk_idx_ptr, scale, stride_q, 0, 0.0,
            H, HV, K, V, BK, BV_OUT, USE_L2NORM, False)
    _retire(ws_ptr, n_programs, 2 + 2 * N)


def prefill_one_launch(q, k, v, g, beta, state_pool, state_indices, meta, scale, use_qk_l2norm,
                       output_checkpoints=False, track_slots=None, track_chunks=None, gating=None,
                       output_norm=None):
    """:func:`~mamba_edu.kernels.prefill.prefill_triton` in one launch: same arguments (checked
    inputs, as :func:`mamba_edu.kernels.gdn_prefill` checks them), same results
    ``(o, checkpoints or None)``; with ``output_norm`` a norm kernel follows it."""
    T, H, K = q.shape
    HV, V = v.shape[1:]
    dev, work = q.device, work_dtype(v.dtype)
    gamma, k_hat, w, u = prepare_outputs(k, v)
    v_new = torch.empty_like(u)
    h = torch.empty(meta.NT, HV, K, V, device=dev,
                    dtype=torch.float32 if output_checkpoints else work)
    o = torch.empty(T, HV, V, device=dev, dtype=q.dtype)
    A_log, dt_bias = gating or (None, None)
    workspace = torch.zeros(2 + 2 * meta.N, device=dev, dtype=torch.int32)
    plan = prefill_plan(meta.N, meta.NT, HV, K, V)
    n_programs = HV * (meta.NT + plan.scan_grid[0] * meta.N + plan.output_grid[0] * meta.NT)
    chained_prefill_kernel[(n_programs,)](
        q, k, v, g, beta, A_log, dt_bias, gamma, k_hat, w, u, v_new, h, o, state_pool,
        meta.cu_seqlens, meta.chunk_indices, meta.chunk_offsets, state_indices, track_slots,
        track_chunks, workspace, scale, q.stride(0), k.stride(0), v.stride(0), g.stride(0),
        beta.stride(0), meta.N, meta.NT, H, HV, K, V, plan.BK, plan.BV, plan.scan_bv,
        plan.output_bv, use_qk_l2norm, gating is not None, fp16_inverse(use_qk_l2norm, work),
        track_slots is not None, num_warps=PREPARE_WARPS, num_stages=plan.scan_stages)
    return apply_output_norm(o, output_norm), (h if output_checkpoints else None)
