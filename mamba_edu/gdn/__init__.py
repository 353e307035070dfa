"""The Gated DeltaNet math in plain PyTorch: the oracle every kernel and strategy is tested against.

Shapes (packed varlen, docs/conventions.md): ``q, k: [T, H, K]``, ``v: [T, HV, V]``, ``g, beta: [T, HV]``,
``cu_seqlens: [N+1]``; states ``[N, HV, K, V]`` fp32.
"""

from mamba_edu.gdn.chunked import chunk_gated_delta_rule
from mamba_edu.gdn.conv import causal_conv1d, causal_conv1d_update
from mamba_edu.gdn.gating import gdn_gating, l2norm
from mamba_edu.gdn.recurrent import GDNOutput, recurrent_gated_delta_rule
from mamba_edu.gdn.varlen import CHUNK, checkpoint_offsets, chunk_counts, cu_offsets, seq_lengths

__all__ = [
    "CHUNK", "GDNOutput", "causal_conv1d", "causal_conv1d_update", "checkpoint_offsets",
    "chunk_counts", "chunk_gated_delta_rule", "cu_offsets", "gdn_gating", "l2norm",
    "recurrent_gated_delta_rule", "seq_lengths",
]
