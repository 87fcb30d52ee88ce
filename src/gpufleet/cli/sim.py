"""`gpufleet sim`: what-if runs of a workload under several scheduling policies, and published reproductions.

gpufleet sim                                        synthetic workload, policies fifo,las,default
gpufleet sim -w philly -p fifo,sjf --traces DIR     a public trace (DIR holds philly-2017/ …)
gpufleet sim -w openb -p best-fit,fgd --traces DIR  the FGD protocol on openb (pods never leave)
gpufleet sim -w PATH                                a trace folder or CSV, format detected
gpufleet sim --reproduce fgd --traces DIR           our figures beside the published ones (--seeds 47-51)
gpufleet sim --reproduce helios-philly --set window=december   a month Helios did not publish (held out)
gpufleet sim --reproduce helios-philly -p fifo,default --set window=oct-week1 --set las_min_run_s=300
                                                    one setting of the LAS minimum-run sweep (its tuning week)
gpufleet sim --add-nodes 8xH100@4 --quota team-a:gpu=64   what if the cluster had 4 more nodes, team-a more quota
gpufleet sim --node-mtbf-hours 500 --repair-hours 4 --event 3600:down:syn-0003   … with node failures
… --out DIR (results.json, results.csv, plots, report.md)   … --json (one JSON object on stdout)
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpufleet.cli.extras import skipped_note
from gpufleet.domain.errors import GpufleetError
from gpufleet.sim.engine import SimSettings
from gpufleet.sim.events import FailureModel
from gpufleet.sim.experiment import Comparison, Experiment, run_experiment, scale_load
from gpufleet.sim.experiment import Progress as ProgressFn
from gpufleet.sim.prices import PriceTable, load_price_table, parse_price, prices_from
from gpufleet.sim.report import FGD_REPORT_STEPS, fmt, has_cluster_events, plots_available, write_report
from gpufleet.sim.reproduce import REPRODUCTIONS
from gpufleet.sim.reproduce_pollux import pollux_with_durations
from gpufleet.sim.simulated_backend import BackendSettings
from gpufleet.sim.whatif import apply_what_if
from gpufleet.sim.workload import Workload, WorkloadError
from gpufleet.sim.workloads import load_workload
from gpufleet.sim.workloads.openb_fgd import FGD_SEEDS
from gpufleet.sim.workloads.philly import WINDOWS
from gpufleet.sim.workloads.sources import SOURCES

TRACES_ENV = "GPUFLEET_TRACES"
PRICES_ENV = "GPUFLEET_PRICES"
DEFAULT_POLICIES = "fifo,las,default"
# What `--workload openb` means here: the FGD paper's protocol (sampled pods that never leave), the way the
# openb trace is used in published work. `fgd` is the same.
WORKLOAD_ALIASES = {"openb": "fgd"}
DEFAULT_SEEDS = {"fgd": 42}
GAVEL_DEFAULT_RATE = 2.0
DEFAULT_REPAIR_HOURS = 4.0


def _parse_value(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` pairs -> loader options (numbers and true/false converted)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise WorkloadError(f"option {pair!r} is not KEY=VALUE", "write e.g. --set rate_per_hour=3.0")
        options[key.strip()] = _parse_value(value.strip())
    return options


def traces_root(traces: Path | None) -> Path | None:
    root = traces if traces is not None else (Path(os.environ[TRACES_ENV]) if os.environ.get(TRACES_ENV) else None)
    if root is not None and not root.expanduser().is_dir():
        raise WorkloadError(
            "the traces folder does not exist", "give --traces DIR, the folder holding the trace folders", path=root
        )
    return root.expanduser() if root is not None else None


def _need_traces(root: Path | None, what: str, folder: str) -> Path:
    if root is None:
        raise WorkloadError(
            f"{what} needs the public trace data",
            f"pass --traces DIR (the folder holding {folder}/) or set {TRACES_ENV}",
        )
    return root


def load_named(name: str, root: Path | None, seed: int | None, options: dict[str, Any]) -> Workload:
    """A workload by name (synthetic, openb, fgd, philly, gavel, pollux, tiresias) or path, with CLI defaults."""
    key = WORKLOAD_ALIASES.get(name.strip().lower(), name.strip().lower())
    source = SOURCES.get(key)
    options = dict(options)
    if source is not None and source.name in ("synthetic", "fgd", "gavel"):
        options.setdefault("seed", seed if seed is not None else DEFAULT_SEEDS.get(source.name, 0))
    if source is not None and source.name == "gavel":
        options.setdefault("rate_per_hour", GAVEL_DEFAULT_RATE)
    if source is not None and source.folder is not None:
        root = _need_traces(root, f"workload {name!r}", source.folder)
    workload = load_workload(key if source is not None else name, traces_root=root, **options)
    if source is not None and source.name == "pollux" and "application_durations" not in options:
        workload = pollux_with_durations(workload)
    return workload


def load_prices(prices: Path | None, overrides: list[str]) -> PriceTable | None:
    path = prices if prices is not None else (Path(os.environ[PRICES_ENV]) if os.environ.get(PRICES_ENV) else None)
    given = dict(parse_price(p) for p in overrides)
    if path is not None:
        return load_price_table(path).with_overrides(given)
    return prices_from(given) if given else None


def fail(error: GpufleetError) -> None:
    """A user mistake: one message with its fix on stderr, no stack trace, exit status 2."""
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(2)


# --- output ----------------------------------------------------------------------------------------------


@contextmanager
def progress_bar(enabled: bool) -> Iterator[ProgressFn | None]:
    """A Rich progress bar on stderr, one task per policy (jobs arrived / jobs); None when disabled."""
    if not enabled:
        yield None
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs arrived"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        tasks: dict[str, Any] = {}
        last: dict[str, int] = {}

        def update(policy: str, arrived: int, total: int) -> None:
            task = tasks.get(policy)
            if task is None:
                task = tasks[policy] = bar.add_task(policy, total=total)
                last[policy] = -1
            step = max(1, total // 500)
            if arrived - last[policy] >= step or arrived == total:
                bar.update(task, completed=arrived)
                last[policy] = arrived

        yield update


def _seconds(value: float | None) -> str:
    return fmt(value)


def experiment_table(experiment: Experiment) -> Table:
    w = experiment.workload
    table = Table(
        title=f"{w.name}: {len(w.nodes):,} nodes, {w.gpu_count:,} GPUs, {len(w.jobs):,} jobs",
        caption=f"Source: {w.citation} License: {w.license}",
        caption_justify="left",
    )
    columns: tuple[tuple[str, str], ...] = (
        ("policy", "left"),
        ("done", "right"),
        ("avg JCT s", "right"),
        ("p95 JCT s", "right"),
        ("avg queue s", "right"),
        ("p95 queue s", "right"),
        ("makespan s", "right"),
        ("GPU alloc %", "right"),
        ("frag %", "right"),
        ("preempt", "right"),
        ("cost $", "right"),
        ("Jain", "right"),
        ("avg rho", "right"),
    )
    events = has_cluster_events(experiment)
    if events:
        columns += (("node fail", "right"), ("jobs lost", "right"), ("GPU-h lost", "right"))
    for name, justify in columns:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in experiment.results:
        m = r.metrics
        failures = (fmt(m.node_failures), fmt(m.jobs_lost_to_failures), fmt(m.failure_lost_gpu_hours))
        table.add_row(
            r.policy,
            f"{m.jobs_finished:,}/{m.jobs:,}",
            _seconds(m.jct.avg),
            _seconds(m.jct.p95),
            _seconds(m.queueing.avg),
            _seconds(m.queueing.p95),
            _seconds(m.makespan_s),
            f"{m.gpu_alloc_pct:.1f}",
            fmt(m.fragmentation_pct_of_capacity),
            fmt(m.preemptions),
            fmt(m.cost_usd),
            fmt(m.jain_slowdown),
            fmt(m.ftf_rho.avg),
            *(failures if events else ()),
        )
    return table


def fgd_table(experiment: Experiment) -> Table:
    w = experiment.workload
    table = Table(
        title="GPU allocation % / FGD fragmentation % of capacity, at arrived load (% of GPU capacity)",
        caption=f"Source: {w.citation}",
        caption_justify="left",
    )
    table.add_column("policy")
    for p in FGD_REPORT_STEPS:
        table.add_column(f"{p} %", justify="right")
    for r in experiment.results:
        at = {s.arrived_pct: s for s in r.metrics.fgd_steps}
        table.add_row(
            r.policy,
            *(
                f"{at[p].gpu_alloc_pct:.2f} / {at[p].frag_gpu_pct_of_capacity:.2f}" if p in at else "-"
                for p in FGD_REPORT_STEPS
            ),
        )
    return table


def comparison_table(comparison: Comparison) -> Table:
    table = Table(title=comparison.title, caption=f"Published: {comparison.source}", caption_justify="left")
    for column in comparison.columns:
        table.add_column(column, justify="left" if column in ("policy", "published_policy") else "right")
    for row in comparison.rows:
        table.add_row(*(fmt(v) for v in row))
    return table


def stdout_console() -> Console:
    """The console for tables: the terminal's width, or 200 columns when piped (so no column is cut)."""
    console = Console()
    return console if console.is_terminal else Console(width=200)


