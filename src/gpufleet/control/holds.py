"""What the loop does with jobs that wait outside the scheduler's sight: a user's hold, release and update (the
loop is the only writer of job state: the API files each as a request), and the dependency gate's releases.

A held job leaves the scheduler's sight and the dependency gate; a released or updated one comes back through
the gate, keyed again by the profile's order. A job whose dependencies can never be met ends cancelled."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from gpufleet.control.changes import Changes
from gpufleet.control.gate import NEVER_CODE, DependencyGate
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.lifecycle import JobState
from gpufleet.domain.records import JobRecord
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.ports import Request, RequestKind

if TYPE_CHECKING:
    from gpufleet.control.reconciler import Reconciler

S = JobState
KINDS = frozenset({RequestKind.HOLD, RequestKind.RELEASE, RequestKind.UPDATE})


def apply(loop: Reconciler, record: JobRecord, request: Request, now: float, changes: Changes) -> bool:
    """Apply one hold, release or update; True if the job must go back through the gate once written."""
    by = f" ({request.reason})" if request.kind is not RequestKind.UPDATE else ""
    if request.kind is RequestKind.HOLD and record.state is S.PENDING:
        _leave(loop, record)
        changes.move(record, S.HELD, f"held{by}", now, waiting_code="", waiting_reason="")
        return False
    if request.kind is RequestKind.RELEASE and record.state is S.HELD:
        changes.move(record, S.PENDING, f"released{by}", now)
        return True
    if request.kind is RequestKind.UPDATE and record.state in (S.PENDING, S.HELD):
        fields = json.loads(request.reason)
        job = updated(record.job, fields)
        said = ", ".join(f"{k} {v}" for k, v in sorted(fields.items()) if k != "by")
        if record.state is S.PENDING:
            _leave(loop, record)
        changes.add(record.evolve(job=job, reason=f"updated: {said} (by {fields.get('by', '?')})"))
        return record.state is S.PENDING
    return False


def updated(job: Job, fields: dict[str, Any]) -> Job:
    """The job with the fields an update gives (priority, max_runtime_s, gpus, queue)."""
    changes: dict[str, Any] = {}
    if "priority" in fields:
        changes["priority"] = int(fields["priority"])
    if "queue" in fields:
        changes["queue"] = str(fields["queue"])
    if "gpus" in fields:
        gpus = float(fields["gpus"])
        whole = gpus >= 1
        changes["request"] = dataclasses.replace(
            job.request,
            gpus=int(gpus) if whole else 1,
            gpu_milli=MILLI_PER_GPU if whole else round(gpus * MILLI_PER_GPU),
        )
    if "max_runtime_s" in fields and job.run is not None:
        changes["run"] = dataclasses.replace(job.run, max_runtime_s=fields["max_runtime_s"])
    return dataclasses.replace(job, **changes)


def _leave(loop: Reconciler, record: JobRecord) -> None:
    loop.pending.remove(record.id)
    loop.gate.remove(record.id)
    loop.nominated.discard(record.id)


def gate_of(loop: Reconciler) -> DependencyGate:
    """A dependency gate that reads the loop's records (the store's for jobs that ended)."""

    def lookup(job_id: JobId) -> JobRecord | None:
        record = loop._known.get(job_id)
        return record if record is not None else loop.store.get(job_id)

    def busy(user: str, name: str, job_id: JobId) -> bool:
        return any(
            r.holds_resources and r.job.name == name and r.job.user == user and r.id != job_id
            for r in loop._known.values()
        )

    return DependencyGate(lookup, busy)


def release_dependents(loop: Reconciler, now: float) -> None:
    """Jobs whose dependencies are now met go to the scheduler; those that can never be met end cancelled (which
    may end their own dependents in turn)."""
    while True:
        ready, never = loop.gate.settle()
        if not ready and not never:
            return
        changes = Changes()
        for job, why in never:
            record = loop._latest(job.id, changes)
            if record is not None and record.state is S.PENDING:
                changes.move(record, S.CANCELLED, why, now, finished_at=now, waiting_code=NEVER_CODE)
        loop._write(changes)
        for job in ready:
            record = loop._latest(job.id, changes)
            if record is not None and record.state is S.PENDING and record.id not in loop.pending:
                loop._add_pending(record.as_pending(), now)
