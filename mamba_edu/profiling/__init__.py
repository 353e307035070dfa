"""Measuring what the host waits for: sync counting (CPU sniffer and GPU guard)."""

from mamba_edu.profiling.syncs import SyncEvent, SyncReport, count_syncs, cuda_sync_guard

__all__ = ["SyncEvent", "SyncReport", "count_syncs", "cuda_sync_guard"]