def print_experiment(console: Console, experiment: Experiment) -> None:
    console.print(experiment_table(experiment))
    if experiment.fgd_protocol:
        console.print(fgd_table(experiment))
    for change in experiment.what_if:
        console.print(f"what-if: {change}", highlight=False)
    for note in experiment.notes:
        console.print(f"note: {note}")


def print_comparison(console: Console, comparison: Comparison) -> None:
    console.print(comparison_table(comparison))
    for note in comparison.notes:
        console.print(f"- {note}")


# --- the command -----------------------------------------------------------------------------------------


def sim(
    workload: Annotated[
        str,
        typer.Option(
            "--workload", "-w", help="synthetic, openb (FGD protocol), fgd, philly, gavel, pollux, tiresias, or a path."
        ),
    ] = "synthetic",
    policies: Annotated[str, typer.Option("--policies", "-p", help="Comma-separated scheduling profiles.")] = (
        DEFAULT_POLICIES
    ),
    seed: Annotated[
        int | None, typer.Option(help="Seed of the synthetic generator, of the FGD sampling (default 42), of Gavel's.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write results.json, results.csv, PNG plots and report.md here.")
    ] = None,
    traces: Annotated[
        Path | None, typer.Option(help=f"Folder holding the public trace folders (or set {TRACES_ENV}).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout instead of tables.")] = False,
    reproduce: Annotated[
        str | None, typer.Option(help="Re-run a published experiment: " + ", ".join(REPRODUCTIONS) + ".")
    ] = None,
    load_scale: Annotated[
        float | None,
        typer.Option(
            help="Divide arrival times by K (K-fold load; run times unchanged). Default 1; for --reproduce "
            "helios-philly the calibrated load."
        ),
    ] = None,
    prices: Annotated[
        Path | None,
        typer.Option(help=f"GPU price CSV (e.g. gcp_gpu_prices_us.csv, or its folder; or set {PRICES_ENV})."),
    ] = None,
    price: Annotated[
        list[str] | None, typer.Option(help="USD per GPU-hour for a model: MODEL=USD (repeatable).")
    ] = None,
    options: Annotated[
        list[str] | None, typer.Option("--set", help="Workload loader option KEY=VALUE (repeatable).")
    ] = None,
    oracle: Annotated[
        bool,
        typer.Option(
            "--oracle-durations/--no-oracle-durations", help="Give jobs their true run time (read by sjf, srtf)."
        ),
    ] = True,
    seeds: Annotated[
        str,
        typer.Option(help="--reproduce fgd: seeds, as a count from 42 (3), a range (47-51) or a list (42,45)."),
    ] = "1",
    rates: Annotated[
        str,
        typer.Option(
            help="--reproduce gavel|gavel-multi: arrival rates (jobs/hour); default: every published one "
            "(--progress shows each rate, its place in the sweep and the time left)."
        ),
    ] = "",
    show_progress: Annotated[
        bool | None,
        typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: when stderr is a terminal)."),
    ] = None,
    add_nodes: Annotated[
        list[str] | None,
        typer.Option(
            "--add-nodes",
            help="What if: add nodes from the start, COUNTxMODEL[-MEMGB][@NODES], e.g. 8xH100@4 (repeatable).",
        ),
    ] = None,
    grow_quotas: Annotated[
        bool,
        typer.Option(help="With --add-nodes: grow every queue's nominal GPU quota in proportion to the GPUs added."),
    ] = False,
    quota: Annotated[
        list[str] | None,
        typer.Option(
            help="What if: set a queue's quota from the start, QUEUE:gpu=N[,gpu:MODEL=N,borrowing=N,lending=N,"
            "weight=W] in GPUs (repeatable)."
        ),
    ] = None,
    node_mtbf_hours: Annotated[
        float | None, typer.Option(help="Random node failures: mean time between failures per node, in hours.")
    ] = None,
    repair_hours: Annotated[
        float | None,
        typer.Option(help=f"Random node failures: mean repair time in hours (default {DEFAULT_REPAIR_HOURS:g})."),
    ] = None,
    event: Annotated[
        list[str] | None,
        typer.Option(
            help="A timed cluster event TIME:KIND:WHAT: 3600:down:NODE, 7200:up:NODE, 7200:quota:QUEUE:gpu=32, "
            "1h:add:8xH100@2 (repeatable; times on the workload's clock)."
        ),
    ] = None,
    reservation: Annotated[
        list[str] | None,
        typer.Option(
            help="What if: nodes held NAME:NODES:START:END[:QUEUE] (comma-separated nodes; no QUEUE: maintenance), "
            "e.g. fw:syn-0001,syn-0002:2h:6h; jobs that would run into it do not start there (repeatable).",
        ),
    ] = None,
    checkpoint_every_s: Annotated[
        float | None,
        typer.Option(help="Jobs checkpoint every S seconds of run time (a node failure loses work since then)."),
    ] = None,
    spot_pool: Annotated[
        str | None,
        typer.Option(
            help="ZONE[:FRACTION]: turn FRACTION (default 0.5) of the nodes into spot nodes with the interruptions "
            "of ZONE's NSDI'24 spot trace, and compare cost, JCT and lost GPU-hours with spot off, breaker off "
            "and breaker on (first policy only; --prices for the prices)."
        ),
    ] = None,
    spot_traces: Annotated[
        Path | None,
        typer.Option(help="The spot-traces-nsdi24 folder (default: beside the traces, or $GPUFLEET_COSTS)."),
    ] = None,
    spot_checkpointing: Annotated[
        float, typer.Option(help="With --spot-pool: share of the jobs that checkpoint (every 30 min).")
    ] = 0.5,
    budget: Annotated[
        list[str] | None,
        typer.Option(
            help="QUEUE=AMOUNT[:usd|gpu-hours][:warn|deprioritise|block][:month|rolling-30d] (repeatable): run the "
            "workload with and without these queue budgets, acting as the live control plane does, and compare "
            "cost, refused submissions and JCT (first policy only; --prices for the prices)."
        ),
    ] = None,
    checkpoint_sweep: Annotated[
        bool,
        typer.Option(
            "--checkpoint-sweep",
            help="Instead of a workload: sweep checkpoint intervals under seeded exponential failures and show "
            "where the least time is lost against the control plane's Young/Daly interval sqrt(2CM) (--seed, "
            "--out for JSON and a plot, --json). Default settings: the published ones (Llama 3, NSDI'24 spot).",
        ),
    ] = False,
    checkpoint_setting: Annotated[
        list[str] | None,
        typer.Option(help="With --checkpoint-sweep: C_S:MTBF_H, e.g. 60:3.09 (repeatable; replaces the defaults)."),
    ] = None,
    comm_study: Annotated[
        str | None,
        typer.Option(
            help="LIMIT or 'score': run the workload's multi-GPU jobs as data-parallel gangs of 1-GPU workers with "
            "seeded models and step times, and compare placements and JCT with the communication model off and on "
            "(max_comm_overhead LIMIT, e.g. 0.25; 'score': no limit, the score only). First policy only."
        ),
    ] = None,
) -> None:
    """Simulate a workload under several policies and compare them (or reproduce a published experiment)."""
    try:
        if checkpoint_sweep or checkpoint_setting:
            from gpufleet.cli.sim_checkpoints import checkpoint_sweep as run_sweep

            run_sweep(checkpoint_setting or [], seed, out, as_json)
            return
        root = traces_root(traces)
        table = load_prices(prices, price or [])
        names = [p.strip() for p in policies.split(",") if p.strip()]
        bar = show_progress if show_progress is not None else sys.stderr.isatty()
        if load_scale is not None and not (math.isfinite(load_scale) and load_scale > 0):
            raise WorkloadError(f"--load-scale is {load_scale}", "give a factor > 0, e.g. 4")
        failures = failure_model(node_mtbf_hours, repair_hours, seed)
        what_if = WhatIf(
            add_nodes or [], grow_quotas, quota or [], event or [], failures, checkpoint_every_s, reservation or []
        )
        output = Output(out, as_json, bar)
        if reproduce is not None:
            what_if.refuse(reproduce, repair_hours)
            chosen = names if policies != DEFAULT_POLICIES else None
            _reproduce(reproduce, root, chosen, load_scale, table, seeds, rates, parse_options(options or []), output)
            return
        loaded = load_named(workload, root, seed, parse_options(options or []))
        loaded = scale_load(loaded, 1.0 if load_scale is None else load_scale)
        if spot_pool is not None:
            from gpufleet.cli.sim_spot import spot_study

            spot_study(loaded, spot_pool, root, spot_traces, prices, names[0], seed, spot_checkpointing, as_json)
            return
        if budget:
            from gpufleet.cli.sim_budget import budget_study

            budget_study(loaded, budget, root, prices, names[0], as_json)
            return
        if comm_study is not None:
            from gpufleet.cli.sim_comm import comm_study_command

            comm_study_command(loaded, comm_study, names[0], seed, as_json)
            return
        _simulate(loaded, names, table, what_if, oracle, output)
    except GpufleetError as error:
        fail(error)


