"""Request and response bodies of the HTTP API, in people's units (GPUs, cores, bytes, seconds)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpufleet.server.limits import MAX_PENDING_CAP, MAX_QUOTAS, MAX_WEIGHT
from gpufleet.server.schemas_cost import BudgetOut, not_a_boolean


class FieldErrorOut(BaseModel):
    field: str
    problem: str
    fix: str


class ErrorOut(BaseModel):
    """Every error the API returns: a stable code, a sentence with the fix, and the bad fields."""

    code: str
    message: str
    fields: list[FieldErrorOut] = Field(default_factory=list)


class IsolationOut(BaseModel):
    """How jobs are kept from each other and from the control plane on this machine."""

    users: str  # as which OS user jobs run
    cgroups: str  # which kernel limits apply per worker, or why none do
    single_trust_domain: bool  # every job runs as the control plane's own user
    team_tokens: bool  # whether team tokens are accepted
    notes: list[str] = Field(default_factory=list)


class HealthOut(BaseModel):
    """Liveness for anyone; the rest only for an admin token (null otherwise)."""

    status: Literal["ok"] = "ok"
    isolation: IsolationOut | None = None
    metrics: Literal["token", "public"] | None = None  # whether /metrics needs a token (`up --public-metrics`)


class InfoOut(BaseModel):
    version: str
    emulated: bool
    inventory_source: str
    policy: str
    nodes: int
    gpus: int
    gpus_by_model: dict[str, int]
    role: str
    queue: str | None


# -------------------------------------------------------------------------------------------- jobs


class GpuShareOut(BaseModel):
    index: int
    uuid: str
    model: str
    fraction: float
    memory: int


class WorkerOut(BaseModel):
    rank: int
    node: str
    gpus: list[GpuShareOut]
    cpu: float
    memory: int


class RequestOut(BaseModel):
    gpus: float
    gpu_memory: int
    gpu_models: list[str]
    cpu: float
    memory: int
    spot: str = "never"


class RunOut(BaseModel):
    command: list[str]
    shell: bool
    workdir: str
    env: dict[str, str]
    checkpoint_signal: str
    grace_period: float
    max_runtime: float | None
    retries: int
    image: str = ""


class CommOut(BaseModel):
    """What a data-parallel job synchronises each step, and what its placement costs it (`domain.comm`)."""

    grad_bytes: int
    step_time: float = Field(description="One step's compute time without synchronisation, seconds.")
    max_comm_overhead: float | None
    # Of the placement it holds now (null when it holds none): the ring's slowest link, its bandwidth (GB/s per
    # direction), the all-reduce time of one step and its share of the step.
    link: str | None = None
    bus_gbps: float | None = None
    sync_s: float | None = None
    overhead: float | None = None


class JobOut(BaseModel):
    id: str
    name: str
    queue: str
    user: str = Field("", description="Who submitted it: the name of the token used (empty if unknown).")
    state: str
    reason: str
    waiting_code: str
    waiting_reason: str
    priority: int
    preemptible: bool
    workers: int
    min_workers: int | None
    job_type: str = Field("", description="What the job runs (its measured speeds per GPU model are shared by type).")
    request: RequestOut
    run: RunOut | None
    submit_seq: int
    submitted_at: float
    started_at: float | None
    first_started_at: float | None
    finished_at: float | None
    attempt: int
    exit_code: int | None
    preemptions: int
    failures: int
    resizes: int = 0  # size changes of this attempt (elastic jobs), not failures
    resizing: bool = False  # a resize was started and its new workers are not all up yet
    last_resized_at: float | None = None
    stop_cause: str | None
    attained_gpu_seconds: float
    expected_duration: float | None
    checkpoint_interval: float | None
    placement: list[WorkerOut]
    version: int
    last_checkpoint_at: float | None = Field(None, description="The last checkpoint the job reported.")
    checkpoint_plan: CheckpointPlanOut | None = Field(
        None, description="The interval its current or last attempt was given (GPUFLEET_CHECKPOINT_INTERVAL_S)."
    )
    comm: CommOut | None = None
    depends_on: list[str] = Field(
        default=[], description="What must happen before it may run (afterok:ID, singleton, …)."
    )
    array_id: str | None = Field(default=None, description="The array it is a task of (its id is ARRAYID_TASK).")
    array_task: int | None = None
    array_tasks: int | None = Field(default=None, description="At an array's submit: how many tasks it made.")
    # At submit only: what the submitter should know, e.g. a quota that can never admit the job as it stands.
    warnings: list[str] = []


class CheckpointPlanOut(BaseModel):
    """Young/Daly: interval_s = sqrt(2 C M) from the job's checkpoint cost C and the MTBF M of its nodes."""

    interval_s: float
    cost_s: float = Field(description="C: the duration of the job's last reported checkpoint")
    mtbf_s: float = Field(description="M: mean time between failures of the nodes the attempt was placed on")
    mtbf_source: str = Field(description="where M came from: observed spot pool rates or published defaults")


