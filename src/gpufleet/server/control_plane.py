"""`gpufleet up`: the control plane in one process — the HTTP API, the control loop in a thread, the
executor, and the store — with clean shutdown and re-adoption of running jobs on restart.

The loop is the same `Reconciler` the simulator drives; here its ports are the wall clock, the SQL store
and an executor: the local one, or with `--ray` the Ray backend and its node inventory (`adapters/ray`),
the only difference between one machine and many. API requests only write submissions and requests to the
store and wake the loop.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

from gpufleet.adapters.clock import WallClock
from gpufleet.adapters.local.executor import LocalBackend
from gpufleet.adapters.local.isolation import DEFAULT_LOG_CAP, DEFAULT_PIDS_LIMIT, Isolation, IsolationReport
from gpufleet.adapters.local.logs import DAY_S, LogRetention, read_log_file
from gpufleet.adapters.local.users import DEFAULT_JOBS_HOME, RunAs
from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.adapters.storage.sql_engine import StoreFullError
from gpufleet.control.reconciler import Reconciler, ReconcilerSettings, StepReport
from gpufleet.control.target import RECENT_JOBS, learned_target
from gpufleet.control.throughput_learner import LEARN_EVERY_S
from gpufleet.domain.cluster import Node
from gpufleet.domain.errors import FieldProblem, GpufleetError, SpecError
from gpufleet.domain.jobs import Job
from gpufleet.domain.quotas import DEFAULT_QUEUE, QueueSpec
from gpufleet.domain.throughput_table import table_from_json
from gpufleet.policies.catalog import PolicyData, profile
from gpufleet.ports.admin import JobQuery
from gpufleet.ports.gpu_probe import GpuActivity, GpuProbe
from gpufleet.scheduling.fragmentation import TargetWorkload
from gpufleet.server.chargeback import BudgetWatch
from gpufleet.server.context import ApiContext
from gpufleet.server.job_tokens import JobTokens
from gpufleet.server.limits import DEFAULT_MAX_GRACE_S
from gpufleet.server.ratelimit import ADMIN_RATE, TEAM_RATE, Rate
from gpufleet.server.spot_watch import SpotWatch
from gpufleet.server.store_guard import open_store

if TYPE_CHECKING:
    from gpufleet.adapters.kubernetes.kube_backend import KubernetesBackend
    from gpufleet.adapters.kubernetes.kube_fleet import KubeFleet
    from gpufleet.adapters.ray.backend import RayBackend
    from gpufleet.adapters.ray.local_cluster import LocalRayCluster
    from gpufleet.adapters.ray.ray_inventory import RayFleet
    from gpufleet.server.gpu_monitor import ProbeFactory, Telemetry

log = logging.getLogger("gpufleet.up")

LOOPBACK = ("127.0.0.1", "::1", "localhost")


THROUGHPUT_SETTING = "throughput_table"  # stored by `gpufleet throughput import`


def is_loopback(host: str) -> bool:
    """Whether an address to listen on is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class UpSettings:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8080
    db_url: str | None = None  # default: SQLite (WAL) in the data dir
    emulate: str | None = None  # e.g. "8xA100-80GB": an emulated inventory instead of NVML
    inventory_file: Path | None = None  # a YAML inventory (emulated)
    policy: str = "default"
    max_grace_s: float = DEFAULT_MAX_GRACE_S  # the longest grace_period, in queues without their own maximum
    team_rate: Rate = TEAM_RATE  # requests per team (and metrics) token: per second, burst
    admin_rate: Rate = ADMIN_RATE
    public_metrics: bool = False  # serve /metrics without a token (any local process, a job too, reads it)
    reset_store: bool = False  # start over: move a damaged or foreign store aside (see store_guard.py)
    stop_jobs_on_exit: bool = False
    exit_grace_s: float = 10.0
    busy_tick_s: float = 0.02  # loop period while jobs are starting or stopping
    idle_tick_s: float = 0.2  # loop period otherwise (API calls wake it at once)
    sample_interval_s: float = 5.0  # GPU telemetry: how often every GPU is sampled
    idle_threshold_pct: float = 5.0  # a held GPU under this utilisation ...
    idle_window_s: float = 1800.0  # ... for this long is flagged reserved-but-idle
    usage_flush_s: float = 60.0  # how often measured GPU usage is added to the store
    budget_check_s: float = 60.0  # how often queues' spend is measured against their budgets
    spot_check_s: float = 5.0  # how often spot pools' losses are counted and their breakers stepped
    min_step_s: float = 0.01  # under a burst of API calls, one step per this long decides them together
    root_path: str = ""  # the path prefix a reverse proxy serves us under, e.g. /gpufleet
    # How jobs are isolated (see adapters/local/isolation.py).
    single_user: bool = False  # a control plane that is not root accepts team tokens all the same
    jobs_home: Path = DEFAULT_JOBS_HOME  # homes of the per-queue users
    use_cgroups: bool = True
    private_tmp: bool = True  # each attempt its own /tmp and /dev/shm, and a /proc without others' processes
    pids_limit: int = DEFAULT_PIDS_LIMIT
    # Kept from all jobs together for the system and the control plane (None: max(2GiB, 10%) of the memory,
    # max(1024, 10%) of the process ids), and the disk quota of a queue that sets none (0: no quota).
    memory_reserve: int | None = None
    pids_reserve: int | None = None
    queue_disk: int = 0
    # Job logs: where, how big per worker, and how long finished jobs' logs are kept.
    log_dir: Path | None = None  # default: under the data dir
    log_cap: int = DEFAULT_LOG_CAP
    log_max_age_s: float | None = 30 * DAY_S
    log_max_total: int | None = None
    log_prune_interval_s: float = 600.0
    # Many machines: "local" (a Ray cluster of the inventory's emulated nodes on this machine), "auto" (the
    # cluster this machine belongs to) or HOST:PORT; None: the local executor.
    ray: str | None = None
    agent_dir: Path | None = None  # where node agents keep their files on each node; default: <data_dir>/nodes
    ray_wait_nodes: int = 0  # at start, wait for this many GPU nodes to be up (at most ray_wait_s)
    ray_wait_s: float = 60.0
    ray_token_file: Path | None = None  # the Ray cluster's token (default: RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)
    ray_insecure: bool = False  # join a Ray cluster that runs without authentication
    ray_dashboard: bool = False  # --ray local: also run Ray's dashboard
    # Be the GPU scheduler of a Kubernetes cluster: a kubeconfig's path, or "in-cluster" (the pod's service account).
    kubernetes: str | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def job_reachable_url(self) -> str:
        """The API as jobs on this machine reach it (a wildcard address is reached on loopback)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[Node, ...]
    emulated: bool
    source: str  # "nvml", "emulated: 8xA100-80GB", "emulated: path.yaml"


def discover_inventory(settings: UpSettings) -> Inventory:
    """The GPUs this control plane schedules: NVML's, or an emulated inventory the user asked for."""
    hostname = _hostname()
    if settings.emulate and settings.inventory_file:
        raise GpufleetError("both --emulate and --inventory were given", "give one of them")
    if settings.ray is not None and not (settings.emulate or settings.inventory_file):
        return Inventory((), False, "ray")
    if settings.kubernetes is not None:
        if settings.ray is not None or settings.emulate or settings.inventory_file:
            raise GpufleetError(
                "--kubernetes schedules the nodes of a Kubernetes cluster and takes no other inventory",
                "leave out --ray, --emulate and --inventory",
            )
        return Inventory((), False, "kubernetes")
    if settings.emulate:
        from gpufleet.adapters.inventory.emulated_inventory import parse_emulate

        return Inventory(parse_emulate(settings.emulate, hostname), True, f"emulated: {settings.emulate}")
    if settings.inventory_file:
        from gpufleet.adapters.inventory.emulated_inventory import load_inventory_yaml

        path = settings.inventory_file
        return Inventory(load_inventory_yaml(path), True, f"emulated: {path}")
    from gpufleet.adapters.nvml.discovery import discover_nodes

    return Inventory(discover_nodes(hostname), False, "nvml")


