"""`gpufleet bench telemetry`: what GPU telemetry costs, as one JSON object.

(a) One sample of 8 GPUs with the emulated probe and with the recorded probe (µs, median).
(b) One `/metrics` render of 8 nodes x 8 GPUs and 1,000 jobs in 8 queues (ms, median; goal < 10 ms). The
    scheduler view recomputes its per-queue figures from the 1,000 job records on every scrape, as a
    control plane that reads state on scrape does, so that work is inside the figure.
(c) CPU share of one core at the default 5 s interval: one sample of all 64 GPUs, storing it in the ring,
    and one scrape per interval, measured as process CPU time (goal < 1 %).

No GPU is involved: NVML's own cost depends on the driver and is not measured here.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.adapters.metrics import QueueMetrics, SchedulerState, make_registry, render, wait_histogram
from gpufleet.adapters.probes import EmulatedProbe, RecordedProbe, Recording, SampleRing
from gpufleet.domain.cluster import Node, make_node
from gpufleet.ports.gpu_probe import ActivityLevel, GpuActivity, GpuOwner

GiB = 1024**3
GOALS = {"render_ms": 10.0, "cpu_share_pct": 1.0}
INTERVAL_S = 5.0
LEVELS = (ActivityLevel.BUSY, ActivityLevel.BUSY, ActivityLevel.LIGHT, ActivityLevel.IDLE)


@dataclass(frozen=True, slots=True)
class _Job:
    id: str
    queue: str
    running: bool
    submitted: float
    started: float | None
    gpus: tuple[tuple[str, int], ...]


def _fleet(nodes: int, gpus: int) -> list[Node]:
    return [make_node(f"node-{n:02d}", "A100-80GB", gpus, 80 * GiB, nvlink_groups=2) for n in range(nodes)]


def _jobs(fleet: list[Node], count: int, queues: int) -> list[_Job]:
    """One job per GPU running (64), the rest pending or finished-and-started, spread over the queues."""
    keys = [(node.name, gpu.index) for node in fleet for gpu in node.gpus]
    jobs = []
    for i in range(count):
        running = i < len(keys)
        started = 1000.0 + 7.0 * i if running or i % 3 == 0 else None
        jobs.append(
            _Job(f"job-{i:05d}", f"queue-{i % queues}", running, 1000.0, started, (keys[i],) if running else ())
        )
    return jobs


class _View:
    """A scheduler view over job records, recomputed on every scrape."""

    def __init__(self, jobs: list[_Job], util: Callable[[], dict[tuple[str, int], float]]) -> None:
        self.jobs = jobs
        self.util = util

    def scheduler_state(self) -> SchedulerState:
        util = self.util()
        pending: dict[str, int] = {}
        running: dict[str, list[_Job]] = {}
        waits: dict[str, list[float]] = {}
        owners = {}
        for job in self.jobs:
            pending.setdefault(job.queue, 0)
            running.setdefault(job.queue, [])
            waits.setdefault(job.queue, [])
            if job.running:
                running[job.queue].append(job)
                for key in job.gpus:
                    owners[key] = GpuOwner(job.id, job.queue)
            elif job.started is None:
                pending[job.queue] += 1
            if job.started is not None:
                waits[job.queue].append(job.started - job.submitted)
        queues = []
        for name in sorted(pending):
            held = [key for job in running[name] for key in job.gpus]
            used = sum(util.get(key, 0.0) for key in held) / 100.0
            idle = sum(1 for key in held if util.get(key, 100.0) < 5.0)
            queues.append(
                QueueMetrics(
                    name,
                    pending[name],
                    len(running[name]),
                    wait_histogram(waits[name]),
                    float(len(held)),
                    used,
                    float(idle),
                    idle * 3600.0,
                    3,
                )
            )
        return SchedulerState(tuple(queues), owners, 0.12, 3.5, 1000, 12.5, 0.011)


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_telemetry_bench(repeats: int = 200) -> dict[str, object]:
    """Run the three measurements; `repeats` per timed operation (medians are reported)."""
    one_node = _fleet(1, 8)
    activity = {(one_node[0].name, i): GpuActivity(f"j{i}", LEVELS[i % len(LEVELS)]) for i in range(8)}
    emulated = EmulatedProbe(one_node, lambda: activity, seed=1)
    clock = iter(range(10**9))
    emulated_s = _median_s(lambda: emulated.sample(float(next(clock))), repeats)
    recording = Recording(
        source="emulated (bench)",
        emulated=True,
        hostname=one_node[0].name,
        interval_s=INTERVAL_S,
        frames=tuple(tuple(emulated.sample(float(t))) for t in range(12)),
    )
    recorded = RecordedProbe(recording)
    recorded_s = _median_s(lambda: recorded.sample(float(next(clock)) * INTERVAL_S), repeats)

    fleet = _fleet(8, 8)
    jobs = _jobs(fleet, 1000, 8)
    fleet_activity = {
        key: GpuActivity(job.id, LEVELS[i % len(LEVELS)]) for i, job in enumerate(jobs) for key in job.gpus
    }
    fleet_probe = EmulatedProbe(fleet, lambda: fleet_activity, seed=2)
    ring = SampleRing(720)
    ring.add(fleet_probe.sample(0.0))
    view = _View(jobs, lambda: {s.key: s.gpu_util or 0.0 for s in ring.latest()})
    registry = make_registry(ring.latest, view)
    body = render(registry)
    render_s = _median_s(lambda: render(registry), repeats)

    rounds = max(20, repeats // 4)
    cpu_start = time.process_time()
    for step in range(rounds):
        ring.add(fleet_probe.sample(float(step) * INTERVAL_S))
        render(registry)
    cpu_per_interval_s = (time.process_time() - cpu_start) / rounds
    cpu_share_pct = 100.0 * cpu_per_interval_s / INTERVAL_S

    return {
        "benchmark": "telemetry",
        "sample_8_gpus_us": {"emulated": round(emulated_s * 1e6, 1), "recorded": round(recorded_s * 1e6, 1)},
        "render": {
            "nodes": len(fleet),
            "gpus": sum(len(n.gpus) for n in fleet),
            "jobs": len(jobs),
            "queues": 8,
            "bytes": len(body),
            "series": sum(1 for line in body.splitlines() if line and not line.startswith(b"#")),
            "ms": round(render_s * 1e3, 3),
            "goal_ms": GOALS["render_ms"],
            "met": render_s * 1e3 < GOALS["render_ms"],
        },
        "cpu": {
            "interval_s": INTERVAL_S,
            "per_interval_ms": round(cpu_per_interval_s * 1e3, 3),
            "share_of_one_core_pct": round(cpu_share_pct, 4),
            "goal_pct": GOALS["cpu_share_pct"],
            "met": cpu_share_pct < GOALS["cpu_share_pct"],
            "what": "one emulated sample of 64 GPUs into the ring + one /metrics render, per interval",
        },
        "repeats": repeats,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "note": "emulated and recorded probes only; NVML's own cost depends on the driver and is not measured",
    }
