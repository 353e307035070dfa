"""Triton kernels for serving a GDN layer: chunked prefill, decode step, causal conv1d.

All of them work on **pools** of per-sequence states (``[slots, HV, K, V]`` fp32 SSM states,
``[slots, D, W−1]`` conv states) addressed by slot indices, read and write them in place, and never
synchronise with the host: the batch metadata is built once on the CPU (:func:`build_chunk_meta`).

- :mod:`.metadata`   host-built chunk tables, index tensors that remember their host values
- :mod:`.prefill`    the three prefill kernels, one stage per file (prepare: Γ, k̂, (I+L)⁻¹, W,
                     U; scan: the serial state pass, h and Ṽ; output: all chunks in parallel)
- :mod:`.decode`     the one-token recurrent step
- :mod:`.conv`       causal conv1d prefill and update
- :mod:`.attention`  the full-attention layers' causal attention (GQA, after a cached prefix),
                     unchecked
- :mod:`.fused_ops`  the model's fused elementwise ops (RMSNorm, SwiGLU, RoPE), unchecked
- :mod:`.api`        the entry points: the checks (:mod:`.validation`), then :mod:`.launch`,
                     :mod:`.fused_ops` or :mod:`.attention`
- :mod:`.launch`     the same four operations unchecked, Triton or the torch reference path
                     (``impl=``): what the serving engine calls, its batch checked once

Set ``TRITON_INTERPRET=1`` before importing this module to run the kernels on a CPU
(``import mamba_edu`` does it when no GPU is present).
"""

from mamba_edu._runtime import select_triton_mode

select_triton_mode()  # the interpreter without a GPU, before any @triton.jit runs
from mamba_edu.kernels.api import (add_rms_norm, causal_attention, conv1d_decode, conv1d_prefill,
                                   gated_rms_norm, gdn_decode, gdn_prefill, rms_norm, rope, silu_mul)
from mamba_edu.kernels.metadata import (ChunkMeta, build_chunk_meta, build_chunk_meta_with_indices,
                                        host_values, upload_indices)

__all__ = ["ChunkMeta", "add_rms_norm", "build_chunk_meta", "build_chunk_meta_with_indices", "causal_attention",
           "conv1d_decode", "conv1d_prefill", "gated_rms_norm", "gdn_decode", "gdn_prefill", "host_values",
           "rms_norm", "rope", "silu_mul", "upload_indices"]