def _os_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def _hostname() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


def _telemetry(
    settings: UpSettings,
    store: SqlStore,
    inventory: Inventory,
    hostname: str,
    target: TargetWorkload,
    make_probe: ProbeFactory | None = None,
) -> Telemetry:
    from gpufleet.server.gpu_monitor import Telemetry, TelemetrySettings

    options = TelemetrySettings(
        interval_s=settings.sample_interval_s,
        idle_threshold_pct=settings.idle_threshold_pct,
        idle_window_s=settings.idle_window_s,
        flush_interval_s=settings.usage_flush_s,
    )
    return Telemetry(
        store,
        inventory.nodes,
        emulated=inventory.emulated,
        hostname=hostname,
        settings=options,
        target=target,
        make_probe=make_probe,
    )


def check_listen(host: str, port: int) -> None:
    """Refuse early, in words, an address this process cannot listen on (uvicorn would only log and exit)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise GpufleetError(
            f"cannot listen on {host!r}: {error.strerror}", "give an IP address such as 127.0.0.1"
        ) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            raise GpufleetError(
                f"cannot listen on {host}:{port}: {error.strerror}",
                "pick a free port with --port (ports below 1024 need root)",
            ) from None


class DataDirLock:
    """One control plane per data directory: a second `gpufleet up` on it is refused, not run twice."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "gpufleet.lock"
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            self._file: IO[str] = open(self.path, "a+")  # noqa: SIM115 - held for the process's life
        except OSError as error:
            raise GpufleetError(
                f"cannot use the data folder {data_dir}: {error.strerror} ({error.filename})",
                "give a --data-dir this user may write to",
            ) from None
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            raise GpufleetError(
                f"another gpufleet control plane is running on {data_dir}",
                "stop it first, or give this one its own --data-dir",
            ) from None
        self._file.truncate(0)
        self._file.write(f"{os.getpid()}\n")
        self._file.flush()

    def release(self) -> None:
        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()


