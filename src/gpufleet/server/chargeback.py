"""Chargeback and budgets in the control plane: what jobs cost over a window, and where queues stand.

**Cost** (`cost_report`, `job_cost`): every interval a job held resources (from its transitions, as
`usage.holding_intervals` finds them) x the GPUs of each model and pool it held then, at the price stored
when that attempt started (`charges`, written by the store with the move into holding). An attempt the store
has no charge for (it started before prices existed in this store) is counted at the GPUs it asked for, model
`unknown`, unpriced. The reserved-but-idle part is the job's measured idle share (GPU-seconds held while
flagged idle / GPU-seconds sampled, from `UsageBook`) of its cost; the rest is used.

**Budgets** (`BudgetWatch`): every `interval_s`, each queue with a budget gets its spend over the budget's
window; the level found (ok, notice at 80 %, exceeded at 100 %) is stored (which makes the store mark a queue
whose action is `deprioritise` for the scheduler), a change is logged and written to the audit log as an
event by `gpufleet`, and `block` refuses submissions until the window resets.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpufleet.domain.costs import (
    HOUR,
    BudgetLevel,
    BudgetStatus,
    Charge,
    CostLine,
    Pool,
    attempt_cost,
    budget_status,
    budget_window,
)
from gpufleet.domain.errors import LimitError
from gpufleet.domain.records import JobRecord
from gpufleet.ports import Clock
from gpufleet.ports.admin import AdminStore, AuditEntry, JobQuery
from gpufleet.server.periodic import Periodic
from gpufleet.server.usage import PAGE, UsageBook, holding_intervals

log = logging.getLogger("gpufleet.cost")

UNKNOWN_MODEL = "unknown"
GROUPS = ("queue", "user", "model", "pool")


@dataclass(frozen=True, slots=True)
class CostReport:
    since: float
    until: float
    lines: tuple[CostLine, ...]
    jobs: dict[str, int] = field(default_factory=dict)  # per queue: jobs that held GPUs in the window

    def grouped(self, by: str) -> list[CostGroup]:
        """Totals per value of `by` (queue, user, model or pool), largest cost first."""
        groups: dict[str, CostGroup] = {}
        for line in self.lines:
            key = str(getattr(line, by))
            groups.setdefault(key, CostGroup(key)).add(line)
        return sorted(groups.values(), key=lambda g: (-g.usd, g.key))


@dataclass(slots=True)
class CostGroup:
    key: str
    gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    usd: float = 0.0
    idle_usd: float = 0.0
    unpriced_gpu_hours: float = 0.0

    def add(self, line: CostLine) -> None:
        self.gpu_hours += line.gpu_hours
        self.idle_gpu_hours += line.idle_gpu_hours
        if line.usd is None:
            self.unpriced_gpu_hours += line.gpu_hours
        else:
            self.usd += line.usd
            self.idle_usd += line.idle_usd or 0.0

    @property
    def used_usd(self) -> float:
        return max(0.0, self.usd - self.idle_usd)


def _idle_fraction(book: UsageBook | None, job_id: str) -> float:
    if book is None:
        return 0.0
    use = book.job(job_id)
    return use.idle / use.sampled if use.sampled > 0 else 0.0


def _record_lines(
    record: JobRecord,
    intervals: Sequence[tuple[float, float]],
    charges: dict[float, tuple[Charge, ...]],
    since: float,
    until: float,
    idle: float,
) -> list[CostLine]:
    lines: list[CostLine] = []
    job = record.job
    for start, end in intervals:
        held = max(0.0, min(end, until) - max(start, since))
        if held <= 0:
            continue
        priced = charges.get(start)
        if priced is None:  # no charge stored for this attempt: what it asked for, unpriced
            priced = (Charge(UNKNOWN_MODEL, Pool.ON_DEMAND, job.gpu_milli_total / 1000.0, None),)
        lines.extend(attempt_cost(priced, held, queue=job.queue, user=job.user, idle_fraction=idle))
    return lines


def _merge(lines: Iterable[CostLine]) -> tuple[CostLine, ...]:
    """One line per (queue, user, model, pool)."""
    merged: dict[tuple[str, str, str, Pool], CostLine] = {}
    for line in lines:
        key = (line.queue, line.user, line.model, line.pool)
        before = merged.get(key)
        if before is None:
            merged[key] = line
            continue
        usd = None if before.usd is None or line.usd is None else before.usd + line.usd
        merged[key] = CostLine(
            *key, before.gpu_hours + line.gpu_hours, usd, before.idle_gpu_hours + line.idle_gpu_hours
        )
    return tuple(merged[k] for k in sorted(merged, key=lambda k: (k[0], k[1], k[2], k[3].value)))


def cost_report(
    store: AdminStore, book: UsageBook | None, since: float, until: float, queues: set[str] | None = None
) -> CostReport:
    """What jobs cost in [since, until], per (queue, user, model, pool); `queues` limits it to those."""
    lines: list[CostLine] = []
    jobs: dict[str, int] = {}
    before: int | None = None
    only = next(iter(queues)) if queues is not None and len(queues) == 1 else None
    while True:
        page = store.jobs(JobQuery(queue=only, limit=PAGE, before_seq=before))
        held = [
            r
            for r in page
            if (queues is None or r.job.queue in queues)
            and r.submitted_at <= until
            and not (r.state.terminal and r.finished_at is not None and r.finished_at < since)
            and not (r.first_started_at is None and r.attempt == 0)
        ]
        charges = store.charges([r.id for r in held]) if held else {}
        for record in held:
            intervals = holding_intervals(record, store.history(record.id), until)
            found = _record_lines(
                record, intervals, charges.get(record.id, {}), since, until, _idle_fraction(book, record.id)
            )
            if found:
                lines.extend(found)
                jobs[record.job.queue] = jobs.get(record.job.queue, 0) + 1
        if len(page) < PAGE:
            return CostReport(since, until, _merge(lines), jobs)
        before = page[-1].job.submit_seq


@dataclass(frozen=True, slots=True)
class JobCost:
    lines: tuple[CostLine, ...]

    @property
    def gpu_hours(self) -> float:
        return sum(line.gpu_hours for line in self.lines)

    @property
    def usd(self) -> float:
        return sum(line.usd or 0.0 for line in self.lines)

    @property
    def idle_usd(self) -> float:
        return sum(line.idle_usd or 0.0 for line in self.lines)

    @property
    def unpriced_gpu_hours(self) -> float:
        return sum(line.gpu_hours for line in self.lines if line.usd is None)


def job_cost(store: AdminStore, book: UsageBook | None, record: JobRecord, now: float) -> JobCost:
    """A job's cost over its whole life so far."""
    intervals = holding_intervals(record, store.history(record.id), now)
    charges = store.charges([record.id]).get(record.id, {})
    lines = _record_lines(record, intervals, charges, -math.inf, now, _idle_fraction(book, record.id))
    return JobCost(_merge(lines))


