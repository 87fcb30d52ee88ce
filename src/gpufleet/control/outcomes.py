"""What an attempt's end makes of its job: the moves the loop writes when every worker exited, or when an
attempt it stopped is gone (`Reconciler._observed` picks which). Pure: records and observations in, the
changes made out."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from gpufleet.control.changes import Changes, attempt_loss, back_to_queue
from gpufleet.domain.checkpoints import LossCause
from gpufleet.domain.lifecycle import JobState
from gpufleet.domain.records import JobRecord, StopCause
from gpufleet.ports import Observation

S = JobState


def exited(
    record: JobRecord, obs: Observation, attained: float, checkpoint: float | None, changes: Changes
) -> JobRecord:
    """Every worker of a running attempt has exited: succeeded, failed (retried while it has retries left),
    or, when it exited while being cancelled, cancelled."""
    at = obs.at
    code = obs.exit_code if obs.exit_code is not None else 0
    ended: dict[str, object] = {
        "finished_at": at,
        "exit_code": code,
        "attained_gpu_seconds": attained,
        "last_checkpoint_at": checkpoint,
    }
    if code == 0:
        return changes.move(record, S.SUCCEEDED, "all workers exited 0", at, evicting_for=None, **ended)
    failed = f"a worker exited {code}" + (f": {obs.detail}" if obs.detail else "")
    if record.state is S.EVICTING and record.stop_cause is StopCause.CANCELLED:
        return changes.move(record, S.CANCELLED, f"{record.reason} ({failed})", at, evicting_for=None, **ended)
    ended["attempt_loss"] = attempt_loss(record, LossCause.FAILED, at, checkpoint)
    run = record.job.run
    if record.state is S.RUNNING and run is not None and record.failures < run.retries:
        return changes.move(
            record,
            S.PENDING,
            f"{failed}; retry {record.failures + 1} of {run.retries}",
            at,
            workers=(),
            started_at=None,
            exit_code=code,
            attained_gpu_seconds=attained,
            last_checkpoint_at=checkpoint,
            failures=record.failures + 1,
            attempt_loss=ended["attempt_loss"],
            resize_to=(),
            resizing=False,
        )
    return changes.move(record, S.FAILED, failed, at, evicting_for=None, failures=record.failures + 1, **ended)


def stopped(
    record: JobRecord,
    obs: Observation,
    attained: float,
    checkpoint: float | None,
    changes: Changes,
    submission_cursor: Callable[[], int],
) -> JobRecord:
    """An attempt the loop stopped is gone: cancelled or timed out for good (with the workers' exit code), or
    back in its queue (preempted, requeued; reclaimed ones behind the jobs already waiting, numbered by
    `submission_cursor`)."""
    at = obs.at
    if record.stop_cause in (StopCause.CANCELLED, StopCause.TIMEOUT):
        target = S.CANCELLED if record.stop_cause is StopCause.CANCELLED else S.FAILED
        return changes.move(
            record,
            target,
            record.reason or record.stop_cause.value,
            at,
            finished_at=at,
            exit_code=obs.exit_code,
            attained_gpu_seconds=attained,
            last_checkpoint_at=checkpoint,
            evicting_for=None,
        )
    why = (
        f"preempted for {record.evicting_for}"
        if record.evicting_for
        else (record.reason or f"{(record.stop_cause or StopCause.PREEMPTED).value}")
    )
    job = record.job
    where = f"back in queue {job.queue}"
    if record.stop_cause is StopCause.RECLAIMED:
        # It held GPUs it did not use: it queues again behind the jobs already waiting, so the GPUs
        # go to them rather than straight back to it.
        job = dataclasses.replace(job, submitted_at=at, submit_seq=submission_cursor())
        where = f"at the back of queue {job.queue}"
    more: dict[str, object] = {"job": job}
    if record.stop_cause is not StopCause.RECLAIMED:  # reserved but idle: it was doing no work
        more["attempt_loss"] = attempt_loss(record, LossCause.PREEMPTED, at, checkpoint)
    return back_to_queue(changes, record, f"{why}; {where}", at, attained, checkpoint, record.preemptions + 1, **more)
