"""Prometheus exposition: a custom collector that reads GPU samples and scheduler state on each scrape.

GPU metrics carry NVIDIA dcgm-exporter's names, units and labels (`gpu`, `UUID`, `device`, `modelName`,
`Hostname`), so DCGM Grafana dashboards work unchanged, plus ours: `job_id`, `queue` (who holds the GPU, empty
if nobody) and `probe` (`nvml`, `recorded` or `emulated`: emulated readings are never unlabelled).

The job label is `job_id`, not `job`: Prometheus gives every scraped series its scrape job's name as `job`,
and renames a scraped `job` label to `exported_job`, so a `job` label of ours would never arrive as `job`.

Units of the DCGM_ names follow dcgm-exporter, not base units: framebuffer in MiB, power in W, temperature
in C, clocks in MHz, utilisation in percent. Our own `gpufleet_*` metrics use base units (bytes, seconds,
bytes per second, ratios 0..1).

Our `gpufleet_gpu_*` metrics carry the same labels in snake_case (`uuid`, `model_name`, `hostname`).

Two deliberate departures from dcgm-exporter, both invisible to PromQL. The ECC counts are typed `gauge`
(dcgm-exporter says `counter`): the text format wants counters named `*_total` and prometheus_client renames
them so, which would break dcgm's exact names; `rate()` and `increase()` work on them all the same. And a
value a probe could not read is left out (no series) rather than exported as 0.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

from prometheus_client import generate_latest
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from gpufleet.adapters.metrics.view import SampleSource, SchedulerState, SchedulerView
from gpufleet.ports.gpu_probe import GpuOwner, GpuSample

log = logging.getLogger("gpufleet.metrics")

MIB = 1024**2
# Text format 0.0.4: every name we export is a classic Prometheus name, and Prometheus 2.x servers (Debian
# 12 ships 2.42) negotiate 0.0.4, which prometheus_client's own HTTP handler also answers with.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
# dcgm-exporter's label names on the DCGM_ metrics (camelCase and all: dashboards select on them), and the
# same labels in Prometheus' snake_case on our own gpufleet_gpu_* metrics. `promtool check metrics` flags the
# camelCase names as a style problem; that is the one lint finding we accept, for DCGM_ metrics only.
GPU_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "job_id", "queue", "probe")
OWN_GPU_LABELS = ("gpu", "uuid", "device", "model_name", "hostname", "job_id", "queue", "probe")


@dataclass(frozen=True, slots=True)
class GpuMetric:
    name: str
    help: str
    read: Callable[[GpuSample], float | None]


def _mib(value: int | None) -> float | None:
    return None if value is None else float(value // MIB)


# name, help (dcgm-exporter's wording where the name is theirs), and how to read it from a sample.
GPU_METRICS: tuple[GpuMetric, ...] = (
    GpuMetric("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda s: s.gpu_util),
    GpuMetric("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda s: s.mem_util),
    GpuMetric("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda s: _mib(s.memory_used)),
    GpuMetric("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda s: _mib(s.memory_free)),
    GpuMetric("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB).", lambda s: _mib(s.memory_total)),
    GpuMetric("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda s: s.power_w),
    GpuMetric("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "Enforced power limit (in W).", lambda s: s.power_limit_w),
    GpuMetric("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda s: s.temperature_c),
    GpuMetric("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda s: s.sm_clock_mhz),
    GpuMetric(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors (typed gauge, see gpufleet docs).",
        lambda s: s.ecc_sbe,
    ),
    GpuMetric(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors (typed gauge, see gpufleet docs).",
        lambda s: s.ecc_dbe,
    ),
    GpuMetric("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", lambda s: s.xid),
    GpuMetric("gpufleet_gpu_memory_used_bytes", "GPU memory used (bytes).", lambda s: s.memory_used),
    GpuMetric("gpufleet_gpu_memory_total_bytes", "GPU memory total (bytes).", lambda s: s.memory_total),
    GpuMetric("gpufleet_gpu_pcie_tx_bytes_per_second", "PCIe transmit throughput (bytes/s).", lambda s: s.pcie_tx),
    GpuMetric("gpufleet_gpu_pcie_rx_bytes_per_second", "PCIe receive throughput (bytes/s).", lambda s: s.pcie_rx),
    GpuMetric(
        "gpufleet_gpu_nvlink_tx_bytes_per_second",
        "NVLink transmit throughput, all links (bytes/s).",
        lambda s: s.nvlink_tx,
    ),
    GpuMetric(
        "gpufleet_gpu_nvlink_rx_bytes_per_second",
        "NVLink receive throughput, all links (bytes/s).",
        lambda s: s.nvlink_rx,
    ),
    GpuMetric("gpufleet_gpu_processes", "Compute processes on the GPU.", lambda s: float(len(s.processes))),
    GpuMetric(
        "gpufleet_gpu_sample_timestamp_seconds", "When the GPU was last sampled (probe clock, s).", lambda s: s.at
    ),
)

# Our scheduler metrics: (name, Prometheus type, help). The collector emits exactly these families.
SCHEDULER_METRICS: tuple[tuple[str, str, str], ...] = (
    ("gpufleet_queue_pending_jobs", "gauge", "Jobs waiting in the queue."),
    ("gpufleet_queue_running_jobs", "gauge", "Jobs of the queue holding resources."),
    ("gpufleet_queue_wait_seconds", "histogram", "Time jobs waited in the queue before they started (s)."),
    ("gpufleet_queue_allocated_gpus", "gauge", "GPUs held by the queue's jobs (fractional shares count as such)."),
    ("gpufleet_queue_used_gpus", "gauge", "Held GPUs weighted by measured utilisation (2 GPUs at 50 % = 1)."),
    ("gpufleet_queue_reserved_idle_gpus", "gauge", "Held GPUs flagged reserved-but-idle."),
    ("gpufleet_queue_reserved_idle_gpu_seconds", "counter", "GPU-seconds held while flagged idle, since start."),
    ("gpufleet_preemptions", "counter", "Jobs of the queue preempted, since start."),
    ("gpufleet_fragmentation_ratio", "gauge", "Share of idle GPU capacity that is fragmented (FGD), 0..1."),
    ("gpufleet_fragmented_gpus", "gauge", "Idle GPU capacity that is fragmented (FGD), in GPUs."),
    ("gpufleet_scheduling_cycle_seconds", "summary", "Duration of scheduling cycles (s)."),
    ("gpufleet_scheduling_cycle_last_seconds", "gauge", "Duration of the last scheduling cycle (s)."),
    (
        "gpufleet_cost_usd",
        "counter",
        "USD of GPU time held per queue, GPU model and pool, at the prices set (see report cost); since start.",
    ),
    ("gpufleet_budget_used_ratio", "gauge", "Share of the queue's budget spent in its window (1 = all of it)."),
    ("gpufleet_budget_level", "gauge", "The queue against its budget: 0 ok, 1 notice (80 % spent), 2 exceeded."),
    ("gpufleet_spot_breaker_state", "gauge", "A spot pool's circuit breaker: 0 closed, 1 half-open, 2 open."),
    ("gpufleet_spot_interruption_rate", "gauge", "A spot pool's interruptions per node-hour over the window."),
    ("gpufleet_spot_interruptions", "counter", "Spot nodes of the pool lost, since start."),
    ("gpufleet_telemetry_collect_errors", "counter", "Scrapes where reading samples or scheduler state failed."),
)

# Per-process GPU memory, mapped to jobs: (name, type, help). Emitted only when the state says processes were
# attributed; labels in snake_case like our other gpufleet_gpu_* metrics (promtool's style rule), which join
# DCGM_ series on `gpu` and `Hostname` via label_replace, or on the job's labels directly.
PROCESS_METRICS: tuple[tuple[str, str, str], ...] = (
    ("gpufleet_job_gpu_memory_used_bytes", "gauge", "GPU memory used by the job's processes on the GPU (bytes)."),
    (
        "gpufleet_job_gpu_memory_share_bytes",
        "gauge",
        "GPU memory the job's share of the GPU entitles it to (bytes; 0: it holds no share of this GPU).",
    ),
    (
        "gpufleet_job_gpu_memory_over_share",
        "gauge",
        "1 when the job uses more GPU memory than its share of the GPU (fractional shares are not enforced).",
    ),
    (
        "gpufleet_gpu_unattributed_memory_bytes",
        "gauge",
        "GPU memory used by processes that belong to no gpufleet job (bytes): the GPU is used outside the scheduler.",
    ),
    ("gpufleet_gpu_unattributed_processes", "gauge", "Compute processes on the GPU that belong to no gpufleet job."),
)
JOB_MEMORY_LABELS = ("job_id", "queue", "gpu", "uuid", "hostname")
GPU_ONLY_LABELS = ("gpu", "uuid", "hostname")

_NOBODY = GpuOwner("", "")


class TelemetryCollector(Collector):
    """Reads `samples()` and `scheduler()` on every scrape (nothing is cached between scrapes).

    If either raises, that part is left out of the scrape, the error is logged once per type and counted
    in `gpufleet_telemetry_collect_errors_total`: a broken source must not take down `/metrics`."""

    def __init__(
        self,
        samples: Callable[[], Sequence[GpuSample]] | None = None,
        scheduler: Callable[[], SchedulerState] | None = None,
    ) -> None:
        self._samples = samples
        self._scheduler = scheduler
        self.errors = 0
        self._logged: set[str] = set()

    def _read(self, what: str, fn: Callable[[], object]) -> object | None:
        try:
            return fn()
        except Exception as exc:  # a failing source costs its part of one scrape, not the endpoint
            self.errors += 1
            if type(exc).__name__ not in self._logged:
                self._logged.add(type(exc).__name__)
                log.warning(
                    "metrics: reading %s failed (%s: %s); left out of this scrape", what, type(exc).__name__, exc
                )
            return None

    def _sources(self) -> tuple[Sequence[GpuSample], SchedulerState | None]:
        read_state = self._read("scheduler state", self._scheduler) if self._scheduler else None
        state = read_state if isinstance(read_state, SchedulerState) else None
        samples = self._read("GPU samples", self._samples) if self._samples else None
        return (samples if isinstance(samples, Sequence) else ()), state

    def _errors_family(self) -> Metric:
        errors = CounterMetricFamily("gpufleet_telemetry_collect_errors", SCHEDULER_METRICS[-1][2])
        errors.add_metric([], float(self.errors))
        return errors

    def collect(self) -> Iterator[Metric]:
        samples, state = self._sources()
        yield from self._gpu_families(samples, state)
        if state is not None:
            yield from self._scheduler_families(state)
        yield self._errors_family()

    def exposition(self) -> bytes:
        """The same text as `generate_latest` over `collect()`, written directly: prometheus_client's writer
        spends ~15 µs a series (name checks, escaping, float formatting), too slow for 64 GPUs x 20 metrics
        in the 10 ms a scrape may take. GPU label sets are escaped once per GPU, not once per series."""
        samples, state = self._sources()
        owners = state.owners if state is not None else {}
        rows = []
        for sample in samples:
            owner = owners.get((sample.node, sample.index), _NOBODY)
            index = str(sample.index)
            values = (
                index,
                sample.uuid,
                "nvidia" + index,
                sample.model_name or sample.model,
                sample.node,
                owner.job,
                owner.queue,
                sample.probe,
            )
            rows.append((_labels_text(GPU_LABELS, values), _labels_text(OWN_GPU_LABELS, values), sample))
        out = []
        for metric in GPU_METRICS:
            name, read = metric.name, metric.read
            out.append(f"# HELP {name} {_escape_help(metric.help)}\n# TYPE {name} gauge\n")
            dcgm = name.startswith("DCGM_")
            for dcgm_labels, own_labels, sample in rows:
                value = read(sample)
                if value is not None:
                    out.append(f"{name}{dcgm_labels if dcgm else own_labels} {_number(value)}\n")
        families = [*self._scheduler_families(state)] if state is not None else []
        families.append(self._errors_family())
        out.extend(_family_text(family) for family in families)
        return "".join(out).encode()

    def _gpu_families(self, samples: Sequence[GpuSample], state: SchedulerState | None) -> Iterator[Metric]:
        families = [
            GaugeMetricFamily(m.name, m.help, labels=GPU_LABELS if m.name.startswith("DCGM_") else OWN_GPU_LABELS)
            for m in GPU_METRICS
        ]
        readers = [m.read for m in GPU_METRICS]
        owners = state.owners if state is not None else {}
        for sample in samples:
            owner = owners.get((sample.node, sample.index), _NOBODY)
            index = str(sample.index)
            labels = [
                index,
                sample.uuid,
                "nvidia" + index,
                sample.model_name or sample.model,
                sample.node,
                owner.job,
                owner.queue,
                sample.probe,
            ]
            for family, read in zip(families, readers, strict=True):
                value = read(sample)
                if value is not None:
                    family.add_metric(labels, value)
        yield from families

    def _scheduler_families(self, state: SchedulerState) -> Iterator[Metric]:
        help_of = {name: text for name, _, text in SCHEDULER_METRICS}
        gauges = (
            ("gpufleet_queue_pending_jobs", "pending"),
            ("gpufleet_queue_running_jobs", "running"),
            ("gpufleet_queue_allocated_gpus", "allocated_gpus"),
            ("gpufleet_queue_used_gpus", "used_gpus"),
            ("gpufleet_queue_reserved_idle_gpus", "reserved_idle_gpus"),
        )
        for name, attribute in gauges:
            family = GaugeMetricFamily(name, help_of[name], labels=["queue"])
            for q in state.queues:
                family.add_metric([q.queue], float(getattr(q, attribute)))
            yield family
        idle = CounterMetricFamily(
            "gpufleet_queue_reserved_idle_gpu_seconds",
            help_of["gpufleet_queue_reserved_idle_gpu_seconds"],
            labels=["queue"],
        )
        preemptions = CounterMetricFamily("gpufleet_preemptions", help_of["gpufleet_preemptions"], labels=["queue"])
        wait = HistogramMetricFamily(
            "gpufleet_queue_wait_seconds", help_of["gpufleet_queue_wait_seconds"], labels=["queue"]
        )
        for q in state.queues:
            idle.add_metric([q.queue], q.reserved_idle_gpu_seconds)
            preemptions.add_metric([q.queue], float(q.preemptions))
            buckets = [(repr(float(bound)), float(n)) for bound, n in q.wait.buckets]
            buckets.append(("+Inf", float(q.wait.count)))
            wait.add_metric([q.queue], buckets, q.wait.sum_s)
        yield from (idle, preemptions, wait)
        cost = CounterMetricFamily("gpufleet_cost_usd", help_of["gpufleet_cost_usd"], labels=["queue", "model", "pool"])
        for c in state.costs:
            cost.add_metric([c.queue, c.model, c.pool], c.usd)
        ratio = GaugeMetricFamily("gpufleet_budget_used_ratio", help_of["gpufleet_budget_used_ratio"], labels=["queue"])
        level = GaugeMetricFamily("gpufleet_budget_level", help_of["gpufleet_budget_level"], labels=["queue"])
        for b in state.budgets:
            ratio.add_metric([b.queue], b.ratio)
            level.add_metric([b.queue], float(b.level))
        yield from (cost, ratio, level)
        breaker = GaugeMetricFamily(
            "gpufleet_spot_breaker_state", help_of["gpufleet_spot_breaker_state"], labels=["pool"]
        )
        rate = GaugeMetricFamily(
            "gpufleet_spot_interruption_rate", help_of["gpufleet_spot_interruption_rate"], labels=["pool"]
        )
        lost = CounterMetricFamily(
            "gpufleet_spot_interruptions", help_of["gpufleet_spot_interruptions"], labels=["pool"]
        )
        for p in state.spot_pools:
            breaker.add_metric([p.pool], float(p.state))
            rate.add_metric([p.pool], p.rate_per_node_hour)
            lost.add_metric([p.pool], float(p.interruptions))
        yield from (breaker, rate, lost)
        for name, value in (
            ("gpufleet_fragmentation_ratio", state.fragmentation_ratio),
            ("gpufleet_fragmented_gpus", state.fragmented_gpus),
            ("gpufleet_scheduling_cycle_last_seconds", state.last_cycle_seconds),
        ):
            if value is not None:
                yield GaugeMetricFamily(name, help_of[name], value=value)
        yield SummaryMetricFamily(
            "gpufleet_scheduling_cycle_seconds",
            help_of["gpufleet_scheduling_cycle_seconds"],
            count_value=state.cycles,
            sum_value=state.cycle_seconds_sum,
        )
        if state.processes_attributed:
            yield from _process_families(state)


def _process_families(state: SchedulerState) -> Iterator[Metric]:
    help_of = {name: text for name, _, text in PROCESS_METRICS}
    used, share, over = (
        GaugeMetricFamily(name, help_of[name], labels=JOB_MEMORY_LABELS)
        for name in (
            "gpufleet_job_gpu_memory_used_bytes",
            "gpufleet_job_gpu_memory_share_bytes",
            "gpufleet_job_gpu_memory_over_share",
        )
    )
    for m in state.job_memory:
        labels = [m.job, m.queue, str(m.index), m.uuid, m.node]
        used.add_metric(labels, float(m.used_bytes))
        share.add_metric(labels, float(m.share_bytes))
        over.add_metric(labels, 1.0 if m.over_share else 0.0)
    stray_bytes, stray_count = (
        GaugeMetricFamily(name, help_of[name], labels=GPU_ONLY_LABELS)
        for name in ("gpufleet_gpu_unattributed_memory_bytes", "gpufleet_gpu_unattributed_processes")
    )
    for u in state.unattributed:
        labels = [str(u.index), u.uuid, u.node]
        stray_bytes.add_metric(labels, float(u.used_bytes))
        stray_count.add_metric(labels, float(len(u.pids)))
    yield from (used, share, over, stray_bytes, stray_count)


def make_registry(
    samples: SampleSource | Callable[[], Sequence[GpuSample]] | None = None,
    scheduler: SchedulerView | Callable[[], SchedulerState] | None = None,
) -> TelemetryRegistry:
    """A fresh registry (no process or platform collectors) holding one `TelemetryCollector`.

    `samples`: an object with `latest_samples()` (a `Sampler`) or a callable returning samples.
    `scheduler`: an object with `scheduler_state()` or a callable returning a `SchedulerState`; None on a
    node exporter, whose GPU series then have empty `job` and `queue` labels."""
    read_samples = cast("Callable[[], Sequence[GpuSample]] | None", _method(samples, "latest_samples"))
    read_state = cast("Callable[[], SchedulerState] | None", _method(scheduler, "scheduler_state"))
    return TelemetryRegistry(TelemetryCollector(read_samples, read_state))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels_text(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    return "{" + ",".join(f'{n}="{_escape_label(v)}"' for n, v in zip(names, values, strict=True)) + "}"


def _number(value: float) -> str:
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _family_text(family: Metric) -> str:
    """A family in text format 0.0.4, as prometheus_client writes it (counters get their `_total` name)."""
    name = family.name + "_total" if family.type == "counter" else family.name
    lines = [f"# HELP {name} {_escape_help(family.documentation)}\n# TYPE {name} {family.type}\n"]
    for s in family.samples:
        labels = _labels_text(list(s.labels), list(s.labels.values()))
        lines.append(f"{s.name}{labels} {_number(s.value)}\n")
    return "".join(lines)


class TelemetryRegistry(CollectorRegistry):
    """A registry holding one `TelemetryCollector`, which `render` writes through its fast path."""

    def __init__(self, collector: TelemetryCollector) -> None:
        super().__init__(auto_describe=False)
        self.telemetry = collector
        self.register(collector)


def _method(source: object, name: str) -> object:
    """`source.name` if it has that method, else `source` itself (already a callable, or None)."""
    return getattr(source, name, source)


def render(registry: CollectorRegistry) -> bytes:
    """The Prometheus text exposition (format 0.0.4, `CONTENT_TYPE`) of `registry`: the fast writer for a
    registry from `make_registry`, prometheus_client's own for any other."""
    if isinstance(registry, TelemetryRegistry):
        return registry.telemetry.exposition()
    return generate_latest(registry)


def metrics_endpoint(registry: CollectorRegistry) -> Callable[[], tuple[bytes, str]]:
    """For the HTTP API's `/metrics`: a callable returning (body, content type)."""
    return lambda: (render(registry), CONTENT_TYPE)
