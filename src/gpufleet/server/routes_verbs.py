"""`/v1/jobs/{cancel,hold,release,requeue}` on many jobs at once, and `/v1/jobs/{id}/update`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from gpufleet.server.auth import Principal
from gpufleet.server.job_verbs import ArrayOut, BulkOut, JobVerbs, SelectIn, UpdateIn
from gpufleet.server.request_deps import principal, service
from gpufleet.server.routes_jobs import JobIdPath
from gpufleet.server.schemas import JobOut
from gpufleet.server.service import Service

router = APIRouter(tags=["jobs"])

Who = Annotated[Principal, Depends(principal)]
Svc = Annotated[Service, Depends(service)]


@router.post("/jobs/cancel", status_code=202)
def cancel_many(body: SelectIn, who: Who, svc: Svc) -> BulkOut:
    """Cancel the jobs selected (ids, an array's id, name, queue, state); `dry_run` only counts them."""
    return JobVerbs(svc).act(who, "cancel", body)


@router.post("/jobs/hold", status_code=202)
def hold(body: SelectIn, who: Who, svc: Svc) -> BulkOut:
    """Hold the selected pending jobs: the scheduler does not see them until they are released."""
    return JobVerbs(svc).act(who, "hold", body)


@router.post("/jobs/release", status_code=202)
def release(body: SelectIn, who: Who, svc: Svc) -> BulkOut:
    """Release the selected held jobs: back in their queues, in their places."""
    return JobVerbs(svc).act(who, "release", body)


@router.post("/jobs/requeue", status_code=202)
def requeue(body: SelectIn, who: Who, svc: Svc) -> BulkOut:
    """Stop the selected running jobs (checkpoint signal, grace period) and put them back in their queues."""
    return JobVerbs(svc).act(who, "requeue", body)


@router.post("/jobs/{job_id}/update", status_code=202)
def update(job_id: JobIdPath, body: UpdateIn, who: Who, svc: Svc) -> JobOut:
    """Change a pending or held job's priority, runtime limit, GPUs per worker or queue (applied by the loop)."""
    return JobVerbs(svc).update(who, job_id, body)


@router.get("/arrays/{array_id}")
def array(array_id: JobIdPath, who: Who, svc: Svc) -> ArrayOut:
    """An array's tasks, counted by state."""
    return JobVerbs(svc).array(who, array_id)
