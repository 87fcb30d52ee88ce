"""`gpufleet`: the command line entry point."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from gpufleet import __version__
from gpufleet.cli.commands_admin import register_admin_commands
from gpufleet.cli.commands_client import quota_app, register_client_commands
from gpufleet.cli.commands_config import register_config_commands
from gpufleet.cli.commands_cost import register_cost_commands
from gpufleet.cli.commands_report import idle_policy as idle_policy_command
from gpufleet.cli.commands_report import report_app
from gpufleet.cli.commands_reservations import reservation_app
from gpufleet.cli.commands_run import register_run_commands
from gpufleet.cli.commands_verbs import register_verb_commands
from gpufleet.cli.exporter import exporter as exporter_command
from gpufleet.cli.extras import command_name, missing_extra
from gpufleet.cli.safe_text import plain
from gpufleet.cli.sim import TRACES_ENV, traces_root
from gpufleet.cli.sim import sim as sim_command
from gpufleet.cli.top import top as top_command
from gpufleet.cli.up import up as up_command
from gpufleet.domain.errors import GpufleetError, WorkloadError

app = typer.Typer(
    name="gpufleet",
    help="gpufleet: a control plane for shared GPU fleets.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks; each prints one JSON object.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.command("sim")(sim_command)
register_run_commands(app)
register_client_commands(app)
register_verb_commands(app)
register_admin_commands(app)
register_cost_commands(app)
register_config_commands(app)
app.command("up")(up_command)
app.command("top")(top_command)
app.command("exporter")(exporter_command)
app.add_typer(report_app, name="report")
app.add_typer(reservation_app, name="reservation")
quota_app.command("idle-policy")(idle_policy_command)
throughput_app = typer.Typer(
    help="Measured throughputs the round allocator (gavel profiles) reads.", no_args_is_help=True
)
app.add_typer(throughput_app, name="throughput")


def print_result(result: dict[str, object], as_json: bool) -> None:
    """A benchmark's result: one JSON object, or one `key: value` line each."""
    if as_json:
        typer.echo(json.dumps(result))
        return
    for key, value in result.items():
        typer.echo(f"{key:>20}: {value}")


def fail(error: GpufleetError) -> None:
    """Print a user mistake as one clear message, no stack trace, and exit 2."""
    typer.echo(f"error: {plain(error)}", err=True)
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
    print_result(result, as_json)


@bench_app.command("allocator")
def bench_allocator(
    jobs: int = typer.Option(1000, min=1, help="Active jobs (running and pending)."),
    gpus_per_model: int = typer.Option(128, min=8, help="GPUs of each of the 3 models (nodes of 8)."),
    seed: int = typer.Option(0, help="Seed of the fleet, the jobs and the synthetic throughput table."),
    repeat: int = typer.Option(5, min=1, help="Runs of each measurement; the best is printed."),
    as_json: bool = typer.Option(True, "--json/--no-json", help="Print one JSON object (default)."),
) -> None:
    """One round of the round allocator (gavel): the LP, the plan, and a whole cycle at a round's start."""
    from gpufleet.bench import allocator

    print_result(allocator.run(jobs, gpus_per_model - gpus_per_model % 8, seed, repeat), as_json)


@bench_app.command("resize")
def bench_resize(
    sizes: str = typer.Option("2,4,1", help="Worker counts the job goes through, comma-separated (1 to 8 each)."),
    rounds: int = typer.Option(3, min=1, help="Times the job goes through `sizes`."),
    as_json: bool = typer.Option(True, "--json/--no-json", help="Print one JSON object (default)."),
) -> None:
    """Resize latency of the local executor: checkpoint signal to every worker up at the new size."""
    from gpufleet.bench import resize_latency

    try:
        counts = tuple(int(part) for part in sizes.split(",") if part.strip())
    except ValueError:
        fail(GpufleetError(f"--sizes {sizes!r} is not a list of numbers", "give e.g. --sizes 2,4,1"))
        return
    try:
        result = resize_latency.run(counts, rounds)
    except GpufleetError as error:
        fail(error)
        return
    print_result(result, as_json)


