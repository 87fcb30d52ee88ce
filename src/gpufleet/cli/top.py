"""`gpufleet top`: a live view of the fleet's GPUs and queues, through the control plane's API (works remotely).

Per GPU: utilisation and memory bars, power, temperature, the job and queue on it, and an IDLE flag once it
has read under the idle threshold for the idle window (`low` before that). Per queue: running and pending
jobs, how long the oldest waiting job has waited, GPUs held, used (utilisation-weighted) and held idle.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpufleet.cli import output
from gpufleet.cli.commands_client import TokenOpt, UrlOpt, _client
from gpufleet.cli.safe_text import cell

BAR_WIDTH = 20


def bar(percent: float | None, width: int = BAR_WIDTH) -> Text:
    """`████████░░░░  42%`, coloured by load; `-` when unknown."""
    if percent is None:
        return Text("-".ljust(width + 5), style="dim")
    value = min(max(percent, 0.0), 100.0)
    filled = round(value / 100 * width)
    style = "green" if value >= 50 else ("yellow" if value >= 5 else "red")
    text = Text("█" * filled, style=style)
    text.append("░" * (width - filled), style="dim")
    text.append(f" {value:3.0f}%")
    return text


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 1024**3:.1f}"


def frame(data: dict[str, Any], url: str) -> Group:
    """One screen of `top` from a `/v1/telemetry` answer."""
    label = " [bold yellow]EMULATED[/]" if data["emulated"] else ""
    sampled = data["sampled_at"]
    age = f"{max(0.0, data['now'] - sampled):.1f}s ago" if sampled is not None else "not yet"
    header = Text.from_markup(
        f"[bold]gpufleet top[/]  {url}  probe [bold]{data['probe']}[/]{label}  "
        f"{len(data['gpus'])} GPUs  sampled {age} (every {data['interval_s']:g}s)  "
        f"idle: < {data['idle_threshold_pct']:g}% for {duration(data['idle_window_s'])}"
    )
    gpus = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("NODE", "GPU", "MODEL", "UTIL", "MEMORY", "GiB", "W", "°C", "JOB", "QUEUE", "FLAG"):
        gpus.add_column(column, no_wrap=True)
    for gpu in data["gpus"]:
        total = gpu["memory_total"]
        used = gpu["memory_used"]
        mem_pct = 100.0 * used / total if used is not None and total else None
        if gpu["idle"]:
            flag = Text(f"IDLE {duration(gpu['low_for_s'])}", style="bold red")
        elif gpu["job_id"] and gpu["low_for_s"] is not None:
            flag = Text(f"low {duration(gpu['low_for_s'])}", style="yellow")
        else:
            flag = Text("")
        job = gpu["job_id"] or "-"
        if len(gpu["jobs"]) > 1:
            job += f" +{len(gpu['jobs']) - 1}"
        gpus.add_row(
            cell(gpu["node"]),
            str(gpu["index"]),
            cell(gpu["model"]),
            bar(gpu["util"]),
            bar(mem_pct, 10),
            f"{_gib(used)}/{_gib(total)}",
            "-" if gpu["power_w"] is None else f"{gpu['power_w']:.0f}",
            "-" if gpu["temperature_c"] is None else f"{gpu['temperature_c']:.0f}",
            cell(job),
            cell(gpu["queue"] or "-"),
            flag,
        )
    queues = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("QUEUE", "RUNNING", "PENDING", "OLDEST WAIT", "MEDIAN WAIT", "GPUS", "USED", "IDLE", "ON IDLE"):
        queues.add_column(column, no_wrap=True)
    for q in data["queues"]:
        idle = f"{q['reserved_idle_gpus']:g}"
        queues.add_row(
            cell(q["queue"]),
            str(q["running"]),
            str(q["pending"]),
            duration(q["oldest_wait_s"]),
            duration(q["median_wait_s"]),
            f"{q['allocated_gpus']:g}",
            f"{q['used_gpus']:.2f}",
            Text(idle, style="bold red") if q["reserved_idle_gpus"] else Text(idle),
            cell(q["idle_policy"]),
        )
    return Group(header, Text(""), gpus, Text(""), queues)


def top(
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit (for scripts and tests).")] = False,
    interval: Annotated[float, typer.Option(min=0.2, help="Seconds between refreshes.")] = 2.0,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """A live view of every GPU (utilisation, memory, job, idle flags) and every queue (waits, use).

    Off a terminal (a pipe, a file, a cron job) it prints one snapshot and exits, as with --once."""
    console = output.console()
    with _client(url, token) as client:
        target = client.target.url
        if once or not output.on_terminal():
            console.print(frame(client.get("/v1/telemetry"), target))
            return
        from rich.live import Live

        with Live(console=console, screen=False, auto_refresh=False) as live:
            try:
                while True:
                    live.update(frame(client.get("/v1/telemetry"), target), refresh=True)
                    time.sleep(interval)
            except KeyboardInterrupt:
                return
