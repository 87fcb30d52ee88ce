"""The simulated `ExecutionBackend`: jobs run for their trace duration, scaled by GPU-model speed.

Work is counted in seconds at reference speed. A launch takes `restart_penalty_s` extra when it is a
restart; a stopped (preempted) job keeps the work it had saved: all of it when it checkpoints on the
signal, else up to its last periodic checkpoint; what it loses is counted. A node failure
(`fail_node`) gives no signal: every job with a worker on the node is reported LOST and keeps only the
work up to its last periodic checkpoint (`checkpoint_every_s` of run time; None: none during the
attempt, so the whole attempt is lost).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpufleet.domain.cluster import WorkerPlacement
from gpufleet.domain.jobs import Job, JobId
from gpufleet.ports import BackendCapabilities, Clock, Launch, Observation, ObservationKind

Speed = Callable[[Job, tuple[WorkerPlacement, ...]], float]
Schedule = Callable[[float, Observation], None]


@dataclass(frozen=True)
class BackendSettings:
    restart_penalty_s: float = 30.0
    stop_delay_s: float = 0.0
    checkpoint_on_signal: bool = True
    checkpoint_every_s: float | None = None  # periodic checkpoints, in seconds of an attempt's run time
    # Jobs that declare a checkpoint interval checkpoint at it (others as `checkpoint_every_s` says).
    per_job_checkpoints: bool = False


@dataclass(frozen=True)
class FailureLoss:
    """One job attempt lost to a node failure: the work (reference seconds) and GPU-seconds it lost."""

    job_id: JobId
    attempt: int
    lost_work_s: float
    lost_gpu_s: float


@dataclass
class _Run:
    attempt: int
    started: float
    speed: float
    penalty: float
    gpus: float
    checkpoint_every_s: float | None = None


@dataclass
class BackendStats:
    launches: int = 0
    stops: int = 0
    lost_gpu_seconds: float = 0.0
    lost_work_seconds: float = 0.0
    penalty_gpu_seconds: float = 0.0
    done: dict[JobId, float] = field(default_factory=dict)
    # Node failures (their losses are also in lost_work_seconds / lost_gpu_seconds, which cover both causes).
    node_failures: int = 0
    jobs_lost_to_failures: int = 0
    failure_lost_work_seconds: float = 0.0
    failure_lost_gpu_seconds: float = 0.0


class SimulatedBackend:
    capabilities = BackendCapabilities(multi_node=True, gpu_isolation=True, checkpoint_signal=True)

    def __init__(
        self,
        clock: Clock,
        schedule: Schedule,
        work: dict[JobId, float | None],
        speed: Speed,
        settings: BackendSettings | None = None,
    ) -> None:
        self.clock = clock
        self.schedule = schedule
        self.work = work
        self.speed = speed
        self.settings = settings or BackendSettings()
        self.stats = BackendStats()
        self._running: dict[JobId, _Run] = {}
        self._nodes_of: dict[JobId, frozenset[str]] = {}
        self._inbox: list[Observation] = []

    def launch(self, launch: Launch) -> None:
        job = launch.job
        run = self._running.get(job.id)
        if run is not None and run.attempt == launch.attempt:
            return
        now = self.clock.now()
        penalty = self.settings.restart_penalty_s if launch.attempt > 1 else 0.0
        gpus = sum(s.milli for w in launch.workers for s in w.gpus) / 1000.0
        speed = max(self.speed(job, launch.workers), 1e-9)
        every = self.settings.checkpoint_every_s
        if self.settings.per_job_checkpoints and job.checkpoint_interval is not None:
            every = job.checkpoint_interval
        self._running[job.id] = _Run(launch.attempt, now, speed, penalty, gpus, every)
        self._nodes_of[job.id] = frozenset(w.node for w in launch.workers)
        self.stats.launches += 1
        self.stats.penalty_gpu_seconds += penalty * gpus
        # Seen at the next step, whenever that is: an extra step at the same instant would change nothing.
        self._inbox.append(Observation(job.id, launch.attempt, ObservationKind.STARTED, now))
        total = self.work.get(job.id)
        if total is not None:
            remaining = max(0.0, total - self.stats.done.get(job.id, 0.0))
            end = now + penalty + remaining / speed
            self.schedule(end, Observation(job.id, launch.attempt, ObservationKind.EXITED, end, exit_code=0))

    def _progress(self, job_id: JobId, run: _Run, now: float) -> float:
        """Work (reference seconds) this attempt did, capped at what was left to do."""
        progress = max(0.0, now - run.started - run.penalty) * run.speed
        total = self.work.get(job_id)
        if total is not None:
            progress = min(progress, max(0.0, total - self.stats.done.get(job_id, 0.0)))
        return progress

    def _periodic_saved(self, run: _Run, now: float, progress: float) -> tuple[float, float | None]:
        """Work saved by periodic checkpoints up to `now`, and when the last one was (None: none yet)."""
        every = run.checkpoint_every_s
        if every is None or every <= 0:
            return 0.0, None
        checkpoints = int(max(0.0, now - run.started - run.penalty) // every)
        if not checkpoints:
            return 0.0, None
        return min(progress, checkpoints * every * run.speed), run.started + run.penalty + checkpoints * every

    def _forget(self, job_id: JobId) -> None:
        del self._running[job_id]
        self._nodes_of.pop(job_id, None)

    def stop(self, job_id: JobId, attempt: int, grace_s: float, reason: str) -> None:
        run = self._running.get(job_id)
        if run is None or run.attempt != attempt:
            return
        now = self.clock.now()
        self._forget(job_id)
        self.stats.stops += 1
        progress = self._progress(job_id, run, now)
        saved = progress if self.settings.checkpoint_on_signal else self._periodic_saved(run, now, progress)[0]
        self.stats.done[job_id] = self.stats.done.get(job_id, 0.0) + saved
        lost = progress - saved
        self.stats.lost_work_seconds += lost
        self.stats.lost_gpu_seconds += lost / run.speed * run.gpus
        at = now + min(self.settings.stop_delay_s, grace_s)
        self.schedule(at, Observation(job_id, attempt, ObservationKind.STOPPED, at, checkpoint_at=at))

    def fail_node(self, node: str, reason: str) -> list[FailureLoss]:
        """The node died: every job running with a worker on it is lost now (no checkpoint signal), keeping
        the work up to its last periodic checkpoint. Returns what each lost, in job-id order."""
        now = self.clock.now()
        self.stats.node_failures += 1
        losses: list[FailureLoss] = []
        for job_id in sorted(j for j, nodes in self._nodes_of.items() if node in nodes):
            run = self._running[job_id]
            self._forget(job_id)
            progress = self._progress(job_id, run, now)
            saved, checkpoint_at = self._periodic_saved(run, now, progress)
            self.stats.done[job_id] = self.stats.done.get(job_id, 0.0) + saved
            lost = progress - saved
            lost_gpu = lost / run.speed * run.gpus
            self.stats.lost_work_seconds += lost
            self.stats.lost_gpu_seconds += lost_gpu
            self.stats.jobs_lost_to_failures += 1
            self.stats.failure_lost_work_seconds += lost
            self.stats.failure_lost_gpu_seconds += lost_gpu
            losses.append(FailureLoss(job_id, run.attempt, lost, lost_gpu))
            self._inbox.append(
                Observation(
                    job_id,
                    run.attempt,
                    ObservationKind.LOST,
                    now,
                    detail=f"node {node} failed: {reason}",
                    checkpoint_at=checkpoint_at,
                )
            )
        return losses

    def deliver(self, observation: Observation) -> None:
        """The engine hands over an observation whose time has come (stale exits are dropped)."""
        if observation.kind is ObservationKind.EXITED:
            run = self._running.get(observation.job_id)
            if run is None or run.attempt != observation.attempt:
                return
            self._forget(observation.job_id)
            self.stats.done[observation.job_id] = self.work.get(observation.job_id) or 0.0
        self._inbox.append(observation)

    def adopt(self, live: Sequence[Launch]) -> None:
        """The simulator starts with nothing running: there is nothing to adopt."""

    def poll(self) -> Sequence[Observation]:
        out, self._inbox = self._inbox, []
        return out
