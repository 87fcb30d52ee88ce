"""What the API and the dashboard show of the GPU telemetry: every GPU's last sample with the job on it, each
queue's waits and use, and one job's measured use. Reads the telemetry and the store; decides nothing."""

from __future__ import annotations

import statistics

from gpufleet.domain.lifecycle import JobState
from gpufleet.domain.records import JobRecord
from gpufleet.ports.admin import AdminStore
from gpufleet.server.auth import Principal
from gpufleet.server.context import ApiContext
from gpufleet.server.gpu_monitor import Telemetry, idle_policy, owner_of
from gpufleet.server.schemas import (
    GpuNowOut,
    IdleFlagOut,
    JobGpuMemoryOut,
    JobGpuOut,
    JobUsageOut,
    QueueNowOut,
    TelemetryOut,
)


def fleet_now(tel: Telemetry, store: AdminStore, ctx: ApiContext, who: Principal) -> TelemetryOut:
    """Every GPU's last sample with the job on it and its idle state; each visible queue's waits and use."""
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
    visible = sorted(q.name for q in store.queues() if who.may_see(q.name))
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
                idle_policy=idle_policy(store, name).value,
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


def job_usage(tel: Telemetry, store: AdminStore, record: JobRecord) -> JobUsageOut:
    """A job's measured GPU use and whether it is reserved-but-idle (and the last time it was flagged)."""
    job_id = record.id
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
        idle_policy=idle_policy(store, record.job.queue).value,
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
