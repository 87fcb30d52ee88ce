"""Domain values as API bodies, in people's units, and queue quotas from people's units back to base units."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from gpufleet.domain.checkpoints import CheckpointPlan
from gpufleet.domain.cluster import Node, WorkerPlacement
from gpufleet.domain.comm import CommNeeds, estimate
from gpufleet.domain.errors import FieldProblem, GpufleetError, SpecError
from gpufleet.domain.lifecycle import JobState, Transition
from gpufleet.domain.quotas import CPU, GPU, GPU_MODEL_PREFIX, MEMORY, QueueSpec, Quota
from gpufleet.domain.records import JobRecord
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.ports.admin import AuditEntry, Token
from gpufleet.server.limits import MAX_GRACE_S, MAX_QUOTA_BYTES, MAX_QUOTA_CPU, MAX_QUOTA_GPUS
from gpufleet.server.schemas import (
    AllocationOut,
    AuditEntryOut,
    CheckpointPlanOut,
    CommOut,
    EventOut,
    GpuOut,
    GpuShareOut,
    JobOut,
    NodeOut,
    QueueIn,
    QueueOut,
    QueueUsageOut,
    QuotaIn,
    QuotaOut,
    RequestOut,
    RunOut,
    TokenOut,
    WorkerOut,
)
from gpufleet.server.schemas_cost import BudgetOut
from gpufleet.server.spec import parse_duration, parse_size

HOLDING = (JobState.ADMITTED, JobState.LAUNCHING, JobState.RUNNING, JobState.EVICTING)


def workers_out(workers: Sequence[WorkerPlacement], nodes: Mapping[str, Node]) -> list[WorkerOut]:
    out: list[WorkerOut] = []
    for rank, worker in enumerate(workers):
        node = nodes.get(worker.node)
        shares: list[GpuShareOut] = []
        for share in worker.gpus:
            gpu = node.gpus[share.index] if node is not None and share.index < len(node.gpus) else None
            shares.append(
                GpuShareOut(
                    index=share.index,
                    uuid=gpu.uuid if gpu else "",
                    model=gpu.model if gpu else "",
                    fraction=share.milli / MILLI_PER_GPU,
                    memory=share.memory,
                )
            )
        out.append(
            WorkerOut(rank=rank, node=worker.node, gpus=shares, cpu=worker.cpu_milli / 1000, memory=worker.memory)
        )
    return out


def comm_out(needs: CommNeeds | None, workers: Sequence[WorkerPlacement], nodes: Mapping[str, Node]) -> CommOut | None:
    """A job's communication needs, with the estimate of the placement it holds (when its nodes are known)."""
    if needs is None:
        return None
    out = CommOut(grad_bytes=needs.grad_bytes, step_time=needs.step_time_s, max_comm_overhead=needs.max_overhead)
    per_node: dict[str, set[int]] = {}
    for worker in workers:
        per_node.setdefault(worker.node, set()).update(s.index for s in worker.gpus)
    known = [(nodes[name], gpus) for name, gpus in per_node.items() if name in nodes]
    if not known or len(known) < len(per_node):
        return out
    links = [node.links() for node, _ in known]
    ring = estimate(
        needs,
        np.array([len(g) for _, g in known], dtype=np.int64),
        np.array([len({node.gpus[i].nvlink_group for i in g if i < len(node.gpus)}) for node, g in known]),
        np.array([x.nvlink for x in links]),
        np.array([x.pcie for x in links]),
        np.array([x.network for x in links]),
    )
    return out.model_copy(
        update={"link": ring.link, "bus_gbps": ring.bus_gbps, "sync_s": ring.sync_s, "overhead": ring.overhead}
    )


def job_out(record: JobRecord, nodes: Mapping[str, Node]) -> JobOut:
    job, request = record.job, record.job.request
    run = job.run
    return JobOut(
        depends_on=[str(d) for d in job.depends_on],
        array_id=job.array.array_id if job.array is not None else None,
        array_task=job.array.task if job.array is not None else None,
        id=job.id,
        name=job.name,
        queue=job.queue,
        user=job.user,
        state=record.state.value,
        reason=record.reason,
        waiting_code=record.waiting_code,
        waiting_reason=record.waiting_reason,
        priority=job.priority,
        preemptible=job.preemptible,
        workers=job.workers,
        min_workers=job.min_workers,
        job_type=job.job_type,
        request=RequestOut(
            gpus=request.gpu_milli / MILLI_PER_GPU if request.fractional else float(request.gpus),
            gpu_memory=request.gpu_memory,
            gpu_models=sorted(request.models),
            cpu=request.cpu_milli / 1000,
            memory=request.memory,
            spot=request.spot,
        ),
        run=None
        if run is None
        else RunOut(
            command=list(run.command),
            shell=run.shell,
            workdir=run.workdir,
            env=dict(run.env),
            checkpoint_signal=run.checkpoint_signal,
            grace_period=run.grace_s,
            max_runtime=run.max_runtime_s,
            retries=run.retries,
            image=run.image,
        ),
        submit_seq=job.submit_seq,
        submitted_at=record.submitted_at,
        started_at=record.started_at,
        first_started_at=record.first_started_at,
        finished_at=record.finished_at,
        attempt=record.attempt,
        exit_code=record.exit_code,
        preemptions=record.preemptions,
        failures=record.failures,
        resizes=record.resizes,
        resizing=record.resizing,
        last_resized_at=record.resized_at,
        stop_cause=None if record.stop_cause is None else record.stop_cause.value,
        attained_gpu_seconds=record.attained_gpu_seconds,
        expected_duration=job.expected_duration,
        checkpoint_interval=job.checkpoint_interval,
        placement=workers_out(record.workers, nodes),
        comm=comm_out(job.comm, record.workers, nodes),
        version=record.version,
        last_checkpoint_at=record.last_checkpoint_at,
        checkpoint_plan=_plan_out(record.checkpoint_plan),
    )