@dataclass(frozen=True)
class Output:
    """Where results go: report files under `out`, one JSON object or tables on stdout, a progress bar."""

    out: Path | None
    as_json: bool
    progress: bool

    def experiment(self, experiment: Experiment) -> None:
        self._write([experiment], None)
        if self.as_json:
            typer.echo(json.dumps(experiment.as_dict()))
            return
        console = stdout_console()
        print_experiment(console, experiment)
        if self.out is not None:
            console.print(f"wrote {self.out}/results.json, results.csv, report.md{self._plots_written()}")

    def comparison(self, comparison: Comparison) -> None:
        self._write(list(comparison.experiments), comparison)
        if self.as_json:
            typer.echo(json.dumps(comparison.as_dict()))
            return
        console = stdout_console()
        print_comparison(console, comparison)
        if self.out is not None:
            console.print(
                f"wrote {self.out}/results.json, comparison.csv, results.csv, report.md{self._plots_written()}"
            )

    def _write(self, experiments: list[Experiment], comparison: Comparison | None) -> None:
        """The report files, and a note on stderr when the `plots` extra is missing (no PNG plots)."""
        if self.out is None:
            return
        write_report(self.out, experiments, comparison)
        if not plots_available():
            typer.echo(skipped_note("plots", "PNG plots"), err=True)

    @staticmethod
    def _plots_written() -> str:
        return " and plots" if plots_available() else ""


