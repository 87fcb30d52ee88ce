"""What the store keeps about a job: its spec, where it is in its lifecycle, and where it runs."""

from __future__ import annotations

import dataclasses
import enum
import operator
from dataclasses import dataclass

from gpufleet.domain.checkpoints import AttemptLoss, CheckpointPlan
from gpufleet.domain.cluster import WorkerPlacement
from gpufleet.domain.jobs import Job, JobId, RunningJob
from gpufleet.domain.lifecycle import JobState


class StopCause(enum.StrEnum):
    """Why a job that holds resources is being stopped; decides where it goes once stopped."""

    PREEMPTED = "preempted"  # back to its queue
    RECLAIMED = "reclaimed"  # reserved but idle: back to its queue
    CANCELLED = "cancelled"  # a user cancelled it: cancelled
    TIMEOUT = "timeout"  # ran past its max runtime: failed


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job as stored. Immutable: every change is a new record with `version + 1`.

    `attempt` counts launches (1 for the first); `attained_gpu_seconds` the GPU-time the job has
    received over all attempts (what least-attained-service ordering reads); `waiting_code` and
    `waiting_reason` say, for a waiting job, why, in the core's words. While it is EVICTING,
    `stop_cause` says why and `evicting_for` names the preemptor (empty for a cancel or timeout);
    `failures` counts failed attempts, against the run spec's `retries`. `last_checkpoint_at` is the last
    save the job reported (or the backend saw), whichever attempt made it.

    An elastic job's size changes within one attempt (a resize, not a failure): `resizes` counts them,
    `resized_at` is when its holdings last changed (GPU-time received is counted up to then), and while a
    shrink is under way `resize_to` holds the workers it keeps: it holds all of `workers` until the backend
    reports RESIZED (a grow holds its new workers from the decision on). `resizing`: a resize was asked of
    the backend and RESIZED not yet observed.
    """

    job: Job
    state: JobState
    version: int = 1
    attempt: int = 0
    workers: tuple[WorkerPlacement, ...] = ()
    submitted_at: float = 0.0
    started_at: float | None = None
    first_started_at: float | None = None
    finished_at: float | None = None
    last_checkpoint_at: float | None = None
    attained_gpu_seconds: float = 0.0
    evicting_for: JobId | None = None
    preemptions: int = 0
    exit_code: int | None = None
    waiting_code: str = ""
    waiting_reason: str = ""
    stop_cause: StopCause | None = None
    failures: int = 0
    reason: str = ""  # the last transition's reason: why it is in its state
    # The duration of the last checkpoint the job reported (C), and the interval its current or last attempt
    # was given with what it was computed from (`domain/checkpoints.py`); None until known.
    checkpoint_cost_s: float | None = None
    checkpoint_plan: CheckpointPlan | None = None
    # The work lost by the last attempt that ended by preemption, node loss or failure (the store keeps each).
    attempt_loss: AttemptLoss | None = None
    resizes: int = 0
    resized_at: float | None = None
    resize_to: tuple[WorkerPlacement, ...] = ()
    resizing: bool = False

    @property
    def id(self) -> JobId:
        return self.job.id

    @property
    def holds_resources(self) -> bool:
        return self.state in (JobState.ADMITTED, JobState.LAUNCHING, JobState.RUNNING, JobState.EVICTING)

    def evolve(self, **changes: object) -> JobRecord:
        """The next version of this record with `changes` applied."""
        # `dataclasses.replace` without its per-field Python loop: the control loop makes a new version of
        # every job it moves, thousands a step. All fields are read at once and the record is built
        # positionally, so it is the same record `replace` would make.
        values = list(_all_fields(self))
        for name, value in changes.items():
            position = _FIELD_POSITION.get(name)
            if position is None or name == "version":
                raise TypeError(f"JobRecord.evolve() got an unexpected field {name!r}")
            values[position] = value
        values[_VERSION_POSITION] = self.version + 1
        return JobRecord(*values)

    def as_running(self) -> RunningJob:
        job = dataclasses.replace(self.job, attained_gpu_seconds=self.attained_gpu_seconds)
        return RunningJob(
            job,
            self.workers,
            started_at=self.started_at if self.started_at is not None else self.submitted_at,
            last_checkpoint_at=self.last_checkpoint_at,
            evicting_for=self.evicting_for
            if self.evicting_for is not None
            else ("" if self.state is JobState.EVICTING else None),
        )

    def as_pending(self) -> Job:
        return dataclasses.replace(self.job, attained_gpu_seconds=self.attained_gpu_seconds)


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(JobRecord))
_all_fields = operator.attrgetter(*_FIELD_NAMES)
_FIELD_POSITION = {name: position for position, name in enumerate(_FIELD_NAMES)}
_VERSION_POSITION = _FIELD_POSITION["version"]