def event_out(transition: Transition) -> EventOut:
    return EventOut(
        source=transition.source.value, target=transition.target.value, reason=transition.reason, at=transition.at
    )


def audit_entry_out(entry: AuditEntry) -> AuditEntryOut:
    return AuditEntryOut(
        at=entry.at,
        actor=entry.actor,
        token_id=entry.token_id,
        action=entry.action,
        target=entry.target,
        detail=entry.detail,
        source=entry.source,
        outcome=entry.outcome,
    )


def token_out(token: Token) -> TokenOut:
    return TokenOut(
        id=token.id,
        name=token.name,
        role=token.role.value,
        queue=token.queue,
        created_at=token.created_at,
        revoked=token.revoked,
    )


# ------------------------------------------------------------------------------------------ quotas


def resource_unit(key: str) -> str:
    if key == CPU:
        return "cores"
    if key == MEMORY:
        return "bytes"
    return "GPUs"


def to_base(key: str, value: float | str | None, field: str) -> int | None:
    """A quota amount in people's units (GPUs, cores, 64GiB) in base units (milli-GPU, milli-cores, bytes)."""
    if value is None:
        return None
    if key == MEMORY:
        return parse_size(value, "memory quota", MAX_QUOTA_BYTES)
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise GpufleetError(f"{field} is {str(value)[:40]!r}", "give a number") from None
    most, unit = (MAX_QUOTA_CPU, "cores") if key == CPU else (MAX_QUOTA_GPUS, "GPUs")
    if not 0 <= number <= most:
        raise GpufleetError(f"{field} is {str(value)[:40]!r}", f"give a number from 0 to {most:,} {unit}")
    return round(number * 1000)


def from_base(key: str, value: int | None) -> float | None:
    if value is None:
        return None
    return float(value) if key == MEMORY else value / 1000


def queue_spec(name: str, body: QueueIn) -> QueueSpec:
    """`QueueIn` (people's units) -> `QueueSpec` (base units); every bad key and amount named."""
    problems: list[FieldProblem] = []
    quotas: dict[str, Quota] = {}
    for key, raw in body.quotas.items():
        if key not in (GPU, CPU, MEMORY) and not (
            key.startswith(GPU_MODEL_PREFIX) and len(key) > len(GPU_MODEL_PREFIX)
        ):
            problems.append(FieldProblem(f"quotas.{key}", "is not a resource", "use gpu, gpu:<MODEL>, cpu or memory"))
            continue
        given = raw if isinstance(raw, QuotaIn) else QuotaIn(nominal=raw)
        amounts: dict[str, int | None] = {}
        for part in ("nominal", "borrowing_limit", "lending_limit"):
            field = f"quotas.{key}.{part}"
            try:
                amounts[part] = to_base(key, getattr(given, part), field)
            except ValueError as error:  # parse_size's message carries its fix
                problem, _, fix = str(error).partition("; to fix: ")
                problems.append(FieldProblem(field, problem, fix or "give an amount"))
            except GpufleetError as error:
                problems.append(FieldProblem(field, error.message.removeprefix(field + " "), error.fix))
        quotas[key] = Quota(amounts.get("nominal"), amounts.get("borrowing_limit"), amounts.get("lending_limit"))
    max_grace = None
    if body.max_grace is not None:
        try:
            max_grace = parse_duration(body.max_grace, MAX_GRACE_S)
        except ValueError as error:
            problem, _, fix = str(error).partition("; to fix: ")
            problems.append(FieldProblem("max_grace", problem, fix or "give a duration such as 30s, 2h"))
    host: dict[str, int | None] = {}
    for part in ("memory_per_gpu", "memory_no_gpu", "disk"):
        raw = getattr(body, part)
        try:
            host[part] = None if raw is None else parse_size(raw, part.replace("_", " "), MAX_QUOTA_BYTES)
        except ValueError as error:
            problem, _, fix = str(error).partition("; to fix: ")
            problems.append(FieldProblem(part, problem, fix or "give a size such as 64GiB"))
    if problems:
        raise SpecError(f"queue {name!r}", tuple(problems))
    return QueueSpec(
        name=name,
        quotas=quotas,
        cohort=body.cohort or None,
        weight=body.weight,
        max_pending=body.max_pending,
        max_grace_s=max_grace,
        run_as=body.run_as or None,
        memory_per_gpu=host["memory_per_gpu"],
        memory_no_gpu=host["memory_no_gpu"],
        disk=host["disk"],
    )


