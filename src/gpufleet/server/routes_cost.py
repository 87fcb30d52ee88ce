"""`/v1/prices` (the price table), `/v1/budgets` and `/v1/queues/{name}/budget`, `/v1/jobs/{id}/cost`,
`/v1/reports/cost` (chargeback: allocated, used and reserved-idle cost per queue, user, model or pool),
`/v1/reports/lost-work` (GPU-hours and USD lost to preemptions, node losses and failures), and
`/v1/spot-pools` (the spot pools' circuit breakers).

Prices are readable by every token (they are what a GPU-hour costs, not anyone's spend); a team token sees
its own queue's budget, jobs and costs only; changing prices and budgets is for admins.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query

from gpufleet.domain.costs import Budget, BudgetAction, BudgetPeriod, BudgetUnit, Price, parse_pool, read_price_csv
from gpufleet.domain.errors import FieldProblem, SpecError
from gpufleet.server.auth import Principal
from gpufleet.server.chargeback import UNKNOWN_MODEL, CostGroup, cost_report, job_cost
from gpufleet.server.http_errors import NotFoundError
from gpufleet.server.lost_work import LostWorkGroup, lost_work_report
from gpufleet.server.request_deps import principal, service
from gpufleet.server.schemas_cost import (
    BudgetIn,
    BudgetOut,
    BudgetsOut,
    CostReportOut,
    JobCostOut,
    LostWorkGroupOut,
    LostWorkReportOut,
    PriceImportIn,
    PriceIn,
    PriceOut,
    PricesOut,
    SpotPoolOut,
    SpotPoolsOut,
)
from gpufleet.server.service import Service
from gpufleet.server.spot_watch import PoolStatus
from gpufleet.server.views_cost import budget_of, budget_out, group_out, line_out, price_out

router = APIRouter(tags=["cost"])

Who = Annotated[Principal, Depends(principal)]
Svc = Annotated[Service, Depends(service)]
QueueName = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$", description="e.g. team-a")]
ModelName = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._()/+-]{0,99}$", description="e.g. A100-80GB")]
JobIdPath = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$", description="e.g. j-7f3a9c21")]
PoolQuery = Annotated[Literal["on-demand", "spot", "reserved"], Query(description="the price's pool")]


@router.get("/prices")
def prices(who: Who, svc: Svc) -> PricesOut:
    """USD per GPU-hour per GPU model and pool."""
    return PricesOut(prices=[price_out(p) for p in svc.store.prices().prices])


@router.put("/prices/{model}")
def set_price(model: ModelName, body: PriceIn, who: Who, svc: Svc) -> PriceOut:
    """Set the price of a GPU model in a pool (admin). Attempts that start from now on are billed at it."""
    svc.audit.require_admin(who, "setting a price", "price.set", model)
    price = Price(model, parse_pool(body.pool), body.usd_per_gpu_hour, body.source)
    svc.store.set_prices([price], svc.ctx.clock.now())
    svc.audit.record(who, "price.set", model, body.model_dump())
    return price_out(price)


@router.delete("/prices/{model}", status_code=204)
def delete_price(model: ModelName, who: Who, svc: Svc, pool: PoolQuery = "on-demand") -> None:
    """Remove a price (admin): the model's GPU-hours in that pool are then counted but not billed."""
    svc.audit.require_admin(who, "removing a price", "price.delete", model)
    svc.store.delete_price(model, parse_pool(pool))
    svc.audit.record(who, "price.delete", model, {"pool": pool})


@router.post("/prices/import")
def import_prices(body: PriceImportIn, who: Who, svc: Svc) -> PricesOut:
    """Load prices from a CSV (admin): gpufleet's `model,pool,usd_per_gpu_hour`, or SkyPilot's GCP catalog
    (`cloud,kind,name,count,…`); all rows or none."""
    svc.audit.require_admin(who, "importing prices", "price.import", body.source)
    found = read_price_csv(body.csv, source=body.source, region=body.region, host_vm=body.host_vm)
    svc.store.set_prices(found, svc.ctx.clock.now())
    svc.audit.record(who, "price.import", body.source, {"prices": len(found), "region": body.region})
    return PricesOut(prices=[price_out(p) for p in found])


