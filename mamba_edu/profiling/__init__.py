"""Measuring what the host waits for: sync counting (CPU sniffer, GPU guard), traces, bubbles.

Plots live in :mod:`mamba_edu.profiling.plots` (not imported here, so counting syncs does not
pull in matplotlib).
"""

from mamba_edu.profiling.bubbles import Bubble, TraceAnalysis, TraceSync, analyze_trace, load_trace
from mamba_edu.probes import host_only
from mamba_edu.profiling.syncs import SyncEvent, SyncReport, count_syncs, cuda_sync_guard
from mamba_edu.profiling.traces import FORWARD_RANGE, RecordedTrace, record_trace, trim_trace

__all__ = [
    "Bubble", "FORWARD_RANGE", "RecordedTrace", "SyncEvent", "SyncReport", "TraceAnalysis",
    "TraceSync", "analyze_trace", "count_syncs", "cuda_sync_guard", "host_only", "load_trace", "record_trace",
    "trim_trace",
]