def make_private(data_dir: Path) -> None:
    """The data dir is the control plane's alone (0700), and so are its store and lock files (0600): they
    hold every job's environment and the tokens' hashes."""
    try:
        data_dir.chmod(0o700)
        for path in data_dir.glob("state.db*"):
            path.chmod(0o600)
        (data_dir / "gpufleet.lock").chmod(0o600)
    except PermissionError as error:
        raise GpufleetError(
            f"cannot make {error.filename} private to the control plane: {error.strerror}",
            "run gpufleet up as the owner of its data folder, or give a --data-dir of your own",
        ) from None


def disk_full_words(error: BaseException) -> str | None:
    """The words "disk full at …" when `error` is the disk filling up (the store's or the executor's)."""
    if isinstance(error, StoreFullError):
        return error.message
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full at {error.filename or 'the data folder'}"
    return None


class LoopThread(threading.Thread):
    """Runs `Reconciler.step()` until stopped: fast while jobs start or stop, slower when idle, and at
    once when woken (a submit, a cancel, a quota change)."""

    def __init__(
        self,
        reconciler: Reconciler,
        busy_tick_s: float,
        idle_tick_s: float,
        min_step_s: float = 0.01,
        observer: Callable[[Reconciler, StepReport, float], None] | None = None,
    ) -> None:
        super().__init__(name="gpufleet-loop", daemon=True)
        self.observer = observer  # told after every step, in this thread (telemetry reads the loop's state)
        self.reconciler = reconciler
        self.busy_tick_s = busy_tick_s
        self.idle_tick_s = idle_tick_s
        self.min_step_s = min_step_s
        self._wake = threading.Event()
        self._halt = threading.Event()
        self.steps = 0
        self.errors = 0
        self._busy_until = 0.0
        self._failing: str | None = None  # the failure the loop is retrying, said once
        self._errors_before = 0

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._halt.set()
        self._wake.set()

    def run(self) -> None:
        last = 0.0
        while not self._halt.is_set():
            since = time.monotonic() - last
            if since < self.min_step_s:
                self._halt.wait(self.min_step_s - since)
            last = time.monotonic()
            self._wake.clear()
            try:
                report = self.reconciler.step()
            except Exception as error:
                # A failing step must not kill the control plane: say so once and retry every second. What
                # the step observed is kept by the reconciler and written when the store takes it again.
                self.errors += 1
                self._say_failure(error)
                self._halt.wait(1.0)
                continue
            if self._failing is not None:
                log.warning("control loop: working again after %d failed step(s)", self.errors - self._errors_before)
                self._failing = None
            self.steps += 1
            if self.observer is not None:
                try:
                    self.observer(self.reconciler, report, self.reconciler.clock.now())
                except Exception:
                    log.exception("loop observer failed; the loop carries on")
            now = time.monotonic()
            if report.placed or report.preempted or report.migrated or report.stopped or report.observed:
                # Started/exited observations follow launches and stops within moments: look often.
                self._busy_until = now + 2.0
            self._wake.wait(self.busy_tick_s if now < self._busy_until else self.idle_tick_s)

    def _say_failure(self, error: Exception) -> None:
        full = disk_full_words(error)
        what = full or f"{type(error).__name__}: {error}"
        if what == self._failing:
            return
        if self._failing is None:
            self._errors_before = self.errors - 1
        self._failing = what
        if full is not None:
            log.error(
                "%s; the control loop retries every second, keeps every exit it observed and writes it once "
                "space is freed; the API answers 503 to writes meanwhile",
                error if isinstance(error, StoreFullError) else full,
            )
        else:
            log.exception("control loop step failed; retrying every second")


