"""`gpufleet sim … --budget QUEUE=AMOUNT[:…]`: what queue budgets do to the chosen workload, with and without
them (see `gpufleet.sim.budget_study`), printed as tables or one JSON object."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from gpufleet.cli.safe_text import cell
from gpufleet.cli.sim_spot import PRICE_FILE, costs_root, workload_prices
from gpufleet.cli.variant_table import variant_table
from gpufleet.sim.budget_study import VARIANTS, parse_budget, run_budget_study
from gpufleet.sim.workload import Workload


def budget_study(
    workload: Workload, budgets: list[str], traces: Path | None, prices: Path | None, policy: str, as_json: bool
) -> None:
    parsed = [parse_budget(text) for text in budgets]
    if prices is None:
        prices = costs_root(traces, "--budget needs prices") / PRICE_FILE
    table = workload_prices(prices, workload)
    report = run_budget_study(workload, parsed, table, policy)
    report["prices"] = sorted({p.source for p in table.prices})
    if as_json:
        typer.echo(json.dumps(report, sort_keys=True))
        return
    print_budget_study(report)


def print_budget_study(report: dict[str, Any]) -> None:
    from gpufleet.cli.sim import stdout_console

    console = stdout_console()
    title = f"Budgets on {report['workload']} ({report['policy']})"
    columns = ("COST $", "FINISHED", "REFUSED", "JCT MEAN H", "JCT MEAN H (OTHER QUEUES)")
    out = variant_table(title, columns, report, VARIANTS, _budget_cells)
    console.print(out)
    queues = Table(title="Budgeted queues", header_style="bold")
    for column in ("QUEUE", "BUDGET", "VARIANT", "SPENT $", "GPU-H", "80 % AT H", "100 % AT H", "REFUSED", "JCT H"):
        queues.add_column(column, justify="left" if column in ("QUEUE", "BUDGET", "VARIANT") else "right")
    for budget in report["budgets"]:
        words = f"{budget['amount']:g} {budget['unit']} / {budget['period']}, {budget['action']}"
        for name in VARIANTS:
            row = report["variants"][name]["queues"][budget["queue"]]
            queues.add_row(
                cell(budget["queue"]),
                words,
                name,
                f"{row['spent_usd']:,.2f}",
                f"{row['spent_gpu_hours']:,.1f}",
                "-" if row["notice_at_h"] is None else f"{row['notice_at_h']:g}",
                "-" if row["exceeded_at_h"] is None else f"{row['exceeded_at_h']:g}",
                str(row["refused_submissions"]),
                str(row["jct_mean_h"]),
            )
    console.print(queues)
    console.print(cell(f"workload: {report['workload_citation']}"))
    console.print(cell("prices: " + "; ".join(report["prices"])))


def _budget_cells(row: Mapping[str, Any]) -> tuple[str, ...]:
    return (
        f"{row['cost_usd']:,.2f}",
        str(row["jobs_finished"]),
        str(row["jobs_refused"]),
        str(row["jct_mean_h"]),
        str(row["jct_mean_h_other_queues"]),
    )
