"""What the cost API takes and gives: prices, budgets, a job's cost and the cost report (USD, GPU-hours)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

PoolName = Literal["on-demand", "spot", "reserved"]


def not_a_boolean(value: object) -> object:
    """A JSON true or false is not a number here (pydantic would read it as 1 or 0)."""
    if isinstance(value, bool):
        raise ValueError(f"is {str(value).lower()}; to fix: give a number")
    return value


class PriceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    usd_per_gpu_hour: float = Field(ge=0, le=1e6, allow_inf_nan=False, description="USD per GPU-hour")
    pool: PoolName = "on-demand"
    source: str = Field("set by an admin", max_length=500)

    _number = field_validator("usd_per_gpu_hour", mode="before")(not_a_boolean)


class PriceOut(BaseModel):
    model: str
    pool: PoolName
    usd_per_gpu_hour: float
    source: str


class PricesOut(BaseModel):
    prices: list[PriceOut]


class PriceImportIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    csv: str = Field(max_length=1 << 20, description="the CSV file's text")
    source: str = Field("price file", max_length=500, description="where the file comes from (cited with prices)")
    region: str = Field("us-central1", max_length=100, description="GCP catalog: the region to take")
    host_vm: bool = Field(True, description="GCP catalog: add the A2/A3 host VM's per-GPU share")


class BudgetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: float = Field(gt=0, le=1e12, allow_inf_nan=False)
    unit: Literal["usd", "gpu-hours"] = "usd"
    period: Literal["month", "rolling-30d"] = "month"
    action: Literal["warn", "deprioritise", "block"] = "warn"

    _number = field_validator("amount", mode="before")(not_a_boolean)


class BudgetOut(BaseModel):
    queue: str
    amount: float
    unit: Literal["usd", "gpu-hours"]
    period: Literal["month", "rolling-30d"]
    action: Literal["warn", "deprioritise", "block"]
    spent: float | None = Field(
        default=None, description="in the budget's unit, over its window (null: not measured yet)"
    )
    fraction: float | None = None
    level: Literal["ok", "notice", "exceeded"] = "ok"
    window_start: float | None = None
    resets_at: float | None = Field(default=None, description="null: a rolling window")
    summary: str = ""


class BudgetsOut(BaseModel):
    budgets: list[BudgetOut]


class CostLineOut(BaseModel):
    queue: str
    user: str
    model: str
    pool: PoolName
    gpu_hours: float
    reserved_idle_gpu_hours: float
    usd: float | None = Field(description="null: no price for this model and pool")
    reserved_idle_usd: float | None


class JobCostOut(BaseModel):
    job_id: str
    gpu_hours: float
    usd: float
    used_usd: float
    reserved_idle_usd: float
    unpriced_gpu_hours: float
    lines: list[CostLineOut]
    notes: list[str]


class CostGroupOut(BaseModel):
    key: str
    gpu_hours: float
    reserved_idle_gpu_hours: float
    usd: float
    used_usd: float
    reserved_idle_usd: float
    idle_share: float | None = Field(description="reserved-idle USD / USD: what the field calls waste")
    unpriced_gpu_hours: float


class CostReportOut(BaseModel):
    since: float
    until: float
    by: Literal["queue", "user", "model", "pool"]
    emulated: bool
    groups: list[CostGroupOut]
    total: CostGroupOut
    prices: list[PriceOut]
    notes: list[str]


class SpotPoolOut(BaseModel):
    pool: str
    state: Literal["closed", "open", "half-open"]
    since: float
    reason: str
    interruptions_in_window: int
    node_hours_in_window: float
    rate_per_node_hour: float
    interruptions_total: int
    probe: str | None
    description: str


class SpotPoolsOut(BaseModel):
    enabled: bool = Field(description="whether this control plane runs the spot breakers")
    threshold_per_node_hour: float | None = None
    pools: list[SpotPoolOut]


class LostWorkGroupOut(BaseModel):
    key: str
    attempts: int = Field(description="attempts that ended by preemption, node loss or failure")
    lost_hours: float = Field(description="hours of work lost, summed over attempts (not GPU-weighted)")
    gpu_hours: float
    usd: float = Field(description="priced GPU-hours only; see unpriced_gpu_hours")
    unpriced_gpu_hours: float
    gpu_hours_by_cause: dict[str, float] = Field(description="preempted, lost (node loss), failed")


class LostWorkReportOut(BaseModel):
    since: float
    until: float
    by: Literal["queue", "user"]
    groups: list[LostWorkGroupOut]
    total: LostWorkGroupOut
    notes: list[str]
