"""`gpufleet apply -f fleet.yaml` and `gpufleet export`: the fleet's queues, quotas, cohorts, budgets, prices and
token bindings as one file, applied as `kubectl apply` applies one (see `server/fleet_config.py`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from gpufleet.cli.commands_client import JsonOpt, TokenOpt, UrlOpt, _client, _print_json
from gpufleet.cli.safe_text import plain
from gpufleet.domain.errors import GpufleetError
from gpufleet.server.yaml_file import read_yaml_mapping

CONFIG_EXAMPLE = "queues: {team-a: {quotas: {gpu: 8}}}, prices: […], tokens: […]"
HEADER = (
    "# gpufleet fleet config: `gpufleet apply -f FILE` makes the fleet match it (`--dry-run` shows how first).\n"
    "# Each queue listed is replaced whole; `--prune` also removes queues and prices left out; tokens are never\n"
    "# revoked by a file. Secrets are not in it: a token binding that is new gets a new secret when applied.\n"
)
VERB = {
    "create": ("created", "would create"),
    "update": ("changed", "would change"),
    "delete": ("deleted", "would delete"),
}


def apply(
    file: Annotated[str, typer.Option("--file", "-f", help="The fleet config (YAML); `-` reads it from stdin.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only show what would change.")] = False,
    prune: Annotated[
        bool, typer.Option("--prune", help="Also remove the queues and prices the file does not list.")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Make the fleet's queues, quotas, cohorts, budgets, prices and token bindings match a file (admin).

    Every entry is checked first and one bad entry changes nothing; applying the same file again changes nothing.
    The changes are listed field by field (`live → file`); a token the file makes is printed with its secret,
    shown this once. `gpufleet export` writes the fleet's config in the same format."""
    with _client(url, token) as client:
        config = read_yaml_mapping(file, "fleet config", CONFIG_EXAMPLE)
        result = client.apply_config(config, dry_run=dry_run, prune=prune)
    if as_json:
        _print_json(dataclasses.asdict(result))
        return
    for change in result.changes:
        done, would = VERB[change.action]
        typer.echo(plain(f"{change.kind} {change.name} {would if dry_run else done}"))
        for field, (old, new) in change.fields.items():
            typer.echo(plain(f"  {field}: {_shown(old)} → {_shown(new)}"))
    for name, secret in result.secrets.items():
        typer.echo(plain(f"token {name}: secret {secret} (shown once: give it to its holder now)"))
    changed = len(result.changes)
    if dry_run:
        summary = f"dry run: {changed} change(s) would be made, {result.unchanged} entry(ies) already match"
    elif changed:
        summary = f"applied: {changed} change(s), {result.unchanged} entry(ies) already matched"
    else:
        summary = f"nothing to change: the fleet matches the file ({result.unchanged} entry(ies))"
    typer.echo(summary)


def export(
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="Write it to this file (default: stdout).")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Write the fleet's config (queues, quotas, cohorts, budgets, prices, token bindings) as `apply -f` reads
    it (admin). `export > fleet.yaml; apply -f fleet.yaml` changes nothing."""
    with _client(url, token) as client:
        config = client.fleet_config()
    text = HEADER + yaml.safe_dump(_pruned(config), sort_keys=False, allow_unicode=True)
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as error:
        typer.echo(
            f"error: {plain(GpufleetError(f'cannot write {output}: {error.strerror}', 'give a writable path'))}",
            err=True,
        )
        raise typer.Exit(2) from None
    typer.echo(f"wrote {output}", err=True)


def _pruned(config: dict[str, Any]) -> dict[str, Any]:
    """The export without the fields left at their defaults (null), so that it reads as a person writes it."""
    queues = {
        name: {key: value for key, value in entry.items() if value is not None}
        for name, entry in config.get("queues", {}).items()
    }
    tokens = [{key: value for key, value in t.items() if value is not None} for t in config.get("tokens", [])]
    return {"queues": queues, "prices": config.get("prices", []), "tokens": tokens}


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return str(value)


def register_config_commands(app: typer.Typer) -> None:
    app.command("apply")(apply)
    app.command("export")(export)