@router.get("/budgets")
def budgets(who: Who, svc: Svc) -> BudgetsOut:
    """Every visible queue's budget, with its spend at the last check."""
    statuses = svc.budgets.statuses()
    shown = [budget_out(b, statuses.get(q)) for q, (b, _) in svc.store.budgets().items() if who.may_see(q)]
    return BudgetsOut(budgets=shown)


@router.put("/queues/{name}/budget", tags=["queues"])
def set_budget(name: QueueName, body: BudgetIn, who: Who, svc: Svc) -> BudgetOut:
    """Set a queue's budget (admin): an amount in USD or GPU-hours per calendar month (UTC) or rolling 30
    days, and what happens at 100 %: warn, deprioritise or block. A notice comes at 80 %."""
    svc.audit.require_admin(who, "setting a budget", "budget.set", name)
    budget = Budget(name, body.amount, BudgetUnit(body.unit), BudgetPeriod(body.period), BudgetAction(body.action))
    svc.store.set_budget(budget)
    svc.audit.record(who, "budget.set", name, body.model_dump())
    svc.budgets.check()
    svc.ctx.wake()
    found = budget_of(svc.store.budgets(), svc.budgets.statuses(), name)
    assert found is not None
    return found


@router.delete("/queues/{name}/budget", tags=["queues"], status_code=204)
def delete_budget(name: QueueName, who: Who, svc: Svc) -> None:
    """Remove a queue's budget (admin); a queue deprioritised or blocked by it is so no longer."""
    svc.audit.require_admin(who, "removing a budget", "budget.delete", name)
    svc.store.delete_budget(name)
    svc.audit.record(who, "budget.delete", name, {})
    svc.budgets.check()
    svc.ctx.wake()


@router.post("/budgets/check", tags=["queues"])
def check_budgets(who: Who, svc: Svc) -> BudgetsOut:
    """Measure every budget now instead of at the next periodic check (admin)."""
    svc.audit.require_admin(who, "checking budgets", "budget.check", "all")
    statuses = svc.budgets.check()
    return BudgetsOut(budgets=[budget_out(s.budget, s) for s in statuses.values()])


@router.get("/jobs/{job_id}/cost", tags=["jobs"])
def cost_of_job(job_id: JobIdPath, who: Who, svc: Svc) -> JobCostOut:
    """A job's cost so far: GPU-hours held x the price of each model and pool when each attempt started."""
    record = svc.store.get(job_id)
    if record is None or not who.may_see(record.job.queue):
        raise NotFoundError(f"no job {job_id!r}", "list your jobs with `gpufleet jobs`")
    cost = job_cost(svc.store, svc.usage_book(), record, svc.ctx.clock.now())
    notes = []
    if any(line.model == UNKNOWN_MODEL for line in cost.lines):
        notes.append("an attempt started before this store priced attempts: counted at the GPUs asked, unpriced")
    if cost.unpriced_gpu_hours > 0:
        notes.append("some GPU-hours have no price for their model and pool: set one with `gpufleet price set`")
    return JobCostOut(
        job_id=job_id,
        gpu_hours=cost.gpu_hours,
        usd=cost.usd,
        used_usd=max(0.0, cost.usd - cost.idle_usd),
        reserved_idle_usd=cost.idle_usd,
        unpriced_gpu_hours=cost.unpriced_gpu_hours,
        lines=[line_out(line) for line in cost.lines],
        notes=notes,
    )


@router.get("/reports/cost")
def report_cost(
    who: Who,
    svc: Svc,
    since: Annotated[float, Query(ge=0, le=1e11, description="Start of the window (Unix seconds).")],
    until: Annotated[float | None, Query(ge=0, le=1e11, description="End of the window (default: now).")] = None,
    by: Annotated[Literal["queue", "user", "model", "pool"], Query()] = "queue",
) -> CostReportOut:
    """Allocated, used and reserved-idle cost in a window, per queue, user, GPU model or pool."""
    end = svc.ctx.clock.now() if until is None else until
    if end < since:
        raise SpecError("cost window", (FieldProblem("until", f"is before since ({since})", "give until >= since"),))
    queues = None if who.admin else {who.queue or ""}
    book = svc.usage_book()
    report = cost_report(svc.store, book, since, end, queues)
    groups = report.grouped(by)
    total = CostGroup("all")
    for line in report.lines:
        total.add(line)
    notes = [
        "allocated: exact, from job history, each attempt at the price in force when it started",
        "reserved-idle: the job's measured idle share of its cost (GPU telemetry)",
    ]
    if book is None:
        notes.append("no GPU telemetry in this control plane: reserved-idle cost is not measured (shown as 0)")
    if total.unpriced_gpu_hours > 0:
        notes.append(f"{total.unpriced_gpu_hours:,.2f} GPU-hours have no price: `gpufleet price set` or `price import`")
    sources = sorted({p.source for p in svc.store.prices().prices if p.source})
    if sources:
        notes.append("prices from: " + "; ".join(sources))
    return CostReportOut(
        since=since,
        until=end,
        by=by,
        emulated=svc.ctx.emulated,
        groups=[group_out(g) for g in groups],
        total=group_out(total),
        prices=[price_out(p) for p in svc.store.prices().prices],
        notes=notes,
    )