@dataclass(frozen=True)
class WhatIf:
    """The what-if flags of one command: cluster changes, failures, checkpoints."""

    add_nodes: list[str]
    grow_quotas: bool
    quotas: list[str]
    events: list[str]
    failures: FailureModel | None
    checkpoint_every_s: float | None
    reservations: list[str]

    def refuse(self, reproduce: str, repair_hours: float | None) -> None:
        """A reproduction runs a published setup as published: no what-if flag may change it."""
        given = [
            flag
            for flag, value in (
                ("--add-nodes", self.add_nodes),
                ("--grow-quotas", self.grow_quotas),
                ("--quota", self.quotas),
                ("--event", self.events),
                ("--node-mtbf-hours", self.failures),
                ("--repair-hours", repair_hours),
                ("--checkpoint-every-s", self.checkpoint_every_s),
                ("--reservation", self.reservations),
            )
            if value
        ]
        if given:
            raise WorkloadError(
                f"{', '.join(given)} change the cluster, and --reproduce runs a published setup as published",
                f"drop {', '.join(given)}, or run --workload with them instead of --reproduce",
            )

    def apply(self, workload: Workload) -> tuple[Workload, list[str]]:
        """The workload with the asked changes, and each change in words."""
        if self.grow_quotas and not self.add_nodes:
            raise WorkloadError("--grow-quotas grows quotas with the GPUs added", "add --add-nodes, or drop it")
        changed = apply_what_if(
            workload,
            add_nodes=self.add_nodes,
            quotas=self.quotas,
            events=self.events,
            grow_quotas=self.grow_quotas,
            reservations=self.reservations,
        )
        changes = list(changed.changes)
        if self.failures is not None:
            changes.append(f"--node-mtbf-hours {self.failures.mtbf_hours:g}: {self.failures.describe()}")
        if self.checkpoint_every_s is not None:
            changes.append(
                f"--checkpoint-every-s {self.checkpoint_every_s:g}: jobs keep their work up to their last periodic "
                "checkpoint when their node fails"
            )
        return changed.workload, changes

    def settings(self) -> SimSettings | None:
        return sim_settings(self.failures, self.checkpoint_every_s)


