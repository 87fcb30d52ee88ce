"""`gpufleet cancel | hold | release | requeue` on one job, many, a whole array (its id) or one task (ARRAYID_N),
or every job a filter selects (--name, --queue, --state, --user); and `gpufleet update` of a waiting job.

More than 10 jobs are acted on only after a confirmation: asked on a terminal, `--yes` otherwise (a script that
cancels hundreds of jobs says so)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from gpufleet.cli.commands_client import JsonOpt, TokenOpt, UrlOpt, _client, _print_json
from gpufleet.cli.safe_text import plain
from gpufleet.client import Client
from gpufleet.domain.errors import GpufleetError

CONFIRM_ABOVE = 10

JobsArg = Annotated[
    list[str] | None,
    typer.Argument(metavar="[JOB]…", help="Job ids; an array's id means all its tasks, ARRAYID_N one task."),
]
NameOpt = Annotated[str | None, typer.Option("--name", help="Only jobs of this name.")]
QueueOpt = Annotated[str | None, typer.Option("--queue", "-q", help="Only jobs of this queue.")]
StateOpt = Annotated[list[str] | None, typer.Option("--state", help="Only jobs in this state (repeatable).")]
UserOpt = Annotated[str | None, typer.Option("--user", help="Only jobs submitted with this token name.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help=f"Act on more than {CONFIRM_ABOVE} jobs without asking.")]


def _act(
    verb: str,
    jobs: list[str] | None,
    *,
    name: str | None,
    queue: str | None,
    state: list[str] | None,
    user: str | None,
    yes: bool,
    url: str | None,
    token: str | None,
    as_json: bool,
    force: bool = False,
) -> None:
    body: dict[str, Any] = {"ids": list(jobs or ()), "name": name, "queue": queue, "states": list(state or ())}
    body |= {"user": user, "force": force}
    with _client(url, token) as client:
        count: dict[str, Any] = client.call("POST", f"/v1/jobs/{verb}", json_body={**body, "dry_run": True})
        if count["matched"] > CONFIRM_ABOVE and not yes:
            _confirm(verb, count)
        answer = _send(client, verb, body) if count["matched"] else count
    if as_json:
        _print_json(answer)
        return
    typer.echo(plain(answer["message"]))
    if answer["matched"] == 1 and len(answer["ids"]) == 1 and not jobs:
        typer.echo(plain(answer["ids"][0]))


def _send(client: Client, verb: str, body: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = client.call("POST", f"/v1/jobs/{verb}", json_body=body)
    return answer


def _confirm(verb: str, count: dict[str, Any]) -> None:
    what = f"{verb} {count['matched']} jobs"
    if not sys.stdin.isatty():
        raise GpufleetError(
            f"refusing to {what} without a confirmation (stdin is not a terminal)", "add --yes to do it anyway"
        )
    shown = ", ".join(count["ids"][:10]) + (", …" if count["matched"] > 10 else "")
    typer.echo(plain(f"{what}: {shown}"), err=True)
    if not typer.confirm("Go ahead?", default=False, err=True):
        raise typer.Exit(1)


def cancel(
    jobs: JobsArg = None,
    name: NameOpt = None,
    queue: QueueOpt = None,
    state: StateOpt = None,
    user: UserOpt = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Kill at once (SIGKILL), whatever the grace period; recorded in the audit log."),
    ] = False,
    yes: YesOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel jobs: checkpoint signal, grace period, then kill (--force: kill at once). Jobs by id (an array's
    id: all its tasks), or every job of --name/--queue/--state/--user; it asks before cancelling more than 10."""
    _act("cancel", jobs, name=name, queue=queue, state=state, user=user, yes=yes, url=url, token=token,
         as_json=as_json, force=force)  # fmt: skip


def hold(
    jobs: JobsArg = None,
    name: NameOpt = None,
    queue: QueueOpt = None,
    user: UserOpt = None,
    yes: YesOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Hold pending jobs: the scheduler does not see them (nor reserves anything for them) until `release`."""
    _act("hold", jobs, name=name, queue=queue, state=None, user=user, yes=yes, url=url, token=token,
         as_json=as_json)  # fmt: skip


def release(
    jobs: JobsArg = None,
    name: NameOpt = None,
    queue: QueueOpt = None,
    user: UserOpt = None,
    yes: YesOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Release held jobs: back in their queues, in the places their priority and submit time give them."""
    _act("release", jobs, name=name, queue=queue, state=None, user=user, yes=yes, url=url, token=token,
         as_json=as_json)  # fmt: skip


def requeue(
    jobs: JobsArg = None,
    name: NameOpt = None,
    queue: QueueOpt = None,
    user: UserOpt = None,
    yes: YesOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Requeue running jobs: checkpoint signal, grace period, stop, then back in their queues (as a preemption)."""
    _act("requeue", jobs, name=name, queue=queue, state=None, user=user, yes=yes, url=url, token=token,
         as_json=as_json)  # fmt: skip


def update(
    job_id: Annotated[str, typer.Argument(metavar="JOB")],
    priority: Annotated[int | None, typer.Option(help="New priority (higher runs first).")] = None,
    max_runtime: Annotated[str | None, typer.Option(help="New longest run of one attempt: 2h, 30m, seconds.")] = None,
    gpus: Annotated[float | None, typer.Option(help="New GPUs per worker.")] = None,
    queue: Annotated[str | None, typer.Option("--queue", "-q", help="Move it to this queue.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a pending or held job's priority, runtime limit, GPUs or queue (a team token: within its queue)."""
    body = {"priority": priority, "max_runtime": max_runtime, "gpus": gpus, "queue": queue}
    with _client(url, token) as client:
        answer = client.call(
            "POST", f"/v1/jobs/{job_id}/update", json_body={k: v for k, v in body.items() if v is not None}
        )
    if as_json:
        _print_json(answer)
    else:
        typer.echo(plain(f"{job_id}: update requested; the loop applies it shortly"))


def register_verb_commands(app: typer.Typer) -> None:
    """Add cancel, hold, release, requeue and update to the `gpufleet` app."""
    for command in (cancel, hold, release, requeue, update):
        app.command()(command)
