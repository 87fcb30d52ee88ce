"""`gpufleet bench scheduler`: placements per second of the scheduling core on a synthetic fleet.

The fleet is heterogeneous (several GPU models, 8 GPUs per node in two NVLink groups, racks of 16),
starts with some fractional load, and the pending jobs mix fractional, 1/2/4/8-GPU jobs and gangs
(10 %), model constraints and priorities, spread over several team queues with quotas in one cohort.
Cycles run, placed jobs becoming running ones, until a cycle places nothing more; they share one
`InventoryCache` (the fleet's table and capacity memo, and what was derived from each running job), as the
control loop's cycles do.

Two rates, because a job is not a unit of work: `placements_per_s` counts jobs placed (a gang is one),
`gpus_placed_per_s` the GPUs they were given (a half-GPU share counts 0.5). A profile that runs small jobs
first places many more jobs for about the same GPUs.

`host_yardstick_before`/`_after`: the host's speed right before and after the cycles (`gpufleet.bench.yardstick`),
so that a figure moved by the host is told apart from one moved by the code.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from gpufleet.bench import yardstick
from gpufleet.domain import (
    ClusterSnapshot,
    GiB,
    GpuShare,
    Job,
    Node,
    QueueSpec,
    Quota,
    RunningJob,
    WorkerPlacement,
    WorkerRequest,
    make_node,
)
from gpufleet.domain.snapshot import Placement
from gpufleet.policies.catalog import profile as named_profile
from gpufleet.scheduling.cycle import CycleResult, run_cycle
from gpufleet.scheduling.plugin_api import Profile
from gpufleet.scheduling.state import InventoryCache

MODELS: tuple[tuple[str, int, float], ...] = (
    ("H100-80GB", 80, 0.2),
    ("A100-80GB", 80, 0.3),
    ("V100-32GB", 32, 0.25),
    ("T4", 16, 0.25),
)
QUEUES = 8


@dataclass(frozen=True)
class Fleet:
    nodes: tuple[Node, ...]
    running: tuple[RunningJob, ...]
    queues: tuple[QueueSpec, ...]
    pending: tuple[Job, ...]


def build_fleet(nodes: int, pending: int, seed: int) -> Fleet:
    rng = np.random.default_rng(seed)
    names = [m for m, _, _ in MODELS]
    weights = np.array([w for _, _, w in MODELS])
    model_of = rng.choice(len(MODELS), size=nodes, p=weights / weights.sum())
    fleet_nodes = tuple(
        make_node(
            f"node-{i:05d}",
            MODELS[model_of[i]][0],
            8,
            MODELS[model_of[i]][1] * GiB,
            cpu_milli=128_000,
            memory=1024 * GiB,
            nvlink_groups=2,
            rack=f"rack-{i // 16:04d}",
            zone=f"zone-{i // 512}",
        )
        for i in range(nodes)
    )
    total_gpus = nodes * 8
    per_queue = total_gpus * 1000 // QUEUES
    queues = tuple(
        QueueSpec(f"team-{q}", {"gpu": Quota(nominal=per_queue)}, cohort="org", weight=1.0 + (q % 2))
        for q in range(QUEUES)
    )
    # Some fractional load: a tenth of the nodes run a half-GPU job on GPU 0.
    running = tuple(
        RunningJob(
            Job(f"warm-{i}", f"team-{i % QUEUES}", WorkerRequest(gpus=1, gpu_milli=500), submit_seq=-1),
            (WorkerPlacement(fleet_nodes[i].name, (GpuShare(0, 500, 0),)),),
        )
        for i in range(0, nodes, 10)
    )
    jobs = job_mix(rng, pending, names)
    return Fleet(fleet_nodes, running, queues, tuple(jobs))


def job_mix(rng: np.random.Generator, count: int, models: list[str], first: int = 0) -> list[Job]:
    """`count` jobs of the benchmark's mix, numbered from `first`: 20 % fractional (0.25 or 0.5 GPU), 65 %
    1/2/4/8 GPUs, 15 % gangs of 2-4 x 8 GPUs; 20 % of the GPU jobs allowed on two models only; priorities
    0-2; spread evenly over the queues. Jobs are submitted one second apart."""
    kinds = rng.choice(7, size=count, p=[0.2, 0.3, 0.15, 0.1, 0.1, 0.1, 0.05])
    jobs = []
    for k in range(first, first + count):
        kind = int(kinds[k - first])
        workers = 1
        if kind == 0:
            request = WorkerRequest(gpus=1, gpu_milli=int(rng.choice([250, 500])), cpu_milli=2000)
        elif kind in (1, 2, 3, 4):
            request = WorkerRequest(gpus=(1, 2, 4, 8)[kind - 1], cpu_milli=8000, memory=64 * GiB)
        else:
            workers = int(rng.integers(2, 5))
            request = WorkerRequest(gpus=8, cpu_milli=32_000, memory=256 * GiB)
        if rng.random() < 0.2 and request.gpus:
            allowed = frozenset(rng.choice(models, size=2, replace=False).tolist())
            request = WorkerRequest(
                request.gpus, request.gpu_milli, request.gpu_memory, request.cpu_milli, request.memory, allowed
            )
        jobs.append(
            Job(
                f"job-{k:06d}",
                f"team-{int(rng.integers(QUEUES))}",
                request,
                workers=workers,
                priority=int(rng.integers(0, 3)),
                submit_seq=k,
                submitted_at=float(k),
            )
        )
    return jobs


@dataclass(frozen=True)
class Cycle:
    """One benchmark cycle: what the core was given, what it decided, and how long it took."""

    snapshot: ClusterSnapshot
    pending: tuple[Job, ...]
    result: CycleResult
    seconds: float


def cycles(fleet: Fleet, profile: Profile, max_cycles: int = 50) -> Iterator[Cycle]:
    """`run_cycle` on a fresh snapshot until a cycle decides nothing: placed jobs run from then on,
    preempted ones are stopped at once (the benchmark's backend) and wait again, nominated."""
    running = {r.id: r for r in fleet.running}
    waiting = {j.id: j for j in fleet.pending}
    now = 0.0
    nominated: set[str] = set()
    # The node inventory's table and memo, kept across cycles as a control loop keeps them.
    inventory = InventoryCache()
    for _ in range(max_cycles):
        snapshot = ClusterSnapshot(
            fleet.nodes, tuple(running.values()), fleet.queues, now=now, nominated=tuple(sorted(nominated))
        )
        pending = tuple(waiting.values())
        start = time.perf_counter()
        result = run_cycle(snapshot, pending, profile, inventory=inventory)
        elapsed = time.perf_counter() - start
        yield Cycle(snapshot, pending, result, elapsed)
        for placement in result.placements:
            job = waiting.pop(placement.job)
            running[job.id] = _running(job, placement, now)
        for preemption in result.preemptions:
            victim = running.pop(preemption.victim)
            waiting[victim.id] = victim.job
            nominated.add(preemption.for_job)
        nominated -= {p.job for p in result.placements}
        now += 60.0
        if not result.placements and not result.preemptions:
            return


def placed_gpus(placement: Placement) -> float:
    """The GPUs a placement holds, fractions as fractions."""
    return sum(share.milli for worker in placement.workers for share in worker.gpus) / 1000.0


def run(nodes: int, pending: int, seed: int = 0, policy: str = "default", max_cycles: int = 50) -> dict[str, object]:
    fleet = build_fleet(nodes, pending, seed)
    yardstick_before = yardstick.measure()
    placed = preempted = count = 0
    gpus = seconds = 0.0
    first_cycle_s = 0.0
    still_pending = len(fleet.pending)
    for cycle in cycles(fleet, named_profile(policy), max_cycles):
        if not count:
            first_cycle_s = cycle.seconds
        count += 1
        seconds += cycle.seconds
        placed += len(cycle.result.placements)
        preempted += len(cycle.result.preemptions)
        gpus += sum(placed_gpus(p) for p in cycle.result.placements)
        still_pending = len(cycle.pending) - len(cycle.result.placements) + len(cycle.result.preemptions)
    yardstick_after = yardstick.measure()
    return {
        "benchmark": "scheduler",
        "policy": policy,
        "seed": seed,
        "nodes": nodes,
        "gpus": nodes * 8,
        "pending": pending,
        "placed": placed,
        "gpus_placed": round(gpus, 3),
        "preempted": preempted,
        "still_pending": still_pending,
        "cycles": count,
        "seconds": round(seconds, 4),
        "first_cycle_seconds": round(first_cycle_s, 4),
        "placements_per_s": round(placed / seconds, 1) if seconds else 0.0,
        "gpus_placed_per_s": round(gpus / seconds, 1) if seconds else 0.0,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "host_yardstick_before": yardstick_before,
        "host_yardstick_after": yardstick_after,
    }


def _running(job: Job, placement: Placement, now: float) -> RunningJob:
    return RunningJob(job, placement.workers, started_at=now)
