"""`gpufleet reservation create|list|delete`: nodes held for a queue, or taken out for maintenance, for a time."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from gpufleet.cli.commands_client import JsonOpt, TokenOpt, UrlOpt, _client, _console, _print_json
from gpufleet.cli.safe_text import cell
from gpufleet.domain.errors import GpufleetError

reservation_app = typer.Typer(
    help="Nodes held for a queue, or out of service for maintenance, for a time (admin).", no_args_is_help=True
)

_RELATIVE = re.compile(r"^\+(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
WHEN_HELP = "ISO 8601 (2026-12-24T02:00, UTC unless a zone is given), 'now', or from now: +30m, +2h, +1d"


def moment(text: str, now: float) -> float:
    """Seconds since the epoch for `text` (see WHEN_HELP)."""
    value = text.strip()
    if value == "now":
        return now
    relative = _RELATIVE.match(value)
    if relative:
        return now + float(relative.group(1)) * _UNITS[relative.group(2)]
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise GpufleetError(f"{text!r} is not a time", f"give {WHEN_HELP}") from None
    return (parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)).timestamp()


@reservation_app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="Its name: lower-case letters, digits and '-'.")],
    start: Annotated[str, typer.Option(help=f"When it begins: {WHEN_HELP}.")],
    end: Annotated[str, typer.Option(help=f"When it ends: {WHEN_HELP} (+ counts from the start).")],
    nodes: Annotated[str | None, typer.Option(help="Comma-separated node names.")] = None,
    gpus: Annotated[
        int | None, typer.Option(help="Instead of --nodes: whole nodes with this many GPUs in all.")
    ] = None,
    gpu_model: Annotated[str | None, typer.Option(help="With --gpus: nodes of this GPU model only.")] = None,
    queue: Annotated[str | None, typer.Option(help="The queue the nodes are held for.")] = None,
    maintenance: Annotated[bool, typer.Option(help="Take the nodes out of service instead.")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Hold nodes for a queue, or for maintenance, from START to END (replaces one of the same name): the nodes
    named, or whole nodes with --gpus GPUs in all (of --gpu-model), those running the fewest jobs now first.

    Jobs that would still run at START (by their max_runtime) do not start on the nodes; jobs running there get
    their checkpoint signal a grace period before START and go back to their queue. A queue's own jobs may use its
    nodes at any time; during the window no other queue's jobs run there."""
    now = time.time()
    begins = moment(start, now)
    ends = moment(end, begins) if end.strip().startswith("+") else moment(end, now)
    body: dict[str, Any] = {"start": begins, "end": ends}
    if nodes is not None:
        body["nodes"] = [n.strip() for n in nodes.split(",") if n.strip()]
    if gpus is not None:
        body |= {"gpus": gpus} | ({"gpu_model": gpu_model} if gpu_model is not None else {})
    body |= {"maintenance": True} if maintenance else {"queue": queue} if queue is not None else {}
    with _client(url, token) as client:
        answer = client.call("PUT", f"/v1/reservations/{name}", json_body=body)
    if as_json:
        _print_json(answer)
        return
    held = "maintenance" if answer["maintenance"] else f"queue {answer['queue']}"
    nodes_text = ", ".join(answer["nodes"])
    typer.echo(f"reservation {answer['name']}: {nodes_text} for {held}, {answer['start']} .. {answer['end']}")


@reservation_app.command("list")
def list_(url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Every reservation: upcoming, active, and ended ones until deleted."""
    with _client(url, token) as client:
        answer = client.call("GET", "/v1/reservations")
    if as_json:
        _print_json(answer)
        return
    table = Table("NAME", "FOR", "NODES", "START", "END", "STATE", box=None, header_style="bold")
    for r in answer["reservations"]:
        held = "maintenance" if r["maintenance"] else f"queue {r['queue']}"
        table.add_row(cell(r["name"]), cell(held), cell(", ".join(r["nodes"])), r["start"], r["end"], r["state"])
    _console().print(table)


@reservation_app.command("delete")
def delete(
    name: Annotated[str, typer.Argument(help="The reservation to delete.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete a reservation: its nodes are free for every job again."""
    with _client(url, token) as client:
        client.call("DELETE", f"/v1/reservations/{name}")
    typer.echo(f"reservation {name} deleted")
