"""`gpufleet up`: start the control plane on this machine."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from gpufleet.cli.safe_text import markup, plain
from gpufleet.domain.errors import GpufleetError
from gpufleet.server.limits import MAX_GRACE_S
from gpufleet.server.ratelimit import ADMIN_RATE, TEAM_RATE, Rate

DATA_DIR_ENV = "GPUFLEET_DATA_DIR"


def default_data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("gpufleet"))


def up(
    data_dir: Annotated[
        Path | None,
        typer.Option(envvar=DATA_DIR_ENV, help="Where state, job logs and the lock live [default: user data dir]."),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on (loopback unless you mean it).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="HTTP port.")] = 8080,
    db: Annotated[
        str | None,
        typer.Option(help="Database URL, e.g. postgresql+psycopg://user@host/db [default: SQLite in the data dir]."),
    ] = None,
    emulate: Annotated[
        str | None,
        typer.Option(help="Emulate GPUs instead of using NVML, e.g. 8xA100-80GB or 2xT4,4xL4 (labelled emulated)."),
    ] = None,
    inventory: Annotated[
        Path | None, typer.Option(help="An emulated inventory in YAML (several nodes, models, racks).")
    ] = None,
    policy: Annotated[str, typer.Option(help="Scheduling profile (see `gpufleet sim --help`).")] = "default",
    max_grace: Annotated[
        str,
        typer.Option(
            help="The longest grace_period a job may ask (between its checkpoint signal and SIGKILL), in queues "
            "whose admin set no maximum (`quota set … --max-grace`)."
        ),
    ] = "1h",
    team_rate: Annotated[
        float, typer.Option(min=0, help="Requests per second per team or metrics token, on average (0: no limit).")
    ] = TEAM_RATE.per_s,
    team_burst: Annotated[float, typer.Option(min=1, help="... and at most this many at once.")] = TEAM_RATE.burst,
    admin_rate: Annotated[
        float, typer.Option(min=0, help="Requests per second per admin token, on average (0: no limit).")
    ] = ADMIN_RATE.per_s,
    admin_burst: Annotated[float, typer.Option(min=1, help="... and at most this many at once.")] = ADMIN_RATE.burst,
    public_metrics: Annotated[
        bool,
        typer.Option(
            "--public-metrics",
            help="Serve /metrics without a token (it lists job ids, queues and hostnames, to every process that "
            "reaches it: jobs on this host too). Without it, /metrics needs a metrics or admin token, on loopback too.",
        ),
    ] = False,
    reset_store: Annotated[
        bool,
        typer.Option(
            "--reset-store",
            help="Start over with a new, empty store when the existing one is damaged or not this data "
            "directory's: a SQLite file is moved aside (never deleted) and jobs still running from it are stopped.",
        ),
    ] = False,
    stop_jobs: Annotated[
        bool,
        typer.Option(
            "--stop-jobs/--keep-jobs",
            help="On exit, stop running jobs and put them back in their queues, or leave them running to be "
            "adopted by the next start.",
        ),
    ] = False,
    sample_interval: Annotated[
        float, typer.Option(min=0.01, help="Seconds between two samples of every GPU (telemetry).")
    ] = 5.0,
    idle_threshold: Annotated[
        float, typer.Option(min=0.01, max=100, help="A held GPU under this utilisation (%) is idle ...")
    ] = 5.0,
    idle_window: Annotated[
        float, typer.Option(min=0.01, help="... and flagged reserved-but-idle after this many seconds.")
    ] = 1800.0,
    root_path: Annotated[
        str,
        typer.Option(
            help="The path prefix a reverse proxy serves gpufleet under, e.g. /gpufleet (a proxy may also send "
            "X-Forwarded-Prefix); the dashboard's links and cookie use it."
        ),
    ] = "",
    single_user: Annotated[
        bool,
        typer.Option(
            "--single-user",
            help="Not root: accept team tokens anyway, although every job runs as this user and can read every "
            "team's data (one trust domain). Refused as root, where each queue's jobs run as their own user.",
        ),
    ] = False,
    jobs_home: Annotated[
        Path,
        typer.Option(help="As root: where the per-queue users (gpufleet-<queue>) get their home folders."),
    ] = Path("/var/lib/gpufleet-jobs"),
    cgroups: Annotated[
        bool,
        typer.Option(
            "--cgroups/--no-cgroups", help="Run each worker in a cgroup with its memory, CPU, pids and GPU limits."
        ),
    ] = True,
    private_tmp: Annotated[
        bool,
        typer.Option(
            "--private-tmp/--shared-tmp",
            help="As root: give each job attempt its own /tmp and /dev/shm (removed when it ends) and a /proc "
            "that shows only its own user's processes. --shared-tmp: jobs share the host's (e.g. to reach a "
            "daemon's socket in /tmp).",
        ),
    ] = True,
    pids_limit: Annotated[int, typer.Option(min=1, help="Processes and threads per worker (cgroup pids.max).")] = 8192,
    memory_reserve: Annotated[
        str | None,
        typer.Option(
            help="Memory kept from all jobs together for the system and the control plane [default: max(2GiB, "
            "10%)]; a job without `memory` gets its share of the rest per GPU it holds."
        ),
    ] = None,
    pids_reserve: Annotated[
        int | None,
        typer.Option(
            min=0, help="Processes kept from all jobs together for the system [default: max(1024, 10% of pid_max)]."
        ),
    ] = None,
    queue_disk: Annotated[
        str,
        typer.Option(
            help="As root: what a queue's jobs may keep on disk on a node unless its quota says (quota set --disk); "
            "a loop-mounted file system per queue user. 0: no quota for such queues."
        ),
    ] = "0",
    log_dir: Annotated[
        Path | None,
        typer.Option(help="Where job logs go (keep them off the store's file system); default: in the data dir."),
    ] = None,
    log_cap: Annotated[
        str, typer.Option(help="Largest log per worker and attempt; beyond it the newest part is kept.")
    ] = "1GiB",
    log_max_age: Annotated[
        str, typer.Option(help="Finished jobs' logs are deleted this long after their last line (0: never).")
    ] = "30d",
    log_max_total: Annotated[
        str | None,
        typer.Option(help="All logs together stay under this; the oldest finished jobs' logs go first."),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            help="Run jobs on the nodes of a Ray cluster: `auto` (the cluster this machine joined), HOST:PORT, or "
            "`local` (a Ray cluster of the --inventory's emulated nodes on this machine). Needs gpufleet[ray].",
        ),
    ] = None,
    agent_dir: Annotated[
        Path | None,
        typer.Option(
            help="With --ray: where each node's agent keeps its files on that node [default: DATA_DIR/nodes]."
        ),
    ] = None,
    ray_token_file: Annotated[
        Path | None,
        typer.Option(
            help="With --ray HOST:PORT: the file (mode 0600) holding the cluster's Ray token "
            "[default: RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token]."
        ),
    ] = None,
    ray_insecure: Annotated[
        bool,
        typer.Option(
            help="With --ray HOST:PORT: run on a Ray cluster without token authentication (refused otherwise): "
            "then any process that reaches its ports, a job included, runs code as root on its nodes."
        ),
    ] = False,
    ray_dashboard: Annotated[
        bool, typer.Option(help="With --ray local: also run Ray's dashboard (on 127.0.0.1, token required).")
    ] = False,
    kubernetes: Annotated[
        str | None,
        typer.Option(
            metavar="KUBECONFIG|in-cluster",
            help="Be the GPU scheduler of a Kubernetes cluster: bind its pods that name schedulerName: gpufleet "
            "to its nodes. A kubeconfig's path, or `in-cluster` (the service account of the pod gpufleet runs in). "
            "Needs gpufleet[kubernetes].",
        ),
    ] = None,
) -> None:
    """Start the control plane: HTTP API, scheduling loop and executor (this machine, or a Ray cluster's
    nodes with --ray), on embedded defaults."""
    from gpufleet.server.control_plane import ControlPlane, UpSettings, is_loopback
    from gpufleet.server.spec import parse_duration, parse_size

    console = Console(stderr=True, soft_wrap=True)
    # Whatever the control plane writes (store, records, logs) is its own alone unless it says otherwise.
    os.umask(0o077)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        max_grace_s = parse_duration(max_grace, MAX_GRACE_S)
    except ValueError as error:
        typer.echo(f"error: --max-grace {error}", err=True)
        raise typer.Exit(2) from None
    settings = UpSettings(
        data_dir=(data_dir or default_data_dir()).expanduser(),
        host=host,
        port=port,
        db_url=db,
        emulate=emulate,
        inventory_file=inventory,
        policy=policy,
        reset_store=reset_store,
        max_grace_s=max_grace_s,
        team_rate=Rate(team_rate, team_burst),
        admin_rate=Rate(admin_rate, admin_burst),
        public_metrics=public_metrics,
        stop_jobs_on_exit=stop_jobs,
        sample_interval_s=sample_interval,
        idle_threshold_pct=idle_threshold,
        idle_window_s=idle_window,
        root_path=_root_path(root_path),
        single_user=single_user,
        jobs_home=jobs_home,
        use_cgroups=cgroups,
        private_tmp=private_tmp,
        pids_limit=pids_limit,
        memory_reserve=_option(parse_size, memory_reserve, "--memory-reserve") if memory_reserve else None,
        pids_reserve=pids_reserve,
        queue_disk=_option(parse_size, queue_disk, "--queue-disk"),
        log_dir=log_dir.expanduser().absolute() if log_dir is not None else None,
        log_cap=_option(parse_size, log_cap, "--log-cap"),
        log_max_age_s=_option(parse_duration, log_max_age, "--log-max-age") or None,
        log_max_total=_option(parse_size, log_max_total, "--log-max-total") if log_max_total else None,
        ray=ray,
        agent_dir=agent_dir.expanduser().absolute() if agent_dir is not None else None,
        ray_token_file=ray_token_file.expanduser().absolute() if ray_token_file is not None else None,
        ray_insecure=ray_insecure,
        ray_dashboard=ray_dashboard,
        kubernetes=kubernetes,
    )
    try:
        plane = ControlPlane(settings)
    except GpufleetError as error:
        typer.echo(f"error: {plain(error)}", err=True)
        raise typer.Exit(2) from None

    def ready() -> None:
        gpus = sum(len(node.gpus) for node in plane.inventory.nodes)
        label = " [bold yellow](EMULATED)[/]" if plane.inventory.emulated else ""
        console.print(f"gpufleet control plane at [bold]{settings.url}[/]")
        console.print(f"  dashboard: {settings.url}/   API: {settings.url}/docs")
        console.print(f"  GPUs: {gpus} on {len(plane.inventory.nodes)} node(s), {plane.inventory.source}{label}")
        console.print(f"  data: {settings.data_dir}   store: {settings.db_url or 'SQLite (WAL)'}")
        console.print(f"  policy: {settings.policy}   on exit: {'stop jobs' if stop_jobs else 'keep jobs running'}")
        console.print(f"  adopted {plane.reconciler.adopted} running job(s) from the last start")
        if plane.local_cluster is not None:
            state = markup(str(plane.local_cluster.state_dir / "cluster.json"))
            console.print(
                f"  local Ray cluster: {'reused, ' if plane.local_cluster.reused else ''}token authentication on; "
                f"it keeps running after this process unless it stops with --stop-jobs (its PIDs: {state})"
            )
        report = plane.isolation_report
        console.print(f"  jobs: {report.users}", markup=False)
        console.print(f"  limits: {report.cgroups}", markup=False)
        for note in report.notes:
            console.print(f"[bold yellow]warning:[/] {markup(note)}")
        if plane.opened.reset:
            kept = markup(", ".join(str(path) for path in plane.opened.moved) or "nothing to move")
            console.print(
                f"  [bold yellow]store reset:[/] started with a new store; the old one was moved aside ({kept}); "
                "jobs still running from it are stopped"
            )
        if not is_loopback(host):
            console.print(
                f"[bold red]warning:[/] listening on {host}, reachable from other machines; every call needs a "
                "token, but use TLS in front of it (a reverse proxy) or bind to 127.0.0.1"
            )
        if public_metrics:
            console.print(
                "  [bold yellow]/metrics: public[/] (--public-metrics): job ids, queues and hostnames for every "
                "process that reaches it, jobs on this host included"
            )
        else:
            console.print(
                "  /metrics: needs a bearer token (Prometheus: `authorization: {type: Bearer, credentials_file: …}` "
                "in the scrape config); make one with `gpufleet token create prometheus --role metrics`"
            )
        if plane.admin_token is not None:
            console.print(f"  admin token (shown once, keep it): [bold]{plane.admin_token}[/]")
            saved = _save_client_config(settings.url, plane.admin_token)
            if saved is not None:
                console.print(f"  saved to {saved} for the gpufleet CLI on this machine")
        console.print("Ctrl-C to stop.")

    try:
        plane.serve(on_ready=ready)
    except GpufleetError as error:
        typer.echo(f"error: {plain(error)}", err=True)
        raise typer.Exit(2) from None


def _option(parse: Callable[[str], float | int], value: str, name: str) -> int:
    """An option in people's units (1GiB, 30d), or exit with what was wrong and how to fix it."""
    try:
        return round(parse(value))
    except ValueError as error:
        typer.echo(f"error: {name}: {error}", err=True)
        raise typer.Exit(2) from None


def _root_path(text: str) -> str:
    """`/gpufleet`, `gpufleet/` and `/gpufleet/` all mean the prefix `/gpufleet`; `/` or nothing, none."""
    from gpufleet.server.web.prefix import clean_prefix

    cleaned = clean_prefix(text)
    if cleaned is None:
        typer.echo(
            f"error: --root-path {text!r} is not a URL path; to fix: give a path such as /gpufleet "
            "(letters, digits, '-', '_', '.', '~' between slashes)",
            err=True,
        )
        raise typer.Exit(2)
    return cleaned


def _save_client_config(url: str, token: str) -> Path | None:
    """First start: let the CLI on this machine talk to this control plane without more setup, unless the
    user already has a client config (never overwrite one)."""
    try:
        from gpufleet.client.transport import save_client_config
    except ImportError:
        return None
    return save_client_config(url, token, overwrite=False)
