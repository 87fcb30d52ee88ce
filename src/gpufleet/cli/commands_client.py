"""Client commands: jobs, show, explain, cancel, logs, queues, quota, nodes, cordon/drain, tokens, login.

Each talks to the control plane's HTTP API. Every command takes --url/--token (or GPUFLEET_URL /
GPUFLEET_TOKEN, or the file `gpufleet login` writes) and most take --json for scripts.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, RenderableType
from rich.table import Table

from gpufleet.cli import arrays_view, output, progress_view
from gpufleet.cli.cost_text import budget_cell, cost_line
from gpufleet.cli.safe_text import cell, markup, plain, text_block
from gpufleet.client import ApiError, Client
from gpufleet.client.transport import TOKEN_ENV, URL_ENV, resolve, write_config
from gpufleet.domain.errors import GpufleetError

UrlOpt = Annotated[str | None, typer.Option("--url", envvar=URL_ENV, help="Control plane URL.", show_default=False)]
TokenOpt = Annotated[str | None, typer.Option("--token", envvar=TOKEN_ENV, help="API token.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]

ACTIVE_STATES = ("pending", "held", "admitted", "launching", "running", "evicting")
TERMINAL_STATES = ("succeeded", "failed", "cancelled")
STATE_STYLE = {
    "pending": "yellow",
    "held": "bold yellow",
    "running": "green",
    "succeeded": "bold green",
    "failed": "red",
    "cancelled": "dim",
    "evicting": "magenta",
}

token_app = typer.Typer(help="API tokens (admin).", no_args_is_help=True)
quota_app = typer.Typer(help="Queue quotas (admin).", no_args_is_help=True)
nodes_app = typer.Typer(help="Nodes, their GPUs, and which jobs hold each GPU.")


def _console() -> Console:
    return output.console()


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


@contextmanager
def _client(url: str | None, token: str | None) -> Iterator[Client]:
    """A client; any GpufleetError inside becomes `error: …; to fix: …` and exit code 2."""
    try:
        with Client(target=resolve(url, token)) as client:
            yield client
    except GpufleetError as error:
        typer.echo(f"error: {plain(error)}", err=True)
        raise typer.Exit(2) from None


def _gpus(value: float) -> str:
    return f"{value:g}"


def _size(nbytes: float | None) -> str:
    if not nbytes:
        return "-"
    from gpufleet.server.spec import format_size

    return format_size(int(nbytes))


def _state(state: str) -> str:
    style = STATE_STYLE.get(state)
    return f"[{style}]{markup(state)}[/]" if style else markup(state)


def _since(at: float | None) -> str:
    if at is None:
        return "-"
    seconds = max(0.0, time.time() - at)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


# ---------------------------------------------------------------------------------------------- jobs


def login(
    url: Annotated[str, typer.Argument(help="e.g. http://127.0.0.1:8080")],
    token: Annotated[str, typer.Argument(help="The token `gpufleet up` printed, or one from `token create`.")],
    check: Annotated[bool, typer.Option("--check/--no-check", help="Check the URL and token first.")] = True,
) -> None:
    """Save the control plane's URL and a token for later commands."""
    if check:
        with _client(url, token) as client:
            info = client.get("/v1/info")
        typer.echo(f"logged in to gpufleet {info['version']} at {url} as {info['role']}")
    path = write_config(url.rstrip("/"), token)
    typer.echo(f"saved to {path}")


def _why(job: dict[str, Any]) -> str:
    why = job["waiting_reason"] if job["state"] == "pending" else job["reason"]
    return str(why or "")


def _workers(job: dict[str, Any]) -> str:
    """Workers it holds now against those it asked for (`2/4`: an elastic job at 2 of at most 4)."""
    held = len(job["placement"])
    if not held or held == job["workers"]:
        return str(job["workers"])
    return f"{held}/{job['workers']}"


