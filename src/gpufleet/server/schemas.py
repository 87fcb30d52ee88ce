"""Request and response bodies of the HTTP API, in people's units (GPUs, cores, bytes, seconds)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class FieldErrorOut(BaseModel):
    field: str
    problem: str
    fix: str


class ErrorOut(BaseModel):
    """Every error the API returns: a stable code, a sentence with the fix, and the bad fields."""

    code: str
    message: str
    fields: list[FieldErrorOut] = Field(default_factory=list)


class HealthOut(BaseModel):
    status: Literal["ok"] = "ok"


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


class RunOut(BaseModel):
    command: list[str]
    shell: bool
    workdir: str
    env: dict[str, str]
    checkpoint_signal: str
    grace_period: float
    max_runtime: float | None
    retries: int


class JobOut(BaseModel):
    id: str
    name: str
    queue: str
    state: str
    reason: str
    waiting_code: str
    waiting_reason: str
    priority: int
    preemptible: bool
    workers: int
    min_workers: int | None
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
    stop_cause: str | None
    attained_gpu_seconds: float
    expected_duration: float | None
    checkpoint_interval: float | None
    placement: list[WorkerOut]
    version: int


class JobListOut(BaseModel):
    jobs: list[JobOut]
    # Pass as `before_seq` to get the next (older) page; null when this page is the last.
    next_before_seq: int | None


class EventOut(BaseModel):
    source: str
    target: str
    reason: str
    at: float


class EventsOut(BaseModel):
    job_id: str
    events: list[EventOut]


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


class QuotaIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nominal: float | str | None = None
    borrowing_limit: float | str | None = None
    lending_limit: float | str | None = None


class QueueIn(BaseModel):
    """A queue's quotas in people's units. Keys: gpu, gpu:<MODEL>, cpu (cores), memory (64GiB or bytes);
    each value is the nominal quota, or an object with nominal, borrowing_limit, lending_limit."""

    model_config = ConfigDict(extra="forbid")

    quotas: dict[str, float | str | QuotaIn] = Field(default_factory=dict)
    cohort: str | None = None
    weight: float = 1.0


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


class QueueOut(BaseModel):
    name: str
    quotas: dict[str, QuotaOut]
    cohort: str | None
    weight: float
    usage: QueueUsageOut


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
    cpu: float
    memory: int
    cpu_allocated: float
    memory_allocated: int
    gpus: list[GpuOut]


class NodesOut(BaseModel):
    nodes: list[NodeOut]


class DrainOut(BaseModel):
    node: NodeOut
    requeued: list[str]


# ------------------------------------------------------------------------------------------ tokens


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=200)
    role: Literal["admin", "team"] = "team"
    queue: str | None = None


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
