"""The GDN prefill through flash-linear-attention's Triton path: SGLang's fallback kernel.

``Engine(model, prefill_kernel="fla")`` runs each GDN layer's core (gating, chunked delta rule,
output norm) with fla-core 0.6.0 (``pip install 'mamba_edu[fla]'``, CUDA only) instead of our
Triton kernels; the conv, the decode step and the tracking stay ours. The kernel is chosen once,
when the backend is built (:func:`check_prefill_kernel`); nothing global switches it.

fla's public ``chunk_gated_delta_rule`` returns ``(o, final_state)`` and drops the checkpoints
``h`` that the ``naive``, ``precomputed`` and ``sync_free`` strategies copy from. SGLang carries
its own copy of fla's forward, which returns ``h``. :func:`gdn_prefill` calls the same steps of
fla-core's forward (``chunk_gated_delta_rule_fwd`` in ``fla/ops/gated_delta_rule/chunk.py``)
and keeps ``h``::

    l2norm_fwd(q), l2norm_fwd(k)            q̂, k̂ (eps 1e-6 inside the sqrt, as ours)
    chunk_local_cumsum(g, scale=1/ln 2)     Γ, the gate's cumsum inside each chunk, in log2
                                            (fla's kernels use exp2)
    chunk_gated_delta_rule_fwd_intra        W, U (β K Kᵀ and its inverse, one kernel)
    chunk_gated_delta_rule_fwd_h            h, Ṽ and the final states
    chunk_fwd_o                             o

Calling them below fla's public function also bypasses fla's backend dispatch (which hands
``chunk_gated_delta_rule`` to FlashQLA when that package is installed): this is fla's Triton path.

fla takes a packed batch as a batch of one, ``[1, T, heads, dim]``, contiguous, and our
:class:`~mamba_edu.kernels.ChunkMeta`'s tables are fla's own: ``chunk_indices [NT, 2]`` =
(sequence, chunk) is ``prepare_chunk_indices``, ``chunk_offsets`` is ``prepare_chunk_offsets``.
Handing them over skips fla's ``.tolist()`` (its one host sync, docs/sglang.md "How many syncs").

**Checkpoints in bf16.** fla allocates ``h`` like ``k`` (``k.new_empty``): with a bf16 model, bf16.
``h[offsets[n] + c]`` is sequence n's state at the start of its chunk c, after ``64·c`` of its
tokens, as ours (docs/conventions.md §1.4); the final states are fp32. :func:`gdn_prefill`
returns ``h`` as fla made it, ``[NT, HV, K, V]`` in q's dtype, and the strategies' copy
(:meth:`LinearAttentionBackend._track_ssm <mamba_edu.serving.backend.LinearAttentionBackend>`)
converts the tracked rows to the pool's fp32. So a snapshot tracked from a checkpoint is rounded
to bf16 (about 3 significant digits) before it reaches the fp32 pool, as it was in SGLang before
its Triton kernel learned to snapshot from its fp32 accumulator (#34820); one tracked from the
final state is exact. A prefix hit on such a snapshot then differs from a recompute by that
rounding (ours: bit-exact). Converting all of ``h`` to fp32 would cost a copy and gain nothing.
"""

from __future__ import annotations

import functools
from importlib import metadata
from types import SimpleNamespace

import torch

from mamba_edu.gdn import gdn_gating
from mamba_edu.kernels.fused_ops import gated_rms_norm
from mamba_edu.kernels.metadata import kernel_copy
from mamba_edu.serving.pool import SCRATCH_SLOT

#: The prefill kernels an engine can be built with: ``triton`` (ours), ``fla`` (this module).
PREFILL_KERNELS = ("triton", "fla")
FLA_VERSION = "0.6.0"  # the steps below are fla's internals: pinned, as the extra pins them
INSTALL = "pip install 'mamba_edu[fla]'"


@functools.cache
def fla_steps() -> SimpleNamespace:
    """fla-core's forward steps, imported once, when first needed (fla is an optional extra)."""
    from fla.modules.norm.l2norm import l2norm_fwd
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.common.chunk_o import chunk_fwd_o
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2
    return SimpleNamespace(l2norm_fwd=l2norm_fwd, chunk_local_cumsum=chunk_local_cumsum, RCP_LN2=RCP_LN2,
                           fwd_intra=chunk_gated_delta_rule_fwd_intra, fwd_h=chunk_gated_delta_rule_fwd_h,
                           chunk_fwd_o=chunk_fwd_o)