def _elapsed(job: dict[str, Any]) -> str:
    """How long its current (or last) attempt ran, or has run so far."""
    started = job.get("started_at")
    if started is None:
        return "-"
    end = job.get("finished_at") or time.time()
    return _duration(max(0.0, end - started))


JOB_COLUMNS: dict[str, tuple[str, Callable[[dict[str, Any]], RenderableType]]] = {
    "id": ("ID", lambda j: cell(j["id"])),
    "name": ("NAME", lambda j: cell(j["name"] or "-")),
    "queue": ("QUEUE", lambda j: cell(j["queue"])),
    "user": ("USER", lambda j: cell(j.get("user") or "-")),
    "state": ("STATE", lambda j: _state(j["state"])),
    "gpus": ("GPUS", lambda j: _gpus(j["request"]["gpus"])),
    "workers": ("WORKERS", _workers),
    "priority": ("PRIORITY", lambda j: str(j["priority"])),
    "submitted": ("SUBMITTED", lambda j: _since(j["submitted_at"])),
    "started": ("STARTED", lambda j: _since(j["started_at"])),
    "elapsed": ("ELAPSED", _elapsed),
    "exit": ("EXIT", lambda j: "-" if j["exit_code"] is None else str(j["exit_code"])),
    "nodes": ("NODES", lambda j: cell(",".join(sorted({w["node"] for w in j["placement"]})) or "-")),
    "why": ("WHY", lambda j: cell(_why(j))),
}
DEFAULT_JOB_COLUMNS = ("id", "name", "queue", "state", "gpus", "workers", "submitted", "why")


