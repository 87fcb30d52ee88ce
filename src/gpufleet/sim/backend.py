"""The simulated `ExecutionBackend`: jobs run for their trace duration, scaled by GPU-model speed.

Work is counted in seconds at reference speed. A launch takes `restart_penalty_s` extra when it is a
restart; a stopped (preempted) job keeps the work it had saved: all of it when it checkpoints on the
signal, else up to its last periodic checkpoint; what it loses is counted.
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


@dataclass
class _Run:
    attempt: int
    started: float
    speed: float
    penalty: float
    gpus: float


@dataclass
class BackendStats:
    launches: int = 0
    stops: int = 0
    lost_gpu_seconds: float = 0.0
    lost_work_seconds: float = 0.0
    penalty_gpu_seconds: float = 0.0
    done: dict[JobId, float] = field(default_factory=dict)


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
        self._running[job.id] = _Run(launch.attempt, now, speed, penalty, gpus)
        self.stats.launches += 1
        self.stats.penalty_gpu_seconds += penalty * gpus
        # Seen at the next step, whenever that is: an extra step at the same instant would change nothing.
        self._inbox.append(Observation(job.id, launch.attempt, ObservationKind.STARTED, now))
        total = self.work.get(job.id)
        if total is not None:
            remaining = max(0.0, total - self.stats.done.get(job.id, 0.0))
            end = now + penalty + remaining / speed
            self.schedule(end, Observation(job.id, launch.attempt, ObservationKind.EXITED, end, exit_code=0))

    def stop(self, job_id: JobId, attempt: int, grace_s: float, reason: str) -> None:
        run = self._running.get(job_id)
        if run is None or run.attempt != attempt:
            return
        now = self.clock.now()
        del self._running[job_id]
        self.stats.stops += 1
        progress = max(0.0, now - run.started - run.penalty) * run.speed
        total = self.work.get(job_id)
        done_before = self.stats.done.get(job_id, 0.0)
        if total is not None:
            progress = min(progress, max(0.0, total - done_before))
        saved = progress if self.settings.checkpoint_on_signal else 0.0
        self.stats.done[job_id] = done_before + saved
        lost = progress - saved
        self.stats.lost_work_seconds += lost
        self.stats.lost_gpu_seconds += lost / run.speed * run.gpus
        at = now + min(self.settings.stop_delay_s, grace_s)
        self.schedule(at, Observation(job_id, attempt, ObservationKind.STOPPED, at, checkpoint_at=at))

    def deliver(self, observation: Observation) -> None:
        """The engine hands over an observation whose time has come (stale exits are dropped)."""
        if observation.kind is ObservationKind.EXITED:
            run = self._running.get(observation.job_id)
            if run is None or run.attempt != observation.attempt:
                return
            del self._running[observation.job_id]
            self.stats.done[observation.job_id] = self.work.get(observation.job_id) or 0.0
        self._inbox.append(observation)

    def adopt(self, live: Sequence[Launch]) -> None:
        """The simulator starts with nothing running: there is nothing to adopt."""

    def poll(self) -> Sequence[Observation]:
        out, self._inbox = self._inbox, []
        return out


def constant_speed(job: Job, workers: tuple[WorkerPlacement, ...]) -> float:
    return 1.0
