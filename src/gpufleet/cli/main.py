"""`gpufleet`: the command line entry point."""

from __future__ import annotations

import json
import sys

import typer

from gpufleet import __version__
from gpufleet.domain.errors import GpufleetError

app = typer.Typer(
    name="gpufleet",
    help="gpufleet: a control plane for shared GPU fleets.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks; each prints one JSON object.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def fail(error: GpufleetError) -> None:
    """Print a user mistake as one clear message, no stack trace, and exit 2."""
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(2)


@app.command()
def version() -> None:
    """Print the gpufleet version."""
    typer.echo(__version__)


@bench_app.command("scheduler")
def bench_scheduler(
    nodes: int = typer.Option(1000, min=1, help="Nodes in the synthetic fleet (8 GPUs each)."),
    pending: int = typer.Option(10_000, min=1, help="Pending jobs."),
    seed: int = typer.Option(0, help="Seed of the fleet and workload generator."),
    policy: str = typer.Option("default", help="Scheduling profile."),
    as_json: bool = typer.Option(True, "--json/--no-json", help="Print one JSON object (default)."),
) -> None:
    """Placements per second of the scheduling core until nothing more fits."""
    from gpufleet.bench import scheduler

    try:
        result = scheduler.run(nodes, pending, seed=seed, policy=policy)
    except GpufleetError as error:
        fail(error)
        return
    if as_json:
        typer.echo(json.dumps(result))
    else:
        for key, value in result.items():
            typer.echo(f"{key:>20}: {value}")


def main() -> None:  # pragma: no cover - console entry
    try:
        app()
    except GpufleetError as error:
        typer.echo(f"error: {error}", err=True)
        sys.exit(2)
