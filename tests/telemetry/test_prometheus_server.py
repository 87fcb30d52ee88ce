"""A real Prometheus server (Debian's `prometheus`, on loopback) scrapes our registry over HTTP, and the
series are read back through Prometheus' query API: names, labels and values survive a real scrape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import start_http_server

from gpufleet.adapters.metrics import QueueMetrics, SchedulerState, make_registry, wait_histogram
from gpufleet.adapters.probes import EmulatedProbe, Sampler, SampleRing
from gpufleet.domain.cluster import make_node
from gpufleet.ports.gpu_probe import ActivityLevel, GpuActivity, GpuOwner
from tests.telemetry.prom import free_port, get_json, prometheus_server, query, require, wait_for

GiB = 1024**3


class _World:
    """What the control plane would hold: an emulated node, who runs where, and queue figures."""

    def __init__(self) -> None:
        self.activity = {("n1", 0): GpuActivity("job-7", ActivityLevel.BUSY), ("n1", 1): GpuActivity("job-8")}
        self.pending = 3
        self.sampler = Sampler(
            EmulatedProbe([make_node("n1", "A100-80GB", 2, 80 * GiB)], lambda: self.activity, seed=1), SampleRing(10)
        )
        self.now = 0.0

    def latest_samples(self):
        self.now += 1.0
        self.sampler.tick(self.now)  # a fresh sample per scrape keeps the test fast and deterministic
        return self.sampler.latest_samples()

    def scheduler_state(self) -> SchedulerState:
        return SchedulerState(
            queues=(QueueMetrics("research", self.pending, 2, wait_histogram([5.0, 100.0]), 2.0, 1.9, 0.0, 0.0, 1),),
            owners={("n1", 0): GpuOwner("job-7", "research"), ("n1", 1): GpuOwner("job-8", "research")},
            fragmentation_ratio=0.0,
            cycles=4,
            cycle_seconds_sum=0.02,
            last_cycle_seconds=0.004,
        )


@pytest.fixture
def scraped(tmp_path: Path) -> Iterator[tuple[str, _World]]:
    require("prometheus")
    world = _World()
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=make_registry(world, world))
    try:
        with prometheus_server(f"127.0.0.1:{port}", tmp_path, scrape_interval_s=0.5) as base:
            yield base, world
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _target_up(base: str) -> bool:
    targets = get_json(base + "/api/v1/targets")["data"]["activeTargets"]
    return bool(targets) and targets[0]["health"] == "up"


def test_prometheus_scrapes_our_metrics_and_answers_queries(scraped: tuple[str, _World]) -> None:
    base, world = scraped
    wait_for(lambda: _target_up(base), 20, "Prometheus to scrape the gpufleet target")
    util = wait_for(lambda: query(base, 'DCGM_FI_DEV_GPU_UTIL{gpu="0"}'), 10, "the GPU series")
    (series,) = util
    labels = series["metric"]
    assert labels["__name__"] == "DCGM_FI_DEV_GPU_UTIL"
    assert labels["UUID"] == "GPU-n1-0"
    assert labels["Hostname"] == "n1"
    assert labels["modelName"] == "emulated A100-80GB"
    assert labels["device"] == "nvidia0"
    assert labels["job_id"] == "job-7"
    assert labels["queue"] == "research"
    assert labels["probe"] == "emulated"
    assert labels["job"] == "gpufleet"  # Prometheus' own scrape-job label, untouched by ours
    assert 85 <= float(series["value"][1]) <= 99

    (pending,) = query(base, 'gpufleet_queue_pending_jobs{queue="research"}')
    assert float(pending["value"][1]) == 3
    (fb,) = query(base, 'DCGM_FI_DEV_FB_TOTAL{gpu="1"}')
    assert float(fb["value"][1]) == 80 * 1024  # MiB, as dcgm-exporter
    (p50,) = query(base, 'histogram_quantile(0.5, gpufleet_queue_wait_seconds_bucket{queue="research"})')
    assert 0 < float(p50["value"][1]) <= 10
    by_queue = query(base, "sum by (queue) (DCGM_FI_DEV_GPU_UTIL)")
    assert [s["metric"] for s in by_queue] == [{"queue": "research"}]

    # State is read on scrape: a change shows up in Prometheus at the next scrape.
    world.pending = 11
    world.activity[("n1", 0)] = GpuActivity("job-7", ActivityLevel.IDLE)
    wait_for(
        lambda: float(query(base, 'gpufleet_queue_pending_jobs{queue="research"}')[0]["value"][1]) == 11,
        10,
        "the new pending count",
    )
    wait_for(
        lambda: float(query(base, 'DCGM_FI_DEV_GPU_UTIL{gpu="0"}')[0]["value"][1]) <= 2,
        10,
        "the idle job's utilisation",
    )
