"""Cost values as the API shows them (see `schemas_cost.py`)."""

from __future__ import annotations

from collections.abc import Mapping

from gpufleet.domain.costs import Budget, BudgetLevel, BudgetStatus, CostLine, Price
from gpufleet.server.chargeback import CostGroup
from gpufleet.server.schemas_cost import BudgetOut, CostGroupOut, CostLineOut, PriceOut


def price_out(price: Price) -> PriceOut:
    return PriceOut(
        model=price.model, pool=price.pool.value, usd_per_gpu_hour=price.usd_per_gpu_hour, source=price.source
    )


def budget_out(budget: Budget, status: BudgetStatus | None) -> BudgetOut:
    out = BudgetOut(
        queue=budget.queue,
        amount=budget.amount,
        unit=budget.unit.value,
        period=budget.period.value,
        action=budget.action.value,
    )
    if status is None or status.budget != budget:
        return out
    return out.model_copy(
        update={
            "spent": status.spent,
            "fraction": status.fraction,
            "level": status.level.value,
            "window_start": status.window_start,
            "resets_at": status.resets_at,
            "summary": f"{status.summary()}; {status.reset_text()}",
        }
    )


def budget_of(
    budgets: Mapping[str, tuple[Budget, BudgetLevel]], statuses: Mapping[str, BudgetStatus], queue: str
) -> BudgetOut | None:
    """A queue's budget as shown, with where it stood at the last check (None: the queue has none)."""
    found = budgets.get(queue)
    return None if found is None else budget_out(found[0], statuses.get(queue))


def line_out(line: CostLine) -> CostLineOut:
    return CostLineOut(
        queue=line.queue,
        user=line.user,
        model=line.model,
        pool=line.pool.value,
        gpu_hours=line.gpu_hours,
        reserved_idle_gpu_hours=line.idle_gpu_hours,
        usd=line.usd,
        reserved_idle_usd=line.idle_usd,
    )


def group_out(group: CostGroup) -> CostGroupOut:
    return CostGroupOut(
        key=group.key,
        gpu_hours=group.gpu_hours,
        reserved_idle_gpu_hours=group.idle_gpu_hours,
        usd=group.usd,
        used_usd=group.used_usd,
        reserved_idle_usd=group.idle_usd,
        idle_share=group.idle_usd / group.usd if group.usd > 0 else None,
        unpriced_gpu_hours=group.unpriced_gpu_hours,
    )
