"""`RayBackend`: the `ExecutionBackend` that runs jobs on the nodes of a Ray cluster through their agents.

The job-level rules are the local executor's (`adapters/local/executor.py`): every worker or none (a gang
whose member fails or cannot start is stopped everywhere), the checkpoint signal then SIGKILL after the
grace period, exit codes and failure wording (`describe_failure`), observations once each. What differs is
where workers run: each node's `NodeAgent` starts them with the same supervisor and isolation, and this
backend talks to the agents asynchronously. `launch`, `stop` and `poll` never wait on a node: they send
actor calls and `poll` takes the answers that have arrived (`ray.wait(..., timeout=0)`), so a slow or dead
node never holds up the control loop.

A launch takes one round trip for a job on one node: the agent of rank 0's node leases a MASTER_PORT that
is free on that node and starts its workers with it; the agents of the job's other nodes start theirs when
that port is known (a second round trip). STARTED is reported once every worker's command runs.

A node lost (told by `RayFleet`, from Ray's own liveness) loses every job with a worker there: the job's
workers on its other nodes are killed and the job is reported LOST with `node NAME lost`, keeping the work
up to its last periodic checkpoint (the simulator's accounting). The LOST observations are held back by one
poll, so the loop has read the node as down before it puts the job back in its queue (it is never placed
on the dead node again).

A restart of the control plane adopts what the agents' files say runs (which workers, after how many resizes);
an attempt no agent has heard of (the control plane died between writing the launch and sending it) starts
then. A resize under way goes on: workers stopping for it keep stopping, and the new set starts (or, started on
rank 0's node only, starts on the others, with the port leased there) once the loop has asked for the resize
again, as it does at start for every job its store says is resizing.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.adapters.inbox import ObservationInbox
from gpufleet.adapters.local.executor import describe_failure, stopped_code
from gpufleet.adapters.local.isolation import WorkerSpec
from gpufleet.adapters.local.logs import LogRetention
from gpufleet.adapters.local.worker_env import allocator_env
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.jobs import JobId
from gpufleet.ports import BackendCapabilities, Clock, Launch, Observation, ObservationKind

if TYPE_CHECKING:
    from gpufleet.adapters.ray.ray_inventory import RayFleet

log = logging.getLogger(__name__)

SHUTDOWN_REASON = "the control plane shut down"
Key = tuple[JobId, int]
WorkerKey = tuple[str, int, int]
LOG_TIMEOUT_S = 10.0


@dataclass
class _Worker:
    rank: int
    node: str
    started_at: float | None = None  # when its command started (wall clock)
    pid: int | None = None
    exit: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        return self.exit is not None


@dataclass
class _Job:
    launch: Launch
    signal: int
    workers: list[_Worker]
    nodes: list[str]  # the job's nodes, rank 0's first
    started_nodes: set[str] = field(default_factory=set)  # nodes whose agent took its start call
    port: int | None = None
    started_reported: bool = False
    stop_reason: str | None = None
    stop_signal: int | None = None
    kill_at: float | None = None  # time.monotonic() of the SIGKILL deadline
    failure: tuple[int, str] | None = None
    lost: str | None = None
    checkpoint_at: float | None = None  # wall clock, for a job lost with its node
    lost_with_node: bool = False  # its LOST waits one poll (the loop reads the node as down first)
    resize_count: int = 0  # resizes of this attempt so far: `workers` are those after the last
    resizing: tuple[Launch, int] | None = None  # a resize under way (new placement, count): workers stopping
    resized_reported: bool = True  # False from the start of a resize's new workers until RESIZED
    # After a restart, workers found stopping for this resize: its new placement comes when the loop asks again.
    awaiting_resize: int | None = None
    half_started: bool = False  # after a restart, a resize's new set found started on only some of its nodes

    @property
    def key(self) -> Key:
        return (self.launch.job.id, self.launch.attempt)


@dataclass
class _FoundOnNode:
    """What one node's agent holds of an attempt after a restart: its latest workers (after `resize_count`
    resizes), the attempt's record there, those workers' states and their stop record."""

    resize_count: int
    record: dict[str, Any]
    states: list[Any] = field(default_factory=list)
    stop: dict[str, Any] | None = None


class RayBackend:
    """Runs jobs on the nodes of `fleet`. Observation times come from `clock`."""

    def __init__(
        self,
        fleet: RayFleet,
        clock: Clock,
        *,
        gang_grace_s: float = 5.0,
        status_every_s: float = 0.05,
        job_env: Callable[[JobId, int], Mapping[str, str]] | None = None,
    ):
        """`job_env(job id, attempt)`: variables the control plane gives every worker of that attempt (its
        progress-report URL and job token), set after the job's own and the allocator's, as on the local
        executor."""
        self.job_env = job_env
        self.fleet = fleet
        self.ray = fleet.ray
        self.clock = clock
        self.gang_grace_s = gang_grace_s
        self.status_every_s = status_every_s
        self._live: dict[Key, _Job] = {}
        self._inbox = ObservationInbox(clock)
        self._finished = self._inbox.finished
        self._held: list[Observation] = []  # LOST for a lost node: reported one poll later
        self._calls: dict[Any, tuple[str, str, Key | None]] = {}  # ref -> (what, node, job)
        self._status_due: dict[str, float] = {}
        self._status_out: dict[str, Any] = {}  # node -> its outstanding status call
        self._lost_nodes: list[str] = []
        self._lock = threading.Lock()  # guards _lost_nodes (the fleet's thread adds to it)
        self._pids: dict[WorkerKey, int] = {}  # for telemetry, replaced whole (read from another thread)
        self._pending_specs: dict[Key, dict[str, list[WorkerSpec]]] = {}  # specs of nodes not started yet

    @property
    def capabilities(self) -> BackendCapabilities:
        isolated = self.fleet.gpu_isolation()
        return BackendCapabilities(multi_node=True, gpu_isolation=isolated, checkpoint_signal=True, resize=True)

    # --- the port -------------------------------------------------------------------------------------

    def launch(self, launch: Launch) -> None:
        job = launch.job
        key = (job.id, launch.attempt)
        if key in self._live or key in self._finished:
            return
        run = job.run
        if run is None:
            self._finished.add(key)
            self._inbox.emit(key, ObservationKind.EXITED, exit_code=127, detail="the job has no command to run")
            return
        nodes = list(dict.fromkeys(w.node for w in launch.workers))
        try:
            specs = self._specs(launch, 0)
        except GpufleetError as exc:
            self._inbox.lose(key, str(exc))
            return
        signum = int(signal.Signals[run.checkpoint_signal])
        tracked = _Job(launch, signum, [_Worker(r, w.node) for r, w in enumerate(launch.workers)], nodes)
        self._live[key] = tracked
        self._start(tracked, specs)

    def _specs(self, launch: Launch, resize_count: int) -> list[WorkerSpec]:
        """Every worker's spec (MASTER_PORT still to come from rank 0's agent). Raises GpufleetError (a node
        lost, a placement this fleet cannot run)."""
        job, run = launch.job, launch.job.run
        assert run is not None
        nodes = list(dict.fromkeys(w.node for w in launch.workers))
        missing = [name for name in nodes if self.fleet.agent(name) is None]
        if missing:
            raise GpufleetError(f"node {missing[0]} lost")
        addresses = {name: self.fleet.address(name) for name in nodes}
        argv = ("/bin/sh", "-c", run.command[0]) if run.shell else tuple(run.command)
        granted = dict(self.job_env(job.id, launch.attempt)) if self.job_env is not None else {}
        known = self.fleet.nodes_by_name()
        return [
            WorkerSpec(
                job_id=job.id,
                attempt=launch.attempt,
                rank=rank,
                queue=job.queue,
                argv=argv,
                env={
                    **dict(run.env),
                    **allocator_env(
                        launch,
                        rank,
                        self.fleet.nodes_by_name(),
                        master_addr=addresses[nodes[0]],
                        master_port=0,  # set by rank 0's agent, which checks it is free on its node
                        emulated=self.fleet.is_emulated(placement.node),
                        node_addresses=addresses,
                        resize_count=resize_count,
                    ),
                    **granted,
                },
                workdir=run.workdir,
                cpu_milli=placement.cpu_milli,
                memory=placement.memory,
                gpus=tuple((s.index, self.fleet.gpu_uuid(placement.node, s.index)) for s in placement.gpus),
                run_as=launch.run_as,
                resize_count=resize_count,
                gpu_milli=sum(s.milli for s in placement.gpus),
                node_gpus=len(known[placement.node].gpus) if placement.node in known else 0,
                node_memory=known[placement.node].memory if placement.node in known else 0,
                memory_per_gpu=launch.memory_per_gpu,
                memory_no_gpu=launch.memory_no_gpu,
                disk=launch.disk,
            )
            for rank, placement in enumerate(launch.workers)
        ]

    def _start(self, job: _Job, specs: list[WorkerSpec]) -> None:
        """Ask rank 0's agent to start its workers; the other nodes start theirs once the port is known."""
        key = job.key
        self._pending_specs[key] = {name: [s for s in specs if job.workers[s.rank].node == name] for name in job.nodes}
        info = {"job_id": key[0], "attempt": key[1], "workers": len(specs), "nodes": job.nodes}
        master = self.fleet.agent(job.nodes[0])
        if master is None:
            job.lost = f"node {job.nodes[0]} lost"
            return
        self._call("start", job.nodes[0], key, master.start.remote(self._pending_specs[key][job.nodes[0]], info, True))

    def resize(self, launch: Launch, grace_s: float, resize_count: int) -> None:
        """Restart the attempt with `launch.workers` (see the port): the checkpoint signal to its workers on
        every node, SIGKILL after `grace_s`, then the new set started as a launch is (rank 0's node first).
        Ignored for an attempt not running here, stopping or failed, and for a count not above the last."""
        if not launch.workers:
            raise GpufleetError(
                f"cannot resize job {launch.job.id!r} to no workers", "stop it instead, or give at least one worker"
            )
        job = self._live.get((launch.job.id, launch.attempt))
        if job is None or job.stop_reason is not None or job.failure is not None or job.lost is not None:
            return
        if job.half_started and resize_count == job.resize_count:
            self._start_the_rest(job, launch)
            return
        if resize_count <= (job.resizing[1] if job.resizing is not None else job.resize_count):
            return
        if job.resizing is None and job.awaiting_resize is None and job.workers and all(w.done for w in job.workers):
            return  # it ended by itself first: the next poll reports that
        first = job.resizing is None
        job.resizing, job.awaiting_resize = (launch, resize_count), None
        if first:
            self._begin_stop(job, job.signal, grace_s, resize=resize_count)

    def stop(self, job_id: JobId, attempt: int, grace_s: float, reason: str) -> None:
        job = self._live.get((job_id, attempt))
        if job is None or job.stop_reason is not None:
            return
        if job.resizing is None and job.awaiting_resize is None and job.workers and all(w.done for w in job.workers):
            return
        job.resizing, job.awaiting_resize = None, None  # a stop wins over a resize under way
        if job.half_started:  # the workers not started yet never will be
            job.half_started = False
            for worker in job.workers:
                if not worker.node:
                    worker.exit = {"code": 0, "not_started": True, "ended_at": time.time()}
        job.stop_reason = reason or "stopped"
        self._begin_stop(job, job.signal, grace_s)

    def poll(self) -> Sequence[Observation]:
        out, self._held = self._held, []
        self._take_lost_nodes()
        self._take_answers()
        self._ask_status()
        for job in list(self._live.values()):
            self._watch(job)
        self._pids = {
            (job.launch.job.id, job.launch.attempt, w.rank): w.pid
            for job in self._live.values()
            for w in job.workers
            if w.pid is not None and not w.done
        }
        return out + self._inbox.take()

    def adopt(self, live: Sequence[Launch]) -> None:
        """Every agent is told which attempts to keep (and kills the rest); jobs on nodes that are gone are
        LOST. Waits for the agents' answers (at start, before the loop runs).

        Where an attempt's workers run, and after how many resizes, is what the agents' files say, not the
        launch: the store may hold a resize's placement before its workers start (a grow's) or the one before
        it (a shrink's). Workers stopping for a resize keep stopping; the resize goes on when the loop asks
        for it again (it does at start, for every job its store says is resizing)."""
        alive = self.fleet.alive()
        keep = [(launch.job.id, launch.attempt, None) for launch in live]
        answers = {name: self.fleet.agent_or_raise(name).adopt.remote(keep) for name in alive}
        answered: dict[str, Any] = {}
        for name, ref in answers.items():
            try:
                answered[name] = self.ray.get(ref, timeout=60)
            except Exception as exc:  # an agent that cannot answer: its node is as good as lost
                log.warning("agent of node %s did not answer adoption: %s", name, exc)
                self.fleet.report_unreachable(name)
        # What each node holds of each attempt: its latest workers' resize count, attempt record, states, stop.
        held: dict[Key, dict[str, _FoundOnNode]] = {}
        for name, (states, stops, records) in answered.items():
            for job_id, attempt, record in records:
                held.setdefault((job_id, attempt), {})[name] = _FoundOnNode(
                    int(record.get("resize_count") or 0), record
                )
            for state in states:
                found = held.get((state[0], state[1]), {}).get(name)
                if found is not None and state[6] == found.resize_count:
                    found.states.append(state)
            for job_id, attempt, record in stops:
                found = held.get((job_id, attempt), {}).get(name)
                if found is not None:
                    found.stop = record
        for launch in live:
            self._adopt_one(launch, held.get((launch.job.id, launch.attempt), {}), set(answered))

    def _adopt_one(self, launch: Launch, held: dict[str, _FoundOnNode], alive: set[str]) -> None:
        key = (launch.job.id, launch.attempt)
        run = launch.job.run
        signum = int(signal.Signals[run.checkpoint_signal]) if run is not None else int(signal.SIGTERM)
        generation = max((h.resize_count for h in held.values()), default=0)
        current = {name: h for name, h in held.items() if h.resize_count == generation}
        for name, h in held.items():
            if h.resize_count < generation:  # the workers before the last resize, ended: not watched any more
                agent = self.fleet.agent(name)
                if agent is not None:
                    agent.forget.remote(key[0], key[1], h.resize_count)
        record = next(iter(current.values())).record if current else {}
        nodes = [str(n) for n in record.get("nodes") or dict.fromkeys(w.node for w in launch.workers)]
        on = {int(state[2]): name for name, h in current.items() for state in h.states}
        size = int(record.get("workers") or len(launch.workers))
        workers = [_Worker(r, on.get(r, "")) for r in range(size)]  # "": not found on any node
        job = _Job(launch, signum, workers, nodes)
        job.started_nodes = set(current)
        job.resize_count, job.resized_reported = generation, generation == 0
        self._live[key] = job
        gone = [n for n in nodes if n not in alive]
        if gone:
            job.lost = f"node {gone[0]} lost while the control plane was down"
        elif not current:
            # Nothing of it ran on any node: the control plane died between writing the launch and sending it.
            # It starts now, as launched (an agent starts an attempt once, however often asked; one that gave
            # it up refuses, and the attempt is lost then).
            del self._live[key]
            self.launch(launch)
            return
        elif len(on) < size:
            master = current.get(nodes[0])
            if master is not None and master.record.get("port") is not None:
                # Started on rank 0's node and not yet on the others: they start with the rendezvous rank 0's node
                # leased; a resize's new set when the loop asks for the resize again, the attempt's first now.
                job.port, job.half_started = int(master.record["port"]), True
            else:
                job.lost = (
                    f"resize {generation}: its workers were being started when the control plane stopped"
                    if generation
                    else "never started on every node (control plane stopped during launch)"
                )
        for h in current.values():
            self._apply_states(h.states)
            stop = h.stop
            if stop is None or job.lost is not None:
                continue
            if stop.get("lost"):
                job.lost = str(stop["lost"])
            elif stop.get("reason"):
                if job.stop_reason is None:
                    job.stop_reason = str(stop["reason"])
                    job.stop_signal = int(stop.get("signal", signal.SIGTERM))
            elif stop.get("resize") is not None:
                # Stopping for a resize: they go on stopping (their agents hold the deadline), and the new set
                # starts once the loop has said again where it goes.
                job.stop_signal = int(stop.get("signal", signum))
                job.awaiting_resize = int(stop["resize"])
        for worker in job.workers:
            if worker.exit is not None and worker.exit.get("vanished") and job.lost is None:
                job.lost = "worker died while the control plane was down"
        if job.half_started and not generation and job.lost is None:
            if job.stop_signal is None:
                self._start_the_rest(job, launch)
            else:  # stopped before its other nodes started: they never will
                job.half_started = False
                for worker in job.workers:
                    if not worker.node:
                        worker.exit = {"code": 0, "not_started": True, "ended_at": time.time()}

    # --- beyond the port ------------------------------------------------------------------------------

    def node_lost(self, name: str) -> None:
        """Told by the fleet (from its own thread): node `name` is gone."""
        with self._lock:
            self._lost_nodes.append(name)

    def live_on(self, name: str) -> list[tuple[str, int, list[int]]]:
        """The attempts this backend runs on node `name` (job id, attempt, ranks there)."""
        found = []
        for job in list(self._live.values()):
            ranks = [w.rank for w in job.workers if w.node == name]
            if ranks and job.lost is None:
                found.append((job.launch.job.id, job.launch.attempt, ranks))
        return found

    def log_paths(self, job_id: JobId) -> list[Path]:
        """The job's logs on every node that answers, oldest attempt first."""
        refs = [agent.log_paths.remote(job_id) for _, agent in self.fleet.agents()]
        found: list[tuple[int, int, str]] = []
        for ref in refs:
            try:
                paths = self.ray.get(ref, timeout=LOG_TIMEOUT_S)
            except Exception:  # a node that does not answer: its logs are not listed
                continue
            for path in paths:
                p = Path(path)
                found.append((_number(p.parent.name, "attempt-"), _number(p.stem, "worker-"), path))
        return [Path(path) for _, _, path in sorted(found)]

    def read_log(
        self, path: Path, offset: int, limit: int, tail: int | None = None, since: float | None = None
    ) -> tuple[bytes, int, int]:
        """Read a log that `log_paths` listed, through the agent of the node it is on."""
        name = self.fleet.node_of_path(path)
        agent = self.fleet.agent(name) if name is not None else None
        if agent is None:
            raise GpufleetError(
                f"the log {path} is on node {name or '?'}, which is not reachable now",
                "read it when the node is back",
            )
        reading = agent.read_log.remote(str(path), offset, limit, tail, since)
        data, start, size = self.ray.get(reading, timeout=LOG_TIMEOUT_S)
        return data, start, size

    def prune_logs(self, retention: LogRetention, finished: Callable[[str], bool]) -> dict[str, int]:
        """Delete, on every node that answers, finished jobs' logs that `retention` no longer keeps (never a
        live job's). Called by the control plane's log janitor, from its own thread."""
        live = {job_id for job_id, _ in list(self._live)}
        total = {"jobs": 0, "bytes": 0}
        for name, agent in self.fleet.agents():
            try:
                logged = self.ray.get(agent.logged_jobs.remote(), timeout=LOG_TIMEOUT_S)
                done = [job_id for job_id in logged if job_id not in live and finished(job_id)]
                if done:
                    pruned = self.ray.get(agent.prune_logs.remote(retention, done), timeout=LOG_TIMEOUT_S)
                    total = {key: total[key] + pruned[key] for key in total}
            except Exception as error:  # the next round tries again
                log.warning("log retention on node %s: %s", name, error)
        return total

    def running_commands(self) -> dict[WorkerKey, int]:
        """The pid of each running worker's command, on its node (for emulated GPUs' process lists)."""
        return dict(self._pids)

    def owner_of(self, pids: Iterable[int]) -> dict[int, WorkerKey]:
        """The worker whose command has each pid (commands only, not their children)."""
        by_pid = {pid: key for key, pid in self._pids.items()}
        return {pid: by_pid[pid] for pid in pids if pid in by_pid}

    def shutdown(self, stop_jobs: bool, grace_s: float) -> None:
        """With `stop_jobs`, stop every job and wait for it; otherwise leave the jobs to their agents, for the
        next start to adopt."""
        if not stop_jobs:
            self._live.clear()
            return
        for job in list(self._live.values()):
            self.stop(job.launch.job.id, job.launch.attempt, grace_s, SHUTDOWN_REASON)
        deadline = time.monotonic() + grace_s + 10.0
        while self._live and time.monotonic() < deadline:
            self.poll()
            time.sleep(0.02)

    # --- talking to agents ----------------------------------------------------------------------------

    def _call(self, what: str, node: str, key: Key | None, ref: Any) -> None:
        self._calls[ref] = (what, node, key)

    def _take_answers(self) -> None:
        if not self._calls:
            return
        ready, _ = self.ray.wait(list(self._calls), num_returns=len(self._calls), timeout=0)
        for ref in ready:
            what, node, key = self._calls.pop(ref)
            try:
                answer = self.ray.get(ref, timeout=0)
            except Exception as exc:
                # An error raised in the agent arrives wrapped, its remote traceback in its text: say the cause.
                cause = getattr(exc, "cause", None)
                if isinstance(cause, GpufleetError):
                    self._failed_call(what, node, key, str(cause))
                    continue
                if isinstance(cause, OSError):
                    self._failed_call(what, node, key, f"cannot write its files there: {cause.strerror or cause}")
                    continue
                if _is_actor_gone(exc):
                    self.fleet.report_unreachable(node)
                    self._failed_call(what, node, key, f"node {node} lost")
                    continue
                log.warning("agent of node %s: %s failed: %s", node, what, exc)
                self._failed_call(what, node, key, f"node {node}: {what} failed: {exc}")
                continue
            if what == "status":
                self._status_out.pop(node, None)
                self._apply_states(answer)
            elif what == "start" and key is not None:
                self._started(key, node, answer)

    def _failed_call(self, what: str, node: str, key: Key | None, detail: str) -> None:
        if what == "status":
            self._status_out.pop(node, None)
            return
        job = self._live.get(key) if key is not None else None
        if job is not None and what == "start":
            job.started_nodes.add(node)  # it may have started some workers there: they are killed with the job
            if job.lost is None:
                job.lost = f"could not start on node {node}: {detail}"

    def _started(self, key: Key, node: str, port: int | None) -> None:
        job = self._live.get(key)
        specs = self._pending_specs.get(key, {})
        if job is None:
            if key in self._finished:  # it ended (lost) while this start was under way: nothing of it stays
                agent = self.fleet.agent(node)
                if agent is not None:
                    agent.kill.remote(key[0], key[1], "the attempt ended while it was starting here")
                    agent.forget.remote(key[0], key[1])
            return
        job.started_nodes.add(node)
        if node == job.nodes[0]:
            job.port = port
            rest = job.nodes[1:]
            if job.stop_signal is not None or job.lost is not None:
                # Stopped before the other nodes started: they never will.
                for worker in job.workers:
                    if worker.node in rest:
                        worker.exit = {"code": 0, "not_started": True, "ended_at": time.time()}
                rest = []
            info = {"job_id": key[0], "attempt": key[1], "workers": len(job.workers), "nodes": job.nodes}
            for name in rest:
                agent = self.fleet.agent(name)
                if agent is None:
                    job.lost = job.lost or f"node {name} lost"
                    continue
                with_port = [_with_port(s, port) for s in specs.get(name, [])]
                self._call("start", name, key, agent.start.remote(with_port, info, False))
        if job.stop_signal is not None and job.kill_at is not None:
            agent = self.fleet.agent(node)
            if agent is not None:  # a stop asked for while its start was under way
                left = max(0.0, job.kill_at - time.monotonic())
                agent.stop.remote(key[0], key[1], job.stop_signal, left, job.stop_reason)
        if job.started_nodes >= set(job.nodes):
            self._pending_specs.pop(key, None)

    def _ask_status(self) -> None:
        now = time.monotonic()
        for name, agent in self.fleet.agents():
            if name in self._status_out or now < self._status_due.get(name, 0.0):
                continue
            self._status_due[name] = now + self.status_every_s
            ref = agent.status.remote()
            self._status_out[name] = ref
            self._call("status", name, None, ref)

    def _apply_states(
        self, states: Sequence[tuple[str, int, int, float | None, int | None, dict[str, Any] | None, int]]
    ) -> None:
        for job_id, attempt, rank, started_at, pid, exit_record, resize_count in states:
            job = self._live.get((job_id, attempt))
            if job is None or rank >= len(job.workers) or resize_count != job.resize_count:
                continue  # (a worker of the attempt before its last resize)
            worker = job.workers[rank]
            if worker.done:
                continue
            worker.started_at = started_at if started_at is not None else worker.started_at
            worker.pid = pid if pid is not None else worker.pid
            worker.exit = exit_record

    def _take_lost_nodes(self) -> None:
        with self._lock:
            lost, self._lost_nodes = self._lost_nodes, []
        for name in lost:
            self._status_out.pop(name, None)
            for ref, (_, node, _) in list(self._calls.items()):
                if node == name:
                    del self._calls[ref]
            now = time.time()
            for job in self._live.values():
                if job.lost is None and any(w.node == name for w in job.workers):
                    job.checkpoint_at = _last_checkpoint(job, now)
                    job.lost = f"node {name} lost" + _work_lost(job.checkpoint_at, now)
                    job.lost_with_node = True

    # --- job rules ------------------------------------------------------------------------------------

    def _watch(self, job: _Job) -> None:
        key = job.key
        if not job.resized_reported and job.lost is None:
            refused = [w for w in job.workers if w.exit is not None and "error" in w.exit]
            if refused:  # a resize's new worker could not be started: the attempt cannot go on
                first = min(refused, key=lambda w: w.rank)
                assert first.exit is not None
                detail = describe_failure(first.rank, first.exit)[1]
                job.lost = f"resize {job.resize_count}: {detail} on node {first.node}"
        if job.lost is not None:
            self._kill_everywhere(job)
            self._finish(job)
            wall_checkpoint = job.checkpoint_at
            checkpoint = None
            if wall_checkpoint is not None:
                checkpoint = self.clock.now() - max(0.0, time.time() - wall_checkpoint)
            observation = Observation(
                key[0], key[1], ObservationKind.LOST, self.clock.now(), detail=job.lost, checkpoint_at=checkpoint
            )
            if job.lost_with_node:
                self._held.append(observation)  # the loop reads the node as down first
            else:
                self._inbox.add(observation)
            return
        if not job.started_reported and all(w.started_at is not None for w in job.workers):
            job.started_reported = True
            self._inbox.emit(key, ObservationKind.STARTED, wall=max(w.started_at or 0.0 for w in job.workers))
        if not job.resized_reported and all(w.started_at is not None for w in job.workers):
            job.resized_reported = True
            up = max(w.started_at or 0.0 for w in job.workers)
            self._inbox.emit(
                key,
                ObservationKind.RESIZED,
                wall=up,
                detail=f"resize {job.resize_count}",
                resize_count=job.resize_count,
            )
        resizing = job.resizing is not None or job.awaiting_resize is not None
        if job.stop_reason is None and job.failure is None and not resizing:
            self._check_failure(job)
        if not all(w.done for w in job.workers):
            return
        if job.resizing is not None:
            self._start_generation(job, *job.resizing)  # the old workers are gone: how they ended does not count
            return
        if job.awaiting_resize is not None:
            return  # the new placement is not known yet
        self._finish(job)
        ended = max((float(w.exit.get("ended_at", 0.0)) for w in job.workers if w.exit), default=0.0)
        wall = ended or None
        if job.stop_reason == SHUTDOWN_REASON:
            self._inbox.emit(key, ObservationKind.LOST, wall=wall, detail="stopped when the control plane shut down")
        elif job.stop_reason is not None:
            code = stopped_code(w.exit for w in sorted(job.workers, key=lambda w: w.rank))
            self._inbox.emit(key, ObservationKind.STOPPED, wall=wall, exit_code=code, detail=job.stop_reason)
        elif job.failure is not None:
            self._inbox.emit(key, ObservationKind.EXITED, wall=wall, exit_code=job.failure[0], detail=job.failure[1])
        else:
            self._inbox.emit(key, ObservationKind.EXITED, wall=wall, exit_code=0)

    def _check_failure(self, job: _Job) -> None:
        failed = [w for w in job.workers if w.exit is not None and int(w.exit.get("code", 0)) != 0]
        if not failed:
            return
        first = min(failed, key=lambda w: (float(w.exit.get("ended_at", 0.0)) if w.exit else 0.0, w.rank))
        assert first.exit is not None
        code, detail = describe_failure(first.rank, first.exit)
        job.failure = (code, f"{detail} on node {first.node}")
        if not all(w.done for w in job.workers):
            self._begin_stop(job, int(signal.SIGTERM), self.gang_grace_s)

    def _begin_stop(self, job: _Job, signum: int, grace_s: float, resize: int | None = None) -> None:
        grace_s = max(0.0, grace_s)
        if job.kill_at is not None:
            grace_s = min(grace_s, max(0.0, job.kill_at - time.monotonic()))
        job.stop_signal = signum
        job.kill_at = time.monotonic() + grace_s
        for name in job.started_nodes:
            agent = self.fleet.agent(name)
            if agent is not None:
                agent.stop.remote(job.key[0], job.key[1], signum, grace_s, job.stop_reason, resize)

    def _start_generation(self, job: _Job, launch: Launch, resize_count: int) -> None:
        """Start the new workers of a resize, every old one ended: the agents that ran the old ones tidy them
        up (only those: an agent may take the calls in another order), then the new set starts as a launch."""
        key = job.key
        for name in job.started_nodes:
            agent = self.fleet.agent(name)
            if agent is not None:
                agent.forget.remote(key[0], key[1], job.resize_count)
        job.launch, job.resizing, job.resize_count, job.resized_reported = launch, None, resize_count, False
        job.workers = [_Worker(r, w.node) for r, w in enumerate(launch.workers)]
        job.nodes = list(dict.fromkeys(w.node for w in launch.workers))
        job.started_nodes, job.port, job.stop_signal, job.kill_at = set(), None, None, None
        try:
            specs = self._specs(launch, resize_count)
        except GpufleetError as exc:
            job.lost = f"resize {resize_count}: {exc}"
            return
        self._start(job, specs)

    def _start_the_rest(self, job: _Job, launch: Launch) -> None:
        """Start the workers of the attempt's first set or of a resize's new one that a restart found not started
        (their nodes' start calls went with the control plane), at `launch`, with the MASTER_PORT rank 0's node
        leased for them."""
        job.half_started = False
        started = {w.rank for w in job.workers if w.node}
        which = f"resize {job.resize_count}: " if job.resize_count else ""
        if len(launch.workers) != len(job.workers) or any(
            launch.workers[r].node != job.workers[r].node for r in started
        ):
            job.lost = f"{which}its workers were being started when the control plane stopped"
            return
        try:
            specs = self._specs(launch, job.resize_count)
        except GpufleetError as exc:
            job.lost = f"{which}{exc}"
            return
        job.launch = launch
        job.workers = [w if w.rank in started else _Worker(w.rank, launch.workers[w.rank].node) for w in job.workers]
        info = {"job_id": job.key[0], "attempt": job.key[1], "workers": len(job.workers), "nodes": job.nodes}
        for name in dict.fromkeys(launch.workers[r].node for r in range(len(job.workers)) if r not in started):
            agent = self.fleet.agent(name)
            if agent is None:
                job.lost = f"node {name} lost"
                return
            mine = [_with_port(s, job.port) for s in specs if launch.workers[s.rank].node == name]
            self._call("start", name, job.key, agent.start.remote(mine, info, False))

    def _kill_everywhere(self, job: _Job) -> None:
        """Give the attempt up on every node told to start it: those that answered, and those whose start has
        not answered yet (the agent records the kill, so a start that runs after it there starts nothing)."""
        for name in job.started_nodes | self._starting_on(job.key):
            agent = self.fleet.agent(name)
            if agent is not None:
                agent.kill.remote(job.key[0], job.key[1], job.lost or "killed")

    def _starting_on(self, key: Key) -> set[str]:
        return {node for what, node, job in self._calls.values() if what == "start" and job == key}

    def _finish(self, job: _Job) -> None:
        key = job.key
        for name in job.started_nodes:
            agent = self.fleet.agent(name)
            if agent is not None:
                agent.forget.remote(key[0], key[1])
        self._live.pop(key, None)
        self._pending_specs.pop(key, None)
        self._finished.add(key)


def _with_port(spec: WorkerSpec, port: int | None) -> WorkerSpec:
    if port is None:
        return spec
    return dataclasses.replace(spec, env={**spec.env, "MASTER_PORT": str(port)})


def _last_checkpoint(job: _Job, now: float) -> float | None:
    """When the job last saved its work, as the simulator counts it: its periodic checkpoints since its
    workers started (none: the start). Work after it is lost with the node."""
    started = max((w.started_at for w in job.workers if w.started_at is not None), default=None)
    if started is None:
        return None
    interval = job.launch.job.checkpoint_interval
    if not interval:
        return started
    return started + ((now - started) // interval) * interval


def _work_lost(checkpoint_at: float | None, now: float) -> str:
    if checkpoint_at is None:
        return ""
    return f"; {now - checkpoint_at:.0f} s of work since its last checkpoint lost"


def _is_actor_gone(exc: BaseException) -> bool:
    return type(exc).__name__ in {"ActorDiedError", "RayActorError", "ActorUnavailableError", "ActorUnschedulableError"}


def _number(name: str, prefix: str) -> int:
    rest = name.removeprefix(prefix)
    return int(rest) if rest.isdigit() else 0


__all__ = ["RayBackend"]
