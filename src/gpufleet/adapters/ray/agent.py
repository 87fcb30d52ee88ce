"""The node agent: one per node of a Ray cluster, a detached named actor pinned to its node.

It is the local executor's per-node half run remotely: workers start and are watched by the very
`WorkerSupervisor` the local executor uses (`adapters/local/supervisor.py`), isolated by the same
`Isolation` (own OS user per queue when root, clean environment, cgroup with limits and the GPU device
lock, whole-cgroup kill). Job-level rules (gangs, stop deadlines, observations for the loop) stay in the
control plane's `RayBackend`; the agent only runs what it is told on its node, and keeps no state that its
files do not also hold, so a new agent on the node (after its actor died) finds every worker again.

Beyond workers, the agent checks that a MASTER_PORT is free on its node (`PortLeases`), serves log reads
(offset and length, so `gpufleet logs -f` follows a worker on any node) and samples its node's GPUs (NVML
on real GPUs, the emulated probe on emulated nodes).

This module does not import Ray: `RayBackend` makes it an actor. A watcher thread refreshes the workers
every `watch_s` (started? ended?), sends the stop signal to commands that started after a stop and kills
them at the deadline, so a stop holds even while the control plane is down.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.adapters.local.firewall import EngineFirewall
from gpufleet.adapters.local.isolation import Isolation, IsolationReport, WorkerSpec
from gpufleet.adapters.local.layout import job_id_of, safe_name
from gpufleet.adapters.local.logs import LogRetention, read_log_file, run_records
from gpufleet.adapters.local.proc import read_json
from gpufleet.adapters.local.supervisor import Worker, WorkerSupervisor
from gpufleet.domain.cluster import Node
from gpufleet.domain.errors import GpufleetError
from gpufleet.ports.gpu_probe import GpuActivity, GpuSample

log = logging.getLogger(__name__)

ORPHAN_DETAIL = "killed by its node's agent: the control plane no longer runs it here"
DEFAULT_PORT_RANGE = (29500, 30499)
# (job id, attempt, rank, command started at (wall), command pid, exit record or None, resizes of the attempt
# before this worker started)
WorkerState = tuple[str, int, int, float | None, int | None, dict[str, Any] | None, int]


@dataclass(frozen=True)
class AgentOptions:
    """How an agent isolates workers and where it keeps its files; the same for every node."""

    root: str  # every agent keeps its files in `root/<node name>` (the node's own disk)
    jobs_home: str = "/var/lib/gpufleet-jobs"
    use_cgroups: bool = True
    pids_limit: int = 8192
    log_cap: int = 1 << 30
    memory_reserve: int | None = None  # None: the node's default (see host_limits.py)
    pids_reserve: int | None = None
    queue_disk: int = 0  # the disk quota of a queue that sets none (0: none)
    private_tmp: bool = True  # each attempt its own /tmp and /dev/shm, and a /proc without others' processes
    port_range: tuple[int, int] = DEFAULT_PORT_RANGE
    watch_s: float = 0.05
    # The engine's ports no job may connect to (the control plane adds what Ray reports of its nodes).
    engine_ports: tuple[tuple[int, int], ...] = ()
    firewall: bool = True  # shut job users out of `engine_ports` (as root; `adapters/local/firewall.py`)


@dataclass
class _Attempt:
    job_id: str
    attempt: int
    workers: dict[int, Worker] = field(default_factory=dict)
    port: int | None = None
    stop_signal: int | None = None
    kill_at: float | None = None  # time.monotonic() after which the workers get SIGKILL
    lost: bool = False
    resize_count: int = 0  # the workers are those started after this many resizes of the attempt


class PortLeases:
    """MASTER_PORTs handed out on this machine: a lease file per port in a folder every agent of the machine
    shares (several emulated nodes on one machine share its ports), and a bind test on the node's address."""

    def __init__(self, folder: Path, low: int, high: int, host: str) -> None:
        self.folder = folder
        self.low, self.high, self.host = low, high, host
        self.folder.mkdir(parents=True, exist_ok=True)
        self._next = low

    def acquire(self, owner: str) -> int:
        size = self.high - self.low + 1
        for step in range(size):
            port = self.low + (self._next - self.low + step) % size
            try:
                fd = os.open(self.folder / str(port), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as lease:
                lease.write(owner)
            if not self._bindable(port):
                self.release(port, owner)
                continue
            self._next = self.low + (port - self.low + 1) % size
            return port
        raise GpufleetError(
            f"no free port in {self.low}-{self.high} for MASTER_PORT on this node",
            "free ports in that range, or give the agents a wider --port-range",
        )

    def release(self, port: int | None, owner: str) -> None:
        if port is None:
            return
        path = self.folder / str(port)
        with contextlib.suppress(OSError):
            if path.read_text() == owner:
                path.unlink()

    def hold(self, port: int, owner: str) -> None:
        with contextlib.suppress(OSError):
            (self.folder / str(port)).write_text(owner)

    def owned_by(self, prefix: str) -> dict[int, str]:
        found = {}
        for path in self.folder.glob("*"):
            with contextlib.suppress(OSError, ValueError):
                owner = path.read_text()
                if owner.startswith(prefix):
                    found[int(path.name)] = owner
        return found

    def _bindable(self, port: int) -> bool:
        with socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((self.host, port))
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
                    return False
                raise
        return True


class NodeAgent:
    """Runs workers on one node. Every method is safe to call from several threads (the actor is threaded:
    a long log read does not hold up the status of the node's workers)."""

    def __init__(
        self, name: str, address: str, options: AgentOptions, emulated: Node | None = None, ray_node_id: str = ""
    ) -> None:
        self.name = name
        self.address = address
        self.ray_node_id = ray_node_id
        self.options = options
        state_dir = Path(options.root) / safe_name(name)
        self.isolation = Isolation.detect(
            state_dir,
            jobs_home=Path(options.jobs_home),
            data_dir=Path(options.root),
            use_cgroups=options.use_cgroups,
            pids_limit=options.pids_limit,
            log_cap=options.log_cap,
            memory_reserve=options.memory_reserve,
            pids_reserve=options.pids_reserve,
            queue_disk=options.queue_disk,
            sandbox=options.private_tmp,
        )
        if options.firewall and self.isolation.switches_users:
            self.isolation.firewall = EngineFirewall()
            self._shut_out([*options.engine_ports, *raylet_ports()])
        self.supervisor = WorkerSupervisor(state_dir, self.isolation)
        low, high = options.port_range
        self.ports = PortLeases(Path(options.root) / "ports", low, high, address)
        self.emulated = emulated
        self.node = emulated if emulated is not None else _discover(name)
        self._attempts: dict[tuple[str, int], _Attempt] = {}
        self._lock = threading.RLock()
        self._probe: Any = None
        self._halt = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="gpufleet-agent-watch", daemon=True)
        self._watcher.start()

    # --- who am I -----------------------------------------------------------------------------------------

    def set_engine_ports(self, ports: Sequence[tuple[int, int]]) -> dict[str, Any]:
        """Shut job users out of `ports` too (added to what they were shut out of). A firewall the kernel
        refuses is reported in `describe` and refuses every worker start (a job must never reach the engine)."""
        self._shut_out(ports)
        return self.describe()

    def _shut_out(self, ports: Sequence[tuple[int, int]]) -> None:
        firewall = self.isolation.firewall
        if firewall is not None:
            try:
                firewall.add_ports(ports)
            except GpufleetError as error:
                log.error("node %s: %s", self.name, error)

    def describe(self) -> dict[str, Any]:
        """The node as this agent sees it: its GPUs (NVML or the emulated spec), address, isolation."""
        report: IsolationReport = self.isolation.report(single_user_allowed=True)
        return {
            "name": self.name,
            "node": self.node,
            "address": self.address,
            "hostname": socket.gethostname(),
            "emulated": self.emulated is not None,
            "gpu_isolation": "devices" in self.isolation.cgroups.controls,
            "isolation": report,
            "pid": os.getpid(),
            "ray_node_id": self.ray_node_id,
            "engine_ports": raylet_ports(),  # this node's, for every node's firewall
        }

    # --- workers ------------------------------------------------------------------------------------------

    def start(self, specs: Sequence[WorkerSpec], info: Mapping[str, Any], reserve_port: bool) -> int | None:
        """Start the workers of one attempt that run on this node. With `reserve_port`, first lease a free
        MASTER_PORT on this node and give it to them (the node of rank 0). Returns the port (None without).
        After a resize (`resize_count` of the specs above 0) the workers start anew beside the ended ones
        of the same attempt (the control plane has `forget`-ten those). Idempotent: an attempt (after the
        same resize) started before is only watched again. An attempt given up here (`kill`) starts nothing:
        the control plane may send the kill of a lost attempt before the start it sent earlier has run (calls
        run on several threads), and that start must not leave workers nobody watches. Raises GpufleetError
        when the attempt was given up here or no port is free, OSError when the agent's files cannot be
        written."""
        job_id, attempt, resize_count = specs[0].job_id, specs[0].attempt, specs[0].resize_count
        key = (job_id, attempt)
        with self._lock:
            if self.supervisor.given_up(job_id, attempt):
                raise GpufleetError(
                    f"attempt {attempt} of job {job_id} was given up on node {self.name}: it does not start there",
                    "nothing to do: the job starts again as a new attempt",
                )
            known = self._attempts.get(key)
            if known is not None and known.resize_count >= resize_count:
                return known.port
            if known is not None:
                self.forget(job_id, attempt)
            recorded = self.supervisor.attempt_record(job_id, attempt)
            if (recorded is not None and int(recorded.get("resize_count") or 0) >= resize_count) or (
                resize_count == 0 and self.supervisor.attempt_dir(job_id, attempt).exists()
            ):
                return self._adopt_one(job_id, attempt, [s.rank for s in specs]).port
            port = self.ports.acquire(_owner(self.name, job_id, attempt)) if reserve_port else None
            tracked = _Attempt(job_id, attempt, port=port, resize_count=resize_count)
            self._attempts[key] = tracked
            record = {**info, "port": port, "node": self.name, "resize_count": resize_count}
            if resize_count == 0:
                self.supervisor.begin_attempt(job_id, attempt, record)
            else:
                self.supervisor.begin_generation(job_id, attempt, resize_count, record)
            for given in specs:
                spec = (
                    given if port is None else dataclasses.replace(given, env={**given.env, "MASTER_PORT": str(port)})
                )
                missing = self._missing_workdir(spec)
                if missing is not None:
                    tracked.workers[spec.rank] = self.supervisor.refuse(spec, missing)
                else:
                    tracked.workers[spec.rank] = self.supervisor.start(spec)
            return port

    def status(self) -> list[WorkerState]:
        """Every worker this agent tracks, as last refreshed by its watcher."""
        with self._lock:
            return [
                (a.job_id, a.attempt, rank, _started_at(w), _pid(w), w.exit, a.resize_count)
                for a in self._attempts.values()
                for rank, w in a.workers.items()
            ]

    def stop(
        self, job_id: str, attempt: int, signum: int, grace_s: float, reason: str | None, resize: int | None = None
    ) -> None:
        """Send `signum` to the attempt's workers here, and SIGKILL what is left after `grace_s`. A stop
        already under way keeps its earlier deadline. Persisted first (a command not yet started is not).
        `resize`: the workers stop to make room for that resize of the attempt (recorded so)."""
        with self._lock:
            tracked = self._attempts.get((job_id, attempt))
            if tracked is None:
                return
            deadline = time.monotonic() + max(0.0, grace_s)
            if tracked.kill_at is not None:
                deadline = min(deadline, tracked.kill_at)
            tracked.stop_signal, tracked.kill_at = signum, deadline
            left = max(0.0, deadline - time.monotonic())
            record: dict[str, Any] = {"reason": reason, "signal": signum, "kill_at": time.time() + left}
            if resize is not None:
                record["resize"] = resize
            self.supervisor.mark_stopping(job_id, attempt, record, tracked.resize_count)
            for worker in tracked.workers.values():
                self.supervisor.signal(worker, signum)

    def kill(self, job_id: str, attempt: int, detail: str) -> None:
        """Give the attempt up here: kill its workers (whole cgroups) at once; it stays given up after a
        restart. An attempt this agent no longer tracks is killed as its files show: the control plane sends
        `kill` then `forget`, and this actor may run the two calls in either order (on several threads). It is
        recorded first (`given_up.json`), so a start of the attempt that runs after it starts nothing."""
        with self._lock:
            self.supervisor.give_up(job_id, attempt, detail)
            tracked = self._attempts.get((job_id, attempt))
            if tracked is None:
                self._kill_untracked(job_id, attempt, detail)
                return
            tracked.lost = True
            lost = {"lost": detail, "signal": int(signal.SIGKILL)}
            self.supervisor.mark_stopping(job_id, attempt, lost, tracked.resize_count)
            for worker in tracked.workers.values():
                if not worker.done or worker.vanished:
                    self.supervisor.abandon(worker)

    def _kill_untracked(self, job_id: str, attempt: int, detail: str) -> None:
        info = self.supervisor.attempt_record(job_id, attempt)
        if info is None:
            return  # never ran here
        resize_count = int(info.get("resize_count") or 0)
        self.supervisor.mark_stopping(job_id, attempt, {"lost": detail, "signal": int(signal.SIGKILL)}, resize_count)
        for rank in self._ranks_here(job_id, attempt):
            worker = self.supervisor.find(job_id, attempt, rank, resize_count)
            if not worker.done:
                self.supervisor.abandon(worker)

    def forget(self, job_id: str, attempt: int, resize_count: int | None = None) -> None:
        """The control plane has taken the attempt's end: tidy its cgroups, detach its private /tmp, release
        its port, stop tracking. With `resize_count`, only the workers after that many resizes: a late call
        (this actor runs calls on several threads, so not always in the order sent) never drops the set a
        later resize started."""
        with self._lock:
            tracked = self._attempts.get((job_id, attempt))
            if tracked is None or (resize_count is not None and tracked.resize_count != resize_count):
                return
            del self._attempts[(job_id, attempt)]
            for worker in tracked.workers.values():
                self.supervisor.tidy(worker)
            self.supervisor.end_attempt(job_id, attempt)
            self.ports.release(tracked.port, _owner(self.name, job_id, attempt))

    def adopt(
        self, keep: Sequence[tuple[str, int, Sequence[int] | None]]
    ) -> tuple[list[WorkerState], list[tuple[str, int, dict[str, Any]]], list[tuple[str, int, dict[str, Any]]]]:
        """After the control plane (or this agent) restarted: watch again the attempts in `keep` (job id,
        attempt, ranks on this node; None: the ranks its files show here, if it ran here at all), kill every
        other worker found under this node's folder (no job may run twice, nor hold GPUs given to another).
        Returns the status, the stop records and the attempt records (`attempt.json`: its resize count, its
        workers and nodes) of the kept attempts found here (a stop asked for before the restart still holds)."""
        with self._lock:
            wanted: set[Path] = set()
            for job_id, attempt, ranks in keep:
                wanted.add(self.supervisor.attempt_dir(job_id, attempt))
                if (job_id, attempt) in self._attempts:
                    continue
                if ranks is not None:
                    self._adopt_one(job_id, attempt, ranks)
                elif self.supervisor.attempt_record(job_id, attempt) is not None:
                    self._adopt_one(job_id, attempt, self._ranks_here(job_id, attempt))
            for key in [k for k in self._attempts if self.supervisor.attempt_dir(*k) not in wanted]:
                self.kill(key[0], key[1], ORPHAN_DETAIL)
                self.forget(*key)
            self.supervisor.orphans(wanted, ORPHAN_DETAIL)
            mine = f"{self.name}/"
            for port, owner in self.ports.owned_by(mine).items():
                leased_job, _, leased_attempt = owner.removeprefix(mine).rpartition("#")
                if (leased_job, int(leased_attempt or 0)) not in self._attempts:
                    self.ports.release(port, owner)
            stops, attempts = [], []
            for job_id, attempt, _ in keep:
                found = self._attempts.get((job_id, attempt))
                record = self.supervisor.stop_record(job_id, attempt, found.resize_count if found else 0)
                if record is not None:
                    stops.append((job_id, attempt, record))
                info = self.supervisor.attempt_record(job_id, attempt) if found is not None else None
                if info is not None:
                    attempts.append((job_id, attempt, info))
        return self.status(), stops, attempts

    def _ranks_here(self, job_id: str, attempt: int) -> list[int]:
        """The ranks of the attempt's latest workers on this node, as their folders show."""
        info = self.supervisor.attempt_record(job_id, attempt) or {}
        folder = self.supervisor.layout.generation_dir(job_id, attempt, int(info.get("resize_count") or 0))
        names = (p.name.removeprefix("worker-") for p in folder.glob("worker-*"))
        return sorted(int(n) for n in names if n.isdigit())

    def _adopt_one(self, job_id: str, attempt: int, ranks: Sequence[int]) -> _Attempt:
        info = read_json(self.supervisor.attempt_dir(job_id, attempt) / "attempt.json") or {}
        port = info.get("port")
        resize_count = int(info.get("resize_count") or 0)
        tracked = _Attempt(job_id, attempt, port=int(port) if port is not None else None, resize_count=resize_count)
        for rank in ranks:
            tracked.workers[rank] = self.supervisor.find(job_id, attempt, rank, resize_count)
        stop = self.supervisor.stop_record(job_id, attempt, resize_count)
        if stop is not None and stop.get("lost"):
            tracked.lost = True
        elif stop is not None:
            tracked.stop_signal = int(stop.get("signal", signal.SIGTERM))
            tracked.kill_at = time.monotonic() + max(0.0, float(stop.get("kill_at", 0.0)) - time.time())
        if tracked.port is not None:
            self.ports.hold(tracked.port, _owner(self.name, job_id, attempt))
        self._attempts[(job_id, attempt)] = tracked
        return tracked

    def _missing_workdir(self, spec: WorkerSpec) -> str | None:
        """Why this node cannot run the worker in its working folder (None: it can). A relative workdir is
        inside the job's own folder, which the worker's user creates; an absolute one must exist here."""
        workdir = spec.workdir
        if not workdir or workdir.startswith("~") or not os.path.isabs(workdir) or os.path.isdir(workdir):
            return None
        return (
            f"its working folder {workdir} does not exist on node {self.name}; to fix: put it on a file "
            "system every node mounts at the same path (jobs run in their workdir on every node), or create it there"
        )

    def _watch(self) -> None:
        # Every `watch_s` while it runs workers; a node without any looks four times a second.
        while not self._halt.wait(self.options.watch_s if self._attempts else max(self.options.watch_s, 0.25)):
            try:
                self.refresh()
            except Exception:  # the watcher must go on: the next round retries
                log.exception("node agent %s: refreshing workers failed", self.name)

    def refresh(self) -> None:
        """One round of the watcher: bring every worker up to date, send a stop signal to commands that
        started after their stop, kill what is past its deadline."""
        with self._lock:
            now = time.monotonic()
            for tracked in list(self._attempts.values()):
                for worker in tracked.workers.values():
                    self.supervisor.refresh(worker)
                    if tracked.lost and not worker.done:
                        self.supervisor.abandon(worker)
                        continue
                    if tracked.stop_signal is not None:
                        self.supervisor.signal(worker, tracked.stop_signal)
                    if tracked.kill_at is not None and now >= tracked.kill_at:
                        self.supervisor.kill(worker)

    # --- logs ---------------------------------------------------------------------------------------------

    def log_paths(self, job_id: str) -> list[str]:
        return [str(p) for p in self.supervisor.log_paths(job_id)]

    def read_log(
        self, path: str, offset: int, limit: int, tail: int | None = None, since: float | None = None
    ) -> tuple[bytes, int, int]:
        """Up to `limit` bytes of a worker's log from `offset` (with `tail`: its last `tail` bytes; with
        `since`: from the output written then on): (data, where it starts, the file's size). Only files under
        this node's log folder are read."""
        root = self.supervisor.layout.log_root.resolve()
        target = Path(path).resolve()
        if not target.is_relative_to(root):
            raise GpufleetError(f"{path} is not a job log of node {self.name}", "ask for a path `log_paths` gave")
        return read_log_file(target, offset, limit, tail, since)

    def logged_jobs(self) -> list[str]:
        """The jobs that have logs or run records on this node."""
        root = self.supervisor.layout.log_root
        found = []
        for folder in root.iterdir() if root.is_dir() else ():
            with contextlib.suppress(UnicodeDecodeError):
                found.append(job_id_of(folder.name))
        return list(dict.fromkeys([*found, *(job_id for job_id, _ in run_records(self.supervisor.layout))]))

    def prune_logs(self, retention: LogRetention, finished: Sequence[str]) -> dict[str, int]:
        """Delete the logs (and run records) of the `finished` jobs that `retention` no longer keeps; never
        those of an attempt this agent still runs."""
        with self._lock:
            live = {job_id for job_id, _ in self._attempts}
        done = set(finished) - live
        return self.supervisor.prune_logs(retention, done.__contains__)

    # --- telemetry ----------------------------------------------------------------------------------------

    def sample(
        self, now: float, activity: Mapping[tuple[str, int], GpuActivity], pid_weights: Mapping[int, int]
    ) -> list[GpuSample]:
        """One sample of each GPU of this node: NVML's readings, or the emulated probe's (driven by what the
        jobs on each GPU declare, told by the control plane) on an emulated node."""
        if self._probe is None:
            if self.emulated is not None:
                from gpufleet.adapters.probes import EmulatedProbe

                self._probe = EmulatedProbe([self.node], lambda: self._activity, pid_weights=lambda: self._weights)
            else:
                from gpufleet.adapters.nvml import NvmlProbe

                self._probe = NvmlProbe(self.name)
        self._activity, self._weights = dict(activity), dict(pid_weights)
        return list(self._probe.sample(now))

    def close(self) -> None:
        self._halt.set()


