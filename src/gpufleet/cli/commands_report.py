"""`gpufleet report usage`: GPU-hours per queue, allocated vs used vs held idle; and `gpufleet quota idle-policy`.

The figures come from the control plane's `/v1/usage` (so the report works against a remote one): allocation
from job history, use and idleness from the GPU samples it kept.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from gpufleet.cli import output
from gpufleet.cli.commands_client import JsonOpt, TokenOpt, UrlOpt, _client
from gpufleet.cli.safe_text import cell, markup, plain
from gpufleet.domain.errors import GpufleetError

report_app = typer.Typer(help="Reports from the control plane.", no_args_is_help=True)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float) -> float:
    """`7d`, `12h`, `30m`, `90s`, `2w` before `now`; or a date / date-time (ISO 8601, UTC unless it says)."""
    match = _DURATION.match(text)
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2).lower()]
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise GpufleetError(
            f"--since {text!r} is neither a duration nor a date",
            "give e.g. 7d, 12h, 30m, 90s, or a date such as 2025-01-31 or 2025-01-31T08:00",
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _hours(value: float) -> str:
    return f"{value:,.2f}"


def table(report: dict[str, Any]) -> Table:
    since = datetime.fromtimestamp(report["since"], UTC).strftime("%Y-%m-%d %H:%M")
    until = datetime.fromtimestamp(report["until"], UTC).strftime("%Y-%m-%d %H:%M")
    label = " (emulated GPUs)" if report["emulated"] else ""
    out = Table(title=f"GPU-hours per queue, {since} to {until} UTC{label}", header_style="bold")
    for column in ("QUEUE", "JOBS", "ALLOCATED", "SAMPLED", "USED", "RESERVED-IDLE", "UTILISATION"):
        out.add_column(column, justify="left" if column == "QUEUE" else "right")
    for row in [*report["queues"], report["total"]]:
        util = row["utilisation"]
        out.add_row(
            Text(row["queue"], style="bold") if row is report["total"] else cell(row["queue"]),
            str(row["jobs"]),
            _hours(row["allocated_gpu_hours"]),
            _hours(row["sampled_gpu_hours"]),
            _hours(row["used_gpu_hours"]),
            _hours(row["reserved_idle_gpu_hours"]),
            "-" if util is None else f"{100 * util:.0f}%",
        )
    return out


def chart(report: dict[str, Any], path: Path) -> Path:
    """A grouped bar chart per queue: allocated, used and reserved-idle GPU-hours (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["queues"]
    names = [r["queue"] for r in rows]
    series = (
        ("allocated", "allocated_gpu_hours", "#4c72b0"),
        ("used (utilisation-weighted)", "used_gpu_hours", "#55a868"),
        ("reserved-idle", "reserved_idle_gpu_hours", "#c44e52"),
    )
    width = 0.27
    figure, axes = plt.subplots(figsize=(max(6.0, 1.2 * len(names) + 3), 4.5))
    for i, (label, key, colour) in enumerate(series):
        positions = [n + (i - 1) * width for n in range(len(names))]
        axes.bar(positions, [r[key] for r in rows], width, label=label, color=colour)
    axes.set_xticks(range(len(names)), names, rotation=30 if len(names) > 6 else 0)
    axes.set_ylabel("GPU-hours")
    since = datetime.fromtimestamp(report["since"], UTC).strftime("%Y-%m-%d %H:%M")
    until = datetime.fromtimestamp(report["until"], UTC).strftime("%Y-%m-%d %H:%M")
    emulated = " - EMULATED GPUs" if report["emulated"] else ""
    axes.set_title(f"GPU usage per queue, {since} to {until} UTC{emulated}")
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


@report_app.command("usage")
def usage(
    since: Annotated[str, typer.Option(help="Window start: 7d, 12h, 30m, or a date (UTC).")] = "7d",
    until: Annotated[str | None, typer.Option(help="Window end, same forms as --since [default: now].")] = None,
    png: Annotated[Path | None, typer.Option(help="Also write a bar chart to this PNG file.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Per queue: GPU-hours allocated, used (utilisation-weighted) and held while idle."""
    with _client(url, token) as client:
        now = time.time()
        params: dict[str, Any] = {"since": max(0.0, parse_since(since, now))}
        if until is not None:
            params["until"] = max(0.0, parse_since(until, now))
        report = client.get("/v1/usage", **params)
        if png is not None:
            try:
                chart(report, png)
            except OSError as error:
                raise GpufleetError(f"cannot write the chart to {png}: {error}", "give a writable path") from None
    if as_json:
        typer.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        console = output.console()
        console.print(table(report))
        for note in report["notes"]:
            console.print(f"[dim]{markup(note)}[/]")
    if png is not None and not as_json:
        typer.echo(f"chart written to {png}")


def idle_policy(
    queue: Annotated[str, typer.Argument(help="The queue (team).")],
    policy: Annotated[
        str | None, typer.Argument(help="notify (default), reclaim or none; leave out to show the current one.")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What happens to a queue's reserved-but-idle jobs: notify, reclaim (requeue if preemptible), or none."""
    with _client(url, token) as client:
        path = f"/v1/queues/{queue}/idle-policy"
        answer = client.get(path) if policy is None else client.call("PUT", path, json_body={"policy": policy})
    if as_json:
        typer.echo(json.dumps(answer, indent=2, sort_keys=True))
    else:
        typer.echo(plain(f"queue {answer['queue']}: idle policy {answer['policy']}"))
