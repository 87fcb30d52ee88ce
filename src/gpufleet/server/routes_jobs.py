"""`/v1/jobs`: submit, list, show, events, explain, cancel, logs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Response

from gpufleet.domain.errors import FieldProblem, SpecError
from gpufleet.domain.lifecycle import JobState
from gpufleet.ports.admin import JobQuery
from gpufleet.server.auth import Principal
from gpufleet.server.job_verbs import JobVerbs, SelectIn
from gpufleet.server.limits import MAX_IDEMPOTENCY_KEY, MAX_SEQ
from gpufleet.server.request_deps import principal, service
from gpufleet.server.schemas import CancelOut, EventsOut, ExplainOut, JobListOut, JobOut, LogsOut
from gpufleet.server.service import MAX_LOG_CHUNK, Service
from gpufleet.server.spec import JobSpec

router = APIRouter(tags=["jobs"])

Who = Annotated[Principal, Depends(principal)]
Svc = Annotated[Service, Depends(service)]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$"
JobIdPath = Annotated[str, Path(pattern=NAME_PATTERN, description="A job id such as j-7f3a9c21.")]


IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=MAX_IDEMPOTENCY_KEY,
        pattern=r"^[\x21-\x7e]+$",
        description="Any unique string (e.g. a UUID) per job: a retry with the same key and body returns the job "
        "the first request made (200, `Idempotent-Replayed: true`) instead of a second job; the same key with "
        "another body is refused (422). Kept 24 h.",
    ),
]


REPLAYED: dict[int | str, dict[str, Any]] = {
    200: {"model": JobOut, "description": "Replayed: the job an earlier request with this Idempotency-Key made"}
}


@router.post("/jobs", status_code=201, responses=REPLAYED)
async def submit(
    spec: JobSpec, who: Who, svc: Svc, response: Response, idempotency_key: IdempotencyKey = None
) -> JobOut:
    """Submit a job; the id is chosen by the server. Without `queue`, a team token submits to its queue."""
    # Committed by the service's batcher thread, grouped with concurrent submits (one transaction).
    job, replayed = await svc.submit_async(who, spec, idempotency_key)
    if replayed:
        response.status_code = 200
        response.headers["Idempotent-Replayed"] = "true"
    return job


@router.get("/jobs")
def list_jobs(
    who: Who,
    svc: Svc,
    queue: Annotated[str | None, Query(max_length=200)] = None,
    state: Annotated[list[JobState] | None, Query(description="Repeatable: ?state=pending&state=running")] = None,
    name: Annotated[str | None, Query(max_length=200)] = None,
    array: Annotated[str | None, Query(max_length=200, description="Only the tasks of this array")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before_seq: Annotated[
        int | None, Query(ge=0, le=MAX_SEQ, description="Paging: `next_before_seq` of the last page")
    ] = None,
) -> JobListOut:
    """Jobs, newest first. Team tokens see only their queue's."""
    return svc.list_jobs(
        who,
        queue=_plain(queue),
        states=state or [],
        name=_plain(name),
        array=_plain(array),
        limit=limit,
        before_seq=before_seq,
    )


@router.get("/jobs/{job_id}")
def show(job_id: JobIdPath, who: Who, svc: Svc) -> JobOut:
    return svc.get_job(who, job_id)


@router.get("/jobs/{job_id}/events")
def events(job_id: JobIdPath, who: Who, svc: Svc) -> EventsOut:
    """Every state change of the job, oldest first, with its reason."""
    return svc.events(who, job_id)


@router.get("/jobs/{job_id}/explain")
def explain(job_id: JobIdPath, who: Who, svc: Svc) -> ExplainOut:
    """Why a job waits (the scheduler's words, its place in its queue, its queue's quota), or what happened."""
    return svc.explain(who, job_id)


@router.post("/jobs/{job_id}/cancel", status_code=202)
def cancel(
    job_id: JobIdPath,
    who: Who,
    svc: Svc,
    force: Annotated[bool, Query(description="Kill at once (SIGKILL), whatever the job's grace period")] = False,
) -> CancelOut:
    """Ask the loop to stop the job for good (checkpoint signal, grace period, then kill; `force`: kill now). An
    array's id cancels every task of it that has not ended."""
    if svc.store.get(job_id) is None and svc.store.count_jobs(JobQuery(array_id=job_id)):
        done = JobVerbs(svc).act(
            who, "cancel", SelectIn(ids=[job_id], name=None, queue=None, user=None, dry_run=False, force=force)
        )
        return CancelOut(id=job_id, state="array", requested=done.requested, message=done.message)
    return svc.cancel(who, job_id, force=force)


@router.get("/jobs/{job_id}/logs")
def logs(
    job_id: JobIdPath,
    who: Who,
    svc: Svc,
    worker: Annotated[int, Query(ge=0, le=100_000)] = 0,
    attempt: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
    offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
    tail: Annotated[
        int | None,
        Query(ge=1, le=MAX_LOG_CHUNK, description="Read the log's last `tail` bytes instead (`offset` unused)"),
    ] = None,
    since: Annotated[
        float | None,
        Query(
            ge=0,
            le=1e11,
            description="Read from the output written at this time (epoch seconds) on, to within a second "
            "before (`offset` unused)",
        ),
    ] = None,
) -> LogsOut:
    """A chunk of a worker's output from byte `offset` (latest attempt by default); follow with `next_offset`."""
    if tail is not None and since is not None:
        raise SpecError("logs request", (FieldProblem("since", "is given with `tail`", "give one of them"),))
    return svc.logs(who, job_id, worker=worker, attempt=attempt, offset=offset, tail=tail, since=since)


def _plain(text: str | None) -> str | None:
    """An empty filter is no filter; a NUL cannot match any stored name."""
    if text is None or not text:
        return None
    return text.replace("\x00", "")
