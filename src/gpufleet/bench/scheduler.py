"""`gpufleet bench scheduler`: placements per second of the scheduling core on a synthetic fleet.

The fleet is heterogeneous (several GPU models, 8 GPUs per node in two NVLink groups, racks of 16),
starts with some fractional load, and the pending jobs mix fractional, 1/2/4/8-GPU jobs and gangs
(10 %), model constraints and priorities, spread over several team queues with quotas in one cohort.
Cycles run, placed jobs becoming running ones, until a cycle places nothing more; they share one
`InventoryCache` (the fleet's table and capacity memo, and what was derived from each running job), as the
control loop's cycles do.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass

import numpy as np

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
from gpufleet.scheduling.cycle import run_cycle
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
    kinds = rng.choice(7, size=pending, p=[0.2, 0.3, 0.15, 0.1, 0.1, 0.1, 0.05])
    jobs = []
    for k in range(pending):
        kind = int(kinds[k])
        workers = 1
        if kind == 0:
            request = WorkerRequest(gpus=1, gpu_milli=int(rng.choice([250, 500])), cpu_milli=2000)
        elif kind in (1, 2, 3, 4):
            request = WorkerRequest(gpus=(1, 2, 4, 8)[kind - 1], cpu_milli=8000, memory=64 * GiB)
        else:
            workers = int(rng.integers(2, 5))
            request = WorkerRequest(gpus=8, cpu_milli=32_000, memory=256 * GiB)
        if rng.random() < 0.2 and request.gpus:
            allowed = frozenset(rng.choice(names, size=2, replace=False).tolist())
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
    return Fleet(fleet_nodes, running, queues, tuple(jobs))


def run(nodes: int, pending: int, seed: int = 0, policy: str = "default", max_cycles: int = 50) -> dict[str, object]:
    fleet = build_fleet(nodes, pending, seed)
    profile = named_profile(policy)
    running = {r.id: r for r in fleet.running}
    waiting = {j.id: j for j in fleet.pending}
    placed = preempted = cycles = 0
    seconds = 0.0
    cycle_seconds: list[float] = []
    now = 0.0
    nominated: set[str] = set()
    # The node inventory's table and memo, kept across cycles as a control loop keeps them.
    inventory = InventoryCache()
    while cycles < max_cycles:
        snapshot = ClusterSnapshot(
            fleet.nodes, tuple(running.values()), fleet.queues, now=now, nominated=tuple(sorted(nominated))
        )
        start = time.perf_counter()
        result = run_cycle(snapshot, tuple(waiting.values()), profile, inventory=inventory)
        elapsed = time.perf_counter() - start
        seconds += elapsed
        cycle_seconds.append(elapsed)
        cycles += 1
        for placement in result.placements:
            job = waiting.pop(placement.job)
            running[job.id] = _running(job, placement, now)
        for preemption in result.preemptions:  # the bench's backend stops victims at once
            victim = running.pop(preemption.victim)
            waiting[victim.id] = victim.job
            nominated.add(preemption.for_job)
        nominated -= {p.job for p in result.placements}
        placed += len(result.placements)
        preempted += len(result.preemptions)
        now += 60.0
        if not result.placements and not result.preemptions:
            break
    return {
        "benchmark": "scheduler",
        "policy": policy,
        "seed": seed,
        "nodes": nodes,
        "gpus": nodes * 8,
        "pending": pending,
        "placed": placed,
        "preempted": preempted,
        "still_pending": len(waiting),
        "cycles": cycles,
        "seconds": round(seconds, 4),
        "first_cycle_seconds": round(cycle_seconds[0], 4),
        "placements_per_s": round(placed / seconds, 1) if seconds else 0.0,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _running(job: Job, placement: Placement, now: float) -> RunningJob:
    return RunningJob(job, placement.workers, started_at=now)