def check_prefill_kernel(name, strategy: str, device) -> str:
    """``name`` if an engine with tracking ``strategy`` on ``device`` can run that prefill kernel.

    Raises ``ValueError`` for an unknown name, or ``fla`` with the ``fused`` strategy (its
    tracking lives inside our kernel, which fla has no arguments for); ``RuntimeError`` for
    ``fla`` without a CUDA device, or without fla-core 0.6.0 importable."""
    if not isinstance(name, str) or name not in PREFILL_KERNELS:
        raise ValueError(f"prefill_kernel must be one of {list(PREFILL_KERNELS)}; got {name!r}")
    if name == "triton":
        return name
    if strategy == "fused":
        raise ValueError("prefill_kernel='fla' cannot track with the 'fused' strategy: its snapshots are "
                         "written inside our prefill kernel (track_slots, track_chunks), and fla's has no such "
                         "arguments; use naive, precomputed or sync_free")
    if torch.device(device).type != "cuda":
        raise RuntimeError(f"prefill_kernel='fla' needs a CUDA device (fla's kernels are Triton for GPUs); "
                           f"the model is on {device}")
    try:
        version = metadata.version("fla-core")
    except metadata.PackageNotFoundError:
        version = None  # e.g. a source tree on PYTHONPATH: the import decides
    if version not in (None, FLA_VERSION):
        raise RuntimeError(f"prefill_kernel='fla' needs fla-core=={FLA_VERSION} (it calls the steps of "
                           f"fla's forward); fla-core {version} is installed: {INSTALL}")
    try:
        fla_steps()
    except Exception as error:  # noqa: BLE001  (not installed, or an import that fails on its own)
        raise RuntimeError(f"prefill_kernel='fla' needs fla-core {FLA_VERSION} and einops: {INSTALL} "
                           f"(importing fla failed: {type(error).__name__}: {error})") from error
    return name


def gdn_prefill(q, k, v, *, a, b, A_log, dt_bias, state_pool, state_indices, meta,
                output_checkpoints=True, output_norm=None, track_slots=None, track_chunks=None):
    """:func:`mamba_edu.kernels.launch.gdn_prefill`'s contract, run by fla: ``(o, h or None)``.

    Args:
        q, k: ``[T, H, K]``; v: ``[T, HV, V]`` (row-strided allowed: copied contiguous for fla);
        a, b: ``[T, HV]`` raw gate projections, A_log, dt_bias ``[HV]``
            (:func:`~mamba_edu.gdn.gdn_gating` gives g and β in fp32);
        state_pool: ``[slots, HV, K, V]`` fp32: sequence n starts from ``state_pool[state_indices[n]]``
            and its final state is written back there. A negative slot (a bucket's padding row)
            starts from zeros and its final state lands in the scratch slot (no mask, no sync);
        meta: the batch's :class:`~mamba_edu.kernels.ChunkMeta` (built with exact chunk rows,
            as every eager forward builds it);
        output_norm: ``(z, weight, eps)``: return ``gated_rms_norm(o, z, weight, eps)``.
    Returns:
        ``o [T, HV, V]`` in q's dtype and, with ``output_checkpoints``, ``h [NT, HV, K, V]`` in
        q's dtype (bf16 when serving: see the module docstring).
    """
    if track_slots is not None or track_chunks is not None:
        raise ValueError("fla's prefill has no in-kernel tracking (the fused strategy)")
    fla = fla_steps()
    m = meta.kernel_view()
    varlen = dict(cu_seqlens=m.cu_seqlens, chunk_indices=m.chunk_indices)
    slots = kernel_copy(state_indices).long()
    live = slots >= 0
    q, k, v = (x.contiguous()[None] for x in (q, k, v))           # [1, T, heads, dim]
    q_hat, _ = fla.l2norm_fwd(q)
    k_hat, _ = fla.l2norm_fwd(k)
    g, beta = gdn_gating(A_log, a, b, dt_bias)                      # fp32 [T, HV]
    gamma = fla.chunk_local_cumsum(g[None], chunk_size=64, scale=fla.RCP_LN2, **varlen)
    w, u, _ = fla.fwd_intra(k=k_hat, v=v, g=gamma, beta=beta[None], **varlen)
    initial = torch.where(live[:, None, None, None], state_pool[slots.clamp(min=0)], 0.0)
    h, v_new, final = fla.fwd_h(k=k_hat, w=w, u=u, g=gamma, initial_state=initial, output_final_state=True,
                                chunk_offsets=m.chunk_offsets, **varlen)
    o = fla.chunk_fwd_o(q=q_hat, k=k_hat, v=v_new, h=h, g=gamma, scale=q.shape[-1] ** -0.5, **varlen)[0]
    state_pool[torch.where(live, slots, SCRATCH_SLOT)] = final
    if output_norm is not None:
        o = gated_rms_norm(o, *output_norm)
    return o, (h[0] if output_checkpoints else None)