class JobListOut(BaseModel):
    jobs: list[JobOut]
    # Pass as `before_seq` to get the next (older) page; null when this page is the last.
    next_before_seq: int | None


class EventOut(BaseModel):
    source: str
    target: str
    reason: str
    at: float


class NoticeOut(BaseModel):
    kind: str
    message: str
    at: float


class EventsOut(BaseModel):
    job_id: str
    events: list[EventOut]
    # Remarks that are not state changes, e.g. "reserved but idle" flags.
    notices: list[NoticeOut] = []


class QuotaUseOut(BaseModel):
    resource: str
    used: float
    nominal: float | None
    borrowing_limit: float | None
    unit: str


class ExplainOut(BaseModel):
    id: str
    state: str
    summary: str
    waits_for: list[str] = Field(
        default=[], description="Dependencies that do not hold yet, each with its job's state."
    )
    reason: str
    waiting_code: str
    waiting_reason: str
    queue: str
    # Among the queue's pending jobs, by priority then submission: 1 = next. Null unless pending.
    position: int | None
    ahead: list[str]
    quota: list[QuotaUseOut]
    placement: list[WorkerOut]
    exit_code: int | None
    events: list[EventOut]
    # Set when the job holds GPUs it does not use (reserved but idle), or was flagged so before.
    idle: str | None = None
    notices: list[NoticeOut] = []
    # Spot pools whose breaker is not closed, in words, when the job waits on spot capacity; its queue's budget.
    spot_pools: list[str] = []
    budget: str | None = None
    # A running elastic job below its most workers: why it has not grown, as far as the control plane can say.
    elastic: str | None = None


class CancelOut(BaseModel):
    id: str
    state: str
    requested: bool
    message: str


class LogsOut(BaseModel):
    job_id: str
    attempt: int
    worker: int
    path: str | None
    offset: int
    next_offset: int
    text: str
    # The job is finished and every byte of this log was read.
    complete: bool
    available: list[str]


# ------------------------------------------------------------------------------------------ queues


_not_a_boolean = not_a_boolean  # JSON's true would otherwise be read as 1


class QuotaIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nominal: float | str | None = None
    borrowing_limit: float | str | None = None
    lending_limit: float | str | None = None

    _numbers = field_validator("nominal", "borrowing_limit", "lending_limit", mode="before")(_not_a_boolean)


