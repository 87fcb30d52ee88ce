"""The record changes one step of the control loop makes, and the record arithmetic it shares: what a job
has received, the work an attempt loses, a job put back in its queue, several versions collapsed into one
write. Pure functions of records (no store, no backend)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpufleet.domain.checkpoints import AttemptLoss, LossCause
from gpufleet.domain.jobs import JobId
from gpufleet.domain.lifecycle import JobState, Transition, transition
from gpufleet.domain.records import JobRecord

S = JobState


@dataclass
class Changes:
    records: list[JobRecord] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    latest: dict[JobId, JobRecord] = field(default_factory=dict)

    def add(self, record: JobRecord) -> None:
        self.records.append(record)
        self.latest[record.id] = record

    def move(self, record: JobRecord, target: JobState, reason: str, at: float, **changes: object) -> JobRecord:
        self.transitions.append(transition(record.id, record.state, target, reason, at))
        new = record.evolve(state=target, reason=reason, **changes)
        self.add(new)
        return new

    def resize(self, record: JobRecord, reason: str, at: float, **changes: object) -> JobRecord:
        """A running job's size changes: its state stays, its history says so (RUNNING -> RUNNING)."""
        if record.state is S.RUNNING:
            self.transitions.append(transition(record.id, S.RUNNING, S.RUNNING, reason, at))
        new = record.evolve(reason=reason, **changes)
        self.add(new)
        return new


def gpus_held(record: JobRecord) -> float:
    return sum(s.milli for w in record.workers for s in w.gpus) / 1000.0


def attained_until(record: JobRecord, at: float) -> float:
    """GPU-seconds received up to `at`: what was counted until its holdings last changed, and its GPUs since."""
    attained = record.attained_gpu_seconds
    if record.started_at is not None and record.state in (S.RUNNING, S.EVICTING, S.LAUNCHING):
        since = max(record.started_at, record.resized_at if record.resized_at is not None else record.started_at)
        attained += gpus_held(record) * max(0.0, at - since)
    return attained


def back_to_queue(
    changes: Changes,
    record: JobRecord,
    reason: str,
    at: float,
    attained: float,
    checkpoint: float | None,
    preemptions: int,
    **more: object,
) -> JobRecord:
    """The job stopped holding resources and waits again: what it received and saved so far is kept."""
    return changes.move(
        record,
        S.PENDING,
        reason,
        at,
        workers=(),
        started_at=None,
        attained_gpu_seconds=attained,
        last_checkpoint_at=checkpoint,
        evicting_for=None,
        stop_cause=None,
        preemptions=preemptions,
        resize_to=(),
        resizing=False,
        **more,
    )


def attempt_loss(record: JobRecord, cause: LossCause, at: float, checkpoint: float | None) -> AttemptLoss | None:
    """The work the attempt of `record` loses ending at `at`, counted as victim choice counts it."""
    if record.started_at is None:
        return None
    running = dataclasses.replace(record.as_running(), last_checkpoint_at=checkpoint)
    return AttemptLoss(
        record.attempt,
        cause,
        record.started_at,
        at,
        running.lost_work_seconds(at),
        gpus_held(record) or len(record.workers),
    )


def collapse(records: Sequence[JobRecord]) -> list[tuple[int, JobRecord]]:
    """Several versions of one record written at once: the last one, with the version it started from."""
    first: dict[JobId, int] = {}
    latest: dict[JobId, JobRecord] = {}
    for record in records:
        first.setdefault(record.id, record.version - 1)
        latest[record.id] = record
    return [(first[job_id], record) for job_id, record in latest.items()]
