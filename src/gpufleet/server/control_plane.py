"""`gpufleet up`: the control plane in one process — the HTTP API, the control loop in a thread, the local
executor, and the store — with clean shutdown and re-adoption of running jobs on restart.

The loop is the same `Reconciler` the simulator drives; here its ports are the wall clock, the SQL store
and the local executor. API requests only write submissions and requests to the store and wake the loop.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from gpufleet.adapters.clock import WallClock
from gpufleet.adapters.local.executor import LocalBackend
from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.control.reconciler import Reconciler, StepReport
from gpufleet.control.target import RECENT_JOBS, learned_target
from gpufleet.domain.cluster import Node
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.quotas import DEFAULT_QUEUE, QueueSpec
from gpufleet.domain.throughput_table import table_from_json
from gpufleet.policies.catalog import PolicyData, profile
from gpufleet.ports.admin import JobQuery
from gpufleet.scheduling.fragmentation import TargetWorkload
from gpufleet.server.context import ApiContext

if TYPE_CHECKING:
    from gpufleet.server.gpu_monitor import Telemetry

log = logging.getLogger("gpufleet.up")

LOOPBACK = ("127.0.0.1", "::1", "localhost")


THROUGHPUT_SETTING = "throughput_table"  # stored by `gpufleet throughput import`


@dataclass(frozen=True)
class UpSettings:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8080
    db_url: str | None = None  # default: SQLite (WAL) in the data dir
    emulate: str | None = None  # e.g. "8xA100-80GB": an emulated inventory instead of NVML
    inventory_file: Path | None = None  # a YAML inventory (emulated)
    policy: str = "default"
    stop_jobs_on_exit: bool = False
    exit_grace_s: float = 10.0
    busy_tick_s: float = 0.02  # loop period while jobs are starting or stopping
    idle_tick_s: float = 0.2  # loop period otherwise (API calls wake it at once)
    sample_interval_s: float = 5.0  # GPU telemetry: how often every GPU is sampled
    idle_threshold_pct: float = 5.0  # a held GPU under this utilisation ...
    idle_window_s: float = 1800.0  # ... for this long is flagged reserved-but-idle
    usage_flush_s: float = 60.0  # how often measured GPU usage is added to the store
    min_step_s: float = 0.01  # under a burst of API calls, one step per this long decides them together

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
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
    if settings.emulate:
        from gpufleet.adapters.inventory.emulated_inventory import parse_emulate

        return Inventory(parse_emulate(settings.emulate, hostname), True, f"emulated: {settings.emulate}")
    if settings.inventory_file:
        from gpufleet.adapters.inventory.emulated_inventory import load_inventory_yaml

        path = settings.inventory_file
        return Inventory(load_inventory_yaml(path), True, f"emulated: {path}")
    from gpufleet.adapters.nvml.discovery import discover_nodes

    return Inventory(discover_nodes(hostname), False, "nvml")


def _hostname() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


def _telemetry(
    settings: UpSettings, store: SqlStore, inventory: Inventory, hostname: str, target: TargetWorkload
) -> Telemetry:
    from gpufleet.server.gpu_monitor import Telemetry, TelemetrySettings

    options = TelemetrySettings(
        interval_s=settings.sample_interval_s,
        idle_threshold_pct=settings.idle_threshold_pct,
        idle_window_s=settings.idle_window_s,
        flush_interval_s=settings.usage_flush_s,
    )
    return Telemetry(
        store, inventory.nodes, emulated=inventory.emulated, hostname=hostname, settings=options, target=target
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
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / "gpufleet.lock"
        self._file: IO[str] = open(self.path, "a+")  # noqa: SIM115 - held for the process's life
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
            except Exception:
                # A failing step must not kill the control plane: log it and retry after a pause.
                self.errors += 1
                log.exception("control loop step failed; retrying in 1 s")
                self._halt.wait(1.0)
                continue
            self.steps += 1
            if self.observer is not None:
                try:
                    self.observer(self.reconciler, report, self.reconciler.clock.now())
                except Exception:
                    log.exception("loop observer failed; the loop carries on")
            now = time.monotonic()
            if report.placed or report.preempted or report.stopped or report.observed:
                # Started/exited observations follow launches and stops within moments: look often.
                self._busy_until = now + 2.0
            self._wake.wait(self.busy_tick_s if now < self._busy_until else self.idle_tick_s)


class ControlPlane:
    """Everything `gpufleet up` runs, built from settings; `serve()` runs until SIGINT/SIGTERM."""

    def __init__(self, settings: UpSettings, *, inventory: Inventory | None = None) -> None:
        from gpufleet.server.auth import bootstrap_admin

        self.settings = settings
        self.lock = DataDirLock(settings.data_dir)
        try:
            self.inventory = inventory or discover_inventory(settings)
            self.clock = WallClock()
            self.store = SqlStore.open(settings.db_url or default_sqlite_url(settings.data_dir))
            self.store.set_nodes(self.inventory.nodes)
            if not self.store.queues():
                self.store.set_queue(QueueSpec(DEFAULT_QUEUE))
            self.store.set_setting("inventory", self.inventory.source)
            self.admin_token = bootstrap_admin(self.store, self.clock)
            self.backend = LocalBackend(
                settings.data_dir / "jobs", self.inventory.nodes, self.clock, emulated=self.inventory.emulated
            )
            recent = [record.job for record in self.store.jobs(JobQuery(limit=RECENT_JOBS))]
            self.fgd_target = learned_target(recent)
            log.info("FGD target workload: %s", self.fgd_target.source)
            stored = self.store.get_setting(THROUGHPUT_SETTING)
            throughput = table_from_json(stored) if stored else None
            if throughput is not None:
                log.info("throughput table: %d entries from %s", len(throughput.entries), throughput.source)
            policy = profile(settings.policy, PolicyData(target=self.fgd_target.target, throughput=throughput))
            self.reconciler = Reconciler(self.store, self.backend, self.clock, policy)
            self.telemetry = _telemetry(
                settings, self.store, self.inventory, hostname=_hostname(), target=self.fgd_target.target
            )
            self.loop = LoopThread(
                self.reconciler,
                settings.busy_tick_s,
                settings.idle_tick_s,
                settings.min_step_s,
                observer=self.telemetry.observer.after_step,
            )
            self.telemetry.wake = self.loop.wake
            self.context = ApiContext(
                store=self.store,
                clock=self.clock,
                log_paths=self.backend.log_paths,
                wake=self.loop.wake,
                emulated=self.inventory.emulated,
                inventory_source=self.inventory.source,
                policy=settings.policy,
                metrics=self.telemetry.metrics,
                extra={"telemetry": self.telemetry},
            )
        except BaseException:
            self.lock.release()
            raise

    def serve(self, on_ready: Callable[[], None] | None = None) -> None:
        import uvicorn

        from gpufleet.server.http_app import create_app

        check_listen(self.settings.host, self.settings.port)
        app = create_app(self.context)
        config = uvicorn.Config(app, host=self.settings.host, port=self.settings.port, log_level="warning")
        server = uvicorn.Server(config)
        # Uvicorn re-raises the signal that stopped it once it is done; with the default handlers that
        # would kill the process before the executor is shut down. Ours only note it.
        stopped_by: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signo, _frame: stopped_by.append(signo))
        self.loop.start()
        self.telemetry.start()
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
        try:
            if self.settings.stop_jobs_on_exit:
                self._stop_jobs()
            self.backend.shutdown(stop_jobs=self.settings.stop_jobs_on_exit, grace_s=self.settings.exit_grace_s)
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