class QueueIn(BaseModel):
    """A queue's quotas in people's units. Keys: gpu, gpu:<MODEL>, cpu (cores), memory (64GiB or bytes);
    each value is the nominal quota, or an object with nominal, borrowing_limit, lending_limit."""

    model_config = ConfigDict(extra="forbid")

    quotas: dict[str, float | str | QuotaIn] = Field(default_factory=dict, max_length=MAX_QUOTAS)
    cohort: str | None = Field(None, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    weight: float = Field(1.0, gt=0, le=MAX_WEIGHT, allow_inf_nan=False)
    max_pending: int | None = Field(
        None, ge=0, le=MAX_PENDING_CAP, description="The most jobs the queue may have pending at once (null: no cap)."
    )
    run_as: str | None = Field(
        None,
        max_length=32,
        description="OS user the queue's jobs run as (admin-mapped); null: the queue's own gpufleet-<queue>.",
    )
    max_grace: float | str | None = Field(
        None,
        description="The longest grace_period its jobs may ask: 30s, 2h or seconds (null: the control plane's "
        "default, 1h); at most 7d.",
    )
    memory_per_gpu: int | str | None = Field(
        None,
        description="Memory limit per GPU held of a worker whose job gave no memory, e.g. 32GiB (null: the node's "
        "memory, less its reserve, divided among its GPUs).",
    )
    memory_no_gpu: int | str | None = Field(
        None, description="Memory limit of a worker holding no GPU whose job gave no memory (null: one GPU's share)."
    )
    disk: int | str | None = Field(
        None,
        description="What the queue's jobs may keep in their working folders on a node, e.g. 200GiB; a job past "
        "it gets ENOSPC (null: the control plane's --queue-disk).",
    )

    _numbers = field_validator(
        "weight", "max_pending", "max_grace", "memory_per_gpu", "memory_no_gpu", "disk", mode="before"
    )(_not_a_boolean)

    @field_validator("quotas", mode="before")
    @classmethod
    def _quota_numbers(cls, value: object) -> object:
        if isinstance(value, dict):
            for amount in value.values():
                _not_a_boolean(amount)
        return value


class QuotaOut(BaseModel):
    nominal: float | None
    borrowing_limit: float | None
    lending_limit: float | None


class QueueUsageOut(BaseModel):
    running: int
    pending: int
    gpus: float
    cpu: float
    memory: int
    gpus_by_model: dict[str, float] = Field(default_factory=dict, description="GPUs held now, per GPU model.")


class QueueOut(BaseModel):
    name: str
    quotas: dict[str, QuotaOut]
    cohort: str | None
    weight: float
    max_pending: int | None = None
    max_grace: float | None = Field(None, description="seconds; null: the control plane's default")
    run_as: str | None = None
    memory_per_gpu: int | None = Field(None, description="bytes; null: the node's share per GPU")
    memory_no_gpu: int | None = Field(None, description="bytes; null: one GPU's share")
    disk: int | None = Field(None, description="bytes; null: the control plane's --queue-disk")
    usage: QueueUsageOut
    budget: BudgetOut | None = None


class QueuesOut(BaseModel):
    queues: list[QueueOut]


# ------------------------------------------------------------------------------------------- nodes


class AllocationOut(BaseModel):
    job_id: str
    queue: str
    fraction: float
    memory: int


class GpuOut(BaseModel):
    index: int
    uuid: str
    model: str
    memory: int
    nvlink_group: int
    allocated: float
    jobs: list[AllocationOut]


class NodeOut(BaseModel):
    name: str
    emulated: bool
    cordoned: bool
    healthy: bool
    rack: str
    zone: str
    pool: str = "on-demand"  # which price its GPU-hours bill at: on-demand, spot or reserved
    cpu: float
    memory: int
    cpu_allocated: float
    memory_allocated: int
    gpus: list[GpuOut]
    # Interconnect per GPU, GB/s per direction: what the node's inventory sets, else its GPU model's default.
    nvlink_gbps: float | None = None
    pcie_gbps: float | None = None
    network_gbps: float | None = None


class NodesOut(BaseModel):
    nodes: list[NodeOut]
    isolation: IsolationOut | None = None  # how jobs are isolated on the local executor's machine


class DrainOut(BaseModel):
    node: NodeOut
    requeued: list[str]


# ------------------------------------------------------------------------------------------ tokens


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=200)
    role: Literal["admin", "team", "metrics"] = Field(
        "team", description="admin: everything; team: one queue's jobs; metrics: scrape /metrics only"
    )
    queue: str | None = Field(None, max_length=63)


class TokenOut(BaseModel):
    id: str
    name: str
    role: str
    queue: str | None
    created_at: float
    revoked: bool


class TokenCreatedOut(TokenOut):
    # Shown once; only its SHA-256 is stored.
    secret: str


class TokensOut(BaseModel):
    tokens: list[TokenOut]


# ------------------------------------------------------------------------------------------- audit


class AuditEntryOut(BaseModel):
    at: float
    actor: str = Field(description="The token's name, or local:<OS user> for commands run on the machine")
    token_id: str | None
    action: str = Field(description="e.g. token.create, queue.set, node.drain, job.force_cancel, store.backup")
    target: str
    detail: str = Field(description="JSON, or empty")
    source: str = Field(description="The client's address, or local")
    outcome: str = Field(description="ok, or denied (a token that may not do it)")


class AuditOut(BaseModel):
    entries: list[AuditEntryOut]


# --------------------------------------------------------------------------------------- telemetry


class IdlePolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: Literal["notify", "reclaim", "none"] = Field(
        description="What a reserved-but-idle job of the queue gets: notify (flag it), reclaim (requeue it if "
        "preemptible), none."
    )


class IdlePolicyOut(BaseModel):
    queue: str
    policy: str


class GpuNowOut(BaseModel):
    """One GPU's last sample and who holds it. `low_for_s`: how long it has read under the idle threshold."""

    node: str
    index: int
    uuid: str
    model: str
    model_name: str
    probe: str
    at: float
    util: float | None
    mem_util: float | None
    memory_used: int | None
    memory_total: int | None
    power_w: float | None
    temperature_c: float | None
    job_id: str
    queue: str
    jobs: list[str]
    low_for_s: float | None
    idle: bool
    unattributed_memory: int | None = Field(
        default=None, description="bytes used by processes of no gpufleet job (None: processes not mapped to jobs)"
    )
    unattributed_pids: list[int] = Field(default_factory=list)


class QueueNowOut(BaseModel):
    """One queue now: waiting jobs and how long the oldest has waited, GPUs held, used and held idle."""

    queue: str
    pending: int
    running: int
    oldest_wait_s: float | None
    median_wait_s: float | None
    allocated_gpus: float
    used_gpus: float
    reserved_idle_gpus: float
    idle_policy: str


