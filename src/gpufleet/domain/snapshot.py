"""The immutable input of a scheduling cycle and the decisions that come out of it."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.domain.cluster import Node, WorkerPlacement
from gpufleet.domain.errors import FieldProblem, check
from gpufleet.domain.jobs import JobId, RunningJob
from gpufleet.domain.quotas import QueueSpec
from gpufleet.domain.windows import Window


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """The cluster as one cycle sees it: nodes, what runs on them, queues, and the time `now`.

    Jobs whose placement was decided but not yet confirmed are in `running` too (assume-then-bind).
    `nominated` lists pending jobs that preempted others in an earlier cycle: they go first, so the
    room their victims left is not taken by someone else (Kubernetes' nominated pods). `windows` hold nodes for a
    queue or for maintenance: a job starts on them only if the window lets it (`Window.lets`).
    """

    nodes: tuple[Node, ...]
    running: tuple[RunningJob, ...] = ()
    queues: tuple[QueueSpec, ...] = ()
    now: float = 0.0
    seed: int = 0
    nominated: tuple[JobId, ...] = ()
    windows: tuple[Window, ...] = ()  # an admin's maintenance windows and queue reservations (`domain/windows.py`)

    def __post_init__(self) -> None:
        problems: list[FieldProblem] = []
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            problems.append(FieldProblem("nodes", "node names repeat", "give every node a unique name"))
        queue_names = [q.name for q in self.queues]
        if len(set(queue_names)) != len(queue_names):
            problems.append(FieldProblem("queues", "queue names repeat", "give every queue a unique name"))
        ids = [r.id for r in self.running]
        if len(set(ids)) != len(ids):
            problems.append(FieldProblem("running", "a job id runs twice", "each job runs once"))
        check(problems, "cluster snapshot")


@dataclass(frozen=True, slots=True)
class Placement:
    """A decision: start `job` with these workers (all of them, for a gang)."""

    job: JobId
    workers: tuple[WorkerPlacement, ...]


@dataclass(frozen=True, slots=True)
class Preemption:
    """A decision: stop `victim` (checkpoint signal, grace period) to make room for `for_job`."""

    victim: JobId
    for_job: JobId
    reason: str


@dataclass(frozen=True, slots=True)
class Migration:
    """A decision: stop `job` (checkpoint signal, grace period) so that it starts again elsewhere, on the GPUs its
    policy plans for it (a round allocator moving a job to the GPU model of its share). It goes back to its queue
    with what it saved, as a preempted job does; no other job claims its room."""

    job: JobId
    reason: str


@dataclass(frozen=True, slots=True)
class ReservedStart:
    """A start reserved for a job that has waited too long (EASY backfill): it runs on `nodes` by `start_by`, when
    the running jobs it waits for (`waits_for`) have ended by their run time limits; until then only jobs that end
    before `start_by`, or that use other room, may go first. `start_by` None: one of those jobs declares no limit,
    so the room is kept from every other job until they end (the nodes are drained for it)."""

    job: JobId
    start_by: float | None
    nodes: tuple[str, ...]
    waits_for: tuple[JobId, ...]