class LogPruner(Protocol):
    """What the janitor needs of an executor: the local one prunes this machine's logs, the Ray one each
    node's through its agent."""

    def prune_logs(self, retention: LogRetention, finished: Callable[[str], bool]) -> dict[str, int]: ...


class LogJanitor(threading.Thread):
    """Deletes finished jobs' logs past their retention, at start and then every `interval_s`."""

    def __init__(self, backend: LogPruner, store: SqlStore, retention: LogRetention, interval_s: float) -> None:
        super().__init__(name="gpufleet-logs", daemon=True)
        self.backend = backend
        self.store = store
        self.retention = retention
        self.interval_s = interval_s
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while True:
            self.prune()
            if self._halt.wait(self.interval_s):
                return

    def prune(self) -> dict[str, int]:
        def finished(job_id: str) -> bool:
            record = self.store.get(job_id)
            return record is None or record.state.terminal

        try:
            done = self.backend.prune_logs(self.retention, finished)
        except Exception as error:  # the store may be down: the next round tries again
            log.warning("log retention: %s; trying again in %.0f s", error, self.interval_s)
            return {"jobs": 0, "bytes": 0}
        if done["jobs"]:
            log.info("log retention: removed the logs of %d finished job(s), %d bytes", done["jobs"], done["bytes"])
        return done


