"""How costs and budgets read in the terminal (shared by `show`, `queues` and the cost commands)."""

from __future__ import annotations

from typing import Any

from gpufleet.cli.safe_text import markup
from gpufleet.domain.costs import gpu_hours_text


def usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def budget_cell(budget: dict[str, Any] | None) -> str:
    """`$812/$1,000 month 81% notice (block)`, or `-` for a queue without a budget."""
    if not budget:
        return "-"
    unit = budget["unit"]
    amount = usd(budget["amount"]) if unit == "usd" else f"{gpu_hours_text(budget['amount'])} GPU-h"
    spent = (
        "?" if budget["spent"] is None else (usd(budget["spent"]) if unit == "usd" else gpu_hours_text(budget["spent"]))
    )
    level = budget["level"]
    share = "" if budget["fraction"] is None else f" {100 * budget['fraction']:.0f}%"
    mark = {"ok": "", "notice": " NOTICE", "exceeded": " EXCEEDED"}[level]
    return f"{spent}/{amount} {budget['period']}{share}{mark} ({budget['action']})"


def cost_line(cost: dict[str, Any]) -> str:
    """A job's cost for `show`: total, used and reserved-idle, and what is unpriced."""
    text = (
        f"cost: {usd(cost['usd'])} for {cost['gpu_hours']:,.2f} GPU-hours "
        f"(used {usd(cost['used_usd'])}, reserved-idle {usd(cost['reserved_idle_usd'])})"
    )
    if cost["unpriced_gpu_hours"] > 0:
        text += f"; {cost['unpriced_gpu_hours']:,.2f} GPU-hours unpriced"
    parts = [
        f"{line['model']} {line['pool']} {line['gpu_hours']:,.2f} GPU-h {usd(line['usd'])}" for line in cost["lines"]
    ]
    if parts:
        text += " [" + "; ".join(parts) + "]"
    return markup(text)
