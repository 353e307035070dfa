"""Serving a hybrid GDN model: state pool, prefix cache, planning, forward batch, the model↔backend
seam and its backend.

See ``docs/serving.md`` for the whole flow and ``docs/conventions.md`` for the semantics.
"""

from mamba_edu.serving.backend import LinearAttentionBackend
from mamba_edu.serving.batch import ForwardBatch, build_batch, upload_host_lists
from mamba_edu.serving.gdn_layer import GDNLayerParams
from mamba_edu.serving.planning import TrackDecision, plan_tracking
from mamba_edu.serving.pool import SCRATCH_SLOT, PoolExhausted, StatePool
from mamba_edu.serving.prefix_cache import PrefixMatch, RadixCache, RadixNode
from mamba_edu.serving.seam import GDNBackend
from mamba_edu.serving.tokens import Tokens
from mamba_edu.serving.tracking import (STRATEGIES, ForwardMetadata, SlotArgs, TrackIndices, TrackingStrategy,
                                        get_strategy)

__all__ = ["SCRATCH_SLOT", "STRATEGIES", "ForwardBatch", "ForwardMetadata", "GDNBackend", "GDNLayerParams",
           "LinearAttentionBackend", "PoolExhausted", "PrefixMatch", "RadixCache", "RadixNode", "SlotArgs",
           "StatePool", "Tokens", "TrackIndices", "TrackDecision", "TrackingStrategy", "build_batch", "get_strategy",
           "plan_tracking", "upload_host_lists"]
