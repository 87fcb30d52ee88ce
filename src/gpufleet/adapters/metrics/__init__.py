"""Prometheus exposition of GPU telemetry (dcgm-exporter names) and scheduler metrics (`gpufleet_*`)."""

from gpufleet.adapters.metrics.exposition import (
    CONTENT_TYPE,
    GPU_LABELS,
    GPU_METRICS,
    OWN_GPU_LABELS,
    SCHEDULER_METRICS,
    TelemetryCollector,
    TelemetryRegistry,
    make_registry,
    metrics_endpoint,
    render,
)
from gpufleet.adapters.metrics.view import (
    WAIT_BUCKETS_S,
    QueueMetrics,
    SampleSource,
    SchedulerState,
    SchedulerView,
    WaitHistogram,
    wait_histogram,
)

__all__ = [
    "CONTENT_TYPE",
    "GPU_LABELS",
    "GPU_METRICS",
    "OWN_GPU_LABELS",
    "SCHEDULER_METRICS",
    "WAIT_BUCKETS_S",
    "QueueMetrics",
    "SampleSource",
    "SchedulerState",
    "SchedulerView",
    "TelemetryCollector",
    "TelemetryRegistry",
    "WaitHistogram",
    "make_registry",
    "metrics_endpoint",
    "render",
    "wait_histogram",
]