@throughput_app.command("import")
def throughput_import(
    file: Annotated[
        Path, typer.Argument(help="A throughput CSV: Gavel's layout, or job_type,gpu_model,gpus,throughput.")
    ],
    data_dir: Annotated[
        Path | None,
        typer.Option(envvar="GPUFLEET_DATA_DIR", help="The control plane's data dir [default: user data dir]."),
    ] = None,
    db: Annotated[
        str | None, typer.Option(help="The control plane's database URL [default: SQLite in the data dir].")
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option(help="The GPU model job durations are given on (default: the file's, V100 for Gavel's)."),
    ] = None,
) -> None:
    """Check a measured throughput table and store it for the control plane (read by `gpufleet up` at start)."""
    from gpufleet.cli.throughput import read_table, store_table
    from gpufleet.cli.up import default_data_dir

    try:
        table = read_table(file, reference)
        from gpufleet.adapters.storage.sql import default_sqlite_url

        url = db or default_sqlite_url((data_dir or default_data_dir()).expanduser())
        if db is None:
            (data_dir or default_data_dir()).expanduser().mkdir(parents=True, exist_ok=True)
        store_table(url, table)
    except GpufleetError as error:
        fail(error)
        return
    typer.echo(
        f"stored {len(table.entries)} throughputs ({len(table.job_types)} job types on {', '.join(table.models)}); "
        "`gpufleet up` reads them at start: restart the control plane to use them"
    )


@bench_app.command("loop")
def bench_loop(
    nodes: int = typer.Option(1000, min=10, help="Nodes in the synthetic fleet (8 GPUs each)."),
    pending: int | None = typer.Option(None, min=0, help="Jobs kept waiting (default: 10 per node)."),
    steps: int = typer.Option(30, min=1, help="Steady steps measured (one simulated second each)."),
    rate: int | None = typer.Option(None, min=1, help="Jobs arriving per step (default: one per 5 nodes)."),
    seed: int = typer.Option(0, help="Seed of the fleet, the jobs and their durations."),
    policy: str = typer.Option("default", help="Scheduling profile."),
    array_size: int = typer.Option(0, min=0, help="Submit the jobs as arrays of this many tasks (0: plain jobs)."),
    as_json: bool = typer.Option(True, "--json/--no-json", help="Print one JSON object (default)."),
) -> None:
    """The live control loop (Reconciler + SQLite store, a fake in-process backend) at a steady load."""
    from gpufleet.bench import control_loop
    from gpufleet.sim.experiment import check_policies

    try:
        check_policies([policy])
        result = control_loop.run(
            nodes, pending, steps=steps, rate=rate, seed=seed, policy=policy, array_size=array_size
        )
    except GpufleetError as error:
        fail(error)
        return
    print_result(result, as_json)


@bench_app.command("sim")
def bench_sim(
    traces: Annotated[
        Path | None, typer.Option(help=f"Folder holding alibaba-openb-2023/ and philly-2017/ (or set {TRACES_ENV}).")
    ] = None,
    case: Annotated[list[str] | None, typer.Option(help="Run only this case (openb_fgd, philly); repeatable.")] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(help="Run each case under this profile (repeatable; default: its baseline and default)."),
    ] = None,
    pods: Annotated[str, typer.Option(help="openb_fgd: pod list, default or gpuspec33.")] = "default",
    as_json: Annotated[bool, typer.Option("--json/--no-json", help="Print one JSON object (default).")] = True,
) -> None:
    """Simulator speed: the FGD protocol on openb and the whole Philly trace, per policy."""
    from gpufleet.bench import simulator as sim_bench
    from gpufleet.sim.experiment import check_policies

    try:
        root = traces_root(traces)
        if root is None:
            raise WorkloadError(
                "the simulator benchmark needs the public traces", f"pass --traces DIR or set {TRACES_ENV}"
            )
        cases = tuple(case or ())
        unknown = sorted(set(cases) - set(sim_bench.GOALS_S))
        if unknown:
            raise WorkloadError(f"no benchmark case {unknown[0]!r}", f"use one of: {', '.join(sim_bench.GOALS_S)}")
        policies = check_policies(policy) if policy else ()
        result = sim_bench.run(root, cases or tuple(sim_bench.GOALS_S), policies, pods)
    except GpufleetError as error:
        fail(error)
        return
    print_result(result, as_json)


@bench_app.command("api")
def bench_api(
    jobs: int = typer.Option(2000, min=1, help="Jobs submitted in the throughput run."),
    clients: int = typer.Option(16, min=1, help="Concurrent HTTP clients in the throughput run."),
    samples: int = typer.Option(50, min=1, help="Jobs timed one by one for submit -> process started."),
    as_json: bool = typer.Option(True, "--json/--no-json", help="Print one JSON object (default)."),
) -> None:
    """Submit throughput and submit -> process-started latency through the HTTP API (SQLite)."""
    from gpufleet.bench import api

    try:
        result = api.run(jobs, clients, samples)
    except GpufleetError as error:
        fail(error)
        return
    print_result(result, as_json)