def _simulate(
    workload: Workload, names: list[str], prices: PriceTable | None, what_if: WhatIf, oracle: bool, output: Output
) -> None:
    """Run the (changed) workload under every policy and write or print the experiment."""
    settings = what_if.settings()
    loaded, changes = what_if.apply(workload)
    notes = []
    if oracle and any(tj.duration is not None for tj in loaded.jobs):
        loaded = loaded.with_expected_durations()
        notes.append("Jobs carry their trace run time as expected_duration (read only by sjf and srtf).")
    with progress_bar(output.progress) as progress:
        experiment = run_experiment(
            loaded, names, prices=prices, progress=progress, notes=notes, settings=settings, what_if=changes
        )
    output.experiment(experiment)


def failure_model(mtbf_hours: float | None, repair_hours: float | None, seed: int | None) -> FailureModel | None:
    """The failure model the flags ask for (None: nodes never fail at random)."""
    if mtbf_hours is None:
        if repair_hours is not None:
            raise WorkloadError(
                "--repair-hours needs --node-mtbf-hours (how often nodes fail)",
                "add --node-mtbf-hours H, e.g. --node-mtbf-hours 1000",
            )
        return None
    repair = DEFAULT_REPAIR_HOURS if repair_hours is None else repair_hours
    for flag, value in (("--node-mtbf-hours", mtbf_hours), ("--repair-hours", repair)):
        if not (math.isfinite(value) and value > 0):
            raise WorkloadError(f"{flag} is {value:g}", f"give hours > 0, e.g. {flag} 4")
    return FailureModel(mtbf_hours, repair, seed if seed is not None else 0)