class TelemetryOut(BaseModel):
    probe: str
    emulated: bool
    inventory_source: str
    interval_s: float
    idle_threshold_pct: float
    idle_window_s: float
    now: float
    sampled_at: float | None
    gpus: list[GpuNowOut]
    queues: list[QueueNowOut]


class JobGpuOut(BaseModel):
    node: str
    index: int
    fraction: float
    util: float | None
    low_since: float | None
    flagged: bool


class IdleFlagOut(BaseModel):
    flagged_at: float
    idle_since: float
    policy: str
    action: str
    reason: str


class JobUsageOut(BaseModel):
    """A job's measured GPU use: GPU-seconds held with a reading (sampled), utilisation-weighted (used) and held
    while flagged idle; whether it is reserved-but-idle now, and its last flag (kept after it ends)."""

    job_id: str
    queue: str
    state: str
    probe: str
    emulated: bool
    idle_threshold_pct: float
    idle_window_s: float
    idle_policy: str
    reserved_idle: bool
    idle_since: float | None
    gpus: list[JobGpuOut]
    sampled_gpu_seconds: float
    used_gpu_seconds: float
    reserved_idle_gpu_seconds: float
    last_flag: IdleFlagOut | None
    processes_attributed: bool = Field(
        default=False, description="whether GPU processes are mapped to jobs here (False: the fields below are empty)"
    )
    gpu_memory: list[JobGpuMemoryOut] = Field(
        default_factory=list, description="GPU memory the job's processes use, per GPU, at the last sample"
    )
    gpu_memory_used: int = Field(default=0, description="bytes, all its GPUs")
    over_share: bool = Field(
        default=False, description="uses more GPU memory than its share on a GPU (fractional shares are not enforced)"
    )


class UsageQueueOut(BaseModel):
    queue: str
    jobs: int
    allocated_gpu_hours: float
    sampled_gpu_hours: float
    used_gpu_hours: float
    reserved_idle_gpu_hours: float
    utilisation: float | None = Field(description="used / sampled GPU-hours, 0..1; None without samples")


class UsageOut(BaseModel):
    since: float
    until: float
    probe: str | None
    emulated: bool
    queues: list[UsageQueueOut]
    total: UsageQueueOut
    notes: list[str]


class JobGpuMemoryOut(BaseModel):
    """GPU memory a job's processes use on one GPU, against what its share of that GPU entitles it to."""

    node: str
    index: int
    uuid: str
    used: int = Field(description="bytes")
    share: int = Field(description="bytes its share entitles it to; 0 when it holds no share of this GPU")
    over_share: bool
    pids: list[int]


JobUsageOut.model_rebuild()


class SizeThroughputOut(BaseModel):
    gpus: int = Field(description="GPUs the job held (its workers' count if it holds none).")
    model: str = Field("", description="The GPU model it held (upper case); empty when unknown or mixed.")
    samples: float = Field(description="Samples counted at this size and model, between consecutive reports.")
    seconds: float = Field(description="Seconds over which they were counted.")
    reports: int
    samples_per_s: float | None
    nodes: int | None = Field(None, description="Nodes it spanned, when its reports said (and counted steps).")
    steps: float | None = Field(None, description="Steps counted with the samples, when its reports counted them.")
    batch: float | None = Field(None, description="The quarter octave of its mean batch (samples per step) counted.")


class ProgressOut(BaseModel):
    """What a job reported about itself (gpufleet.runtime.report / checkpoint_saved), bounded."""

    job_id: str
    reports: int
    last_at: float | None = Field(description="When the latest report was made (epoch seconds).")
    step: int | None
    samples: float | None
    loss: float | None
    grad_sqr: float | None
    grad_var: float | None
    batch: float | None = Field(None, description="Its total batch (samples per step) as last reported.")
    min_batch: float | None = Field(None, description="The least total batch it said it may train at.")
    max_batch: float | None = Field(None, description="The largest total batch it said it may train at.")
    nodes: int | None = Field(None, description="Nodes it spanned as last reported.")
    metrics: dict[str, float] = Field(description="Other numbers it reported, as last seen (at most 32).")
    loss_curve: list[tuple[float, float]] = Field(description="(samples, loss), at most 512, thinner in the past.")
    sizes: list[tuple[float, int]] = Field(description="(time, GPUs) each time its size changed.")
    throughput: list[SizeThroughputOut]
    last_checkpoint_at: float | None
    checkpoint_duration_s: float | None
    checkpoints: int


class ReportsAcceptedOut(BaseModel):
    accepted: int = Field(description="Reports of this batch, all kept.")
    reports: int = Field(description="Reports the job has made in all.")
