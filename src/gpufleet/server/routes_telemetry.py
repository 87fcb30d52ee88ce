"""`/v1/telemetry` (GPUs and queues now, for `gpufleet top`), `/v1/usage` (the usage report),
`/v1/jobs/{id}/usage` (a job's measured use and idle flag), `/v1/queues/{name}/idle-policy`.

GPUs and who holds them are visible to every token (as `/v1/nodes` shows); queue figures and usage only to
the queue's team and to admins.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request

from gpufleet.server.auth import Principal
from gpufleet.server.gpu_monitor import Telemetry, idle_policy, set_idle_policy
from gpufleet.server.http_errors import NotFoundError
from gpufleet.server.request_deps import principal, service
from gpufleet.server.schemas import (
    IdlePolicyIn,
    IdlePolicyOut,
    JobUsageOut,
    TelemetryOut,
    UsageOut,
    UsageQueueOut,
)
from gpufleet.server.service import Service
from gpufleet.server.usage import QueueUsage, usage_report

router = APIRouter(tags=["telemetry"])

Who = Annotated[Principal, Depends(principal)]
Svc = Annotated[Service, Depends(service)]
QueueName = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$", description="e.g. team-a")]
JobIdPath = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$", description="e.g. j-7f3a9c21")]
HOUR = 3600.0


def _telemetry(request: Request, *, required: bool = True) -> Telemetry | None:
    found = request.app.state.ctx.extra.get("telemetry")
    if isinstance(found, Telemetry):
        return found
    if required:
        raise NotFoundError(
            "GPU telemetry is not enabled in this control plane", "telemetry runs in a control plane started by `up`"
        )
    return None


def _queue_known(svc: Service, who: Principal, queue: str) -> None:
    if queue not in {q.name for q in svc.store.queues()} or not who.may_see(queue):
        raise NotFoundError(f"no queue named {queue!r}", "list queues with `gpufleet queues`")


@router.get("/telemetry")
def telemetry(who: Who, svc: Svc) -> TelemetryOut:
    """Every GPU's last sample with the job on it and its idle state; each visible queue's waits and use."""
    return svc.telemetry(who)


@router.get("/jobs/{job_id}/usage", tags=["jobs"])
def job_usage(job_id: JobIdPath, who: Who, svc: Svc) -> JobUsageOut:
    """A job's measured GPU use and whether it is reserved-but-idle (and the last time it was flagged)."""
    return svc.job_usage(who, job_id)


def _row(q: QueueUsage) -> UsageQueueOut:
    return UsageQueueOut(
        queue=q.queue,
        jobs=q.jobs,
        allocated_gpu_hours=q.allocated_gpu_seconds / HOUR,
        sampled_gpu_hours=q.sampled_gpu_seconds / HOUR,
        used_gpu_hours=q.used_gpu_seconds / HOUR,
        reserved_idle_gpu_hours=q.idle_gpu_seconds / HOUR,
        utilisation=q.used_gpu_seconds / q.sampled_gpu_seconds if q.sampled_gpu_seconds > 0 else None,
    )


@router.get("/usage")
def usage(
    request: Request,
    who: Who,
    svc: Svc,
    since: Annotated[float, Query(ge=0, le=1e11, description="Start of the window (Unix seconds).")],
    until: Annotated[float | None, Query(ge=0, le=1e11, description="End of the window (default: now).")] = None,
) -> UsageOut:
    """Per queue, GPU-hours allocated (from job history), used (utilisation-weighted) and reserved-idle."""
    tel = _telemetry(request, required=False)
    end = svc.ctx.clock.now() if until is None else until
    if end < since:
        from gpufleet.domain.errors import FieldProblem, SpecError

        raise SpecError("usage window", (FieldProblem("until", f"is before since ({since})", "give until >= since"),))
    queues = None if who.admin else {who.queue or ""}
    report = usage_report(svc.store, tel.book if tel else None, since, end, queues)
    rows = [_row(q) for q in report.queues]
    total = QueueUsage(
        "all",
        sum(q.allocated_gpu_seconds for q in report.queues),
        sum(q.sampled_gpu_seconds for q in report.queues),
        sum(q.used_gpu_seconds for q in report.queues),
        sum(q.idle_gpu_seconds for q in report.queues),
        sum(q.jobs for q in report.queues),
    )
    return UsageOut(
        since=since,
        until=end,
        probe=tel.probe.kind if tel else None,
        emulated=svc.ctx.emulated,
        queues=rows,
        total=_row(total),
        notes=list(report.notes),
    )


@router.get("/queues/{name}/idle-policy", tags=["queues"])
def get_idle_policy(name: QueueName, who: Who, svc: Svc) -> IdlePolicyOut:
    """What the queue's reserved-but-idle jobs get: notify (default), reclaim or none."""
    _queue_known(svc, who, name)
    return IdlePolicyOut(queue=name, policy=idle_policy(svc.store, name).value)


@router.put("/queues/{name}/idle-policy", tags=["queues"])
def put_idle_policy(name: QueueName, body: IdlePolicyIn, who: Who, svc: Svc) -> IdlePolicyOut:
    """Set the queue's idle policy (admin)."""
    svc.audit.require_admin(who, "setting an idle policy", "queue.idle_policy", name)
    _queue_known(svc, who, name)
    policy = set_idle_policy(svc.store, name, body.policy).value
    svc.audit.record(who, "queue.idle_policy", name, {"policy": policy})
    return IdlePolicyOut(queue=name, policy=policy)