def sim_settings(failures: FailureModel | None, checkpoint_every_s: float | None) -> SimSettings | None:
    if checkpoint_every_s is not None and not (math.isfinite(checkpoint_every_s) and checkpoint_every_s > 0):
        raise WorkloadError(f"--checkpoint-every-s is {checkpoint_every_s:g}", "give seconds > 0, e.g. 1800")
    if failures is None and checkpoint_every_s is None:
        return None
    return SimSettings(backend=BackendSettings(checkpoint_every_s=checkpoint_every_s), failures=failures)


# `--set` options each reproduction takes, and what they are.
REPRODUCE_OPTIONS: dict[str, dict[str, str]] = {
    "fgd": {
        "pods": "pods=default|gpuspec33|PATH",
        "gpushare_pct": "gpushare_pct=60 (resample with more GPU sharing)",
        "resample_seed": "resample_seed=0",
    },
    "helios-philly": {
        "window": f"window={'|'.join(WINDOWS)}",
        "las_min_run_s": "las_min_run_s=900 (LAS preemption's minimum run, s)",
    },
    "pollux": {"load": "load=1.5 (arrivals scaled; default 1)"},
    "gavel-jobs": {"lists": "lists=DIR (Gavel's generated job lists)", "only": "only=single_5.6 (lists named so)"},
    "pollux-loads": {"loads": "loads=0.5,1,1.5,2"},
    "starvation": {
        "reserve": "reserve=2h (the +reserve= threshold compared)",
        "only": "only=gang-stream,philly-december,openb",
    },
}


