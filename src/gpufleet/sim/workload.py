"""What the simulator replays: a cluster, its queues and a list of timed jobs, plus the tables some policies need.

Loaders for each public trace live in `gpufleet.sim.workloads`; this module holds the shared types only and
imports nothing of ours but `gpufleet.domain`.

    Workload        name, citation, license, nodes, queues, jobs sorted by (arrival, seq), throughput table
    TraceJob        a domain `Job` (arrival = `job.submitted_at`), its run time at reference speed, GPU-seconds
    ThroughputTable job type x GPU model x GPU count -> measured throughput (steps/s), relative speeds
    WorkloadError   a malformed or missing input; says which file, line and column, and how to fix it
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpufleet.domain import GpufleetError, Job, Node, QueueSpec


class WorkloadError(GpufleetError):
    """A workload input that cannot be used: a missing file, a missing column, a bad value.

    The message starts with where the problem is (`path`, `line`, `column`, each when known) and the fix
    says what to change, so that the CLI can print it as is instead of a stack trace.
    """

    def __init__(
        self,
        message: str,
        fix: str = "",
        *,
        path: str | Path | None = None,
        line: int | None = None,
        column: str | None = None,
    ) -> None:
        self.path = str(path) if path is not None else None
        self.line = line
        self.column = column
        where = [part for part in (self.path, f"line {line}" if line is not None else None) if part]
        if column is not None:
            where.append(f"column {column!r}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message, fix)


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
class ThroughputEntry:
    """Measured throughput (steps/s) of `job_type` alone on `gpus` GPUs of `model`.

    `consolidated`: all GPUs on one server (Gavel's "consolidated" placement) or spread over servers.
    """

    job_type: str
    model: str
    gpus: int
    throughput: float
    consolidated: bool = True


def _model_key(model: str) -> str:
    return model.strip().upper()


@dataclass(frozen=True, slots=True)
class ThroughputTable:
    """Job type x GPU model x GPU count -> throughput. Model names match case-insensitively (`v100` = `V100`).

    A throughput of 0 is kept: it is a measurement (the job does not run there, e.g. out of memory).
    `reference` is the model that trace durations are given on (Gavel: V100), the default for relative speeds.
    """

    entries: tuple[ThroughputEntry, ...]
    source: str = ""
    reference: str | None = None
    _index: Mapping[tuple[str, str, int, bool], float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index: dict[tuple[str, str, int, bool], float] = {}
        for entry in self.entries:
            what = f"throughput of {entry.job_type!r} on {entry.gpus} x {entry.model!r}"
            if not entry.job_type.strip() or not entry.model.strip():
                raise WorkloadError(f"{what}: empty job type or model", "name every job type and model")
            if entry.gpus < 1:
                raise WorkloadError(f"{what}: GPU count {entry.gpus}", "give 1 or more GPUs")
            if not (math.isfinite(entry.throughput) and entry.throughput >= 0):
                raise WorkloadError(f"{what} is {entry.throughput}", "give a finite throughput >= 0 (steps/s)")
            key = (entry.job_type, _model_key(entry.model), entry.gpus, entry.consolidated)
            if key in index:
                raise WorkloadError(f"{what} is given twice", "keep one row per job type, model, GPUs, placement")
            index[key] = entry.throughput
        object.__setattr__(self, "_index", index)

    @property
    def job_types(self) -> tuple[str, ...]:
        return tuple(sorted({e.job_type for e in self.entries}))

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted({_model_key(e.model) for e in self.entries}))

    def scale_factors(self, job_type: str) -> tuple[int, ...]:
        """GPU counts that `job_type` was measured at."""
        return tuple(sorted({e.gpus for e in self.entries if e.job_type == job_type}))

    def get(self, job_type: str, model: str, gpus: int, *, consolidated: bool = True) -> float | None:
        """Throughput, or None when not measured. On one GPU, placement makes no difference."""
        value = self._index.get((job_type, _model_key(model), gpus, consolidated))
        if value is None and gpus == 1:
            value = self._index.get((job_type, _model_key(model), 1, not consolidated))
        return value

    def speed(self, job_type: str, model: str, gpus: int, *, consolidated: bool = True) -> float:
        """Throughput in steps/s; raises WorkloadError when the table has no such measurement."""
        value = self.get(job_type, model, gpus, consolidated=consolidated)
        if value is None:
            if job_type not in self.job_types:
                fix = f"use a job type the table has: {', '.join(self.job_types)}"
            else:
                fix = (
                    f"models measured: {', '.join(self.models)}; "
                    f"GPU counts for {job_type!r}: {', '.join(map(str, self.scale_factors(job_type)))}"
                )
            placement = "consolidated" if consolidated else "unconsolidated"
            raise WorkloadError(
                f"no throughput for {job_type!r} on {gpus} x {model} ({placement}) in {self.source or 'the table'}",
                fix,
            )
        return value

    def relative_speed(
        self, job_type: str, model: str, gpus: int, *, reference: str | None = None, consolidated: bool = True
    ) -> float:
        """Speed on `model` relative to `reference` (default: the table's) for the same job type, GPU count and
        placement: 2.0 = twice as fast. A job whose duration is given at reference speed runs
        `duration / relative_speed` seconds on `model`.
        """
        reference = reference or self.reference
        if reference is None:
            raise WorkloadError("no reference model to compare with", "pass reference=MODEL, e.g. V100")
        base = self.speed(job_type, reference, gpus, consolidated=consolidated)
        if base == 0:
            raise WorkloadError(
                f"{job_type!r} has throughput 0 on {gpus} x {reference}, so nothing is relative to it",
                "pick a reference model the job type runs on",
            )
        return self.speed(job_type, model, gpus, consolidated=consolidated) / base


@dataclass(frozen=True, slots=True)
class Workload:
    """A cluster, its queues and the jobs that arrive, ready to simulate.

    `citation` names the paper and data source (every report prints it); `license` says under what terms the
    data may be used; `assumptions` lists each choice the loader made that the source does not fix (GPU
    memory sizes, node shapes, distributions), to be printed with the results.
    """

    name: str
    citation: str
    license: str
    nodes: tuple[Node, ...]
    queues: tuple[QueueSpec, ...]
    jobs: tuple[TraceJob, ...]
    throughput: ThroughputTable | None = None
    assumptions: tuple[str, ...] = ()

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
