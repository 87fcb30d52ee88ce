"""Prometheus exposition of GPU telemetry (dcgm-exporter names) and scheduler metrics (`gpufleet_*`)."""

from gpufleet.adapters.metrics.exposition import (
    CONTENT_TYPE,
    GPU_LABELS,
    GPU_METRICS,
    OWN_GPU_LABELS,
    PROCESS_METRICS,
    SCHEDULER_METRICS,
    TelemetryCollector,
    TelemetryRegistry,
    make_registry,
    metrics_endpoint,
    render,
)
from gpufleet.adapters.metrics.view import (
    WAIT_BUCKETS_S,
    JobGpuMemory,
    QueueMetrics,
    SampleSource,
    SchedulerState,
    SchedulerView,
    UnattributedMemory,
    WaitHistogram,
    wait_histogram,
)

__all__ = [
    "CONTENT_TYPE",
    "GPU_LABELS",
    "GPU_METRICS",
    "OWN_GPU_LABELS",
    "PROCESS_METRICS",
    "SCHEDULER_METRICS",
    "WAIT_BUCKETS_S",
    "JobGpuMemory",
    "QueueMetrics",
    "SampleSource",
    "SchedulerState",
    "SchedulerView",
    "TelemetryCollector",
    "TelemetryRegistry",
    "UnattributedMemory",
    "WaitHistogram",
    "make_registry",
    "metrics_endpoint",
    "render",
    "wait_histogram",
]