def parse_loads(text: str) -> tuple[float, ...]:
    """`--set loads=0.5,1,1.5,2` for --reproduce pollux-loads: arrival scalings, each > 0."""
    try:
        loads = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise WorkloadError(f"loads={text!r} is not a list of numbers", "write e.g. --set loads=0.5,1,1.5,2") from None
    if not loads or min(loads) <= 0:
        raise WorkloadError(f"loads={text!r} gives no load or one <= 0", "write e.g. --set loads=0.5,1,1.5,2")
    return loads


def parse_seeds(text: str) -> tuple[int, ...]:
    """`--seeds`: a count of the paper's seeds from 42 (`3`: 42, 43, 44), a range (`47-51`) or a list (`42,45`)."""
    fix = "write a count (3), a range (47-51) or a list (42,45) of seeds >= 0"
    try:
        if "," in text:
            seeds = tuple(int(part) for part in text.split(",") if part.strip())
        elif "-" in text.strip()[1:]:
            first, last = (int(part) for part in text.split("-", 1))
            seeds = tuple(range(first, last + 1))
        else:
            count = int(text)
            if not 1 <= count <= len(FGD_SEEDS):
                raise WorkloadError(f"--seeds {count} is not a count of 1..{len(FGD_SEEDS)}", fix)
            seeds = FGD_SEEDS[:count]
    except ValueError:
        raise WorkloadError(f"--seeds {text!r} is not a seed count, range or list", fix) from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise WorkloadError(f"--seeds {text!r} gives no seed, a negative one or one twice", fix)
    return seeds


def _reproduce(
    name: str,
    root: Path | None,
    names: list[str] | None,
    load_scale: float | None,
    table: PriceTable | None,
    seeds: str,
    rates: str,
    options: dict[str, Any],
    output: Output,
) -> None:
    runner = REPRODUCTIONS.get(name)
    if runner is None:
        raise WorkloadError(f"no published experiment {name!r} to reproduce", f"use one of: {', '.join(REPRODUCTIONS)}")
    root = _need_traces(root, f"--reproduce {name}", "the trace folders")
    kwargs: dict[str, Any] = {"policies": names, "prices": table}
    if name == "helios-philly":
        kwargs["load_scale"] = load_scale
    elif load_scale is not None:
        raise WorkloadError(f"--load-scale applies to --reproduce helios-philly, not {name}", "drop --load-scale")
    if name == "fgd":
        kwargs["seeds"] = parse_seeds(seeds)
    accepted = REPRODUCE_OPTIONS.get(name, {})
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        takes = "; ".join(f"--reproduce {r} takes --set {', '.join(o.values())}" for r, o in REPRODUCE_OPTIONS.items())
        raise WorkloadError(
            f"--set {', '.join(unknown)} does not apply to --reproduce {name}", f"{takes}; drop the others"
        )
    kwargs |= {
        key: str(value) if key in ("pods", "window", "lists", "only", "reserve") else value
        for key, value in options.items()
    }
    if "loads" in kwargs:
        kwargs["loads"] = parse_loads(str(kwargs["loads"]))
    if "load" in kwargs:
        one = parse_loads(str(kwargs["load"]))
        if len(one) != 1:
            raise WorkloadError(f"load={kwargs['load']!r} is not one load", "give one, e.g. --set load=1.5")
        kwargs["load"] = one[0]
    if name in ("gavel", "gavel-multi") and rates.strip():
        try:
            kwargs["rates"] = tuple(float(r) for r in rates.split(",") if r.strip())
        except ValueError:
            raise WorkloadError(f"--rates {rates!r} is not a list of numbers", "write e.g. --rates 0.4,2.0") from None
    run: Callable[..., Comparison] = runner
    with progress_bar(output.progress) as progress:
        comparison = run(root, progress=progress, **kwargs)
    output.comparison(comparison)