def jobs(
    queue: Annotated[str | None, typer.Option(help="Only this queue.")] = None,
    state: Annotated[list[str] | None, typer.Option(help="Only these states (repeatable).")] = None,
    name: Annotated[str | None, typer.Option(help="Only jobs of this name.")] = None,
    show_all: Annotated[bool, typer.Option("--all", help="Include finished jobs.")] = False,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many.")] = 100,
    columns: Annotated[
        str | None,
        typer.Option(
            "--format",
            "-o",
            help=f"Columns to print, comma-separated, as squeue -o: {','.join(JOB_COLUMNS)} "
            f"(default: {','.join(DEFAULT_JOB_COLUMNS)}).",
        ),
    ] = None,
    no_header: Annotated[bool, typer.Option("--no-header", "-h", help="Rows only (for scripts).")] = False,
    expand: Annotated[bool, typer.Option("--expand", "-r", help="Each array task on its own line.")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List jobs, newest first (active ones unless --all or --state); an array is one line with its tasks
    counted by state (--expand: one line per task). Piped, nothing is cut short."""
    chosen = output.pick_columns(columns, tuple(JOB_COLUMNS), DEFAULT_JOB_COLUMNS)
    states = list(state or ()) or ([] if show_all else list(ACTIVE_STATES))
    with _client(url, token) as client:
        page = client.call(
            "GET", "/v1/jobs", params={"queue": queue, "state": states, "limit": limit, "name": name or None}
        )
        if not expand and not as_json:
            page["jobs"] = arrays_view.fold(client, page["jobs"])
    if as_json:
        _print_json(page["jobs"])
        return
    table = output.table(
        page["jobs"],
        chosen,
        {key: getter for key, (_, getter) in JOB_COLUMNS.items()},
        headers={key: header for key, (header, _) in JOB_COLUMNS.items()},
    )
    table.show_header = not no_header
    console = _console()
    console.print(table)
    if not page["jobs"] and not no_header:
        console.print("no jobs" + ("" if show_all or state else " (add --all to see finished ones)"))


def show(
    job_id: Annotated[str, typer.Argument(metavar="JOB")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
    progress: Annotated[
        bool, typer.Option("--progress", help="Also the loss curve, size over time and last metrics it reported.")
    ] = False,
    png: Annotated[
        Path | None,
        typer.Option("--png", help="Plot loss against samples and GPUs against time to this PNG file.", dir_okay=False),
    ] = None,
) -> None:
    """Everything about one job, with what it reported of its progress (gpufleet.runtime.report)."""
    with _client(url, token) as client:
        job = client.get(f"/v1/jobs/{job_id}")
        job["cost"] = client.get(f"/v1/jobs/{job_id}/cost")
        history = _progress_of(client, job_id)
    if png is not None:
        if history is None:
            raise GpufleetError(
                f"job {job_id} has not reported progress: nothing to plot", "call gpufleet.runtime.report in the job"
            )
        progress_view.plot(history, job_id, png)
    if as_json:
        _print_json({**job, "progress": history})
        return
    request = job["request"]
    lines = [
        f"[bold]{markup(job['id'])}[/] {markup(job['name'])}  queue {markup(job['queue'])}  {_state(job['state'])}",
        f"reason: {markup(job['reason'] or '-')}",
        times_line(job),
        f"asks: {_gpus(request['gpus'])} GPU x {job['workers']} workers"
        + (f", models {markup('|'.join(request['gpu_models']))}" if request["gpu_models"] else "")
        + (f", {request['cpu']:g} CPU" if request["cpu"] else "")
        + (f", {_size(request['memory'])} memory" if request["memory"] else ""),
        f"priority {job['priority']}, {'preemptible' if job['preemptible'] else 'not preemptible'}, "
        f"attempt {job['attempt']}, preempted {job['preemptions']}x"
        + (f", resized {job.get('resizes', 0)}x" if job.get("resizes") else "")
        + (" (resizing now)" if job.get("resizing") else ""),
    ]
    if job["run"]:
        lines.append("command: " + markup(" ".join(job["run"]["command"])))
    if job["exit_code"] is not None:
        lines.append(f"exit code: {job['exit_code']}")
    comm = job.get("comm")
    if comm:
        limit = comm["max_comm_overhead"]
        line = f"synchronises {_size(comm['grad_bytes'])} a step of {comm['step_time']:g} s" + (
            f", at most {100 * limit:g} % in all-reduce" if limit is not None else ""
        )
        if comm["overhead"] is not None:
            line += (
                f"; here ~{100 * comm['overhead']:.0f} % ({1000 * comm['sync_s']:.0f} ms a step over "
                f"{comm['link']} at {comm['bus_gbps']:g} GB/s)"
            )
        lines.append(line)
    for worker in job["placement"]:
        gpus = ", ".join(f"{g['index']} ({g['model']}, {g['fraction']:g})" for g in worker["gpus"]) or "no GPUs"
        lines.append(markup(f"worker {worker['rank']}: {worker['node']} GPUs {gpus}"))
    lines.append(cost_line(job["cost"]))
    lines.append(checkpoint_line(job))
    lines.extend(progress_view.summary_lines(history))
    if progress and history is not None:
        lines.extend(progress_view.detail_lines(history))
    if png is not None:
        lines.append(markup(f"plot written to {png}"))
    console = _console()
    for line in lines:
        console.print(line)


def _when(at: float) -> str:
    return datetime.fromtimestamp(at).astimezone().isoformat(sep=" ", timespec="seconds")


def times_line(job: dict[str, Any]) -> str:
    """When it was submitted, started and ended, how long it waited and ran (this attempt's start: `started`)."""
    parts = [f"submitted {_when(job['submitted_at'])}"]
    first, started, ended = job.get("first_started_at"), job.get("started_at"), job.get("finished_at")
    if first is not None:
        parts.append(f"waited {_duration(max(0.0, first - job['submitted_at']))}")
    if started is not None:
        parts.append(f"started {_when(started)}")
        if first is not None and first != started:
            parts.append(f"first started {_when(first)}")
    if ended is not None:
        parts.append(f"ended {_when(ended)}")
    if started is not None:
        parts.append(f"elapsed {_elapsed(job)}" + ("" if ended is not None else " so far"))
    return markup("times: " + ", ".join(parts))


def checkpoint_line(job: dict[str, Any]) -> str:
    """The interval the job's attempt was given, and from what (older control planes send no plan)."""
    plan = job.get("checkpoint_plan")
    if plan is None:
        return (
            "checkpoint interval: none given (the job has reported no checkpoint: call "
            "gpufleet.runtime.checkpoint_saved(duration_s=…) or `python -m gpufleet.runtime checkpoint --duration S`)"
        )
    return markup(
        f"checkpoint interval: {_duration(plan['interval_s'])} (Young/Daly sqrt(2CM): C {plan['cost_s']:.3g} s, "
        f"MTBF {_duration(plan['mtbf_s'])} from {plan['mtbf_source']})"
    )


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def _progress_of(client: Client, job_id: str) -> dict[str, Any] | None:
    """The job's progress history, or None if it never reported (or the API predates reports)."""
    try:
        history: dict[str, Any] = client.get(f"/v1/jobs/{job_id}/progress")
    except ApiError as error:
        if error.status == 404:
            return None
        raise
    return history


def explain(
    job_id: Annotated[str, typer.Argument(metavar="JOB")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Why a job waits (or what happened to it), in the scheduler's words."""
    with _client(url, token) as client:
        why = client.get(f"/v1/jobs/{job_id}/explain")
    if as_json:
        _print_json(why)
        return
    console = _console()
    console.print(f"[bold]{markup(why['id'])}[/] {_state(why['state'])}: {markup(why['summary'])}")
    if why["position"] is not None:
        ahead = ", ".join(why["ahead"][:10]) + (" …" if len(why["ahead"]) > 10 else "")
        where = f"position {why['position']} in queue {why['queue']}" + (f"; ahead: {ahead}" if ahead else "")
        console.print(markup(where))
    for quota in why["quota"]:
        nominal = "unlimited" if quota["nominal"] is None else f"{quota['nominal']:g}"
        used = _size(quota["used"]) if quota["unit"] == "bytes" else f"{quota['used']:g}"
        if quota["unit"] == "bytes" and quota["nominal"] is not None:
            nominal = _size(quota["nominal"])
        console.print(markup(f"quota {quota['resource']}: {used} used of {nominal} nominal ({quota['unit']})"))
    if why.get("idle"):
        console.print(f"[bold yellow]{markup(why['idle'])}[/]")
    for words in why.get("spot_pools") or ():
        console.print(f"[yellow]{markup(words)}[/]")
    if why.get("budget"):
        console.print(f"[yellow]budget: {markup(why['budget'])}[/]")
    if why.get("elastic"):
        console.print(markup(why["elastic"]))
    for notice in why.get("notices", [])[-3:]:
        console.print(markup(f"  note ({notice['kind']}): {notice['message']}"))
    for event in why["events"][-5:]:
        console.print(markup(f"  {event['source']} -> {event['target']}: {event['reason']}"))


def logs(
    job_id: Annotated[str, typer.Argument(metavar="JOB")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    worker: Annotated[int, typer.Option(min=0, help="Worker (rank).")] = 0,
    attempt: Annotated[int | None, typer.Option(min=1, help="Attempt (default: the latest).")] = None,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="Write the output as the job wrote it, escape sequences included, also to a terminal (where "
            "they can set its title, write its clipboard (OSC 52) or rewrite what is on screen).",
        ),
    ] = False,
    escape_control: Annotated[
        bool,
        typer.Option(
            "--escape-control",
            help="Show control characters escaped (\\x1b) also when the output is not a terminal (a pipe, a file).",
        ),
    ] = False,
    tail: Annotated[
        int | None, typer.Option("--tail", "-n", min=0, help="Only the last N lines (then more with -f).")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="Only what it wrote since then (to within a second before): an age (90s, 10m, 2h, 1d), an ISO "
            "8601 time (2026-12-07T09:30) or epoch seconds.",
        ),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print a job's output (one worker's stdout and stderr). With -f it exits, once the job has ended,
    with the job's exit code (128+N for a job killed by signal N; 1 for one that ended without a code).

    To a terminal, control characters are shown escaped (ESC as \\x1b; newlines and tabs kept), so a job's
    output cannot drive the terminal of whoever reads it. To a file or a pipe it is written as the job wrote
    it, as `> file` (and a Slurm output file) would keep it; `less -R` then shows only colours and links.
    --raw and --escape-control choose either way explicitly."""
    if raw and escape_control:
        raise GpufleetError("--raw and --escape-control contradict each other", "give one of them, or neither")
    if tail is not None and since is not None:
        raise GpufleetError("--tail and --since both choose where to start", "give one of them")
    escape = escape_control or (not raw and sys.stdout.isatty())
    offset = 0
    with _client(url, token) as client:
        if tail is not None:
            offset = client.tail_offset(job_id, tail, worker=worker, attempt=attempt)
        elif since is not None:
            offset = client.since_offset(job_id, since, worker=worker, attempt=attempt)
        while True:
            chunk = client.get(f"/v1/jobs/{job_id}/logs", worker=worker, attempt=attempt, offset=offset)
            if chunk["text"]:
                _write_out(text_block(chunk["text"]) if escape else chunk["text"])
            moved = chunk["next_offset"] != offset
            offset = chunk["next_offset"]
            if attempt is None and chunk["attempt"]:
                attempt = chunk["attempt"]  # stay on the attempt we started reading
            if not follow or (chunk["complete"] and not moved):
                break
            if not moved:
                time.sleep(0.3)
        if follow:
            raise typer.Exit(client.wait(job_id).exit_status)


def _write_out(text: str) -> None:
    """Straight to stdout: `click.echo` would drop colour sequences from a pipe, and the raw output is the
    job's, as it wrote it."""
    data = text.encode("utf-8", "replace")
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(data.decode("utf-8", "replace"))
    else:
        sys.stdout.flush()
        buffer.write(data)
    sys.stdout.flush()


# -------------------------------------------------------------------------------------------- queues


def queues(url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Queues: quotas and what their jobs use now."""
    with _client(url, token) as client:
        listed = client.get("/v1/queues")["queues"]
    if as_json:
        _print_json(listed)
        return
    table = Table(box=None, header_style="bold")
    columns = ("QUEUE", "COHORT", "WEIGHT", "RUNNING", "PENDING", "GPUS USED", "QUOTAS", "LIMITS", "RUN AS", "BUDGET")
    for column in columns:
        table.add_column(column)
    for queue in listed:
        quotas = []
        for key, quota in queue["quotas"].items():
            text = _size(quota["nominal"]) if key == "memory" else _num(quota["nominal"])
            if quota["borrowing_limit"] is not None:
                text += f" (+{_num(quota['borrowing_limit'])})"
            quotas.append(f"{key}={text}")
        usage = queue["usage"]
        limits = []
        if queue.get("max_pending") is not None:
            limits.append(f"pending<={queue['max_pending']}")
        if queue.get("max_grace") is not None:
            limits.append(f"grace<={queue['max_grace']:g}s")
        for key, label in (("memory_per_gpu", "mem/gpu"), ("memory_no_gpu", "mem/no-gpu"), ("disk", "disk")):
            if queue.get(key) is not None:
                limits.append(f"{label}={_size(queue[key])}")
        table.add_row(
            cell(queue["name"]),
            cell(queue["cohort"] or "-"),
            f"{queue['weight']:g}",
            str(usage["running"]),
            str(usage["pending"]),
            _gpus(usage["gpus"]),
            cell(" ".join(quotas) or "unlimited"),
            " ".join(limits) or "-",
            cell(queue.get("run_as") or "-"),
            budget_cell(queue.get("budget")),
        )
    _console().print(table)


def _cap(value: int) -> int | None:
    return None if value < 0 else value


def _num(value: float | None) -> str:
    return "unlimited" if value is None else f"{value:g}"


@quota_app.command("set")
def quota_set(
    queue: Annotated[str, typer.Argument(help="Queue (team) name; created if new.")],
    gpu: Annotated[float | None, typer.Option(help="Nominal GPUs (any model).")] = None,
    gpu_model: Annotated[
        list[str] | None, typer.Option("--gpu-model", help="Per-model nominal, MODEL=N (repeatable).")
    ] = None,
    cpu: Annotated[float | None, typer.Option(help="Nominal CPU cores.")] = None,
    memory: Annotated[str | None, typer.Option(help="Nominal memory, e.g. 512GiB.")] = None,
    borrowing_limit: Annotated[float | None, typer.Option(help="GPUs it may borrow above nominal.")] = None,
    lending_limit: Annotated[float | None, typer.Option(help="GPUs of its nominal it may lend.")] = None,
    cohort: Annotated[str | None, typer.Option(help="Cohort whose idle quota it shares.")] = None,
    weight: Annotated[float | None, typer.Option(help="Fair-share weight.")] = None,
    max_pending: Annotated[
        int | None, typer.Option(min=-1, help="Most jobs it may have pending at once (-1: no cap).")
    ] = None,
    max_grace: Annotated[
        str | None,
        typer.Option(help="Longest grace_period its jobs may ask, e.g. 2h (default: the control plane's, 1h)."),
    ] = None,
    run_as: Annotated[
        str | None,
        typer.Option(
            "--run-as",
            help="OS user the queue's jobs run as (an existing, unprivileged one); '' for the queue's own "
            "gpufleet-<queue> user.",
        ),
    ] = None,
    memory_per_gpu: Annotated[
        str | None,
        typer.Option(
            help="Memory limit per GPU held of a job that gives no `memory`, e.g. 32GiB; '' for the node's share "
            "(its memory less the reserve, divided among its GPUs)."
        ),
    ] = None,
    memory_no_gpu: Annotated[
        str | None,
        typer.Option(help="Memory limit of a job holding no GPU that gives no `memory`; '' for one GPU's share."),
    ] = None,
    disk: Annotated[
        str | None,
        typer.Option(
            help="What the queue's jobs may keep on disk on a node (working folders, their home), e.g. 200GiB; past "
            "it their writes fail with ENOSPC. '' for the control plane's default (up --queue-disk)."
        ),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a queue or change its quotas and limits; what is not given stays as it was."""
    with _client(url, token) as client:
        current = next((q for q in client.get("/v1/queues")["queues"] if q["name"] == queue), None)
        quotas: dict[str, Any] = {k: dict(v) for k, v in (current or {}).get("quotas", {}).items()}
        if gpu is not None or borrowing_limit is not None or lending_limit is not None:
            entry = quotas.setdefault("gpu", {"nominal": None, "borrowing_limit": None, "lending_limit": None})
            if gpu is not None:
                entry["nominal"] = gpu
            if borrowing_limit is not None:
                entry["borrowing_limit"] = borrowing_limit
            if lending_limit is not None:
                entry["lending_limit"] = lending_limit
        for item in gpu_model or ():
            model, sep, amount = item.partition("=")
            try:
                value = float(amount)
            except ValueError:
                value = -1.0
            if not sep or not model.strip() or value < 0:
                raise GpufleetError(f"--gpu-model {item!r} is not MODEL=N", "e.g. --gpu-model A100-80GB=4")
            quotas.setdefault(f"gpu:{model.strip()}", {})["nominal"] = value
        if cpu is not None:
            quotas.setdefault("cpu", {})["nominal"] = cpu
        if memory is not None:
            quotas.setdefault("memory", {})["nominal"] = memory
        body = {
            "quotas": quotas,
            "cohort": cohort if cohort is not None else (current or {}).get("cohort"),
            "weight": weight if weight is not None else (current or {}).get("weight", 1.0),
            "run_as": (run_as or None) if run_as is not None else (current or {}).get("run_as"),
            "max_pending": (current or {}).get("max_pending") if max_pending is None else _cap(max_pending),
            "max_grace": (current or {}).get("max_grace") if max_grace is None else max_grace,
        }
        for key, given in (("memory_per_gpu", memory_per_gpu), ("memory_no_gpu", memory_no_gpu), ("disk", disk)):
            body[key] = (current or {}).get(key) if given is None else (given or None)
        saved = client.call("PUT", f"/v1/queues/{queue}", json_body=body)
    if as_json:
        _print_json(saved)
    else:
        typer.echo(f"queue {queue} {'updated' if current else 'created'}")


@quota_app.command("delete")
def quota_delete(
    queue: Annotated[str, typer.Argument(help="Queue to delete (no active jobs, no live tokens).")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete a queue."""
    with _client(url, token) as client:
        client.call("DELETE", f"/v1/queues/{queue}")
    typer.echo(f"queue {queue} deleted")


# --------------------------------------------------------------------------------------------- nodes


@nodes_app.callback(invoke_without_command=True)
def nodes(ctx: typer.Context, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Nodes, their GPUs, and which jobs hold each GPU (`nodes remove NODE`: forget one that left)."""
    if ctx.invoked_subcommand is not None:
        return
    with _client(url, token) as client:
        answer = client.get("/v1/nodes")
    listed, isolation = answer["nodes"], answer.get("isolation")
    if as_json:
        _print_json(listed)
        return
    table = Table(box=None, header_style="bold")
    for column in ("NODE", "GPU", "MODEL", "MEMORY", "ALLOCATED", "JOBS"):
        table.add_column(column)
    for node in listed:
        flags = [f for f, on in (("cordoned", node["cordoned"]), ("unhealthy", not node["healthy"])) if on]
        if node.get("pool", "on-demand") != "on-demand":
            flags.insert(0, node["pool"])
        label = node["name"] + (" (emulated)" if node["emulated"] else "") + (f" ({', '.join(flags)})" if flags else "")
        for gpu in node["gpus"] or [None]:
            if gpu is None:
                table.add_row(cell(label), "-", "-", "-", "-", "-")
                continue
            jobs_on = ", ".join(f"{a['job_id']} ({a['fraction']:g})" for a in gpu["jobs"]) or "-"
            table.add_row(
                cell(label),
                str(gpu["index"]),
                cell(gpu["model"]),
                _size(gpu["memory"]),
                f"{gpu['allocated']:g}",
                cell(jobs_on),
            )
            label = ""
    _console().print(table)
    spot = client_spot_pools(url, token)
    for pool in spot:
        typer.echo(plain(pool["description"]))
    if isolation:
        typer.echo(plain(f"jobs: {isolation['users']}"))
        typer.echo(plain(f"limits: {isolation['cgroups']}"))
        for note in isolation.get("notes") or ():
            typer.echo(plain(f"warning: {note}"))


@nodes_app.command("remove")
def nodes_remove(
    node: Annotated[str, typer.Argument(metavar="NODE")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Forget a node (admin): one that left for good stays listed, unhealthy, and counted until removed.
    Refused while jobs hold resources on it (drain it first). A node that comes back is listed again."""
    with _client(url, token) as client:
        client.call("DELETE", f"/v1/nodes/{node}")
    typer.echo(plain(f"node {node} removed"))


def client_spot_pools(url: str | None, token: str | None) -> list[dict[str, Any]]:
    """The spot pools' breakers, as `nodes` shows them under its table (none where no spot node is known)."""
    with _client(url, token) as client:
        answer = client.get("/v1/spot-pools")
    return list(answer["pools"])


def _node_action(action: str, node: str, url: str | None, token: str | None, as_json: bool) -> None:
    with _client(url, token) as client:
        answer = client.post(f"/v1/nodes/{node}/{action}")
    if as_json:
        _print_json(answer)
        return
    if action == "drain":
        requeued = answer["requeued"]
        typer.echo(
            plain(
                f"node {node} cordoned; {len(requeued)} job(s) asked to requeue"
                + (": " + ", ".join(requeued) if requeued else "")
            )
        )
    else:
        typer.echo(plain(f"node {node} {action}ed"))


def cordon(node: str, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Place no new jobs on a node."""
    _node_action("cordon", node, url, token, as_json)


def uncordon(node: str, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Allow new jobs on a node again."""
    _node_action("uncordon", node, url, token, as_json)


def drain(node: str, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Cordon a node and send its jobs back to their queues."""
    _node_action("drain", node, url, token, as_json)


# -------------------------------------------------------------------------------------------- tokens


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Argument(help="Who it is for, e.g. team-a-ci.")],
    role: Annotated[str, typer.Option(help="team (one queue), admin, or metrics (scrape /metrics only).")] = "team",
    queue: Annotated[str | None, typer.Option(help="The team's queue (team tokens).")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a token; its secret is printed once."""
    with _client(url, token) as client:
        created = client.post("/v1/tokens", {"name": name, "role": role, "queue": queue})
    if as_json:
        _print_json(created)
        return
    queue_part = ", queue " + created["queue"] if created["queue"] else ""
    typer.echo(plain(f"token {created['id']} ({created['role']}{queue_part})"))
    typer.echo(f"secret (shown once): {created['secret']}")


@token_app.command("list")
def token_list(url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """List tokens (never their secrets)."""
    with _client(url, token) as client:
        listed = client.get("/v1/tokens")["tokens"]
    if as_json:
        _print_json(listed)
        return
    table = Table(box=None, header_style="bold")
    for column in ("ID", "NAME", "ROLE", "QUEUE", "CREATED", "REVOKED"):
        table.add_column(column)
    for item in listed:
        table.add_row(
            cell(item["id"]), cell(item["name"]), cell(item["role"]), cell(item["queue"] or "-"),
            _since(item["created_at"]), "yes" if item["revoked"] else "",
        )  # fmt: skip
    _console().print(table)


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[str, typer.Argument(metavar="ID")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Revoke a token; it stops working at once."""
    with _client(url, token) as client:
        client.call("DELETE", f"/v1/tokens/{token_id}")
    typer.echo(f"token {token_id} revoked")


# ------------------------------------------------------------------------------------------ snapshot


def snapshot(
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the snapshot (JSON).")],
    since: Annotated[str, typer.Option(help="Jobs submitted in the last 7d, 12h, 30m …")] = "7d",
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Save the cluster (nodes, queues, recent jobs) for the simulator: `gpufleet sim --workload FILE`."""
    from gpufleet.server.spec import parse_duration

    with _client(url, token) as client:
        try:
            window = parse_duration(since)
        except ValueError:
            raise GpufleetError(f"--since {since!r} is not a duration", "e.g. 7d, 12h or 30m") from None
        data = client.get("/v1/snapshot", since_s=window)
        try:
            out.write_text(json.dumps(data))
        except OSError as error:
            raise GpufleetError(f"cannot write {out}: {error.strerror}", "give a writable path") from None
    typer.echo(f"saved {len(data['jobs'])} jobs on {len(data['nodes'])} node(s) to {out}")


def register_client_commands(app: typer.Typer) -> None:
    """Add the client commands to the `gpufleet` app."""
    for command in (login, jobs, show, explain, logs, queues, cordon, uncordon, drain, snapshot):
        app.command()(command)
    app.add_typer(quota_app, name="quota")
    app.add_typer(token_app, name="token")
    app.add_typer(nodes_app, name="nodes")
