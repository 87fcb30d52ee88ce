"""The local executor: an `ExecutionBackend` that runs each worker as a real process on this machine.

Jobs are this module's business (gangs, stops and their deadlines, observations for the loop); workers are
the `WorkerSupervisor`'s (`supervisor.py`: each under a shim in a session of its own, isolated as
`isolation.py` says, so jobs outlive the control plane and, after a restart, `adopt` finds them again
through the files under the state folder). The backend itself keeps no state that the files do not also
hold.

A resize (`resize`) keeps the attempt: its workers get the checkpoint signal (and SIGKILL after the grace
period), and once all of them have ended the new set starts in a folder of its own (`layout.py`), with the
new WORLD_SIZE and GPUFLEET_RESIZE_COUNT, a fresh MASTER_PORT and rank r's log continued. What is under way
is in `resize.json` until every new worker has started, so a restart at any point of a resize completes it
(the old workers stop, then the new ones not started yet start) rather than leave workers behind. After a
restart the files, not the launch the loop passes, say which workers run: the store holds a grow's new
placement before its workers start, and a shrink's old one until RESIZED.

`poll` is called every few tens of milliseconds by the loop, so per live worker it only tries to open a
file or two (`exit.json`, and `child.pid` until it exists) and makes one `waitpid` or `/proc` check: it
never scans the state folder (only `adopt` does, once).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.adapters.inbox import ObservationInbox
from gpufleet.adapters.local.isolation import Isolation, IsolationReport, WorkerSpec
from gpufleet.adapters.local.logs import LogRetention
from gpufleet.adapters.local.owners import KnownWorker, ProcessOwners, WorkerKey
from gpufleet.adapters.local.ports import PortAllocator
from gpufleet.adapters.local.proc import read_json
from gpufleet.adapters.local.supervisor import Worker, WorkerSupervisor
from gpufleet.adapters.local.worker_env import allocator_env
from gpufleet.domain.cluster import GpuShare, Node, WorkerPlacement
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.jobs import JobId
from gpufleet.domain.resources import GiB
from gpufleet.ports import BackendCapabilities, Clock, Launch, Observation, ObservationKind

log = logging.getLogger(__name__)

SHUTDOWN_REASON = "the control plane shut down"
ORPHAN_DETAIL = "killed at a restart: the store did not list it as running"
Key = tuple[JobId, int]


@dataclass(frozen=True)
class _Resize:
    launch: Launch  # the new placement
    count: int


@dataclass
class _Job:
    job_id: JobId
    attempt: int
    dir: Path
    signal: int
    port: int | None
    workers: list[Worker] = field(default_factory=list)
    started_reported: bool = False
    stop_reason: str | None = None
    stop_signal: int | None = None  # what stopping workers get: the checkpoint signal, or SIGTERM for a gang
    kill_at: float | None = None  # time.monotonic() after which the workers get SIGKILL
    failure: tuple[int, str] | None = None  # first failed worker: its exit code and the detail to report
    lost: str | None = None
    resize_count: int = 0  # resizes of this attempt so far: its workers are those after the last
    resizing: _Resize | None = None  # a resize under way: the workers are stopping to make room for it
    resized_reported: bool = True  # False from the start of a resize's new workers until RESIZED


class LocalBackend:
    """Runs jobs as processes on this machine. Single node: `multi_node` is False, but `nodes` may list
    several emulated nodes, all run here. Observation times come from `clock`."""

    capabilities = BackendCapabilities(multi_node=False, gpu_isolation=True, checkpoint_signal=True, resize=True)

    def __init__(
        self,
        state_dir: Path,
        nodes: Sequence[Node],
        clock: Clock,
        *,
        emulated: bool,
        port_range: tuple[int, int] = (29500, 30499),
        master_addr: str = "127.0.0.1",
        gang_grace_s: float = 5.0,
        isolation: Isolation | None = None,
        log_dir: Path | None = None,
        job_env: Callable[[JobId, int], Mapping[str, str]] | None = None,
    ) -> None:
        """`isolation`: how workers start (default: as this process's user, without cgroups; the control
        plane passes `Isolation.detect(...)`). `log_dir`: where logs go (default: under `state_dir`).
        `job_env(job id, attempt)`: variables the control plane gives every worker of that attempt (its
        progress-report URL and job token), set after the job's own as the allocator's are."""
        self.job_env = job_env
        self.nodes = {node.name: node for node in nodes}
        self.clock = clock
        self.emulated = emulated
        self.master_addr = master_addr
        self.gang_grace_s = gang_grace_s
        self.ports = PortAllocator(port_range[0], port_range[1], master_addr)
        try:
            self.ports.bindable(0)
        except OSError as exc:
            raise GpufleetError(
                f"the local executor cannot bind its master address {master_addr!r}: {exc.strerror or exc}",
                "set master_addr to an address of this machine, e.g. 127.0.0.1",
            ) from exc
        self.workers = WorkerSupervisor(Path(state_dir), isolation, log_dir)
        self.layout = self.workers.layout
        # GPU isolation is real only where the device cgroup locks the other GPUs' device files.
        locked = "devices" in self.workers.isolation.cgroups.controls
        self.capabilities = BackendCapabilities(
            multi_node=False, gpu_isolation=locked, checkpoint_signal=True, resize=True
        )
        self._live: dict[Key, _Job] = {}
        self._inbox = ObservationInbox(clock)
        self._finished = self._inbox.finished
        self._owners = ProcessOwners()
        self._disk_full_said = False

    @property
    def isolation(self) -> Isolation:
        return self.workers.isolation

    # --- the port -------------------------------------------------------------------------------------

    def launch(self, launch: Launch) -> None:
        job = launch.job
        key = (job.id, launch.attempt)
        attempt_dir = self.workers.attempt_dir(job.id, launch.attempt)
        if key in self._live or key in self._finished:
            return  # idempotent: this attempt was launched already
        if attempt_dir.exists():
            # Launched before a restart and not adopted: watch it (report how it runs or ended), never start
            # it twice.
            self._adopt(launch)
            return
        self._begin(launch)

    def _begin(self, launch: Launch) -> None:
        """Start an attempt of which nothing ran: its record, then its workers."""
        job = launch.job
        key = (job.id, launch.attempt)
        attempt_dir = self.workers.attempt_dir(job.id, launch.attempt)
        run = job.run
        if run is None:
            # Not something a retry can fix: it ends failed (127, as a shell says of a missing command).
            self._finished.add(key)
            self._inbox.emit(key, ObservationKind.EXITED, exit_code=127, detail="the job has no command to run")
            return
        port: int | None = None
        try:
            port = self.ports.acquire(_owner(key))
            envs = self._envs(launch, port, 0)
        except GpufleetError as exc:
            self.ports.release(port, _owner(key))
            self._inbox.lose(key, str(exc))
            return
        signum = int(signal.Signals[run.checkpoint_signal])
        tracked = _Job(job.id, launch.attempt, attempt_dir, signum, port)
        try:
            info = {"job_id": job.id, "attempt": launch.attempt, "workers": len(envs), "port": port}
            self.workers.begin_attempt(job.id, launch.attempt, info)
            self._start_workers(tracked, launch, envs)
        except OSError as exc:
            # Its files could not be written (a full disk): nothing of it may keep running.
            for worker in tracked.workers:
                self.workers.abandon(worker)
            self.workers.end_attempt(job.id, launch.attempt)
            self.ports.release(port, _owner(key))
            self._inbox.lose(key, f"cannot write its files: {_disk_words(exc)}")
            self._say_disk(exc)
            return
        self._live[key] = tracked

    def _envs(self, launch: Launch, port: int, resize_count: int) -> list[dict[str, str]]:
        """Each worker's variables from the allocator and the control plane (raises GpufleetError)."""
        granted = dict(self.job_env(launch.job.id, launch.attempt)) if self.job_env is not None else {}
        return [
            {
                **allocator_env(
                    launch,
                    rank,
                    self.nodes,
                    master_addr=self.master_addr,
                    master_port=port,
                    emulated=self.emulated,
                    resize_count=resize_count,
                ),
                **granted,
            }
            for rank in range(len(launch.workers))
        ]

    def _start_workers(
        self, job: _Job, launch: Launch, envs: list[dict[str, str]], ranks: Sequence[int] | None = None
    ) -> None:
        """Start `launch`'s workers (those of `ranks`; None: all) for `job` (after its `job.resize_count`-th
        resize); raises OSError."""
        run = launch.job.run
        assert run is not None
        argv = ("/bin/sh", "-c", run.command[0]) if run.shell else tuple(run.command)
        for rank, env in enumerate(envs):
            if ranks is not None and rank not in ranks:
                continue
            placement = launch.workers[rank]
            node = self.nodes[placement.node]
            spec = WorkerSpec(
                job_id=launch.job.id,
                attempt=launch.attempt,
                rank=rank,
                queue=launch.job.queue,
                argv=argv,
                env={**dict(run.env), **env},
                workdir=run.workdir,
                cpu_milli=placement.cpu_milli,
                memory=placement.memory,
                gpus=tuple((s.index, node.gpus[s.index].uuid) for s in placement.gpus),
                run_as=launch.run_as,
                resize_count=job.resize_count,
                gpu_milli=sum(s.milli for s in placement.gpus),
                node_gpus=len(node.gpus),
                node_memory=node.memory,
                memory_per_gpu=launch.memory_per_gpu,
                memory_no_gpu=launch.memory_no_gpu,
                disk=launch.disk,
            )
            job.workers.append(self.workers.start(spec))

    def resize(self, launch: Launch, grace_s: float, resize_count: int) -> None:
        """Restart the attempt with `launch.workers` (see the port). A resize of an attempt that is not running
        here, is stopping or has failed is ignored (how it ends comes through `poll`); so is one whose count
        is not above the last asked for (idempotent). A newer resize asked for while the workers are still
        stopping for an earlier one replaces it, within the earlier deadline."""
        if not launch.workers:
            raise GpufleetError(
                f"cannot resize job {launch.job.id!r} to no workers", "stop it instead, or give at least one worker"
            )
        key = (launch.job.id, launch.attempt)
        job = self._live.get(key)
        if job is None or job.stop_reason is not None or job.failure is not None or job.lost is not None:
            return
        self._refresh(job)
        if job.resizing is None and all(w.done for w in job.workers):
            return  # it ended by itself first: the next poll reports that
        if resize_count <= (job.resizing.count if job.resizing is not None else job.resize_count):
            return
        grace_s = max(0.0, grace_s)
        signum = job.signal if grace_s > 0 else int(signal.SIGKILL)
        kill_at = time.monotonic() + grace_s
        if job.kill_at is not None:  # already stopping for an earlier resize: its deadline holds
            kill_at = min(kill_at, job.kill_at)
        info = {
            "resize_count": resize_count,
            "workers": [_placement_record(w) for w in launch.workers],
            "signal": signum,
            "kill_at": time.time() + (kill_at - time.monotonic()),
        }
        try:
            self.workers.record_resize(*key, info)
        except OSError as exc:
            self._say_disk(exc)
            return  # nothing changed: the attempt runs on at its size
        job.resizing = _Resize(launch, resize_count)
        job.kill_at = kill_at
        if job.stop_signal is None:
            job.stop_signal = signum
            self.workers.mark_stopping(*key, {"resize": resize_count, **info}, job.resize_count)
            self._signal_workers(job, signum)

    def stop(self, job_id: JobId, attempt: int, grace_s: float, reason: str) -> None:
        job = self._live.get((job_id, attempt))
        if job is None:
            return
        if job.resizing is not None and job.stop_reason is None:
            # Stopping for a resize: the stop wins. Its workers have had the checkpoint signal already.
            job.resizing = None
            self.workers.clear_resize(job_id, attempt)
            job.stop_reason = reason or "stopped"
            self._begin_stop(job, job.stop_signal or job.signal, grace_s)
            return
        if job.stop_reason is not None:
            if grace_s <= 0 and (job.kill_at is None or job.kill_at > time.monotonic()):
                # Killed now (a forced cancel) although already stopping with a grace period.
                job.stop_reason = reason or job.stop_reason
                self._begin_stop(job, job.stop_signal or job.signal, 0.0)
            return
        self._refresh(job)
        if all(w.done for w in job.workers):
            return  # it ended by itself first: the next poll reports that
        job.stop_reason = reason or "stopped"
        # No grace: SIGKILL at once, not the checkpoint signal first.
        self._begin_stop(job, signal.SIGKILL if grace_s <= 0 else job.signal, grace_s)

    def poll(self) -> Sequence[Observation]:
        for job in list(self._live.values()):
            self._watch(job)
        return self._inbox.take()

    def adopt(self, live: Sequence[Launch]) -> None:
        wanted = {self.workers.attempt_dir(launch.job.id, launch.attempt) for launch in live}
        for launch in live:
            self._adopt(launch)
        self.workers.orphans(wanted | {job.dir for job in self._live.values()}, ORPHAN_DETAIL)

    # --- beyond the port: what the API and the CLI use ------------------------------------------------

    def log_paths(self, job_id: JobId) -> list[Path]:
        """The job's log files, one per attempt and worker, oldest attempt first."""
        return self.workers.log_paths(job_id)

    def prune_logs(self, retention: LogRetention, finished: Callable[[str], bool]) -> dict[str, int]:
        """Delete finished jobs' logs that `retention` no longer keeps (see `logs.py`); never a live job's."""
        live = {job_id for job_id, _ in list(self._live)}
        return self.workers.prune_logs(retention, lambda job_id: job_id not in live and finished(job_id))

    def isolation_report(self, single_user_allowed: bool = False) -> IsolationReport:
        """How this executor isolates jobs, in words (for `up`, `nodes` and `/healthz`)."""
        return self.isolation.report(single_user_allowed)

    def owner_of(self, pids: Iterable[int]) -> dict[int, WorkerKey]:
        """The worker each of `pids` belongs to, as (job id, attempt, rank), through its session or parent
        chain (`owners.py`); pids of no running worker are left out. Reads /proc only for the pids given
        (results cached per pid and start time). Safe to call from another thread than the loop's."""
        return self._owners.resolve(pids, self._known_workers())

    def running_commands(self) -> dict[WorkerKey, int]:
        """The pid of each running worker's command, by (job id, attempt, rank): what an emulated GPU
        reports as its processes. Safe to call from another thread than the loop's."""
        return {w.key: w.child_pid for w in self._known_workers() if w.child_pid is not None}

    def _known_workers(self) -> list[KnownWorker]:
        known = []
        # Copies: the loop thread may add or drop jobs meanwhile (a copy of a dict is one step under the GIL).
        for job in list(self._live.values()):
            for worker in list(job.workers):
                child = worker.child
                if worker.done or (worker.shim_pid is None and child is None):
                    continue
                known.append(
                    KnownWorker(
                        (job.job_id, job.attempt, worker.rank),
                        worker.shim_pid,
                        worker.shim_ticks,
                        int(child["pid"]) if child else None,
                        child.get("ticks") if child else None,
                    )
                )
        return known

    def shutdown(self, stop_jobs: bool, grace_s: float) -> None:
        """With `stop_jobs`, stop every job (checkpoint signal, `grace_s`, then SIGKILL) and wait for them;
        otherwise leave them running, for the next start to adopt."""
        if not stop_jobs:
            self._live.clear()
            return
        for job in list(self._live.values()):
            self.stop(job.job_id, job.attempt, grace_s, SHUTDOWN_REASON)
        deadline = time.monotonic() + grace_s + 5.0
        while self._live and time.monotonic() < deadline:
            for job in list(self._live.values()):
                self._watch(job)  # observations stay queued for a last poll
            time.sleep(0.01)

    # --- watching -------------------------------------------------------------------------------------

    def _refresh(self, job: _Job) -> None:
        """Bring each running worker's state up to date: started? ended? vanished?"""
        for worker in job.workers:
            self.workers.refresh(worker)
            if worker.vanished:
                job.lost = job.lost or f"worker {worker.rank} process vanished"

    def _watch(self, job: _Job) -> None:
        self._refresh(job)
        key = (job.job_id, job.attempt)
        gone = [w for w in job.workers if w.exit is not None and w.exit.get("lost")]
        if gone and job.lost is None:  # a worker could not start through no fault of the job: retried
            first = min(gone, key=lambda w: w.rank)
            assert first.exit is not None
            job.lost = describe_failure(first.rank, first.exit)[1]
        if not job.resized_reported and job.lost is None:
            refused = [w for w in job.workers if w.exit is not None and "error" in w.exit]
            if refused:  # a resize's new worker could not be started: the attempt cannot go on
                first = min(refused, key=lambda w: w.rank)
                assert first.exit is not None
                job.lost = f"resize {job.resize_count}: {describe_failure(first.rank, first.exit)[1]}"
        if job.lost is not None:
            self._kill_workers(job)
            self._finish(job)
            self._inbox.emit(key, ObservationKind.LOST, detail=job.lost)
            return
        if not job.started_reported and all(w.child is not None for w in job.workers):
            job.started_reported = True
            started = max(float(w.child["started_at"]) for w in job.workers if w.child is not None)
            self._inbox.emit(key, ObservationKind.STARTED, wall=started)
        if not job.resized_reported and all(w.child is not None for w in job.workers):
            job.resized_reported = True
            started = max(float(w.child["started_at"]) for w in job.workers if w.child is not None)
            self._inbox.emit(
                key,
                ObservationKind.RESIZED,
                wall=started,
                detail=f"resize {job.resize_count}",
                resize_count=job.resize_count,
            )
        if job.stop_reason is None and job.failure is None and job.resizing is None:
            self._check_failure(job)
        if job.stop_signal is not None:
            self._signal_workers(job, job.stop_signal)  # workers whose command started after the stop
            if job.kill_at is not None and time.monotonic() >= job.kill_at:
                # Every poll until they are gone: a command that started after the deadline gets it too. A
                # shim that has not started its command is left alone: it sees the stop file and records
                # that it did not start (killing it would lose that record).
                for worker in job.workers:
                    self.workers.kill(worker)
        if not all(w.done for w in job.workers):
            return
        if job.resizing is not None:
            self._start_generation(job, job.resizing)  # the old workers are gone: how they ended does not count
            return
        self._finish(job)
        ended = max((float(w.exit.get("ended_at", 0.0)) for w in job.workers if w.exit), default=0.0)
        wall = ended or None
        if job.stop_reason == SHUTDOWN_REASON:
            # The store still believes it runs: a plain STOPPED would be ignored, LOST gets it retried.
            self._inbox.emit(key, ObservationKind.LOST, wall=wall, detail="stopped when the control plane shut down")
        elif job.stop_reason is not None:
            code = stopped_code(w.exit for w in sorted(job.workers, key=lambda w: w.rank))
            self._inbox.emit(key, ObservationKind.STOPPED, wall=wall, exit_code=code, detail=job.stop_reason)
        elif job.failure is not None:
            self._inbox.emit(key, ObservationKind.EXITED, wall=wall, exit_code=job.failure[0], detail=job.failure[1])
        else:
            self._inbox.emit(key, ObservationKind.EXITED, wall=wall, exit_code=0)

    def _check_failure(self, job: _Job) -> None:
        failed = [w for w in job.workers if w.exit is not None and w.exit.get("code", 0) != 0]
        if not failed:
            return
        first = min(failed, key=lambda w: (float(w.exit.get("ended_at", 0.0)) if w.exit else 0.0, w.rank))
        assert first.exit is not None
        job.failure = describe_failure(first.rank, first.exit)
        if not all(w.done for w in job.workers):
            # A gang cannot go on without a member: stop the others, with a short grace.
            self._begin_stop(job, signal.SIGTERM, self.gang_grace_s)

    def _begin_stop(self, job: _Job, signum: int, grace_s: float) -> None:
        job.stop_signal = signum
        grace_s = max(0.0, grace_s)
        if job.kill_at is not None:  # a gang already stopping keeps its earlier deadline
            grace_s = min(grace_s, max(0.0, job.kill_at - time.monotonic()))
        job.kill_at = time.monotonic() + grace_s
        # Persisted first: a shim that has not started its command yet sees it and does not start it, and
        # after a restart the stop (and its deadline) still holds.
        self.workers.mark_stopping(
            job.job_id,
            job.attempt,
            {"reason": job.stop_reason, "signal": signum, "kill_at": time.time() + grace_s},
            job.resize_count,
        )
        self._signal_workers(job, signum)

    def _signal_workers(self, job: _Job, signum: int) -> None:
        for worker in job.workers:
            self.workers.signal(worker, signum)

    def _kill_workers(self, job: _Job) -> None:
        """Kill every worker still running (a lost job is abandoned): its cgroup and command, or the shim
        itself before it started one."""
        lost = {"lost": job.lost or "killed", "signal": int(signal.SIGKILL)}
        self.workers.mark_stopping(job.job_id, job.attempt, lost, job.resize_count)
        for worker in job.workers:
            if worker.done and not worker.vanished:
                continue
            self.workers.abandon(worker)

    def _start_generation(self, job: _Job, resize: _Resize) -> None:
        """Start the new workers of a resize, the old ones all ended. What goes wrong makes the attempt lost."""
        key = (job.job_id, job.attempt)
        for worker in job.workers:
            self.workers.tidy(worker)
        job.resizing, job.stop_signal, job.kill_at = None, None, None
        job.workers, job.resize_count, job.resized_reported = [], resize.count, False
        # A fresh MASTER_PORT: the old rendezvous' sockets may linger a while.
        old_port, job.port = job.port, None
        try:
            job.port = self.ports.acquire(_owner(key))
            envs = self._envs(resize.launch, job.port, resize.count)
        except GpufleetError as exc:
            job.lost = f"resize {resize.count}: {exc}"
            return
        finally:
            self.ports.release(old_port, _owner(key))
        info = {
            "job_id": job.job_id,
            "attempt": job.attempt,
            "workers": len(envs),
            "port": job.port,
            "resize_count": resize.count,
        }
        try:
            self.workers.begin_generation(job.job_id, job.attempt, resize.count, info)
            self._start_workers(job, resize.launch, envs)
        except OSError as exc:
            for worker in job.workers:
                self.workers.abandon(worker)
            job.lost = f"resize {resize.count}: cannot write its files: {_disk_words(exc)}"
            self._say_disk(exc)
        self.workers.clear_resize(*key)

    def _start_rest(self, job: _Job, launch: Launch, ranks: Sequence[int]) -> None:
        """Start the workers `ranks` of `launch` (the attempt's, or a resize's) whose other workers `job` already
        runs (a restart found it half started), with the rendezvous those have. What goes wrong makes the
        attempt lost."""
        try:
            envs = self._envs(launch, job.port or 0, job.resize_count)
        except GpufleetError as exc:
            job.lost = f"resize {job.resize_count}: {exc}"
            return
        try:
            self.layout.generation_dir(job.job_id, job.attempt, job.resize_count).mkdir(parents=True, exist_ok=True)
            self._start_workers(job, launch, envs, ranks)
        except OSError as exc:
            job.lost = f"resize {job.resize_count}: cannot write its files: {_disk_words(exc)}"
            self._say_disk(exc)
        job.workers.sort(key=lambda w: w.rank)

    def _finish(self, job: _Job) -> None:
        key = (job.job_id, job.attempt)
        for worker in job.workers:
            self.workers.tidy(worker)
        self.workers.end_attempt(job.job_id, job.attempt)
        self._live.pop(key, None)
        self._finished.add(key)
        self.ports.release(job.port, _owner(key))

    # --- after a restart ------------------------------------------------------------------------------

    def _adopt(self, launch: Launch) -> None:
        key = (launch.job.id, launch.attempt)
        if key in self._live or key in self._finished:
            return
        attempt_dir = self.workers.attempt_dir(*key)
        info = read_json(attempt_dir / "attempt.json")
        if info is None:
            # Its record comes before any of its workers: none of them ever started. It starts now, once.
            self._begin(launch)
            return
        run = launch.job.run
        signum = int(signal.Signals[run.checkpoint_signal]) if run is not None else int(signal.SIGTERM)
        port = info.get("port")
        job = _Job(launch.job.id, launch.attempt, attempt_dir, signum, int(port) if port is not None else None)
        # The files, not the store, say how many workers run now: the store may hold a resize's placement
        # (a grow's target) before its workers start, or the one before it (a shrink's).
        job.resize_count = int(info.get("resize_count") or 0)
        job.resized_reported = job.resize_count == 0  # RESIZED again: it may not have been seen before the restart
        size = int(info.get("workers", len(launch.workers)))
        resize = self.workers.resize_record(*key)
        # Workers being started when the control plane stopped (the attempt's first, or a resize's new ones):
        # those not started yet (no folder, or one no shim claimed: `void_unspawned`) start now; a worker is
        # never started twice.
        finishing = resize if resize is not None and int(resize["resize_count"]) == job.resize_count else None
        restartable = finishing is not None or (job.resize_count == 0 and resize is None)
        unstarted = []
        for rank in range(size):
            if restartable and self.workers.void_unspawned(*key, rank, job.resize_count):
                unstarted.append(rank)
                continue
            worker = self.workers.find(launch.job.id, launch.attempt, rank, job.resize_count)
            job.workers.append(worker)
            if worker.vanished:
                job.lost = job.lost or (
                    "worker died while the control plane was down"
                    if worker.dir.exists()
                    else "never started (control plane stopped during launch)"
                )
        stop = self.workers.stop_record(*key, job.resize_count)
        if finishing is not None:
            if stop is None and job.lost is None and unstarted:
                target = dataclasses.replace(launch, workers=tuple(_placement_of(w) for w in finishing["workers"]))
                self._start_rest(job, target, unstarted)
            self.workers.clear_resize(*key)
            resize = None
        elif unstarted and stop is None and job.lost is None:
            # The attempt's first workers, at the store's placement (the one their record was made for).
            if len(launch.workers) == size:
                self._start_rest(job, launch, unstarted)
            else:
                job.lost = "its workers were being started when the control plane stopped"
        if stop is not None and stop.get("lost"):
            job.lost = job.lost or str(stop["lost"])  # given up on before: it stays lost
        elif stop is not None and stop.get("resize") is None:
            # A stop asked for (with its reason), or a gang stopping after a failed member (no reason: the
            # failure is found again from the exit records).
            job.stop_reason = str(stop["reason"]) if stop.get("reason") else None
            job.stop_signal = int(stop.get("signal", signal.SIGTERM))
            job.kill_at = time.monotonic() + max(0.0, float(stop.get("kill_at", 0.0)) - time.time())
        elif resize is not None and int(resize["resize_count"]) > job.resize_count:
            # A resize under way when the control plane stopped: the old workers stop, then the new ones start.
            workers = tuple(_placement_of(w) for w in resize["workers"])
            target = dataclasses.replace(launch, workers=workers)  # the store's launch, at the new placement
            job.resizing = _Resize(target, int(resize["resize_count"]))
            job.stop_signal = int(resize.get("signal", signum))
            job.kill_at = time.monotonic() + max(0.0, float(resize.get("kill_at", 0.0)) - time.time())
            self.workers.mark_stopping(*key, {"resize": job.resizing.count, **resize}, job.resize_count)
        if job.port is not None and job.lost is None:
            self.ports.hold(job.port, _owner(key))
        self._live[key] = job

    def _say_disk(self, exc: OSError) -> None:
        if exc.errno in _NO_SPACE and not self._disk_full_said:
            self._disk_full_said = True
            log.error("%s; jobs cannot start until space is freed", _disk_words(exc))


