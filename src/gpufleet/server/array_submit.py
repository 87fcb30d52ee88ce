"""An array's submit: every task written in one batch (a 10,000-task array in one call), its first task alone
first when an idempotency key came, so that a retry finds the array it made instead of making another."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.domain.errors import GpufleetError, SpecError
from gpufleet.domain.jobs import Job
from gpufleet.domain.records import JobRecord
from gpufleet.ports import RequestKind
from gpufleet.ports.admin import JobQuery, SubmitKey
from gpufleet.scheduling.cycle import collector_paused
from gpufleet.server.http_errors import ConflictError
from gpufleet.server.job_graph import array_jobs
from gpufleet.server.schemas import JobOut

if TYPE_CHECKING:
    from gpufleet.server.service import Service


def submit_array(
    service: Service, job: Job, array: tuple[tuple[int, ...], int | None], key: SubmitKey | None, warnings: list[str]
) -> tuple[JobOut, bool]:
    """All of an array's tasks in one write (the first task's alone first when an idempotency key came, so
    that a retry finds the array it made instead of making another)."""
    # Python's cyclic collector paused, as the loop does for a step: 10,000 tasks' records are many young
    # objects, and each collection it ran among them walked them all again (a third of the time).
    with collector_paused():
        return _write(service, job, array, key, warnings)


def _write(
    service: Service, job: Job, array: tuple[tuple[int, ...], int | None], key: SubmitKey | None, warnings: list[str]
) -> tuple[JobOut, bool]:
    indexes, throttle = array
    for _ in range(5):
        array_id = service.new_id()
        tasks = array_jobs(job, array_id, indexes, throttle)
        done: list[JobRecord] = []
        rest = tasks
        if key is not None:
            first = service.store.submit_many(tasks[:1], job.submitted_at, [key], service.ctx.idempotency_ttl_s)[0]
            if isinstance(first, SpecError) and any(f.field == "id" for f in first.fields):
                continue
            if isinstance(first, GpufleetError):
                raise first
            if first.id != tasks[0].id:  # a retry: the array an earlier request made
                return _out(service, first, warnings), True
            done, rest = [first], tasks[1:]
        results = service.store.submit_many(rest, job.submitted_at) if rest else []
        errors = [r for r in results if isinstance(r, GpufleetError)]
        if errors and not done and all(isinstance(e, SpecError) and e.fields[0].field == "id" for e in errors):
            continue
        stored = [*done, *(r for r in results if isinstance(r, JobRecord))]
        if errors and stored:
            # All or nothing: the tasks stored before one was refused (its queue's max_pending reached) are
            # cancelled at once, in the step that takes them in unless the loop was mid-step: a refused array does
            # not run.
            why = f"its array {array_id} was refused: {errors[0].message}"
            service.store.request_many([(r.id, RequestKind.CANCEL, why) for r in stored], job.submitted_at)
        service.ctx.wake()
        if errors:
            raise errors[0]
        return _out(service, stored[0], warnings, len(stored)), False
    raise ConflictError("could not draw a free array id", "submit again")  # pragma: no cover


def _out(service: Service, record: JobRecord, warnings: list[str], tasks: int | None = None) -> JobOut:
    out = service.submitted(record)
    array_id = record.job.array.array_id if record.job.array is not None else record.id
    out.array_tasks = tasks if tasks is not None else service.store.count_jobs(JobQuery(array_id=array_id))
    if warnings:
        out.warnings = warnings
    return out