def _lost_out(group: LostWorkGroup) -> LostWorkGroupOut:
    return LostWorkGroupOut(
        key=group.key,
        attempts=group.attempts,
        lost_hours=group.lost_s / 3600.0,
        gpu_hours=group.gpu_hours,
        usd=group.usd,
        unpriced_gpu_hours=group.unpriced_gpu_hours,
        gpu_hours_by_cause=dict(sorted(group.by_cause.items())),
    )


@router.get("/reports/lost-work")
def report_lost_work(
    who: Who,
    svc: Svc,
    since: Annotated[float, Query(ge=0, le=1e11, description="Start of the window (Unix seconds).")],
    until: Annotated[float | None, Query(ge=0, le=1e11, description="End of the window (default: now).")] = None,
    by: Annotated[Literal["queue", "user"], Query()] = "queue",
) -> LostWorkReportOut:
    """Work lost to preemptions, node losses and failures in a window (attempts that ended in it): the work
    since each attempt's last checkpoint (or its start), in GPU-hours and USD at the attempt's prices."""
    end = svc.ctx.clock.now() if until is None else until
    if end < since:
        raise SpecError(
            "lost-work window", (FieldProblem("until", f"is before since ({since})", "give until >= since"),)
        )
    queues = None if who.admin else {who.queue or ""}
    report = lost_work_report(svc.store, since, end, by, queues)
    notes = [
        "lost: the work since the attempt's last reported checkpoint (a job without one: the last save its "
        "declared checkpoint_interval implies, else its start), for attempts that ended by preemption, node "
        "loss or a failed worker; cancels, timeouts and reclaimed idle jobs are not counted",
        "priced at the price in force when the attempt started",
    ]
    if report.total.unpriced_gpu_hours > 0:
        notes.append(
            f"{report.total.unpriced_gpu_hours:,.2f} lost GPU-hours have no price: "
            "`gpufleet price set` or `price import`"
        )
    return LostWorkReportOut(
        since=since,
        until=end,
        by=by,
        groups=[_lost_out(g) for g in report.groups],
        total=_lost_out(report.total),
        notes=notes,
    )


def _spot_out(svc: Service, statuses: list[PoolStatus]) -> SpotPoolsOut:
    watch = svc.ctx.spot
    if watch is None:
        return SpotPoolsOut(enabled=False, pools=[])
    return SpotPoolsOut(
        enabled=True,
        threshold_per_node_hour=watch.breakers.settings.threshold,
        pools=[SpotPoolOut(**dataclasses.asdict(p)) for p in statuses],
    )


@router.get("/spot-pools", tags=["nodes"])
def spot_pools(who: Who, svc: Svc) -> SpotPoolsOut:
    """Each spot pool's circuit breaker: state, since when and why, its interruption rate per node-hour."""
    return _spot_out(svc, svc.ctx.spot.pools() if svc.ctx.spot is not None else [])


@router.post("/spot-pools/check", tags=["nodes"])
def check_spot_pools(who: Who, svc: Svc) -> SpotPoolsOut:
    """Count spot losses and step the breakers now instead of at the next periodic check (admin)."""
    svc.audit.require_admin(who, "checking spot pools", "spot.check", "all")
    if svc.ctx.spot is None:
        raise NotFoundError("no spot watch runs in this control plane", "it runs in a control plane started by `up`")
    return _spot_out(svc, svc.ctx.spot.check())
