"""Money: GPU prices per model and pool, what a job's placement costs, and budgets per queue.

- A **price** is USD per GPU-hour for one GPU model in one pool: `on-demand`, `spot` (cheaper, may be taken
  back) or `reserved` (committed or owned capacity). Model names compare as `model_key` does (`a100` = `A100`).
- A job **attempt** is priced when it starts: `charges_for` turns its placement into GPU counts per (model,
  pool), each with the price at that moment (a later price change applies to later attempts, as a bill would).
  Its cost is the GPU-hours it held x those prices; the part held while flagged idle is its reserved-but-idle
  cost, the rest its used cost.
- A **budget** caps a queue's spend (USD or GPU-hours) per calendar month (UTC) or over a rolling 30 days. At
  `NOTICE_FRACTION` of it the queue gets a notice; at 100 % its action: `warn` (a notice only), `deprioritise`
  (its jobs run only on idle capacity: they do not borrow, do not preempt, and are the first victims) or
  `block` (new submissions are refused until the budget resets; running jobs go on).

The control plane and the simulator price with these same functions.
"""

from __future__ import annotations

import csv
import enum
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gpufleet.domain.cluster import Node, WorkerPlacement
from gpufleet.domain.errors import FieldProblem, SpecError, WorkloadError, check
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.domain.throughput_table import model_key

HOUR = 3600.0
DAY = 86400.0
ROLLING_DAYS = 30
NOTICE_FRACTION = 0.8