def _placement_record(placement: WorkerPlacement) -> dict[str, Any]:
    gpus = [[share.index, share.milli, share.memory] for share in placement.gpus]
    return {"node": placement.node, "gpus": gpus, "cpu_milli": placement.cpu_milli, "memory": placement.memory}


def _placement_of(record: dict[str, Any]) -> WorkerPlacement:
    gpus = tuple(GpuShare(int(i), int(milli), int(memory)) for i, milli, memory in record["gpus"])
    return WorkerPlacement(str(record["node"]), gpus, int(record["cpu_milli"]), int(record["memory"]))


def stopped_code(exits: Iterable[dict[str, Any] | None]) -> int | None:
    """The exit code of an attempt that was stopped (cancelled, timed out), as a shell gives it: the first
    worker's (by rank) that did not exit 0, e.g. 143 for SIGTERM or 137 for SIGKILL; 0 if all exited 0; None
    if none left a record."""
    codes = [int(record["code"]) for record in exits if record is not None and "code" in record]
    return next((code for code in codes if code != 0), 0 if codes else None)


def describe_failure(rank: int, exit_record: dict[str, Any]) -> tuple[int, str]:
    """A failed worker's exit code and what to tell the user, from its exit record (`exit.json`). Every
    backend that runs workers under the shim (this one, a node agent's) words failures this way."""
    code = int(exit_record["code"])
    if "error" in exit_record:
        return code, f"worker {rank} could not start: {exit_record['error']}"
    if exit_record.get("oom"):
        limit = int(exit_record.get("memory_limit") or 0)
        return code, f"worker {rank} was killed: out of memory (limit {people_size(limit)})"
    quota = exit_record.get("disk_quota")
    full = (
        f"; its queue's disk quota ({people_size(int(quota['size']))}) is full: writes in {quota['folder']} fail "
        "with ENOSPC (an administrator raises it with `gpufleet quota set QUEUE --disk SIZE`)"
        if isinstance(quota, dict)
        else ""
    )
    if exit_record.get("signal"):
        return code, f"worker {rank} was killed by {_signal_name(int(exit_record['signal']))} ({code}){full}"
    return code, f"worker {rank} exited {code}{full}"


def _owner(key: Key) -> str:
    return f"{key[0]}#{key[1]}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _disk_words(exc: OSError) -> str:
    if exc.errno in _NO_SPACE:
        return f"disk full at {exc.filename or 'the executor folder'}"
    return f"{exc.strerror or exc} ({exc.filename})" if exc.filename else str(exc)


def people_size(nbytes: int) -> str:
    """Bytes as people write them: 16 GiB, 512 MiB."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{nbytes} bytes"
