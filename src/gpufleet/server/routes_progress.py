"""`/v1/jobs/{id}/reports` (running jobs send what they did, with their job token) and
`/v1/jobs/{id}/progress` (users read the history)."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gpufleet.domain.errors import FieldProblem, SpecError
from gpufleet.ports.admin import Role
from gpufleet.server.auth import Principal
from gpufleet.server.http_errors import UnauthorizedError
from gpufleet.server.progress_reports import ProgressService, not_reported
from gpufleet.server.request_deps import client_address, principal, service
from gpufleet.server.routes_jobs import JobIdPath
from gpufleet.server.schemas import ProgressOut, ReportsAcceptedOut
from gpufleet.server.service import Service

router = APIRouter(tags=["progress"])

job_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="job token",
    description="`Authorization: Bearer $GPUFLEET_REPORT_TOKEN`: the token the executor gives each running job.",
)


def progress_service(request: Request) -> ProgressService:
    progress: ProgressService = request.app.state.progress
    return progress


@router.post("/jobs/{job_id}/reports", status_code=202)
async def receive_reports(
    job_id: JobIdPath,
    request: Request,
    progress: Annotated[ProgressService, Depends(progress_service)],
    svc: Annotated[Service, Depends(service)],
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Security(job_bearer)],
) -> ReportsAcceptedOut:
    """A batch of reports from a running job: `{"reports": [{"kind": "progress", "at": 1.7e9, "step": 10,
    "samples": 640, "loss": 2.1, "grad_sqr": …, "grad_var": …, "<metric>": …}, {"kind": "checkpoint",
    "duration_s": 12.5}]}`. Only the job's own token of its current attempt is accepted."""
    authorization = request.headers.get("authorization")
    try:
        progress.tokens.attempt_of(authorization, job_id)  # 401 before the body is even read
    except UnauthorizedError:
        svc.limits.check_failed_auth(client_address(request))  # guessing tokens is slowed down as for the API
        raise
    # Jobs are untrusted: each is held to a team token's request rate (the runtime sends a batch every 5 s).
    svc.limits.check_token(f"job:{job_id}", f"job {job_id}", Role.TEAM)
    try:
        body = json.loads(await request.body() or b"null")
    except (ValueError, UnicodeDecodeError) as error:
        fix = 'send a JSON object {"reports": [...]}'
        raise SpecError("reports", (FieldProblem("body", f"is not JSON ({error})", fix),)) from None
    if not isinstance(body, dict):
        raise SpecError("reports", (FieldProblem("body", "is not a JSON object", 'send {"reports": [...]}'),))
    from starlette.concurrency import run_in_threadpool

    history = await run_in_threadpool(progress.receive, job_id, authorization, body)
    return ReportsAcceptedOut(accepted=len(body["reports"]), reports=history.reports)


@router.get("/jobs/{job_id}/progress")
def job_progress(
    job_id: JobIdPath,
    who: Annotated[Principal, Depends(principal)],
    svc: Annotated[Service, Depends(service)],
    progress: Annotated[ProgressService, Depends(progress_service)],
) -> ProgressOut:
    """What the job reported: its last step, samples and loss, throughput (samples/s) at each size it ran at,
    its loss curve and size over time (bounded), and its last checkpoint. 404 if it never reported."""
    record = svc.visible(who, job_id)
    history = progress.history(record)
    if history is None:
        raise not_reported(job_id)
    return ProgressOut(job_id=job_id, **history)
