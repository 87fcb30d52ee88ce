"""The workers of one node: start each under its shim (isolated as `isolation.py` says), see whether it
started and how it ended, signal it, kill it (its whole cgroup), find it again after a restart, read its log.

This is everything an executor does on a node that is not about jobs: `LocalBackend` keeps the job-level
rules (gangs, stops and their deadlines, observations for the loop) and calls a `WorkerSupervisor` for the
machine it runs on; a multi-node backend's node agent imports this module and does the same on its node.
The supervisor keeps no state that its files do not also hold (`layout.py`), so a new supervisor on the same
folders (after a restart) finds every worker again.

Each call is cheap enough for the loop's pace: `refresh` opens a file or two and makes one `waitpid` or
`/proc` check; only `orphans` scans the folders.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.adapters.local import cgroup_ops, namespaces
from gpufleet.adapters.local.disk_quota import move_logs
from gpufleet.adapters.local.isolation import Isolation, WorkerSpec
from gpufleet.adapters.local.layout import Layout, job_id_of
from gpufleet.adapters.local.logs import LogRetention, prune_logs
from gpufleet.adapters.local.proc import is_running, read_json, start_ticks, write_json
from gpufleet.domain.errors import GpufleetError

log = logging.getLogger(__name__)

SHIM_MODULE = "gpufleet.adapters.local.shim"
# The shim runs isolated from the environment (-I: no PYTHONPATH, no user site) but imports the very gpufleet
# this process runs, wherever it is installed.
_HERE = str(Path(__file__).resolve().parents[3])
SHIM_BOOT = f"import sys; sys.path.insert(0, {_HERE!r}); from {SHIM_MODULE} import main; sys.exit(main(sys.argv))"
# The shim's own environment: enough for Python to start. The command gets the one in its spec.
SHIM_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

# The shim resets these to their defaults (the control plane may ignore some), then installs its handlers.
_DEFAULT_SIGNALS = (
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


@dataclass
class Worker:
    """One worker as its files say. `exit` set means it ended (or vanished: `{"vanished": True}`)."""

    rank: int
    dir: Path
    shim_pid: int | None = None
    shim_ticks: int | None = None
    own: bool = False  # its shim is this process's child: reaped with waitpid
    child: dict[str, Any] | None = None  # child.pid: pid, pgid, ticks, started_at
    exit: dict[str, Any] | None = None  # exit.json: code, signal, ended_at, oom (or error / not_started)
    cgroup: tuple[str, ...] = ()
    signalled: bool = False

    @property
    def done(self) -> bool:
        return self.exit is not None

    @property
    def vanished(self) -> bool:
        return self.exit is not None and bool(self.exit.get("vanished"))


class WorkerSupervisor:
    """Starts and watches the workers of this node, under `state_dir` (logs under `log_dir`)."""

    def __init__(self, state_dir: Path, isolation: Isolation | None = None, log_dir: Path | None = None) -> None:
        self.layout = Layout(Path(state_dir), Path(log_dir) if log_dir is not None else None)
        self.isolation = isolation or Isolation.same_user()
        # The memory limit of each worker of an attempt's current workers here, by (job id, attempt), then
        # (resize count, rank): their sum sizes the attempt's tmpfs.
        self._tmp_sizes: dict[tuple[str, int], dict[tuple[int, int], int]] = {}
        try:
            for folder in (self.layout.root, self.layout.run_root()):
                folder.mkdir(parents=True, exist_ok=True)
                folder.chmod(0o700)
            if not self.layout.log_root.exists():
                self.layout.log_root.mkdir(parents=True)
                self.layout.log_root.chmod(0o700)
        except OSError as exc:
            raise GpufleetError(
                f"cannot create the executor's folder {exc.filename or state_dir}: {exc.strerror or exc}",
                "give a writable data folder (and --log-dir)",
            ) from exc

    # --- attempts ---------------------------------------------------------------------------------------

    def attempt_dir(self, job_id: str, attempt: int) -> Path:
        return self.layout.attempt_dir(job_id, attempt)

    def begin_attempt(self, job_id: str, attempt: int, info: dict[str, Any]) -> Path:
        """Record an attempt before its workers start (`attempt.json`); raises OSError (disk full)."""
        folder = self.layout.attempt_dir(job_id, attempt)
        folder.mkdir(parents=True, exist_ok=True)  # made before a restart that came before its record
        write_json(folder / "attempt.json", info)
        return folder

    def begin_generation(self, job_id: str, attempt: int, resize_count: int, info: dict[str, Any]) -> Path:
        """Record that the attempt now runs its workers after resize `resize_count` (`attempt.json`, rewritten
        with `info`), before they start; raises OSError (disk full). A restart that finds the record but not
        every worker of it starts those whose folder is missing (never started): none is started twice."""
        self.layout.attempt_dir(job_id, attempt).mkdir(parents=True, exist_ok=True)  # a node new to the attempt
        write_json(self.layout.attempt_dir(job_id, attempt) / "attempt.json", info)
        folder = self.layout.generation_dir(job_id, attempt, resize_count)
        folder.mkdir(exist_ok=True)
        return folder

    def attempt_record(self, job_id: str, attempt: int) -> dict[str, Any] | None:
        return read_json(self.layout.attempt_dir(job_id, attempt) / "attempt.json")

    def mark_stopping(self, job_id: str, attempt: int, info: dict[str, Any], resize_count: int = 0) -> None:
        """Persist that the attempt's workers (those after resize `resize_count`) are stopping (`stop.json`):
        a shim that has not started its command yet does not start it, and after a restart the stop still
        holds. A full disk only loses the record."""
        with contextlib.suppress(OSError):
            write_json(self.layout.generation_dir(job_id, attempt, resize_count) / "stop.json", info)

    def stop_record(self, job_id: str, attempt: int, resize_count: int = 0) -> dict[str, Any] | None:
        return read_json(self.layout.generation_dir(job_id, attempt, resize_count) / "stop.json")

    def give_up(self, job_id: str, attempt: int, detail: str) -> None:
        """Record that the attempt is given up here (`given_up.json`, made with its folder if need be): none of
        its workers starts here from now on, however late a start of it arrives. Raises OSError (disk full)."""
        folder = self.layout.attempt_dir(job_id, attempt)
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / "given_up.json", {"lost": detail, "at": time.time()})

    def given_up(self, job_id: str, attempt: int) -> bool:
        return (self.layout.attempt_dir(job_id, attempt) / "given_up.json").exists()

    def record_resize(self, job_id: str, attempt: int, info: dict[str, Any]) -> None:
        """Persist a resize under way (`resize.json`: its count, the new placement, the old workers' deadline),
        so that a restart before the new workers are recorded completes it. Raises OSError (disk full)."""
        write_json(self.layout.attempt_dir(job_id, attempt) / "resize.json", info)

    def resize_record(self, job_id: str, attempt: int) -> dict[str, Any] | None:
        return read_json(self.layout.attempt_dir(job_id, attempt) / "resize.json")

    def clear_resize(self, job_id: str, attempt: int) -> None:
        with contextlib.suppress(OSError):
            (self.layout.attempt_dir(job_id, attempt) / "resize.json").unlink(missing_ok=True)

    # --- one worker -------------------------------------------------------------------------------------

    def start(self, spec: WorkerSpec) -> Worker:
        """Start one worker under its shim. Returns at once; a worker that cannot be started (its user, its
        cgroup) is returned ended, with the reason in `exit["error"]` and its log. Raises OSError only
        when its own files cannot be written (disk full)."""
        worker_dir = self.layout.worker_dir(spec.job_id, spec.attempt, spec.rank, spec.resize_count)
        worker_dir.mkdir()
        log = self._open_log(spec)
        worker = Worker(spec.rank, worker_dir)
        try:
            prepared = self.isolation.prepare(spec, self.layout.job_dir(spec.job_id))
        except (GpufleetError, OSError) as exc:
            message = str(exc) if isinstance(exc, GpufleetError) else f"cannot set up its cgroup: {exc}"
            return self._not_started(worker, log, message)
        worker.cgroup = tuple(prepared.cgroup)
        if prepared.disk_quota:
            try:
                move_logs(self.layout.log_dir(spec.job_id), prepared.disk_quota)
            except OSError as exc:
                cgroup_ops.remove(list(worker.cgroup))
                return self._not_started(worker, log, f"cannot keep its logs in its queue's disk quota: {exc}")
        if self.isolation.private_tmp:
            try:
                tmp = self._attempt_tmp(spec, prepared.limits.memory)
            except OSError as exc:
                cgroup_ops.remove(list(worker.cgroup))
                return self._not_started(worker, log, f"cannot set up its private /tmp: {exc.strerror or exc}")
            prepared = dataclasses.replace(prepared, private_tmp=tmp)
        _create_log(log, prepared.log_gid)
        spawn = secrets.token_hex(8)  # the shim claims the worker for this spawn (see `void_unspawned`)
        write_json(
            worker_dir / "spec.json",
            {
                "spawn": spawn,
                "argv": list(spec.argv),
                "stop_file": str(worker_dir.parent / "stop.json"),
                "log": str(log),
                "log_cap": self.isolation.log_cap,
                **prepared.shim_fields(),
            },
        )
        try:
            pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-I", "-c", SHIM_BOOT, str(worker_dir), spawn],
                SHIM_ENV,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_APPEND, 0),
                    (os.POSIX_SPAWN_DUP2, 1, 2),
                ],
                setsid=True,
                setsigdef=_DEFAULT_SIGNALS,
            )
        except OSError as exc:
            cgroup_ops.remove(list(worker.cgroup))
            worker.exit = {"code": 126, "error": f"cannot start the worker shim: {exc.strerror or exc}"}
            write_json(worker_dir / "exit.json", worker.exit)
            return worker
        worker.shim_pid, worker.shim_ticks, worker.own = pid, start_ticks(pid), True
        with contextlib.suppress(OSError):  # the shim writes it too
            write_json(worker_dir / "shim.pid", {"pid": pid, "ticks": worker.shim_ticks})
        return worker

    def _attempt_tmp(self, spec: WorkerSpec, memory: int) -> str:
        """The attempt's tmpfs here, mounted (or grown) to hold what its current workers may hold in memory:
        their limits summed (no limit for any: the kernel's default). Raises OSError."""
        sizes = self._tmp_sizes.setdefault((spec.job_id, spec.attempt), {})
        sizes[(spec.resize_count, spec.rank)] = memory
        current = [size for (count, _), size in sizes.items() if count == spec.resize_count]
        path = str(self.layout.attempt_tmp(spec.job_id, spec.attempt))
        self.layout.tmp_root().mkdir(mode=0o700, exist_ok=True)
        namespaces.attempt_tmp(path, 0 if 0 in current else sum(current))
        return path

    def end_attempt(self, job_id: str, attempt: int) -> None:
        """The attempt has ended here (every worker of it done, or given up and killed): detach its tmpfs, so
        that its memory is freed as its last process goes. Idempotent."""
        self._tmp_sizes.pop((job_id, attempt), None)
        _release_tmp(self.layout.attempt_tmp(job_id, attempt))

    def sweep_tmp(self, keep: set[Path]) -> None:
        """Detach every attempt tmpfs here whose attempt folder is not in `keep` (attempts that ended while the
        control plane was down, or a crashed run's leftovers)."""
        root = self.layout.tmp_root()
        if not root.is_dir():
            return
        found = {Path(p) for p in namespaces.attempt_mounts() if Path(p).parent == root} | set(root.iterdir())
        for path in found:
            name, _, attempt = path.name.rpartition(".")
            try:
                key = (job_id_of(name), int(attempt))
            except ValueError:  # not an attempt's name (UnicodeDecodeError is one): removed all the same
                key = None
            if key is not None and self.layout.attempt_dir(*key) in keep:
                continue
            if key is not None:
                self._tmp_sizes.pop(key, None)
            _release_tmp(path)

    def refuse(self, spec: WorkerSpec, message: str) -> Worker:
        """Record a worker that will not be started (its node cannot run it, e.g. its working folder is
        missing there): returned ended with exit code 126, the reason in `exit["error"]` and in its log.
        Raises OSError only when its own files cannot be written."""
        worker_dir = self.layout.worker_dir(spec.job_id, spec.attempt, spec.rank, spec.resize_count)
        worker_dir.mkdir()
        return self._not_started(Worker(spec.rank, worker_dir), self._open_log(spec), message)

    def _open_log(self, spec: WorkerSpec) -> Path:
        """The worker's log path, its folder made. After a resize, rank r's new worker writes on in rank r's
        log of the attempt, below a line that says so: the earlier workers' output stays."""
        log = self.layout.log_path(spec.job_id, spec.attempt, spec.rank)
        log.parent.mkdir(parents=True, exist_ok=True)
        if spec.resize_count > 0:
            world = spec.env.get("WORLD_SIZE", "?")
            _append(log, f"[gpufleet: resize {spec.resize_count}: worker {spec.rank} of {world} starts here]\n")
        return log

    def _not_started(self, worker: Worker, log: Path, message: str) -> Worker:
        _append(log, f"gpufleet: {message}\n")
        worker.exit = {"code": 126, "error": message, "ended_at": time.time()}
        write_json(worker.dir / "exit.json", worker.exit)
        return worker

    def void_unspawned(self, job_id: str, attempt: int, rank: int, resize_count: int = 0) -> bool:
        """After a restart: whether the worker never started, so that it may be started now. True when its
        folder is missing, or when no shim has claimed it (the control plane died after making its folder,
        before or just after spawning its shim): then it is claimed here, so that a shim of it that runs late
        starts nothing, and its cgroup and folder are removed. False when a shim holds it (or it ended): it
        was started, and `find` watches it."""
        worker_dir = self.layout.worker_dir(job_id, attempt, rank, resize_count)
        if not worker_dir.is_dir():
            return True
        if (worker_dir / "exit.json").exists() or (worker_dir / "shim.pid").exists():
            return False
        spec = read_json(worker_dir / "spec.json")
        if spec is not None and "spawn" not in spec:
            return False  # spawned by a version whose shim does not claim: watched as it is
        try:
            fd = os.open(worker_dir / "claim", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False  # its shim runs
        except FileNotFoundError:
            return True
        os.close(fd)
        cgroup_ops.remove(list((spec or {}).get("cgroup") or ()))
        shutil.rmtree(worker_dir, ignore_errors=True)
        return True

    def find(self, job_id: str, attempt: int, rank: int, resize_count: int = 0) -> Worker:
        """A worker started earlier (by this or an earlier supervisor), as its files say."""
        worker_dir = self.layout.worker_dir(job_id, attempt, rank, resize_count)
        shim = _shim_record(worker_dir)
        spec = read_json(worker_dir / "spec.json") or {}
        worker = Worker(
            rank,
            worker_dir,
            shim_pid=shim.get("pid"),
            shim_ticks=shim.get("ticks"),
            child=read_json(worker_dir / "child.pid"),
            exit=read_json(worker_dir / "exit.json"),
            cgroup=tuple(spec.get("cgroup") or ()),
        )
        if not worker.done and not is_running(worker.shim_pid, worker.shim_ticks):
            worker.exit = read_json(worker_dir / "exit.json") or {"vanished": True}  # it may have just ended
        return worker

    def refresh(self, worker: Worker) -> None:
        """Bring the worker up to date: started? ended? vanished (its shim gone without an exit record)?"""
        if worker.done:
            return
        if worker.child is None:
            worker.child = read_json(worker.dir / "child.pid")
        # exit.json first: the shim writes it just before it exits.
        worker.exit = read_json(worker.dir / "exit.json")
        if worker.exit is not None or self._shim_alive(worker):
            return
        worker.exit = read_json(worker.dir / "exit.json")
        if worker.child is None:
            worker.child = read_json(worker.dir / "child.pid")
        if worker.exit is None:
            worker.exit = {"vanished": True}

    def signal(self, worker: Worker, signum: int) -> None:
        """Send `signum` to the worker's command (its process group), once; nothing before it started."""
        if worker.done or worker.child is None or worker.signalled:
            return
        worker.signalled = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(worker.child["pgid"]), signum)

    def kill(self, worker: Worker) -> None:
        """SIGKILL the worker's command and everything in its cgroup (processes that left its group or
        session too). A shim that has not started its command is left alone: the stop file keeps it from
        starting it, and it records so (killing it would lose that record)."""
        if worker.done or worker.child is None:
            return
        if worker.cgroup:
            cgroup_ops.kill(list(worker.cgroup), timeout_s=0.0)  # one round per call: the loop calls again
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(worker.child["pgid"]), signal.SIGKILL)

    def abandon(self, worker: Worker) -> None:
        """Kill a worker given up on (lost, or found running for no job): its cgroup and command, or its
        shim before it started one; remove its cgroup once empty (its shim may be gone). Whether the command
        started is read from its files, not from the last `refresh`: killing only the shim of a command that
        started since would leave the command running, unwatched."""
        if worker.child is None:
            worker.child = read_json(worker.dir / "child.pid")
        child = worker.child
        if child is not None and (worker.cgroup or is_running(int(child["pid"]), child.get("ticks"))):
            if worker.cgroup:
                cgroup_ops.kill(list(worker.cgroup))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(child["pgid"]), signal.SIGKILL)
        elif child is None and worker.shim_pid is not None and is_running(worker.shim_pid, worker.shim_ticks):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(worker.shim_pid, signal.SIGKILL)
        if worker.cgroup and not is_running(worker.shim_pid, worker.shim_ticks):
            cgroup_ops.kill(list(worker.cgroup))
            cgroup_ops.remove(list(worker.cgroup))

    def tidy(self, worker: Worker) -> None:
        """Remove an ended worker's cgroup if it is empty and still there (its shim normally removes it; one
        killed, or slow on a loaded machine, may leave it)."""
        if worker.done and worker.cgroup:
            cgroup_ops.remove(list(worker.cgroup))

    def orphans(self, keep: set[Path], detail: str) -> None:
        """Kill every worker found running under the state folder whose attempt is not in `keep`: no job
        may run twice (the store gave its resources to someone else, or retried it). The private /tmp of
        every other attempt goes too (`sweep_tmp`)."""
        for attempt_dir in self.layout.run_root().glob("*/attempt-*"):
            if attempt_dir in keep:
                continue
            # The workers as launched, and those after each resize (normally ended, but a restart in the
            # middle of one may find both).
            for worker_dir in [*attempt_dir.glob("worker-*"), *attempt_dir.glob("resize-*/worker-*")]:
                if (worker_dir / "exit.json").exists():
                    continue
                with contextlib.suppress(OSError):
                    write_json(worker_dir.parent / "stop.json", {"lost": detail, "signal": int(signal.SIGKILL)})
                rank = worker_dir.name.removeprefix("worker-")
                if rank.isdigit():
                    found = self._found(worker_dir, int(rank))
                    self.abandon(found)
        self.sweep_tmp(keep)

    def _found(self, worker_dir: Path, rank: int) -> Worker:
        shim = read_json(worker_dir / "shim.pid") or {}
        spec = read_json(worker_dir / "spec.json") or {}
        return Worker(
            rank,
            worker_dir,
            shim_pid=shim.get("pid"),
            shim_ticks=shim.get("ticks"),
            child=read_json(worker_dir / "child.pid"),
            cgroup=tuple(spec.get("cgroup") or ()),
        )

    def _shim_alive(self, worker: Worker) -> bool:
        if worker.own and worker.shim_pid is not None:
            try:
                pid, _ = os.waitpid(worker.shim_pid, os.WNOHANG)
            except ChildProcessError:
                worker.own = False  # reaped elsewhere: look it up by pid and start time below
            else:
                return pid == 0
        return is_running(worker.shim_pid, worker.shim_ticks)

    # --- logs -------------------------------------------------------------------------------------------

    def log_paths(self, job_id: str) -> list[Path]:
        """The job's log files, one per attempt and worker, oldest attempt first."""
        return self.layout.log_paths(job_id)

    def prune_logs(self, retention: LogRetention, finished: Callable[[str], bool]) -> dict[str, int]:
        """Delete finished jobs' logs (and run records) past `retention`; see `logs.py`."""
        return prune_logs(self.layout, retention, finished)


def _shim_record(worker_dir: Path, wait_s: float = 1.0) -> dict[str, Any]:
    """The worker's shim (pid, start ticks). A shim spawned just before the control plane died has not
    written its record yet: give it a moment rather than declare a live worker dead."""
    deadline = time.monotonic() + wait_s
    while True:
        shim = read_json(worker_dir / "shim.pid")
        if shim is not None or not (worker_dir / "spec.json").exists() or time.monotonic() > deadline:
            return shim or {}
        time.sleep(0.01)


def _release_tmp(path: Path) -> None:
    if not path.exists() and not path.is_mount():
        return
    try:
        namespaces.release(str(path))
    except OSError as exc:
        log.warning("cannot remove the private /tmp at %s: %s", path, exc)


def _create_log(path: Path, gid: int) -> None:
    """The worker's log: the control plane's, readable by the worker's group when it runs as its own user."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640 if gid >= 0 else 0o600)
    try:
        if gid >= 0:
            os.fchown(fd, -1, gid)
    finally:
        os.close(fd)


def _append(path: Path, text: str) -> None:
    with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as f:
        f.write(text)
