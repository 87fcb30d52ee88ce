"""Jobs as the scheduler sees them: a gang of workers, a queue, a priority, preemption costs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpufleet.domain.cluster import WorkerPlacement
from gpufleet.domain.comm import CommNeeds
from gpufleet.domain.dependencies import ArrayTask, Dependency
from gpufleet.domain.errors import FieldProblem, check
from gpufleet.domain.resources import MILLI_PER_GPU, WorkerRequest

JobId = str

SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT")


@dataclass(frozen=True, slots=True)
class RunSpec:
    """How a backend runs each worker of a job. The scheduling core never reads it.

    `command` is an argv, or with `shell` a single string run by `/bin/sh -c`. `env` is extra
    environment as (name, value) pairs. On preemption or cancel the backend sends `checkpoint_signal`,
    waits `grace_s`, then kills. `max_runtime_s` bounds one attempt; `retries` is how many times a
    failed attempt is started again.
    """

    command: tuple[str, ...]
    shell: bool = False
    workdir: str = ""
    env: tuple[tuple[str, str], ...] = ()
    checkpoint_signal: str = "SIGTERM"
    grace_s: float = 30.0
    max_runtime_s: float | None = None
    retries: int = 0
    # The OCI image its workers run in ("": the node's own system). Kubernetes runs it; other executors refuse it.
    image: str = ""

    def __post_init__(self) -> None:
        problems: list[FieldProblem] = []
        if not self.command or not all(self.command):
            problems.append(FieldProblem("command", "is empty", "give the program and its arguments"))
        elif self.shell and len(self.command) != 1:
            problems.append(FieldProblem("command", "has several parts with shell", "give one shell string"))
        if self.checkpoint_signal not in SIGNALS:
            problems.append(
                FieldProblem("checkpoint_signal", f"is {self.checkpoint_signal!r}", f"use one of {', '.join(SIGNALS)}")
            )
        if self.grace_s < 0:
            problems.append(FieldProblem("grace_period", f"is {self.grace_s}", "give seconds >= 0"))
        if self.max_runtime_s is not None and self.max_runtime_s <= 0:
            problems.append(FieldProblem("max_runtime", f"is {self.max_runtime_s}", "give seconds > 0, or leave unset"))
        if self.retries < 0:
            problems.append(FieldProblem("retries", f"is {self.retries}", "give 0 or more"))
        check(problems, "run spec")


@dataclass(frozen=True, slots=True)
class Job:
    """A job to place: `workers` identical workers placed all-or-nothing (a gang).

    Elastic jobs set `min_workers < workers`: the gang of `min_workers` is placed all-or-nothing and
    further workers up to `workers` are added when they fit. `submit_seq` is the total tie-breaker of
    every ordering. Times are seconds on the control plane's clock.
    """

    id: JobId
    queue: str
    request: WorkerRequest
    workers: int = 1
    min_workers: int | None = None
    priority: int = 0
    preemptible: bool = True
    submit_seq: int = 0
    submitted_at: float = 0.0
    expected_duration: float | None = None
    checkpoint_interval: float | None = None
    attained_gpu_seconds: float = 0.0
    job_type: str = ""
    name: str = ""
    run: RunSpec | None = None
    user: str = ""  # who submitted it (the name of the API token used); the scheduler never reads it
    comm: CommNeeds | None = None  # what a data-parallel gang synchronises each step (`domain.comm`)
    # What must happen before it may be scheduled, and the array it is a task of (`domain.dependencies`): the
    # control layer holds it back until then; the scheduler never reads either.
    depends_on: tuple[Dependency, ...] = ()
    array: ArrayTask | None = None

    def __post_init__(self) -> None:
        problems: list[FieldProblem] = []
        if not self.id:
            problems.append(FieldProblem("id", "is empty", "give the job an id"))
        if not self.queue or not self.queue.strip():
            problems.append(FieldProblem("queue", "is empty", "name the team queue to submit to"))
        if self.workers < 1:
            problems.append(FieldProblem("workers", f"is {self.workers}", "ask for 1 or more workers"))
        if self.min_workers is not None and not 1 <= self.min_workers <= self.workers:
            problems.append(
                FieldProblem(
                    "min_workers",
                    f"is {self.min_workers} with workers={self.workers}",
                    "give 1 <= min_workers <= workers",
                )
            )
        if self.request.fractional and self.workers > 1:
            problems.append(
                FieldProblem("workers", "a gang of fractional-GPU workers", "use whole GPUs for multi-worker jobs")
            )
        if self.expected_duration is not None and self.expected_duration <= 0:
            problems.append(FieldProblem("expected_duration", "is not positive", "give seconds > 0"))
        if self.checkpoint_interval is not None and self.checkpoint_interval <= 0:
            problems.append(FieldProblem("checkpoint_interval", "is not positive", "give seconds > 0"))
        if self.attained_gpu_seconds < 0:
            problems.append(FieldProblem("attained_gpu_seconds", "is negative", "give >= 0"))
        check(problems, f"job {self.id!r}")

    def numbered(self, submit_seq: int) -> Job:
        """This job with the store's submit number: a copy made without the checks, which do not read the number
        (a 10,000-task array is numbered on one submit's path, and the checks were a third of it)."""
        copy = object.__new__(Job)
        for name in _JOB_FIELDS:
            object.__setattr__(copy, name, getattr(self, name))
        object.__setattr__(copy, "submit_seq", submit_seq)
        return copy

    @property
    def gang_size(self) -> int:
        """Workers that must be placed together for the job to start."""
        return self.min_workers if self.min_workers is not None else self.workers

    @property
    def gpu_milli_total(self) -> int:
        return self.request.gpu_milli_total * self.workers

    @property
    def resizable(self) -> bool:
        """Whether the control loop may resize it while it runs: elastic (`min_workers < workers`) and whole GPUs
        per worker. `default`'s preemption spares such jobs (they shrink instead)."""
        request = self.request
        return (
            self.min_workers is not None
            and self.min_workers < self.workers
            and request.gpus >= 1
            and request.gpu_milli_total == request.gpus * MILLI_PER_GPU
        )


_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(Job))


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job that holds resources now (running, launching, or evicting).

    `last_checkpoint_at` is when its work was last saved: preempting it loses the work since then.
    `evicting_for` is set while it is being stopped: the preemptor's id, or "" when it is stopped for
    another reason (a cancel, a timeout).
    """

    job: Job
    workers: tuple[WorkerPlacement, ...]
    started_at: float = 0.0
    last_checkpoint_at: float | None = None
    evicting_for: JobId | None = None

    @property
    def id(self) -> JobId:
        return self.job.id

    @property
    def evicting(self) -> bool:
        return self.evicting_for is not None

    def lost_work_seconds(self, now: float) -> float:
        """Seconds of work lost if it were stopped at `now`: since the checkpoint it last reported in this
        run; without one, since the last save its declared `checkpoint_interval` implies; else since start."""
        ran = max(0.0, now - self.started_at)
        if self.last_checkpoint_at is not None and self.last_checkpoint_at >= self.started_at:
            return max(0.0, now - self.last_checkpoint_at)
        interval = self.job.checkpoint_interval
        if interval is not None and interval > 0:
            return ran % interval
        return ran
