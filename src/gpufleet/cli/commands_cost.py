"""`gpufleet price …`, `gpufleet budget …`, `gpufleet report cost` and `gpufleet report lost-work`: the price
table, queue budgets, chargeback (allocated, used and reserved-idle cost per queue, user, GPU model or pool),
and the work lost to preemptions, node losses and failures."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from gpufleet.cli import output
from gpufleet.cli.commands_client import JsonOpt, TokenOpt, UrlOpt, _client
from gpufleet.cli.commands_report import parse_since, report_app
from gpufleet.cli.cost_text import budget_cell, usd
from gpufleet.cli.safe_text import cell, markup, plain
from gpufleet.domain.errors import GpufleetError

price_app = typer.Typer(help="GPU prices: USD per GPU-hour per model and pool.", no_args_is_help=True)
budget_app = typer.Typer(
    help="Budgets per queue: a cap on spend, a notice at 80 %, an action at 100 %.", no_args_is_help=True
)

PoolOpt = Annotated[str, typer.Option(help="on-demand, spot or reserved.")]


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True))


def _prices_table(prices: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("MODEL", "POOL", "USD/GPU-H", "SOURCE"):
        table.add_column(column, justify="right" if column == "USD/GPU-H" else "left")
    for price in prices:
        table.add_row(cell(price["model"]), price["pool"], f"{price['usd_per_gpu_hour']:.4f}", cell(price["source"]))
    return table


@price_app.command("set")
def price_set(
    model: Annotated[str, typer.Argument(help="GPU model as the inventory names it, e.g. A100-80GB.")],
    usd_per_gpu_hour: Annotated[float, typer.Argument(help="USD per GPU-hour.", min=0)],
    pool: PoolOpt = "on-demand",
    source: Annotated[str, typer.Option(help="Where the figure comes from (shown with reports).")] = "set by an admin",
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Set the price of a GPU model in a pool (admin); attempts that start from now on are billed at it."""
    with _client(url, token) as client:
        body = {"usd_per_gpu_hour": usd_per_gpu_hour, "pool": pool, "source": source}
        saved = client.call("PUT", f"/v1/prices/{model}", json_body=body)
    if as_json:
        _print_json(saved)
    else:
        typer.echo(plain(f"{saved['model']} ({saved['pool']}): ${saved['usd_per_gpu_hour']:.4f} per GPU-hour"))


