"""Running several cycles: turn a cycle's decisions into the next snapshot, as the control loop would.

Also builds running jobs at exact places, for tests that need a particular layout (preemption).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from gpufleet.domain import ClusterSnapshot, GpuShare, Job, JobId, Node, RunningJob, WorkerPlacement
from gpufleet.scheduling.cycle import CycleResult, run_cycle
from gpufleet.scheduling.plugin_api import Profile
from tests.kit.invariants import check_all


def worker_on(job: Job, node: Node, gpus: Sequence[int] = ()) -> WorkerPlacement:
    """One worker of `job` on `node` holding GPUs `gpus`, as the core would record it."""
    request = job.request
    if request.fractional:
        shares = tuple(GpuShare(i, request.gpu_milli, request.gpu_memory) for i in gpus)
    else:
        shares = tuple(GpuShare(i, 1000, node.gpus[i].memory) for i in gpus)
    return WorkerPlacement(node.name, shares, request.cpu_milli, request.memory)


def running_on(
    job: Job,
    layout: Sequence[tuple[Node, Sequence[int]]],
    *,
    started_at: float = 0.0,
    last_checkpoint_at: float | None = None,
    evicting_for: JobId | None = None,
) -> RunningJob:
    """A running job with one worker per `(node, gpu indices)` entry of `layout`."""
    workers = tuple(worker_on(job, node, gpus) for node, gpus in layout)
    return RunningJob(job, workers, started_at, last_checkpoint_at, evicting_for)


def running_from(
    result: CycleResult,
    jobs: Iterable[Job],
    *,
    started_at: float = 0.0,
    last_checkpoint_at: float | None = None,
) -> tuple[RunningJob, ...]:
    """The placements of `result` as running jobs (`jobs`: at least the placed ones)."""
    by_id = {j.id: j for j in jobs}
    return tuple(RunningJob(by_id[p.job], p.workers, started_at, last_checkpoint_at) for p in result.placements)


def advance(
    snapshot: ClusterSnapshot,
    result: CycleResult,
    jobs: Iterable[Job],
    *,
    now: float | None = None,
    stop_victims: bool = False,
) -> ClusterSnapshot:
    """The next snapshot: placements run; victims and moved jobs are marked evicting, or gone with `stop_victims`.

    Jobs that preempted in this cycle are nominated (they go first next cycle), as are the earlier
    nominees that are still pending.
    """
    at = snapshot.now if now is None else now
    # Moved jobs stop for nobody in particular (the reconciler's `set_evicting(job, "")`).
    victims: Mapping[JobId, JobId] = {
        **{m.job: "" for m in result.migrations},
        **{p.victim: p.for_job for p in result.preemptions},
    }
    kept: list[RunningJob] = []
    for r in snapshot.running:
        if r.id in victims:
            if stop_victims:
                continue
            kept.append(dataclasses.replace(r, evicting_for=victims[r.id]))
        else:
            kept.append(r)
    started = running_from(result, jobs, started_at=at)
    placed_ids = {p.job for p in result.placements}
    nominated = {p.for_job for p in result.preemptions} | (set(snapshot.nominated) - placed_ids)
    return dataclasses.replace(snapshot, running=(*kept, *started), now=at, nominated=tuple(sorted(nominated)))


def still_pending(pending: Iterable[Job], result: CycleResult) -> list[Job]:
    placed = {p.job for p in result.placements}
    return [j for j in pending if j.id not in placed]


def run_cycles(
    snapshot: ClusterSnapshot,
    pending: Sequence[Job],
    profile: Profile,
    cycles: int,
    *,
    step: float = 60.0,
    stop_victims: bool = True,
) -> tuple[list[CycleResult], ClusterSnapshot, list[Job]]:
    """Run `cycles` cycles; between them placements start and victims stop (or keep evicting)."""
    results: list[CycleResult] = []
    waiting = list(pending)
    for _ in range(cycles):
        result = run_cycle(snapshot, waiting, profile)
        results.append(result)
        snapshot = advance(snapshot, result, waiting, now=snapshot.now + step, stop_victims=stop_victims)
        waiting = still_pending(waiting, result)
    return results, snapshot, waiting


def without(snapshot: ClusterSnapshot, job_ids: Iterable[JobId]) -> ClusterSnapshot:
    """The snapshot with these running jobs gone (stopped)."""
    gone = set(job_ids)
    return dataclasses.replace(snapshot, running=tuple(r for r in snapshot.running if r.id not in gone))


def placed(result: CycleResult) -> dict[JobId, tuple[WorkerPlacement, ...]]:
    return {p.job: p.workers for p in result.placements}


def nodes_of(result: CycleResult, job_id: JobId) -> list[str]:
    """The node of each worker of a placed job, in worker order."""
    return [w.node for w in placed(result)[job_id]]


def gpus_of(result: CycleResult, job_id: JobId) -> list[tuple[str, tuple[int, ...]]]:
    """`(node, gpu indices)` of each worker of a placed job."""
    return [(w.node, w.gpu_indices) for w in placed(result)[job_id]]


def victims(result: CycleResult) -> dict[JobId, JobId]:
    """victim -> the job it is preempted for."""
    return {p.victim: p.for_job for p in result.preemptions}


def codes(result: CycleResult) -> dict[JobId, str]:
    """Each waiting job's code, as its string value (readable in table expectations)."""
    return {j: s.code.value for j, s in result.waiting.items()}


def run(snapshot: ClusterSnapshot, pending: Sequence[Job], profile: Profile) -> CycleResult:
    """`run_cycle`, then every invariant of the kit checked on the result."""
    result = run_cycle(snapshot, pending, profile)
    check_all(snapshot, pending, result, profile)
    return result