class ControlPlane:
    """Everything `gpufleet up` runs, built from settings; `serve()` runs until SIGINT/SIGTERM."""

    def __init__(self, settings: UpSettings, *, inventory: Inventory | None = None) -> None:
        from gpufleet.server.auth import bootstrap_admin

        self.settings = settings
        if settings.single_user and os.geteuid() == 0:
            raise GpufleetError(
                "--single-user would run every job as root",
                "leave it out: as root, gpufleet runs each queue's jobs as an unprivileged user of their own",
            )
        self.fleet: RayFleet | None = None  # with --ray: the cluster's nodes and agents
        self.local_cluster: LocalRayCluster | None = None  # with --ray local: the cluster this process started
        self.kube: KubeFleet | None = None  # with --kubernetes: the cluster's nodes and pods
        self.lock = DataDirLock(settings.data_dir)
        try:
            make_private(settings.data_dir)
            self.inventory = inventory or discover_inventory(settings)
            self.clock = WallClock()
            self.opened = open_store(
                settings.data_dir,
                settings.db_url or default_sqlite_url(settings.data_dir),
                reset=settings.reset_store,
                actor=f"local:{_os_user()}",
            )
            self.store = self.opened.store
            make_private(settings.data_dir)  # the store's files, just created
            if settings.ray is not None:
                self.inventory = self._join_ray(settings, self.inventory)
            if settings.kubernetes is not None:
                self.inventory = self._join_kubernetes(settings.kubernetes)
            self.store.set_nodes(self.inventory.nodes)
            if not self.store.queues():
                self.store.set_queue(QueueSpec(DEFAULT_QUEUE))
            self.store.set_setting("inventory", self.inventory.source)
            self.admin_token = bootstrap_admin(self.store, self.clock)
            self.isolation = Isolation.detect(
                settings.data_dir / "jobs",
                jobs_home=settings.jobs_home,
                data_dir=settings.data_dir,
                use_cgroups=settings.use_cgroups,
                pids_limit=settings.pids_limit,
                log_cap=settings.log_cap,
                memory_reserve=settings.memory_reserve,
                pids_reserve=settings.pids_reserve,
                queue_disk=settings.queue_disk,
                sandbox=settings.private_tmp,
            )
            if settings.ray is None and settings.kubernetes is None:
                # Queues with jobs of this store not finished (adopted, or to start): their users' homes move
                # to --jobs-home now, or `up` says why not. Other queues' users move at their next job.
                busy = {record.job.queue for record in self.store.active()}
                self.isolation.settle_homes([(q.name, q.run_as) for q in self.store.queues() if q.name in busy])
            self.backend: LocalBackend | RayBackend | KubernetesBackend
            make_probe: ProbeFactory | None = None
            # Every worker's report URL and job-scoped token, on whichever executor runs it.
            job_tokens = JobTokens(self.store)
            report_base = settings.job_reachable_url

            def job_env(job_id: str, attempt: int) -> Mapping[str, str]:
                return job_tokens.env(report_base, job_id, attempt)

            if self.kube is not None:
                from gpufleet.adapters.kubernetes.kube_backend import KubernetesBackend
                from gpufleet.adapters.probes.absent import AbsentProbe

                self.backend = KubernetesBackend(self.kube.api, self.kube, self.clock)
                self.isolation_report: IsolationReport = _kubelet_isolation()

                def make_probe(
                    activity: Callable[[], Mapping[tuple[str, int], GpuActivity]],
                    weights: Callable[[], Mapping[int, int]],
                ) -> GpuProbe:
                    return AbsentProbe()
            elif self.fleet is not None:
                from gpufleet.adapters.ray.agent_probe import RayProbe
                from gpufleet.adapters.ray.backend import RayBackend

                fleet = self.fleet
                self.backend = RayBackend(fleet, self.clock, job_env=job_env)
                fleet.backend = self.backend
                self.isolation_report = fleet.isolation_report() or self.isolation.report(settings.single_user)

                def make_probe(
                    activity: Callable[[], Mapping[tuple[str, int], GpuActivity]],
                    weights: Callable[[], Mapping[int, int]],
                ) -> GpuProbe:
                    return RayProbe(fleet, activity, weights)
            else:
                self.backend = LocalBackend(
                    settings.data_dir / "jobs",
                    self.inventory.nodes,
                    self.clock,
                    emulated=self.inventory.emulated,
                    isolation=self.isolation,
                    log_dir=settings.log_dir,
                    job_env=job_env,
                )
                self.isolation_report = self.backend.isolation_report(single_user_allowed=settings.single_user)
            self.log_janitor = LogJanitor(
                self.backend,
                self.store,
                LogRetention(settings.log_max_age_s, settings.log_max_total),
                settings.log_prune_interval_s,
            )
            refused = None
            if not self.isolation.switches_users and not settings.single_user and self.kube is None:
                refused = (
                    f"this control plane runs every job as its own user {RunAs.me().name} (it is not root), so a "
                    "team's job could read every other team's jobs and logs and the admin token"
                )
            recent = [record.job for record in self.store.jobs(JobQuery(limit=RECENT_JOBS))]
            self.fgd_target = learned_target(recent)
            log.info("FGD target workload: %s", self.fgd_target.source)
            stored = self.store.get_setting(THROUGHPUT_SETTING)
            throughput = table_from_json(stored) if stored else None
            if throughput is not None:
                log.info("throughput table: %d entries from %s", len(throughput.entries), throughput.source)
            policy = profile(settings.policy, PolicyData(target=self.fgd_target.target, throughput=throughput))
            loop_settings = ReconcilerSettings(
                max_grace_s=settings.max_grace_s, learn_throughput_s=LEARN_EVERY_S, freeze_long_lived=True
            )
            self.reconciler = Reconciler(
                self.store,
                self.backend,
                self.clock,
                policy,
                settings=loop_settings,
                # The spot watch is made below (it wakes the loop), before the loop first runs.
                observed_pools=lambda: self.spot.observed(),  # noqa: PLW0108
                throughput=throughput,
            )
            self.telemetry = _telemetry(
                settings,
                self.store,
                self.inventory,
                hostname=_hostname(),
                target=self.fgd_target.target,
                make_probe=make_probe,
            )
            self.loop = LoopThread(
                self.reconciler,
                settings.busy_tick_s,
                settings.idle_tick_s,
                settings.min_step_s,
                observer=self._after_step,
            )
            self.telemetry.wake = self.loop.wake
            if self.fleet is not None:
                self.fleet.on_nodes = self._nodes_changed
                self.fleet.wake = self.loop.wake
            if self.kube is not None:
                self.kube.on_nodes = self._nodes_changed
                self.kube.wake = self.loop.wake
            self.budgets = BudgetWatch(
                self.store, self.clock, book=lambda: self.telemetry.book, interval_s=settings.budget_check_s
            )
            self.telemetry.budget_statuses = self.budgets.statuses
            self.spot = SpotWatch(self.store, self.clock, interval_s=settings.spot_check_s, wake=self.loop.wake)
            self.telemetry.spot_pools = self.spot.pools
            self.context = ApiContext(
                store=self.store,
                clock=self.clock,
                log_paths=self.backend.log_paths,
                read_log=self.backend.read_log if self.fleet is not None or self.kube is not None else read_log_file,
                emulated_node=self.fleet.is_emulated if self.fleet is not None else None,
                wake=self.loop.wake,
                emulated=self.inventory.emulated,
                inventory_source=self.inventory.source,
                policy=settings.policy,
                metrics=self.telemetry.metrics,
                metrics_need_token=not settings.public_metrics,
                scratch_dir=settings.data_dir,
                max_grace_s=settings.max_grace_s,
                team_rate=settings.team_rate,
                admin_rate=settings.admin_rate,
                data_dir=settings.data_dir,
                extra=self._api_extras(),
                budgets=self.budgets,
                spot=self.spot,
                isolation=self.isolation_report,
                team_tokens_refused=refused,
                check_run_as=self.isolation.check_run_as,
                check_job=_needs_image if self.kube is not None else _no_image,
                check_queue_disk=(
                    self.isolation.check_queue_disk if self.fleet is None and self.kube is None else _no_disk_check
                ),
            )
            for line in (self.isolation_report.users, self.isolation_report.cgroups, *self.isolation_report.notes):
                log.info("isolation: %s", line)
        except BaseException:
            self._leave_ray()
            self.lock.release()
            raise

    def _join_ray(self, settings: UpSettings, emulated: Inventory) -> Inventory:
        """Connect to the Ray cluster (starting a local one for `--ray local`), find or start every node's
        agent, and return the nodes up now plus the store's others, marked down."""
        from gpufleet.adapters.ray.agent import AgentOptions
        from gpufleet.adapters.ray.ray_inventory import RayFleet

        address = settings.ray or "auto"
        if address == "local":
            if not emulated.nodes:
                raise GpufleetError(
                    "--ray local runs a Ray cluster of emulated GPU nodes and needs their inventory",
                    "add --inventory fleet.yaml (or --emulate 8xA100-80GB for one node)",
                )
            from gpufleet.adapters.ray.local_cluster import LocalRayCluster

            # The cluster outlives this process (a kill -9 included): the next start on the same data reuses it
            # and adopts the jobs on it.
            state_dir = settings.data_dir / "ray-local"
            self.local_cluster = LocalRayCluster.reuse(state_dir, emulated.nodes)
            if self.local_cluster is None:
                dashboard = settings.ray_dashboard
                self.local_cluster = LocalRayCluster(emulated.nodes, state_dir=state_dir, dashboard=dashboard)
            address = self.local_cluster.address
        options = AgentOptions(
            root=str((settings.agent_dir or settings.data_dir / "nodes").absolute()),
            jobs_home=str(settings.jobs_home),
            use_cgroups=settings.use_cgroups,
            pids_limit=settings.pids_limit,
            log_cap=settings.log_cap,
            memory_reserve=settings.memory_reserve,
            pids_reserve=settings.pids_reserve,
            queue_disk=settings.queue_disk,
            private_tmp=settings.private_tmp,
            engine_ports=tuple(self.local_cluster.engine_ports()) if self.local_cluster is not None else (),
        )
        token_file = self.local_cluster.token_path if self.local_cluster is not None else settings.ray_token_file
        self.fleet = RayFleet(
            address, options, emulated=emulated.nodes, token_file=token_file, insecure=settings.ray_insecure
        )
        wait_for = settings.ray_wait_nodes or len(emulated.nodes)
        nodes = self.fleet.first_scan(self.store.nodes(), wait_for=wait_for, timeout_s=settings.ray_wait_s)
        where = f"Ray cluster at {settings.ray}"
        if self.local_cluster is not None:
            where = "local Ray cluster" + (" (still running, reused)" if self.local_cluster.reused else "")
        up = sum(1 for n in nodes if n.healthy)
        source = f"{where}: {up} node(s) up" + (f", {emulated.source}" if emulated.nodes else "")
        return Inventory(nodes, self.fleet.all_emulated(), source)

    def _join_kubernetes(self, where: str) -> Inventory:
        """List the cluster's nodes and pods (the watches go on), and say what was found."""
        from gpufleet.adapters.kubernetes.kube_api import KubeApi
        from gpufleet.adapters.kubernetes.kube_fleet import KubeFleet

        api = KubeApi(None if where == "in-cluster" else Path(where).expanduser())
        self.kube = KubeFleet(api, self.store, self.clock)
        nodes = self.kube.start()
        found = self.kube.found_at_start
        log.info(
            "kubernetes: found %d node(s) and %d pod(s) for gpufleet (%d bound, %d pending) at %s",
            found["nodes"],
            found["pods"],
            found["bound"],
            found["pending"],
            api.server,
        )
        return Inventory(nodes, False, f"Kubernetes API server at {api.server}: {len(nodes)} node(s)")

    def _after_step(self, reconciler: Reconciler, report: StepReport, now: float) -> None:
        """After every loop step: telemetry, and the spot breakers at once when a half-open pool may just have
        taken its probe job, so that its gate shuts before the next cycle rather than at the next spot check."""
        self.telemetry.observer.after_step(reconciler, report, now)
        if report.placed and self.spot.awaits_probe():  # the loop starts in `serve`, after `spot` is made
            self.spot.check()

    def _api_extras(self) -> dict[str, object]:
        """What the API reaches beyond its context: the telemetry, and a Ray fleet's own node list (which a
        removed node must leave too, or the next change of the cluster writes it back)."""
        extras: dict[str, object] = {"telemetry": self.telemetry}
        if self.fleet is not None:
            extras["forget_node"] = self.fleet.forget
        return extras

    def _nodes_changed(self, nodes: tuple[Node, ...]) -> None:
        """A node joined or left the Ray cluster: the store (the loop reads it), telemetry's GPU list."""
        self.store.set_nodes(nodes)
        self.telemetry.nodes = nodes

    def _leave_ray(self, stop_cluster: bool | None = None) -> None:
        """Disconnect, and stop a `--ray local` cluster if `stop_cluster` (default: only one this start made:
        one found running may hold jobs of the store). Jobs left running stay on it: the next start on the same
        data reuses it and adopts them."""
        if self.fleet is not None:
            self.fleet.close()
        if self.kube is not None:
            self.kube.close()
        cluster = self.local_cluster
        if cluster is not None and (not cluster.reused if stop_cluster is None else stop_cluster):
            cluster.shutdown()

    def serve(self, on_ready: Callable[[], None] | None = None) -> None:
        import uvicorn

        from gpufleet.server.http_app import create_app

        check_listen(self.settings.host, self.settings.port)
        app = create_app(self.context)
        config = uvicorn.Config(
            app,
            host=self.settings.host,
            port=self.settings.port,
            log_level="warning",
            root_path=self.settings.root_path,
        )
        server = uvicorn.Server(config)
        # Uvicorn re-raises the signal that stopped it once it is done; with the default handlers that
        # would kill the process before the executor is shut down. Ours only note it.
        stopped_by: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signo, _frame: stopped_by.append(signo))
        self.loop.start()
        self.telemetry.start()
        self.log_janitor.start()
        self.budgets.start()
        self.spot.start()
        if self.fleet is not None:
            self.fleet.start()
        if self.kube is not None:
            self.kube.run()
        try:
            if on_ready is not None:
                _call_when_started(server, on_ready)
            server.run()
            if not server.started:
                raise GpufleetError(
                    f"could not listen on {self.settings.url}",
                    "is another program using that port? pick another with --port",
                )
        finally:
            self.close()

    def close(self) -> None:
        """Stop the loop; then either leave the jobs running (the next start adopts them) or stop them,
        recording each as back in its queue."""
        self.loop.stop()
        if self.loop.is_alive():
            self.loop.join(timeout=10)
        self.telemetry.stop()
        self.log_janitor.stop()
        self.budgets.stop()
        self.spot.stop()
        try:
            if self.settings.stop_jobs_on_exit:
                self._stop_jobs()
            self.backend.shutdown(stop_jobs=self.settings.stop_jobs_on_exit, grace_s=self.settings.exit_grace_s)
            self.isolation.cgroups.release()  # only if no job is left running in them
        finally:
            try:
                self._leave_ray(stop_cluster=self.settings.stop_jobs_on_exit)
            finally:
                self.store.close()
                self.lock.release()

    def _stop_jobs(self) -> None:
        from gpufleet.domain.lifecycle import JobState

        self.reconciler.stop_everything("the control plane stopped with --stop-jobs")
        deadline = time.monotonic() + self.settings.exit_grace_s + 5.0
        while time.monotonic() < deadline:
            self.reconciler.observe()
            if not any(r.state is JobState.EVICTING for r in self.store.active()):
                return
            time.sleep(0.05)


