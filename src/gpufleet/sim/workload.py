"""What the simulator replays: a cluster, its queues and a list of timed jobs, plus the tables some policies need.

Loaders for each public trace live in `gpufleet.sim.workloads`; this module holds the shared types only and
imports nothing of ours but `gpufleet.domain`.

    Workload        name, citation, license, nodes, queues, jobs sorted by (arrival, seq), throughput table
    TraceJob        a domain `Job` (arrival = `job.submitted_at`), its run time at reference speed, GPU-seconds
    ThroughputTable job type x GPU model x GPU count -> measured throughput (steps/s), relative speeds
                    (defined in `gpufleet.domain.throughput_table`, so that policies can read it; re-exported here)
    WorkloadError   a malformed or missing input; says which file, line and column, and how to fix it
                    (defined in `gpufleet.domain.errors`; re-exported here)
    ClusterEvent    a timed change to the cluster (node down/up, quota change, nodes added): `gpufleet.sim.events`
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpufleet.domain import Job, Node, QueueSpec
from gpufleet.domain.errors import WorkloadError
from gpufleet.domain.throughput_table import ThroughputEntry, ThroughputTable, model_key
from gpufleet.domain.windows import Window
from gpufleet.sim.events import AddNodes, ClusterEvent, event_problems

if TYPE_CHECKING:
    from gpufleet.sim.simulated_backend import WorkModel

__all__ = ["ThroughputEntry", "ThroughputTable", "TraceJob", "Workload", "WorkloadError"]


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace.

    `job.submitted_at` is the arrival time in seconds from the start of the trace and `job.submit_seq` the
    job's row order in the source (the tie-breaker). `duration` is the run time in seconds at reference
    speed (the trace's own hardware, or the workload's reference GPU model when it has a throughput table);
    None when the trace has none (e.g. openb pods in the FGD protocol, which never leave).
    `gpu_seconds_total` is the trace's own GPU-time figure when it gives one.
    """

    job: Job
    duration: float | None = None
    gpu_seconds_total: float | None = None

    def __post_init__(self) -> None:
        if self.duration is not None and not (math.isfinite(self.duration) and self.duration > 0):
            raise WorkloadError(f"job {self.job.id!r} has duration {self.duration}", "give seconds > 0, or None")
        if self.gpu_seconds_total is not None and not (
            math.isfinite(self.gpu_seconds_total) and self.gpu_seconds_total >= 0
        ):
            raise WorkloadError(
                f"job {self.job.id!r} has gpu_seconds_total {self.gpu_seconds_total}", "give seconds >= 0, or None"
            )

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def arrival(self) -> float:
        return self.job.submitted_at

    @property
    def seq(self) -> int:
        return self.job.submit_seq

    @property
    def job_type(self) -> str | None:
        """The throughput-table job type (Gavel), application (Pollux) or model (Tiresias); None if unknown."""
        return self.job.job_type or None

    @property
    def gpu_milli_total(self) -> int:
        return self.job.gpu_milli_total


@dataclass(frozen=True, slots=True)
class Workload:
    """A cluster, its queues and the jobs that arrive, ready to simulate.

    `citation` names the paper and data source (every report prints it); `license` says under what terms the
    data may be used; `assumptions` lists each choice the loader made that the source does not fix (GPU
    memory sizes, node shapes, distributions), to be printed with the results. `events` are timed changes to
    the cluster during the run (nodes failing, added, quotas changed); their nodes and queues must exist.
    `work`: how the jobs it covers advance at each size (elastic jobs whose rate depends on their GPU count
    and point of training, e.g. Pollux's applications); other jobs run their `duration` at reference speed.
    """

    name: str
    citation: str
    license: str
    nodes: tuple[Node, ...]
    queues: tuple[QueueSpec, ...]
    jobs: tuple[TraceJob, ...]
    throughput: ThroughputTable | None = None
    assumptions: tuple[str, ...] = ()
    events: tuple[ClusterEvent, ...] = ()
    work: WorkModel | None = None
    windows: tuple[Window, ...] = ()  # maintenance windows and queue reservations (`domain/windows.py`)

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not self.name.strip():
            problems.append("the name is empty")
        if not self.citation.strip():
            problems.append("the citation is empty")
        node_names = [n.name for n in self.nodes]
        if len(set(node_names)) != len(node_names):
            problems.append("node names repeat")
        queue_names = {q.name for q in self.queues}
        if len(queue_names) != len(self.queues):
            problems.append("queue names repeat")
        ids: set[str] = set()
        previous = (-math.inf, -1)
        for tj in self.jobs:
            key = (tj.job.submitted_at, tj.job.submit_seq)
            if key < previous:
                problems.append(f"jobs are not sorted by (arrival, seq) at {tj.id!r}")
                break
            previous = key
            if tj.id in ids:
                problems.append(f"job id {tj.id!r} repeats")
                break
            ids.add(tj.id)
            if tj.job.submitted_at < 0 or not math.isfinite(tj.job.submitted_at):
                problems.append(f"job {tj.id!r} arrives at {tj.job.submitted_at}")
                break
            if tj.job.queue not in queue_names:
                problems.append(f"job {tj.id!r} is in queue {tj.job.queue!r}, which the workload does not define")
                break
        problems += event_problems(self.events, set(node_names), queue_names)
        for window in self.windows:
            unknown = sorted(set(window.nodes) - set(node_names))
            if unknown:
                problems.append(f"reservation {window.name!r} names nodes the workload lacks: {', '.join(unknown)}")
            if window.queue is not None and window.queue not in queue_names:
                problems.append(f"reservation {window.name!r} holds nodes for queue {window.queue!r}, which it lacks")
        if self.throughput is not None:
            measured = set(self.throughput.models)
            added = {g.model for e in self.events if isinstance(e, AddNodes) for n in e.nodes for g in n.gpus}
            unmeasured = sorted(m for m in added if model_key(m) not in measured)
            if unmeasured:
                problems.append(f"nodes added by events have GPU models the throughput table lacks: {unmeasured}")
        if problems:
            raise WorkloadError(
                f"workload {self.name!r} is inconsistent: {'; '.join(problems)}",
                "build workloads with the loaders in gpufleet.sim.workloads, or fix the listed fields",
            )

    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    @property
    def gpu_capacity_milli(self) -> int:
        return self.gpu_count * 1000

    @property
    def models(self) -> frozenset[str]:
        return frozenset(g.model for n in self.nodes for g in n.gpus)

    def gpus_by_model(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            for gpu in node.gpus:
                counts[gpu.model] = counts.get(gpu.model, 0) + 1
        return dict(sorted(counts.items()))

    def with_expected_durations(self) -> Workload:
        """A copy whose jobs tell the scheduler their true run time (`Job.expected_duration`): an oracle,
        as SJF/SRTF in Helios' evaluation assume. Jobs without a duration are left as they are."""
        jobs = tuple(
            replace(tj, job=replace(tj.job, expected_duration=tj.duration)) if tj.duration is not None else tj
            for tj in self.jobs
        )
        return replace(self, jobs=jobs)
