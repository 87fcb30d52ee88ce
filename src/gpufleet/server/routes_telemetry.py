"""`/v1/telemetry` (GPUs and queues now, for `gpufleet top`), `/v1/usage` (the usage report),
`/v1/jobs/{id}/usage` (a job's measured use and idle flag), `/v1/queues/{name}/idle-policy`.

GPUs and who holds them are visible to every token (as `/v1/nodes` shows); queue figures and usage only to
the queue's team and to admins.
"""

from __future__ import annotations

import statistics
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request

from gpufleet.domain.lifecycle import JobState
from gpufleet.server.auth import Principal
from gpufleet.server.gpu_monitor import Telemetry, idle_policy, owner_of, set_idle_policy
from gpufleet.server.http_app import principal, service
from gpufleet.server.http_errors import NotFoundError
from gpufleet.server.schemas import (
    GpuNowOut,
    IdleFlagOut,
    IdlePolicyIn,
    IdlePolicyOut,
    JobGpuMemoryOut,
    JobGpuOut,
    JobUsageOut,
    QueueNowOut,
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
def telemetry(request: Request, who: Who, svc: Svc) -> TelemetryOut:
    """Every GPU's last sample with the job on it and its idle state; each visible queue's waits and use."""
    tel = _telemetry(request)
    assert tel is not None
    ctx = svc.ctx
    now = ctx.clock.now()
    tick = tel.state
    gpus = []
    for sample in tel.latest_samples():
        on_gpu = tick.holders.get(sample.key, ())
        owner = owner_of(on_gpu) if on_gpu else None
        low_since = tel.detector.low_since(sample.key) if on_gpu else None
        stray = tick.unattributed.get(sample.key) if tick.processes_attributed else None
        gpus.append(
            GpuNowOut(
                node=sample.node,
                index=sample.index,
                uuid=sample.uuid,
                model=sample.model,
                model_name=sample.model_name,
                probe=sample.probe,
                at=sample.at,
                util=sample.gpu_util,
                mem_util=sample.mem_util,
                memory_used=sample.memory_used,
                memory_total=sample.memory_total,
                power_w=sample.power_w,
                temperature_c=sample.temperature_c,
                job_id=owner.job if owner else "",
                queue=owner.queue if owner else "",
                jobs=sorted({h.job for h in on_gpu}),
                low_for_s=None if low_since is None else max(0.0, sample.at - low_since),
                idle=bool(on_gpu) and tel.detector.gpu_flagged(sample.key),
                unattributed_memory=stray.used_bytes if stray is not None else None,
                unattributed_pids=list(stray.pids) if stray is not None else [],
            )
        )
    state = tel.scheduler_state()
    waits: dict[str, list[float]] = {}
    for job in tel.observer.view.pending.values():
        waits.setdefault(job.queue, []).append(max(0.0, now - job.submitted_at))
    visible = sorted(q.name for q in svc.store.queues() if who.may_see(q.name))
    metrics = {q.queue: q for q in state.queues}
    queues = []
    for name in visible:
        q = metrics.get(name)
        waiting = waits.get(name, [])
        queues.append(
            QueueNowOut(
                queue=name,
                pending=q.pending if q else 0,
                running=q.running if q else 0,
                oldest_wait_s=max(waiting) if waiting else None,
                median_wait_s=statistics.median(waiting) if waiting else None,
                allocated_gpus=q.allocated_gpus if q else 0.0,
                used_gpus=q.used_gpus if q else 0.0,
                reserved_idle_gpus=q.reserved_idle_gpus if q else 0.0,
                idle_policy=idle_policy(svc.store, name).value,
            )
        )
    return TelemetryOut(
        probe=tel.probe.kind,
        emulated=ctx.emulated,
        inventory_source=ctx.inventory_source,
        interval_s=tel.settings.interval_s,
        idle_threshold_pct=tel.settings.idle_threshold_pct,
        idle_window_s=tel.settings.idle_window_s,
        now=now,
        sampled_at=tick.at,
        gpus=gpus,
        queues=queues,
    )


@router.get("/jobs/{job_id}/usage", tags=["jobs"])
def job_usage(job_id: JobIdPath, request: Request, who: Who, svc: Svc) -> JobUsageOut:
    """A job's measured GPU use and whether it is reserved-but-idle (and the last time it was flagged)."""
    tel = _telemetry(request)
    assert tel is not None
    record = svc.store.get(job_id)
    if record is None or not who.may_see(record.job.queue):
        raise NotFoundError(f"no job {job_id!r}", "list your jobs with `gpufleet jobs`")
    tick = tel.state
    gpus = []
    low: list[float | None] = []
    for key, on_gpu in sorted(tick.holders.items()):
        for holder in on_gpu:
            if holder.job == job_id:
                since = tel.detector.low_since(key)
                low.append(since)
                gpus.append(
                    JobGpuOut(
                        node=key[0],
                        index=key[1],
                        fraction=holder.milli / 1000.0,
                        util=tick.utils.get(key),
                        low_since=since,
                        flagged=tel.detector.gpu_flagged(key),
                    )
                )
    flag = tel.detector.flagged_jobs().get(job_id)
    use = tel.book.job(job_id)
    stored = tel.last_flag(job_id)
    last = None
    if stored is not None:
        try:
            last = IdleFlagOut(
                flagged_at=float(stored["flagged_at"]),  # type: ignore[arg-type]
                idle_since=float(stored["idle_since"]),  # type: ignore[arg-type]
                policy=str(stored.get("policy", "")),
                action=str(stored.get("action", "")),
                reason=str(stored.get("reason", "")),
            )
        except (KeyError, TypeError, ValueError):
            last = None
    memory = [
        JobGpuMemoryOut(
            node=m.node,
            index=m.index,
            uuid=m.uuid,
            used=m.used_bytes,
            share=m.share_bytes,
            over_share=m.over_share,
            pids=list(m.pids),
        )
        for m in tel.job_memory(job_id)
    ]
    idle_since = None
    if gpus and all(s is not None for s in low):
        idle_since = max(s for s in low if s is not None)
    return JobUsageOut(
        job_id=job_id,
        queue=record.job.queue,
        state=record.state.value,
        probe=tel.probe.kind,
        emulated=tel.emulated,
        idle_threshold_pct=tel.settings.idle_threshold_pct,
        idle_window_s=tel.settings.idle_window_s,
        idle_policy=idle_policy(svc.store, record.job.queue).value,
        reserved_idle=flag is not None and record.state is JobState.RUNNING,
        idle_since=idle_since,
        gpus=gpus,
        sampled_gpu_seconds=use.sampled,
        used_gpu_seconds=use.used,
        reserved_idle_gpu_seconds=use.idle,
        last_flag=last,
        processes_attributed=tick.processes_attributed,
        gpu_memory=memory,
        gpu_memory_used=sum(m.used for m in memory),
        over_share=any(m.over_share for m in memory),
    )


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
    who.require_admin("setting an idle policy")
    _queue_known(svc, who, name)
    return IdlePolicyOut(queue=name, policy=set_idle_policy(svc.store, name, body.policy).value)