def queue_usage(records: Sequence[JobRecord], nodes: Mapping[str, Node]) -> dict[str, dict[str, int]]:
    """Per queue: running and pending counts and what its running jobs hold, per resource key (base units)."""
    usage: dict[str, dict[str, int]] = {}
    for record in records:
        use = usage.setdefault(record.job.queue, {"running": 0, "pending": 0, GPU: 0, CPU: 0, MEMORY: 0})
        if record.state is JobState.PENDING:
            use["pending"] += 1
        if record.state not in HOLDING:
            continue
        use["running"] += 1
        for worker in record.workers:
            use[CPU] += worker.cpu_milli
            use[MEMORY] += worker.memory
            node = nodes.get(worker.node)
            for share in worker.gpus:
                use[GPU] += share.milli
                if node is not None and share.index < len(node.gpus):
                    model_key = GPU_MODEL_PREFIX + node.gpus[share.index].model
                    use[model_key] = use.get(model_key, 0) + share.milli
    return usage


def queue_out(spec: QueueSpec, use: Mapping[str, int], budget: BudgetOut | None = None) -> QueueOut:
    return QueueOut(
        budget=budget,
        name=spec.name,
        quotas={
            key: QuotaOut(
                nominal=from_base(key, quota.nominal),
                borrowing_limit=from_base(key, quota.borrowing_limit),
                lending_limit=from_base(key, quota.lending_limit),
            )
            for key, quota in sorted(spec.quotas.items())
        },
        cohort=spec.cohort,
        weight=spec.weight,
        max_pending=spec.max_pending,
        max_grace=spec.max_grace_s,
        run_as=spec.run_as,
        memory_per_gpu=spec.memory_per_gpu,
        memory_no_gpu=spec.memory_no_gpu,
        disk=spec.disk,
        usage=QueueUsageOut(
            running=use.get("running", 0),
            pending=use.get("pending", 0),
            gpus=use.get(GPU, 0) / MILLI_PER_GPU,
            cpu=use.get(CPU, 0) / 1000,
            memory=use.get(MEMORY, 0),
            gpus_by_model={
                key.removeprefix(GPU_MODEL_PREFIX): milli / MILLI_PER_GPU
                for key, milli in sorted(use.items())
                if key.startswith(GPU_MODEL_PREFIX)
            },
        ),
    )


# ------------------------------------------------------------------------------------------- nodes


def node_out(node: Node, records: Sequence[JobRecord], emulated: bool) -> NodeOut:
    per_gpu: dict[int, list[AllocationOut]] = {}
    cpu = memory = 0
    for record in records:
        if record.state not in HOLDING:
            continue
        for worker in record.workers:
            if worker.node != node.name:
                continue
            cpu += worker.cpu_milli
            memory += worker.memory
            for share in worker.gpus:
                per_gpu.setdefault(share.index, []).append(
                    AllocationOut(
                        job_id=record.id,
                        queue=record.job.queue,
                        fraction=share.milli / MILLI_PER_GPU,
                        memory=share.memory,
                    )
                )
    links = node.links()
    return NodeOut(
        name=node.name,
        emulated=emulated,
        cordoned=node.cordoned,
        healthy=node.healthy,
        rack=node.rack,
        zone=node.zone,
        pool=node.pool,
        nvlink_gbps=links.nvlink,
        pcie_gbps=links.pcie,
        network_gbps=links.network,
        cpu=node.cpu_milli / 1000,
        memory=node.memory,
        cpu_allocated=cpu / 1000,
        memory_allocated=memory,
        gpus=[
            GpuOut(
                index=gpu.index,
                uuid=gpu.uuid,
                model=gpu.model,
                memory=gpu.memory,
                nvlink_group=gpu.nvlink_group,
                allocated=sum(a.fraction for a in per_gpu.get(gpu.index, ())),
                jobs=per_gpu.get(gpu.index, []),
            )
            for gpu in node.gpus
        ],
    )


def _plan_out(plan: CheckpointPlan | None) -> CheckpointPlanOut | None:
    if plan is None:
        return None
    return CheckpointPlanOut(
        interval_s=plan.interval_s, cost_s=plan.cost_s, mtbf_s=plan.mtbf_s, mtbf_source=plan.mtbf_source
    )
