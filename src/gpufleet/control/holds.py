"""A user's hold, release and update of a job that waits, as the loop applies them (the loop is the only writer of
job state: the API files each as a request). A held job leaves the scheduler's sight and the dependency gate; a
released or updated one comes back through the gate, keyed again by the profile's order."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from gpufleet.control.changes import Changes
from gpufleet.domain.jobs import Job
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