@bench_app.command("ray")
def bench_ray(
    nodes: int = typer.Option(4, min=2, help="Emulated nodes in the local Ray cluster."),
    gpus_per_node: int = typer.Option(8, min=1, help="Emulated GPUs per node."),
    jobs: int = typer.Option(200, min=1, help="Jobs launched in the burst."),
    as_json: bool = typer.Option(True, "--json/--no-json", help="Print one JSON object (default)."),
) -> None:
    """Jobs on a local Ray cluster: submit -> all workers started p50/p99, launches/s, node death -> requeued."""
    from gpufleet.bench import ray_fleet as ray_bench

    try:
        result = ray_bench.run(nodes, gpus_per_node, jobs)
    except GpufleetError as error:
        fail(error)
        return
    print_result(result, as_json)


@bench_app.command("kubernetes")
def bench_kubernetes(
    nodes: int = typer.Option(100, min=1, help="kwok GPU nodes (8 GPUs each, three models)."),
    pods: int = typer.Option(1000, min=1, help="Pending whole-GPU pods each scheduler binds."),
    seed: int = typer.Option(0, help="Seed of the synthetic pod mix."),
    scheduler_qps: float | None = typer.Option(
        None, help="kube-scheduler's client rate limit to the API server [default: its own, 50/s]."
    ),
    as_json: bool = typer.Option(True, "--json/--no-json", help="Print one JSON object (default)."),
) -> None:
    """gpufleet and kube-scheduler bind the same pods on one real API server: pods/s and GPUs allocated."""
    from gpufleet.bench import kubernetes as k8s_bench

    try:
        result = k8s_bench.run(nodes, pods, seed, scheduler_qps=scheduler_qps)
    except GpufleetError as error:
        fail(error)
        return
    print_result(result, as_json)


@bench_app.command("web")
def bench_web(
    jobs: int = typer.Option(10_000, min=100, help="Jobs in the store before the pages are timed."),
    repeats: int = typer.Option(5, min=1, help="Requests per page (the first and the best are reported)."),
    as_json: bool = typer.Option(True, "--json/--no-json", help="Print one JSON object (default)."),
) -> None:
    """Server time to render each dashboard page with many jobs in the store (goal: 300 ms each)."""
    from gpufleet.bench import web

    try:
        result = web.run(jobs, repeats)
    except GpufleetError as error:
        fail(error)
        return
    print_result(result, as_json)


@bench_app.command("store")
def bench_store(
    jobs: int = typer.Option(2000, min=1, help="Jobs submitted and written."),
    db: str | None = typer.Option(None, help="A PostgreSQL URL to measure instead of a fresh SQLite file."),
    as_json: bool = typer.Option(True, "--json/--no-json", help="Print one JSON object (default)."),
) -> None:
    """The SQL store alone: submits/s, single-job writes/s, batched records/s, active() time."""
    from gpufleet.bench import store

    try:
        result = store.run(jobs, db)
    except GpufleetError as error:
        fail(error)
        return
    print_result(result, as_json)


@bench_app.command("telemetry")
def bench_telemetry(
    repeats: int = typer.Option(200, min=5, help="Repeats per timed operation (medians are reported)."),
    as_json: bool = typer.Option(True, "--json/--no-json", help="Print one JSON object (default)."),
) -> None:
    """Cost of one sample of 8 GPUs, of one /metrics scrape (8x8 GPUs, 1,000 jobs), CPU share at 5 s."""
    from gpufleet.bench.telemetry import run_telemetry_bench

    print_result(run_telemetry_bench(repeats), as_json)


def main() -> None:
    """The console entry: the commands, with a user's mistake or a missing optional part (an extra not
    installed) said in one line with its fix, exit status 2, instead of a stack trace."""
    try:
        app()
    except GpufleetError as error:
        typer.echo(f"error: {plain(error)}", err=True)
        sys.exit(2)
    except ModuleNotFoundError as error:
        missing = missing_extra(error, command_name(sys.argv))
        if missing is None:
            raise
        typer.echo(f"error: {missing}", err=True)
        sys.exit(2)