def _call_when_started(server: object, callback: Callable[[], None]) -> None:
    def watch() -> None:
        import time

        while not getattr(server, "started", False) and not getattr(server, "should_exit", False):
            time.sleep(0.01)
        if getattr(server, "started", False):
            callback()

    threading.Thread(target=watch, name="gpufleet-ready", daemon=True).start()


def _needs_image(job: Job) -> None:
    if job.run is not None and not job.run.image:
        raise SpecError(
            "job spec",
            (FieldProblem("image", "is missing", "on Kubernetes every job runs in an image: give `image: REF`"),),
        )


def _no_image(job: Job) -> None:
    if job.run is not None and job.run.image:
        raise SpecError(
            "job spec",
            (
                FieldProblem(
                    "image",
                    f"is {job.run.image!r}, but this control plane runs jobs as processes on its nodes",
                    "leave `image` out (the job runs on the node's own system), or submit to a control plane "
                    "started with --kubernetes",
                ),
            ),
        )


def _kubelet_isolation() -> IsolationReport:
    return IsolationReport(
        users="each job runs as its pods say (securityContext), on the kubelet of its node",
        cgroups="the kubelet's: each pod's requests and limits, GPUs through the NVIDIA device plugin",
        single_trust_domain=False,
    )


def _no_disk_check(_queue: str, _user: str | None, _size: int | None) -> None:
    """On a Ray cluster each node's agent applies a queue's disk quota when its next job starts there."""
