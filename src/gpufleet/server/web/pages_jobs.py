"""Jobs (filtered, sorted and paged by the store), a job's page (spec, history, `explain`, GPUs, log) and
cancel."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Form, Path, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from gpufleet.domain.errors import FieldProblem, GpufleetError, SpecError
from gpufleet.domain.lifecycle import JobState
from gpufleet.ports.admin import JobOrder, JobQuery
from gpufleet.server.gpu_monitor import Telemetry
from gpufleet.server.http_errors import NotFoundError
from gpufleet.server.schemas import JobUsageOut, LogsOut
from gpufleet.server.web.common import WebRoute, render, service_of, url_for, web_session
from gpufleet.server.web.fleet import telemetry_of
from gpufleet.server.web.security import WebSession, check_csrf

router = APIRouter(route_class=WebRoute, include_in_schema=False)

Session = Annotated[WebSession, Depends(web_session)]
JobIdPath = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")]
PAGE_SIZES = (25, 50, 100, 200)
LOG_TAIL_BYTES = 64 * 1024  # what a job's page shows of a log at first; follow appends from there
ACTIVE = frozenset(s for s in JobState if not s.terminal)
FINISHED = frozenset(s for s in JobState if s.terminal)
STATE_GROUPS = {"active": ACTIVE, "finished": FINISHED}
STATE_CHOICES = ("active", "finished", *(s.value for s in JobState))
HISTORY_S = 3600.0  # the GPU utilisation chart of a job's page: the last hour the ring keeps


def _states(choice: str | None) -> frozenset[JobState]:
    if not choice:
        return frozenset()
    if choice in STATE_GROUPS:
        return STATE_GROUPS[choice]
    if choice not in STATE_CHOICES:
        raise SpecError(
            "job filter", (FieldProblem("state", f"is {choice!r}", f"use one of: {', '.join(STATE_CHOICES)}"),)
        )
    return frozenset({JobState(choice)})


@router.get("/jobs")
def jobs_page(
    request: Request,
    session: Session,
    state: Annotated[str | None, Query(max_length=20)] = None,
    queue: Annotated[str | None, Query(max_length=200)] = None,
    user: Annotated[str | None, Query(max_length=200)] = None,
    name: Annotated[str | None, Query(max_length=200)] = None,
    sort: JobOrder = JobOrder.SUBMITTED,
    order: Literal["asc", "desc"] = "desc",
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
    per: Annotated[int, Query(ge=1, le=max(PAGE_SIZES))] = 50,
) -> Response:
    svc = service_of(request)
    principal = session.principal
    query = JobQuery(
        queue=queue or None,
        states=_states(state),
        user=user.strip() or None if user else None,
        name_contains=name.strip() or None if name else None,
        order=sort,
        ascending=order == "asc",
        limit=per,
        offset=(page - 1) * per,
    )
    found = svc.find_jobs(principal, query)
    pages = max(1, -(-found.total // per))
    queues = [q.name for q in svc.queues(principal)]
    filters = {"state": state, "queue": queue, "user": user, "name": name}
    return render(
        request,
        "jobs.html",
        session,
        title="Jobs",
        page="jobs",
        jobs=found.jobs,
        total=found.total,
        pages=pages,
        current=page,
        per=per,
        page_sizes=PAGE_SIZES,
        sort=sort.value,
        order=order,
        orders=[o.value for o in JobOrder],
        filters=filters,
        state_choices=STATE_CHOICES,
        queues=queues,
        first=(page - 1) * per + 1 if found.jobs else 0,
        last=(page - 1) * per + len(found.jobs),
    )


@router.get("/jobs/{job_id}")
def job_page(request: Request, session: Session, job_id: JobIdPath, done: Literal["cancel"] | None = None) -> Response:
    svc = service_of(request)
    principal = session.principal
    job = svc.get_job(principal, job_id)  # another team's job: NotFoundError, a 404 page
    explain = svc.explain(principal, job_id)
    usage: JobUsageOut | None = None
    tel = telemetry_of(svc)
    if tel is not None:
        usage = svc.job_usage(principal, job_id)
    log, log_error = _first_log(request, session, job_id)
    return render(
        request,
        "job.html",
        session,
        title=f"Job {job.id}",
        page="jobs",
        job=job,
        explain=explain,
        usage=usage,
        gpu_series=_gpu_series(tel, usage, svc.ctx.clock.now()),
        log=log,
        log_error=log_error,
        workers=list(range(job.workers)),
        attempts=list(range(1, job.attempt + 1)),
        done=done,
        can_cancel=not JobState(job.state).terminal,
    )


def _first_log(request: Request, session: WebSession, job_id: str) -> tuple[LogsOut | None, str | None]:
    svc = service_of(request)
    try:
        return svc.logs(session.principal, job_id, worker=0, attempt=None, offset=0, tail=LOG_TAIL_BYTES), None
    except GpufleetError as error:
        return None, f"{error.message}; {error.fix}" if error.fix else error.message


def _gpu_series(tel: Telemetry | None, usage: JobUsageOut | None, now: float) -> dict[str, object]:
    """Per GPU of the job: its utilisation samples of the last hour, on one time axis (null where a GPU has
    no sample at a time)."""
    if usage is None or not usage.gpus or tel is None:
        return {"t": [], "series": []}
    ring = tel.sampler.ring
    per_gpu = {
        (g.node, g.index): {s.at: s.gpu_util for s in ring.history((g.node, g.index), now - HISTORY_S)}
        for g in usage.gpus
    }
    times = sorted({at for samples in per_gpu.values() for at in samples})
    return {
        "t": times,
        "series": [
            {"label": f"{node} GPU {index}", "values": [samples.get(at) for at in times]}
            for (node, index), samples in per_gpu.items()
        ],
    }


@router.get("/jobs/{job_id}/log")
def job_log(
    request: Request,
    session: Session,
    job_id: JobIdPath,
    worker: Annotated[int, Query(ge=0, le=100_000)] = 0,
    attempt: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
    offset: Annotated[int | None, Query(ge=0, le=2**62)] = None,
) -> Response:
    """A chunk of one worker's log as JSON: from `offset` when following, else its last 64 KiB."""
    svc = service_of(request)
    svc.get_job(session.principal, job_id)  # an unknown or another team's job: 404
    tail = LOG_TAIL_BYTES if offset is None else None
    try:
        chunk = svc.logs(session.principal, job_id, worker=worker, attempt=attempt, offset=offset or 0, tail=tail)
    except NotFoundError as error:  # no log (yet) for this worker: said on the page, not a failed request
        return JSONResponse({"error": error.message, "fix": error.fix})
    return JSONResponse(chunk.model_dump())


@router.post("/jobs/{job_id}/cancel")
def cancel_job(
    request: Request, session: Session, job_id: JobIdPath, csrf: Annotated[str | None, Form()] = None
) -> Response:
    check_csrf(request, session.csrf, csrf)
    service_of(request).cancel(session.principal, job_id)
    return RedirectResponse(url_for(request, f"/jobs/{job_id}", {"done": "cancel"}), status_code=303)