def spend(report: CostReport, queue: str) -> tuple[float, float]:
    """A queue's USD (priced GPU-hours only) and GPU-hours (all) in a report."""
    usd = sum(line.usd or 0.0 for line in report.lines if line.queue == queue)
    gpu_hours = sum(line.gpu_hours for line in report.lines if line.queue == queue)
    return usd, gpu_hours


class BudgetWatch:
    """Where each queue with a budget stands; refreshed by `check` (a thread calls it every `interval_s`,
    and the API after a budget changes). `blocking(queue)` is what the submit path asks: no store access."""

    def __init__(
        self,
        store: AdminStore,
        clock: Clock,
        book: Callable[[], UsageBook | None] = lambda: None,
        interval_s: float = 60.0,
    ) -> None:
        self.store = store
        self.clock = clock
        self.book = book
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._statuses: dict[str, BudgetStatus] = {}
        self._periodic = Periodic("gpufleet-budgets", interval_s, self.check, "budget check")

    def statuses(self) -> dict[str, BudgetStatus]:
        with self._lock:
            return dict(self._statuses)

    def status(self, queue: str) -> BudgetStatus | None:
        with self._lock:
            return self._statuses.get(queue)

    def check(self) -> dict[str, BudgetStatus]:
        """Measure every budgeted queue's spend now; store level changes and record them as events."""
        now = self.clock.now()
        budgets = self.store.budgets()
        found: dict[str, BudgetStatus] = {}
        for queue, (budget, level_before) in budgets.items():
            start, _ = budget_window(budget.period, now)
            report = cost_report(self.store, self.book(), start, now, {queue})
            usd, gpu_hours = spend(report, queue)
            status = budget_status(budget, usd, gpu_hours, now)
            found[queue] = status
            if status.level is not level_before:
                self.store.set_budget_level(queue, status.level, now)
                self._event(status, level_before, now)
        with self._lock:
            self._statuses = found
        return found

    def _event(self, status: BudgetStatus, before: BudgetLevel, now: float) -> None:
        budget = status.budget
        words = {
            BudgetLevel.OK: "is back under 80 % of its budget",
            BudgetLevel.NOTICE: "passed 80 % of its budget",
            BudgetLevel.EXCEEDED: f"spent its budget; action: {budget.action.value}",
        }[status.level]
        detail = f"{status.summary()}: {words} (was {before.value}); {status.reset_text()}"
        log.warning("budget: %s", detail)
        self.store.audit(AuditEntry(now, "gpufleet", f"budget.{status.level.value}", budget.queue, detail, "budget"))

    def blocking(self, queue: str) -> None:
        """Raise LimitError if the queue's budget is spent and its action is `block`."""
        status = self.status(queue)
        if status is not None and status.blocks_submissions:
            raise LimitError(
                f"{status.summary()}; its action is block, so it takes no new jobs",
                f"{status.reset_text()}; an admin may raise it (gpufleet budget set {queue} …) or remove it; "
                "running jobs go on",
            )

    def start(self) -> None:
        self._periodic.start()

    def stop(self) -> None:
        self._periodic.stop()


__all__ = ["GROUPS", "HOUR", "BudgetWatch", "CostReport", "JobCost", "cost_report", "job_cost"]