class Pool(enum.StrEnum):
    """Where a node's capacity comes from, which sets its price."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"
    RESERVED = "reserved"


def parse_pool(text: str, field: str = "pool") -> Pool:
    """A pool from its name; SpecError naming the pools otherwise."""
    try:
        return Pool(text.strip().lower())
    except ValueError:
        raise SpecError(
            field, (FieldProblem(field, f"{text!r} is not a pool", f"give one of: {', '.join(p.value for p in Pool)}"),)
        ) from None


@dataclass(frozen=True, slots=True)
class Price:
    """USD per GPU-hour of `model` in `pool`; `source` says where the figure comes from."""

    model: str
    pool: Pool
    usd_per_gpu_hour: float
    source: str = ""

    def __post_init__(self) -> None:
        problems: list[FieldProblem] = []
        if not self.model.strip():
            problems.append(FieldProblem("model", "is empty", "name the GPU model, e.g. A100-80GB"))
        if not (math.isfinite(self.usd_per_gpu_hour) and self.usd_per_gpu_hour >= 0):
            problems.append(
                FieldProblem("usd_per_gpu_hour", f"is {self.usd_per_gpu_hour}", "give a price >= 0 in USD per GPU-hour")
            )
        check(problems, f"price of {self.model!r} ({self.pool})")


@dataclass(frozen=True, slots=True)
class PriceTable:
    """The prices an admin set; a (model, pool) without one is unpriced (its GPU-hours are counted, not billed)."""

    prices: tuple[Price, ...] = ()

    def __post_init__(self) -> None:
        keys = [(model_key(p.model), p.pool) for p in self.prices]
        if len(set(keys)) != len(keys):
            raise SpecError("price table", (FieldProblem("prices", "a model and pool repeat", "give each once"),))

    def usd_per_gpu_hour(self, model: str, pool: Pool) -> float | None:
        key = model_key(model)
        for price in self.prices:
            if price.pool is pool and model_key(price.model) == key:
                return price.usd_per_gpu_hour
        return None

    def with_prices(self, new: Iterable[Price]) -> PriceTable:
        """This table with `new` prices set (replacing the same model and pool)."""
        merged = {(model_key(p.model), p.pool): p for p in self.prices}
        merged.update({(model_key(p.model), p.pool): p for p in new})
        return PriceTable(tuple(sorted(merged.values(), key=lambda p: (model_key(p.model), p.pool.value))))


# ------------------------------------------------------------------------------------------- price files

OWN_COLUMNS = ("model", "pool", "usd_per_gpu_hour")
GCP_COLUMNS = ("cloud", "kind", "name", "count", "region", "price_usd_per_hour", "spot_price_usd_per_hour")
DEFAULT_REGION = "us-central1"


# The GCP machine family whose host VM carries each GPU model (A2/A3 bundle their GPUs with a host VM; the
# catalog prices the two parts separately). Models not listed (T4, V100, L4, ...) attach to general-purpose
# VMs whose size the user picks: they are priced by the accelerator alone.
GCP_HOST_FAMILY = {
    "A100": "a2-highgpu",
    "A100-80GB": "a2-ultragpu",
    "H100": "a3-highgpu",
    "H100-MEGA": "a3-megagpu",
    "H200": "a3-ultragpu",
}


def read_price_csv(text: str, *, source: str, region: str = DEFAULT_REGION, host_vm: bool = True) -> tuple[Price, ...]:
    """Prices from a CSV: gpufleet's own (`model,pool,usd_per_gpu_hour`) or SkyPilot's GCP catalog cut
    (`cloud,kind,name,count,…,price_usd_per_hour,spot_price_usd_per_hour`): the accelerator rows of `region`,
    per GPU, on-demand and, where given, spot; with `host_vm`, plus the per-GPU share of the A2/A3 host VM that
    bundles the model (its 8-GPU machine type, where the file has it for the region), which is what a GPU-hour
    of such a machine costs (A100: 2.934 + 5.916/8 = 3.673 $/h). WorkloadError with the line otherwise."""
    try:
        reader = csv.DictReader(io.StringIO(text))
        columns = tuple(c.strip() for c in (reader.fieldnames or ()))
        if set(OWN_COLUMNS) <= set(columns):
            return _own_prices(reader, source)
        if set(GCP_COLUMNS) <= set(columns):
            return _gcp_prices(list(reader), source, region, host_vm)
    except csv.Error as error:
        raise WorkloadError(f"not a CSV file: {error}", "give a comma-separated text file", path=source) from None
    raise WorkloadError(
        f"the columns {', '.join(columns) or '(none)'} are neither a price table nor a GCP price catalog",
        f"give the columns {','.join(OWN_COLUMNS)}, or a SkyPilot GCP vms.csv cut with {','.join(GCP_COLUMNS)}",
        path=source,
    )


def _number(value: str | None, line: int, column: str, source: str) -> float:
    try:
        number = float((value or "").strip())
    except ValueError:
        raise WorkloadError(
            f"{value!r} is not a number", "give USD per hour, e.g. 3.67", path=source, line=line, column=column
        ) from None
    if not (math.isfinite(number) and number >= 0):
        raise WorkloadError(f"{value!r} is not a price", "give a price >= 0", path=source, line=line, column=column)
    return number


def _own_prices(reader: csv.DictReader[str], source: str) -> tuple[Price, ...]:
    prices: dict[tuple[str, Pool], Price] = {}
    for line, row in enumerate(reader, start=2):
        model = (row.get("model") or "").strip()
        if not model:
            raise WorkloadError("the model is empty", "name the GPU model", path=source, line=line, column="model")
        try:
            pool = parse_pool(row.get("pool") or "")
        except SpecError as error:
            raise WorkloadError(str(error), error.fix, path=source, line=line, column="pool") from None
        usd = _number(row.get("usd_per_gpu_hour"), line, "usd_per_gpu_hour", source)
        prices[(model_key(model), pool)] = Price(model, pool, usd, source)
    return tuple(prices.values())


def _gcp_prices(rows: list[dict[str, str]], source: str, region: str, host_vm: bool) -> tuple[Price, ...]:
    def cell(row: dict[str, str], column: str) -> str:
        return (row.get(column) or "").strip()

    hosts: dict[str, tuple[float, float | None]] = {}  # machine type -> per-GPU on-demand, spot
    for line, row in enumerate(rows, start=2):
        if cell(row, "cloud") == "gcp" and cell(row, "kind") == "host_vm" and cell(row, "region") == region:
            count = _number(row.get("count"), line, "count", source) or 1.0
            spot = cell(row, "spot_price_usd_per_hour")
            hosts[cell(row, "name")] = (
                _number(row.get("price_usd_per_hour"), line, "price_usd_per_hour", source) / count,
                None if not spot else _number(spot, line, "spot_price_usd_per_hour", source) / count,
            )
    prices: dict[tuple[str, Pool], Price] = {}
    regions: set[str] = set()
    for line, row in enumerate(rows, start=2):
        if cell(row, "cloud") != "gcp" or cell(row, "kind") != "gpu":
            continue
        regions.add(cell(row, "region"))
        if cell(row, "region") != region:
            continue
        model = cell(row, "name")
        count = _number(row.get("count"), line, "count", source)
        if not model or count < 1:
            raise WorkloadError("a GPU row without a model or count", "fix the row", path=source, line=line)
        family = GCP_HOST_FAMILY.get(model)
        host = hosts.get(f"{family}-8g") or hosts.get(f"{family}-1g") if host_vm and family else None
        label = f"{source}, {region}, " + (f"GPU + {family} host VM share" if host else "accelerator only")
        on_demand = _number(row.get("price_usd_per_hour"), line, "price_usd_per_hour", source) / count
        prices[(model_key(model), Pool.ON_DEMAND)] = Price(
            model, Pool.ON_DEMAND, on_demand + (host[0] if host else 0.0), label
        )
        spot = cell(row, "spot_price_usd_per_hour")
        if spot and not (host and host[1] is None):
            usd = _number(spot, line, "spot_price_usd_per_hour", source) / count + (host[1] or 0.0 if host else 0.0)
            prices[(model_key(model), Pool.SPOT)] = Price(model, Pool.SPOT, usd, label)
    if not prices:
        raise WorkloadError(
            f"no GCP GPU price in region {region!r}",
            f"choose a region the file has: {', '.join(sorted(regions)) or '(none)'}",
            path=source,
        )
    return tuple(prices.values())


# ------------------------------------------------------------------------------------------- job cost


@dataclass(frozen=True, slots=True)
class Charge:
    """GPUs of one model in one pool that a job attempt holds, and their price when it started (None: unpriced)."""

    model: str
    pool: Pool
    gpus: float
    usd_per_gpu_hour: float | None


def charges_for(
    workers: Sequence[WorkerPlacement], nodes: Mapping[str, Node], prices: PriceTable
) -> tuple[Charge, ...]:
    """What a placement holds per GPU model and pool, priced by `prices` (a node it does not know: skipped)."""
    held: dict[tuple[str, Pool], float] = {}
    for worker in workers:
        node = nodes.get(worker.node)
        if node is None:
            continue
        pool = Pool(node.pool)
        gpus = node.gpus
        for share in worker.gpus:
            if share.index < len(gpus):
                key = (gpus[share.index].model, pool)
                held[key] = held.get(key, 0.0) + share.milli / MILLI_PER_GPU
    return tuple(
        Charge(model, pool, gpus, prices.usd_per_gpu_hour(model, pool))
        for (model, pool), gpus in sorted(held.items(), key=lambda kv: (kv[0][0], kv[0][1].value))
    )


@dataclass(frozen=True, slots=True)
class CostLine:
    """GPU-hours and USD for one (queue, user, model, pool): allocated, of which reserved-but-idle."""

    queue: str
    user: str
    model: str
    pool: Pool
    gpu_hours: float
    usd: float | None  # None: no price for this model and pool
    idle_gpu_hours: float = 0.0

    @property
    def idle_usd(self) -> float | None:
        if self.usd is None or self.gpu_hours <= 0:
            return None if self.usd is None else 0.0
        return self.usd * min(1.0, self.idle_gpu_hours / self.gpu_hours)


def attempt_cost(
    charges: Sequence[Charge], held_s: float, *, queue: str, user: str, idle_fraction: float = 0.0
) -> tuple[CostLine, ...]:
    """The cost of holding `charges` for `held_s` seconds; `idle_fraction` of it reserved-but-idle."""
    idle = min(1.0, max(0.0, idle_fraction))
    lines = []
    for charge in charges:
        gpu_hours = charge.gpus * max(0.0, held_s) / HOUR
        usd = None if charge.usd_per_gpu_hour is None else gpu_hours * charge.usd_per_gpu_hour
        lines.append(CostLine(queue, user, charge.model, charge.pool, gpu_hours, usd, gpu_hours * idle))
    return tuple(lines)


# ------------------------------------------------------------------------------------------- budgets


class BudgetUnit(enum.StrEnum):
    USD = "usd"
    GPU_HOURS = "gpu-hours"


class BudgetPeriod(enum.StrEnum):
    MONTH = "month"  # the calendar month, UTC
    ROLLING_30D = "rolling-30d"


class BudgetAction(enum.StrEnum):
    WARN = "warn"
    DEPRIORITISE = "deprioritise"
    BLOCK = "block"


class BudgetLevel(enum.StrEnum):
    OK = "ok"
    NOTICE = "notice"  # at NOTICE_FRACTION or more
    EXCEEDED = "exceeded"  # at 100 % or more


@dataclass(frozen=True, slots=True)
class Budget:
    queue: str
    amount: float
    unit: BudgetUnit = BudgetUnit.USD
    period: BudgetPeriod = BudgetPeriod.MONTH
    action: BudgetAction = BudgetAction.WARN

    def __post_init__(self) -> None:
        problems: list[FieldProblem] = []
        if not self.queue.strip():
            problems.append(FieldProblem("queue", "is empty", "name the queue"))
        if not (math.isfinite(self.amount) and self.amount > 0):
            problems.append(FieldProblem("amount", f"is {self.amount}", "give an amount > 0"))
        check(problems, f"budget of queue {self.queue!r}")


def budget_window(period: BudgetPeriod, now: float) -> tuple[float, float | None]:
    """The window a budget counts spend in, and when it resets (a calendar month: the next month's start;
    rolling 30 days: None, spend leaves the window as it ages)."""
    if period is BudgetPeriod.ROLLING_30D:
        return now - ROLLING_DAYS * DAY, None
    moment = datetime.fromtimestamp(now, UTC)
    start = datetime(moment.year, moment.month, 1, tzinfo=UTC)
    following = datetime(moment.year + moment.month // 12, moment.month % 12 + 1, 1, tzinfo=UTC)
    return start.timestamp(), following.timestamp()


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    budget: Budget
    spent: float  # in the budget's unit
    window_start: float
    resets_at: float | None

    @property
    def fraction(self) -> float:
        return self.spent / self.budget.amount

    @property
    def level(self) -> BudgetLevel:
        if self.fraction >= 1.0:
            return BudgetLevel.EXCEEDED
        return BudgetLevel.NOTICE if self.fraction >= NOTICE_FRACTION else BudgetLevel.OK

    @property
    def blocks_submissions(self) -> bool:
        return self.level is BudgetLevel.EXCEEDED and self.budget.action is BudgetAction.BLOCK

    @property
    def deprioritises(self) -> bool:
        return self.level is BudgetLevel.EXCEEDED and self.budget.action is BudgetAction.DEPRIORITISE

    def amount_text(self, value: float) -> str:
        return f"${value:,.2f}" if self.budget.unit is BudgetUnit.USD else f"{gpu_hours_text(value)} GPU-hours"

    def reset_text(self) -> str:
        if self.resets_at is None:
            return "the budget is over a rolling 30 days: room comes back as spend older than 30 days leaves it"
        return "the budget resets " + datetime.fromtimestamp(self.resets_at, UTC).strftime("%Y-%m-%d %H:%M UTC")

    def summary(self) -> str:
        """e.g. `team-a has spent $812.00 of its $1,000.00 monthly budget (81 %)`."""
        period = "monthly" if self.budget.period is BudgetPeriod.MONTH else "rolling 30-day"
        return (
            f"queue {self.budget.queue} has spent {self.amount_text(self.spent)} of its "
            f"{self.amount_text(self.budget.amount)} {period} budget ({100 * self.fraction:.0f} %)"
        )


def gpu_hours_text(value: float) -> str:
    """GPU-hours with the digits their size needs: 1,234, 12.3, 0.05 (not `0.1` nor `0`)."""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:,.1f}"
    return f"{value:.2g}"


def budget_status(budget: Budget, spent_usd: float, spent_gpu_hours: float, now: float) -> BudgetStatus:
    """Where a queue stands against its budget, given what it spent in `budget_window`."""
    start, resets = budget_window(budget.period, now)
    spent = spent_usd if budget.unit is BudgetUnit.USD else spent_gpu_hours
    return BudgetStatus(budget, spent, start, resets)