def _discover(name: str) -> Node:
    from gpufleet.adapters.nvml.discovery import discover_nodes

    found = discover_nodes(name)
    if not found:
        raise GpufleetError(f"node {name} has no GPU that NVML can see", "check the driver with nvidia-smi")
    return found[0]


def _owner(node: str, job_id: str, attempt: int) -> str:
    return f"{node}/{job_id}#{attempt}"


def _started_at(worker: Worker) -> float | None:
    return float(worker.child["started_at"]) if worker.child is not None else None


def _pid(worker: Worker) -> int | None:
    return int(worker.child["pid"]) if worker.child is not None else None


def raylet_ports(pid: int | None = None) -> list[tuple[int, int]]:
    """The ports this node's raylet was told to use (its own, its agents', its workers' range), read from its
    command line: Ray reports its workers' range nowhere else. `pid`: the raylet's (default: the one that
    started this process, `RAY_RAYLET_PID`); [] if unknown."""
    if pid is None:
        given = os.environ.get("RAY_RAYLET_PID", "")
        if not given.isdigit():
            return []
        pid = int(given)
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []
    flags = dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)
    found: list[tuple[int, int]] = []
    for name, value in flags.items():
        if name.endswith("_port") and value.isdigit() and 0 < int(value) < 65536:
            found.append((int(value), int(value)))
    low, high = flags.get("min_worker_port", ""), flags.get("max_worker_port", "")
    if low.isdigit() and high.isdigit() and 0 < int(low) <= int(high) < 65536:
        found.append((int(low), int(high)))
    for port in flags.get("worker_port_list", "").split(","):
        if port.isdigit():
            found.append((int(port), int(port)))
    return sorted(set(found))
