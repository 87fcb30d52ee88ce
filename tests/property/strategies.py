"""Random but valid scheduling worlds: heterogeneous clusters, queues with quotas and cohorts, running
jobs (placed by a first cycle, so they never overlap or exceed quota), and pending jobs of every kind."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hypothesis import strategies as st

from gpufleet.domain import (
    ClusterSnapshot,
    GiB,
    Job,
    Node,
    QueueSpec,
    Quota,
    RunningJob,
    WorkerRequest,
    gpu_model_key,
    make_node,
)
from gpufleet.policies.catalog import PROFILES, profile
from gpufleet.scheduling.cycle import run_cycle
from tests.kit import GPU_MEMORY_GIB

MODELS = ("A100-80GB", "H100", "L4", "T4")
ABSENT_MODEL = "B200"  # never in a generated cluster
PROFILE_NAMES = tuple(sorted(PROFILES))
QUEUE_NAMES = ("team-a", "team-b", "team-c")
NOW = 1000.0


@dataclass(frozen=True)
class World:
    snapshot: ClusterSnapshot
    pending: tuple[Job, ...]
    profile_name: str

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        lines = [f"World(profile={self.profile_name!r}, now={self.snapshot.now})"]
        lines += [f"  node {n!r}" for n in self.snapshot.nodes]
        lines += [f"  queue {q!r}" for q in self.snapshot.queues]
        lines += [f"  running {r!r}" for r in self.snapshot.running]
        lines += [f"  pending {j!r}" for j in self.pending]
        return "\n".join(lines)


@st.composite
def nodes(draw: st.DrawFn) -> tuple[Node, ...]:
    models = draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=3, unique=True))
    count = draw(st.integers(1, 5))
    out: list[Node] = []
    for i in range(count):
        model = draw(st.sampled_from(models))
        gpus = draw(st.integers(1, 8))
        out.append(
            make_node(
                f"n{i:02d}",
                model,
                gpus,
                GPU_MEMORY_GIB[model] * GiB,
                cpu_milli=draw(st.sampled_from((8_000, 32_000, 96_000))),
                memory=draw(st.sampled_from((32 * GiB, 256 * GiB))),
                nvlink_groups=draw(st.integers(1, min(gpus, 4))),
                rack=draw(st.sampled_from(("r0", "r1"))),
            )
        )
        if draw(st.integers(0, 2)) == 0:  # a spot node, sometimes gated by its pool's open breaker
            admits = draw(st.sampled_from(("all", "all", "checkpointing", "none", "probe")))
            zone = draw(st.sampled_from(("", "z1")))  # two spot pools
            out[-1] = dataclasses.replace(out[-1], pool="spot", admits=admits, zone=zone)
    return tuple(out)


@st.composite
def quotas(draw: st.DrawFn, max_units: int, unit: int) -> Quota:
    if draw(st.integers(0, 9)) == 0:
        return Quota()  # unlimited
    nominal = draw(st.integers(0, max_units))
    borrowing = draw(st.one_of(st.none(), st.integers(0, max_units)))
    lending = draw(st.one_of(st.none(), st.integers(0, nominal)))
    return Quota(
        nominal * unit,
        None if borrowing is None else borrowing * unit,
        None if lending is None else lending * unit,
    )


@st.composite
def queue_specs(draw: st.DrawFn, models: tuple[str, ...]) -> tuple[QueueSpec, ...]:
    if draw(st.integers(0, 4)) == 0:
        return ()  # no queues: no quotas, any queue name goes
    specs: list[QueueSpec] = []
    for name in QUEUE_NAMES[: draw(st.integers(1, 3))]:
        table: dict[str, Quota] = {}
        if draw(st.booleans()):
            table["gpu"] = draw(quotas(32, 500))  # in half GPUs
        if draw(st.integers(0, 3)) == 0:
            for model in draw(st.lists(st.sampled_from(models), min_size=1, max_size=2, unique=True)):
                table[gpu_model_key(model)] = draw(quotas(16, 500))
        if draw(st.integers(0, 4)) == 0:
            table["cpu"] = draw(quotas(32, 1000))
        specs.append(
            QueueSpec(
                name,
                table,
                cohort=draw(st.sampled_from((None, "c1", "c1", "c2"))),
                weight=draw(st.sampled_from((0.5, 1.0, 2.0))),
                deprioritised=draw(st.integers(0, 5)) == 0,  # a spent budget, action deprioritise
            )
        )
    return tuple(specs)


@st.composite
def requests(draw: st.DrawFn, kind: str, models: tuple[str, ...]) -> WorkerRequest:
    cpu = draw(st.sampled_from((0, 0, 1_000, 4_000, 16_000)))
    memory = draw(st.sampled_from((0, 0, GiB, 16 * GiB)))
    spot = draw(st.sampled_from(("never", "never", "allowed", "preferred")))
    checkpoints = draw(st.booleans())
    if kind == "cpu":
        return WorkerRequest(gpus=0, cpu_milli=max(cpu, 500), memory=memory, spot=spot, checkpoints=checkpoints)
    allowed: frozenset[str] = frozenset()
    if draw(st.integers(0, 3)) == 0:
        allowed = frozenset(draw(st.sets(st.sampled_from((*models, ABSENT_MODEL)), min_size=1, max_size=2)))
    if kind == "fraction":
        return WorkerRequest(
            gpus=1,
            gpu_milli=draw(st.sampled_from((100, 250, 500, 500, 750, 999))),
            gpu_memory=draw(st.sampled_from((0, 0, 4 * GiB, 12 * GiB, 30 * GiB))),
            cpu_milli=cpu,
            memory=memory,
            models=allowed,
            spot=spot,
            checkpoints=checkpoints,
        )
    gpus = draw(st.integers(1, 8) if kind == "whole" else st.integers(1, 4))
    return WorkerRequest(
        gpus=gpus,
        gpu_memory=draw(st.sampled_from((0, 0, 0, 20 * GiB, 40 * GiB))),
        cpu_milli=cpu,
        memory=memory,
        models=allowed,
        spot=spot,
        checkpoints=checkpoints,
    )


@st.composite
def jobs(
    draw: st.DrawFn, job_id: str, queue_names: tuple[str, ...], models: tuple[str, ...], seq: int, top_priority: int
) -> Job:
    kind = draw(st.sampled_from(("whole", "whole", "fraction", "fraction", "gang", "elastic", "cpu")))
    request = draw(requests(kind, models))
    workers = 1
    min_workers: int | None = None
    if kind in ("gang", "elastic"):
        workers = draw(st.integers(2, 4))
        if kind == "elastic":
            min_workers = draw(st.integers(1, workers))
    return Job(
        id=job_id,
        queue=draw(st.sampled_from(queue_names)),
        request=request,
        workers=workers,
        min_workers=min_workers,
        priority=draw(st.integers(0, top_priority)),
        preemptible=draw(st.sampled_from((True, True, True, False))),
        submit_seq=seq,
        submitted_at=float(draw(st.integers(0, 4)) * 10),  # ties on purpose: seq and id break them
        attained_gpu_seconds=draw(st.sampled_from((0.0, 1_800.0, 7_200.0, 50_000.0))),
    )


@st.composite
def job_lists(
    draw: st.DrawFn,
    prefix: str,
    queue_names: tuple[str, ...],
    models: tuple[str, ...],
    max_size: int,
    top_priority: int = 3,
) -> tuple[Job, ...]:
    count = draw(st.integers(0, max_size))
    return tuple(draw(jobs(f"{prefix}{i:02d}", queue_names, models, i, top_priority)) for i in range(count))


@st.composite
def worlds(
    draw: st.DrawFn,
    profile_names: tuple[str, ...] = PROFILE_NAMES,
    max_pending: int = 10,
    pressure: bool | None = None,
) -> World:
    """A cluster with jobs already running (placed by a warm-up cycle under the same quotas), some of
    them evicting, some nodes cordoned or failed since, and a list of pending jobs.

    Under `pressure` (drawn when None) the warm-up fills most nodes, so that pending jobs contend
    for GPUs and the preempting profiles have something to do."""
    cluster_nodes = draw(nodes())
    models = tuple(sorted({g.model for n in cluster_nodes for g in n.gpus}))
    queues = draw(queue_specs(models))
    queue_names = tuple(q.name for q in queues) or QUEUE_NAMES[:2]

    # Running jobs mostly of low priority, so that pending ones of higher priority may preempt them.
    warm_jobs = draw(job_lists("r", queue_names, models, max_size=14, top_priority=1))
    if pressure is None:
        pressure = draw(st.booleans())
    if pressure:
        fill = [
            Job(
                f"r{len(warm_jobs) + i:02d}",
                draw(st.sampled_from(queue_names)),
                WorkerRequest(gpus=draw(st.integers(1, len(n.gpus)))),
                priority=draw(st.integers(0, 1)),
                preemptible=draw(st.sampled_from((True, True, True, False))),
                submit_seq=len(warm_jobs) + i,
            )
            for i, n in enumerate(cluster_nodes)
        ]
        warm_jobs = (*warm_jobs, *fill)
    warm_profile = draw(st.sampled_from(PROFILE_NAMES))
    warm = run_cycle(ClusterSnapshot(cluster_nodes, (), queues), warm_jobs, profile(warm_profile))
    by_id = {j.id: j for j in warm_jobs}
    pending = draw(job_lists("p", queue_names, models, max_size=max_pending, top_priority=4 if pressure else 3))
    evicting_targets = (None, None, None, None, "p00", "p01", "gone")
    running: list[RunningJob] = []
    for placement in warm.placements:
        started = float(draw(st.integers(0, 900)))
        checkpoint = draw(st.one_of(st.none(), st.integers(int(started), int(NOW)).map(float)))
        running.append(
            RunningJob(
                by_id[placement.job],
                placement.workers,
                started_at=started,
                last_checkpoint_at=checkpoint,
                evicting_for=draw(st.sampled_from(evicting_targets)),
            )
        )
    # Nodes cordoned or failed after the warm-up: their running jobs stay, new work may not go there.
    later = tuple(
        dataclasses.replace(
            n,
            cordoned=draw(st.integers(0, 5)) == 0,
            healthy=draw(st.integers(0, 7)) != 0,
        )
        for n in cluster_nodes
    )
    snapshot = ClusterSnapshot(later, tuple(running), queues, now=NOW)
    return World(snapshot, pending, draw(st.sampled_from(profile_names)))
