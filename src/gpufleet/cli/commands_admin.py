"""Admin commands about the store itself: `gpufleet backup` and `gpufleet audit`."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from gpufleet.cli import output
from gpufleet.cli.commands_client import JsonOpt, TokenOpt, UrlOpt, _client, _print_json
from gpufleet.cli.safe_text import cell, plain
from gpufleet.domain.errors import GpufleetError

if TYPE_CHECKING:
    from gpufleet.adapters.storage.health import BackupInfo
    from gpufleet.client import Client


def backup(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="Where to write the backup (a SQLite file).")],
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Back up the store of this data directory directly, without the API (works whether or not "
            "`gpufleet up` runs on it)."
        ),
    ] = None,
    db: Annotated[str | None, typer.Option(help="Back up the store at this database URL directly.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Back up the control plane's store while it runs (SQLite's online backup; PostgreSQL: use pg_dump).

    Through the API by default (an admin token; recorded in the audit log), or directly on the file with
    --data-dir or --db. Restore: stop `gpufleet up`, copy the backup over DATA_DIR/state.db (removing
    state.db-wal and state.db-shm), start again."""
    try:
        if data_dir is not None or db is not None:
            info = _backup_directly(file, data_dir, db)
            how = "directly"
        else:
            with _client(url, token) as client:
                info = _backup_through_api(client, file)
            how = f"from {client.target.url}"
    except GpufleetError as error:
        typer.echo(f"error: {plain(error)}", err=True)
        raise typer.Exit(2) from None
    size = f"{info.size / 1024:.0f} KiB" if info.size < 1 << 30 else f"{info.size / (1 << 30):.2f} GiB"
    typer.echo(plain(f"backed up the store {how}: {info.jobs} jobs, {size}, checked whole, to {info.path}"))


def _backup_directly(file: Path, data_dir: Path | None, db: str | None) -> BackupInfo:
    from gpufleet.adapters.storage.health import backup_sqlite_file, pg_dump_hint, sqlite_path
    from gpufleet.adapters.storage.sql import default_sqlite_url
    from gpufleet.adapters.storage.sql_engine import parse_url, safe_url

    if data_dir is not None and db is not None:
        raise GpufleetError("both --data-dir and --db were given", "give one of them")
    parsed = parse_url(db or default_sqlite_url(data_dir or Path(".")))
    path = sqlite_path(parsed)
    if path is None:
        where = safe_url(parsed)
        raise GpufleetError(
            f"the store {where} is PostgreSQL, which gpufleet does not copy itself", pg_dump_hint(where)
        )
    return backup_sqlite_file(path, file)


def _backup_through_api(client: Client, file: Path) -> BackupInfo:
    from gpufleet.adapters.storage.health import write_backup

    return write_backup(file, lambda partial: client.download("/v1/backup", partial))


def audit(
    since: Annotated[str | None, typer.Option(help="Only the last 7d, 12h, 30m …")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many (the newest).")] = 200,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The audit log of admin actions: who, what, when, from where, and whether it was allowed (admin)."""
    from gpufleet.server.spec import parse_duration

    with _client(url, token) as client:
        params: dict[str, object] = {"limit": limit}
        if since is not None:
            try:
                params["since"] = max(0.0, time.time() - parse_duration(since, 100 * 366 * 86400.0))
            except ValueError:
                raise GpufleetError(f"--since {since!r} is not a duration", "e.g. 7d, 12h or 30m") from None
        entries = client.get("/v1/audit", **params)["entries"]
    if as_json:
        _print_json(entries)
        return
    table = Table(box=None, header_style="bold")
    for column in ("WHEN (UTC)", "WHO", "FROM", "ACTION", "TARGET", "OUTCOME", "DETAIL"):
        table.add_column(column)
    for entry in entries:
        when = datetime.fromtimestamp(entry["at"], UTC).strftime("%Y-%m-%d %H:%M:%S")
        outcome = cell(entry["outcome"])
        if entry["outcome"] != "ok":
            outcome.stylize("bold red")
        table.add_row(
            when,
            cell(entry["actor"]),
            cell(entry["source"]),
            cell(entry["action"]),
            cell(entry["target"]),
            outcome,
            cell(_detail(entry["detail"])),
        )
    console = output.console()
    console.print(table)
    if not entries:
        console.print("no audit entries" + (f" in the last {plain(since)}" if since else ""))


def _detail(text: str) -> str:
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return text[:100]
    if not isinstance(data, dict):
        return text[:100]
    return " ".join(f"{k}={v}" for k, v in data.items())[:100]


def register_admin_commands(app: typer.Typer) -> None:
    app.command()(backup)
    app.command()(audit)