@price_app.command("import")
def price_import(
    file: Annotated[Path, typer.Argument(help="CSV: model,pool,usd_per_gpu_hour; or SkyPilot's GCP vms.csv cut.")],
    region: Annotated[str, typer.Option(help="GCP catalog: the region whose prices to take.")] = "us-central1",
    host_vm: Annotated[
        bool, typer.Option("--host-vm/--gpu-only", help="GCP catalog: add the A2/A3 host VM's per-GPU share.")
    ] = True,
    source: Annotated[str | None, typer.Option(help="Where the file comes from (default: its name).")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Load prices from a CSV file (admin): every row or none."""
    with _client(url, token) as client:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise GpufleetError(f"cannot read {file}: {error}", "give a readable UTF-8 CSV file") from None
        body = {"csv": text, "source": source or file.name, "region": region, "host_vm": host_vm}
        saved = client.call("POST", "/v1/prices/import", json_body=body)
    if as_json:
        _print_json(saved)
    else:
        output.console().print(_prices_table(saved["prices"]))
        typer.echo(f"{len(saved['prices'])} prices set")


@price_app.command("list")
def price_list(url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """The price table."""
    with _client(url, token) as client:
        prices = client.get("/v1/prices")["prices"]
    if as_json:
        _print_json(prices)
    elif not prices:
        typer.echo("no prices set: gpufleet price set MODEL USD [--pool spot], or gpufleet price import FILE.csv")
    else:
        output.console().print(_prices_table(prices))


@price_app.command("delete")
def price_delete(
    model: Annotated[str, typer.Argument(help="GPU model.")],
    pool: PoolOpt = "on-demand",
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Remove a price (admin): that model's GPU-hours in the pool are then counted but not billed."""
    with _client(url, token) as client:
        client.call("DELETE", f"/v1/prices/{model}", params={"pool": pool})
    typer.echo(plain(f"price of {model} ({pool}) removed"))


@budget_app.command("set")
def budget_set(
    queue: Annotated[str, typer.Argument(help="The queue (team).")],
    amount: Annotated[float, typer.Argument(help="The cap, in --unit.", min=0)],
    unit: Annotated[str, typer.Option(help="usd or gpu-hours.")] = "usd",
    period: Annotated[str, typer.Option(help="month (calendar, UTC) or rolling-30d.")] = "month",
    action: Annotated[
        str,
        typer.Option(
            help="At 100 %: warn (a notice only), deprioritise (its jobs run only on idle capacity: no borrowing, "
            "no preempting, first victims) or block (new submissions refused until the budget resets)."
        ),
    ] = "warn",
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Set a queue's budget (admin)."""
    with _client(url, token) as client:
        body = {"amount": amount, "unit": unit, "period": period, "action": action}
        saved = client.call("PUT", f"/v1/queues/{queue}/budget", json_body=body)
    if as_json:
        _print_json(saved)
    else:
        typer.echo(plain(f"queue {queue}: budget {budget_cell(saved)}"))


@budget_app.command("list")
def budget_list(url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Budgets of the queues you may see, with their spend at the last check."""
    with _client(url, token) as client:
        budgets = client.get("/v1/budgets")["budgets"]
    if as_json:
        _print_json(budgets)
        return
    if not budgets:
        typer.echo("no budgets: gpufleet budget set QUEUE AMOUNT [--unit gpu-hours] [--action block]")
        return
    console = output.console()
    for budget in budgets:
        console.print(markup(f"{budget['queue']}: {budget_cell(budget)}"))
        if budget["summary"]:
            console.print(f"  [dim]{markup(budget['summary'])}[/]")


@budget_app.command("delete")
def budget_delete(
    queue: Annotated[str, typer.Argument(help="The queue (team).")], url: UrlOpt = None, token: TokenOpt = None
) -> None:
    """Remove a queue's budget (admin)."""
    with _client(url, token) as client:
        client.call("DELETE", f"/v1/queues/{queue}/budget")
    typer.echo(plain(f"queue {queue}: budget removed"))


def cost_table(report: dict[str, Any]) -> Table:
    since = datetime.fromtimestamp(report["since"], UTC).strftime("%Y-%m-%d %H:%M")
    until = datetime.fromtimestamp(report["until"], UTC).strftime("%Y-%m-%d %H:%M")
    label = " (emulated GPUs)" if report["emulated"] else ""
    out = Table(title=f"Cost per {report['by']}, {since} to {until} UTC{label}", header_style="bold")
    for column in ("KEY", "GPU-HOURS", "COST", "USED", "RESERVED-IDLE", "IDLE SHARE", "UNPRICED GPU-H"):
        out.add_column(
            report["by"].upper() if column == "KEY" else column, justify="left" if column == "KEY" else "right"
        )
    for row in [*report["groups"], report["total"]]:
        share = row["idle_share"]
        out.add_row(
            Text(row["key"], style="bold") if row is report["total"] else cell(row["key"]),
            f"{row['gpu_hours']:,.2f}",
            usd(row["usd"]),
            usd(row["used_usd"]),
            usd(row["reserved_idle_usd"]),
            "-" if share is None else f"{100 * share:.0f}%",
            f"{row['unpriced_gpu_hours']:,.2f}",
        )
    return out


def cost_chart(report: dict[str, Any], path: Path) -> Path:
    """Stacked bars per group: used and reserved-idle USD (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["groups"]
    names = [r["key"] for r in rows]
    used = [r["used_usd"] for r in rows]
    idle = [r["reserved_idle_usd"] for r in rows]
    figure, axes = plt.subplots(figsize=(max(6.0, 1.0 * len(names) + 3), 4.5))
    axes.bar(names, used, label="used", color="#55a868")
    axes.bar(names, idle, bottom=used, label="reserved-idle (waste)", color="#c44e52")
    axes.set_ylabel("USD")
    if len(names) > 6:
        axes.tick_params(axis="x", rotation=30)
    emulated = " - EMULATED GPUs" if report["emulated"] else ""
    since = datetime.fromtimestamp(report["since"], UTC).strftime("%Y-%m-%d")
    until = datetime.fromtimestamp(report["until"], UTC).strftime("%Y-%m-%d")
    axes.set_title(f"GPU cost per {report['by']}, {since} to {until} UTC{emulated}")
    axes.legend()
    sources = [n.removeprefix("prices from: ") for n in report["notes"] if n.startswith("prices from: ")]
    if sources:
        figure.text(0.01, 0.01, "prices: " + sources[0][:150], fontsize=7, color="#555555")
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


@report_app.command("cost")
def cost(
    since: Annotated[str, typer.Option(help="Window start: 30d, 12h, 30m, or a date (UTC).")] = "30d",
    until: Annotated[str | None, typer.Option(help="Window end, same forms as --since [default: now].")] = None,
    by: Annotated[str, typer.Option(help="Group by queue, user, model or pool.")] = "queue",
    png: Annotated[Path | None, typer.Option(help="Also write a bar chart (used and idle USD) to this PNG.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Chargeback: GPU-hours and USD allocated, used and reserved-but-idle (the waste), per group."""
    with _client(url, token) as client:
        if by not in ("queue", "user", "model", "pool"):
            raise GpufleetError(f"--by {by!r} is not a grouping", "give queue, user, model or pool")
        now = time.time()
        params: dict[str, Any] = {"since": max(0.0, parse_since(since, now)), "by": by}
        if until is not None:
            params["until"] = max(0.0, parse_since(until, now))
        report = client.get("/v1/reports/cost", **params)
        if png is not None:
            try:
                cost_chart(report, png)
            except OSError as error:
                raise GpufleetError(f"cannot write the chart to {png}: {error}", "give a writable path") from None
    if as_json:
        _print_json(report)
        return
    console = output.console()
    console.print(cost_table(report))
    for note in report["notes"]:
        console.print(f"[dim]{markup(note)}[/]")
    if png is not None:
        typer.echo(f"chart written to {png}")


def lost_work_table(report: dict[str, Any]) -> Table:
    table = Table(title=f"Work lost to preemptions, node losses and failures, by {report['by']}")
    for name in ("", "attempts", "lost h", "GPU-h", "USD", "preempted GPU-h", "lost-node GPU-h", "failed GPU-h"):
        table.add_column(name, justify="left" if not name else "right")
    for group in [*report["groups"], report["total"]]:
        causes = group["gpu_hours_by_cause"]
        usd_text = usd(group["usd"])
        if group["unpriced_gpu_hours"] > 0:
            usd_text += f" (+{group['unpriced_gpu_hours']:,.2f} GPU-h unpriced)"
        table.add_row(
            cell(group["key"]),
            str(group["attempts"]),
            f"{group['lost_hours']:,.2f}",
            f"{group['gpu_hours']:,.2f}",
            usd_text,
            *(f"{causes.get(cause, 0.0):,.2f}" for cause in ("preempted", "lost", "failed")),
        )
    return table


@report_app.command("lost-work")
def lost_work(
    since: Annotated[str, typer.Option(help="Window start: 30d, 12h, 30m, or a date (UTC).")] = "30d",
    until: Annotated[str | None, typer.Option(help="Window end, same forms as --since [default: now].")] = None,
    by: Annotated[str, typer.Option(help="Group by queue or user.")] = "queue",
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """GPU-hours and USD lost to preemptions, node losses and failures: the work since each ended attempt's
    last checkpoint (or its start), priced like `report cost`."""
    with _client(url, token) as client:
        if by not in ("queue", "user"):
            raise GpufleetError(f"--by {by!r} is not a grouping of lost work", "give queue or user")
        now = time.time()
        params: dict[str, Any] = {"since": max(0.0, parse_since(since, now)), "by": by}
        if until is not None:
            params["until"] = max(0.0, parse_since(until, now))
        report = client.get("/v1/reports/lost-work", **params)
    if as_json:
        _print_json(report)
        return
    console = output.console()
    console.print(lost_work_table(report))
    for note in report["notes"]:
        console.print(f"[dim]{markup(note)}[/]")


def register_cost_commands(app: typer.Typer) -> None:
    app.add_typer(price_app, name="price")
    app.add_typer(budget_app, name="budget")
