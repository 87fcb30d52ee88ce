"""The simulated `ExecutionBackend`: jobs run for their trace duration, scaled by GPU-model speed.

Work is counted in seconds at reference speed. A launch takes `restart_penalty_s` extra when it is a
restart; a stopped (preempted) job keeps the work it had saved: all of it when it checkpoints on the
signal, else up to its last periodic checkpoint; what it loses is counted. A node failure
(`fail_node`) gives no signal: every job with a worker on the node is reported LOST and keeps only the
work up to its last periodic checkpoint (`checkpoint_every_s` of run time; None: none during the
attempt, so the whole attempt is lost).

A resize (`resize`) keeps the work done (the checkpoint signal saves it), costs `restart_penalty_s` without
progress, and goes on at the new placement's speed; RESIZED is reported at once. Jobs a `WorkModel` covers
(Pollux's applications, `sim/elastic_work.py`) do their work at the rate the model gives for their size and
point of training instead of a constant speed, and report their progress (samples, gradient statistics)
through `reporter` every `report_every_s` of run time, as a job calling `gpufleet.runtime.report` would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpufleet.domain.cluster import WorkerPlacement
from gpufleet.domain.jobs import Job, JobId
from gpufleet.ports import BackendCapabilities, Clock, Launch, Observation, ObservationKind

Speed = Callable[[Job, tuple[WorkerPlacement, ...]], float]
Schedule = Callable[[float, Observation], None]


class WorkModel(Protocol):
    """How a job's work (in the model's own units) advances at a placement: for jobs whose rate changes as they
    train (statistical efficiency) and with their GPUs. `layout`: the whole GPUs the job holds on each node
    it runs on, in the order of the nodes' names (its GPU count is their sum)."""

    def covers(self, job: Job) -> bool: ...

    def total(self, job: Job) -> float:
        """The job's whole work."""
        ...

    def seconds(self, job: Job, layout: tuple[int, ...], done: float) -> float:
        """Seconds of computing at `layout` from `done` to the end."""
        ...

    def done_after(self, job: Job, layout: tuple[int, ...], done: float, seconds: float) -> float:
        """Work done after computing `seconds` at `layout` from `done` (at most `total`)."""
        ...

    def samples_per_s(self, job: Job, layout: tuple[int, ...], done: float) -> float:
        """Samples the job processes per second at `layout`, at `done`."""
        ...

    def gradient(self, job: Job, layout: tuple[int, ...], done: float) -> tuple[float, float]:
        """(squared norm, variance) of the job's gradient at its batch at `layout`, at `done`."""
        ...

    def counts(self, job: Job, layout: tuple[int, ...], start: float, end: float) -> tuple[float, float]:
        """(samples, steps) the job processes at `layout` from work `start` to `end`."""
        ...

    def batch(self, job: Job, layout: tuple[int, ...], done: float) -> tuple[float, float, float, float]:
        """(total batch now, least and largest total batch it may choose, largest per GPU) at `layout`, at
        `done`."""
        ...


# (job, attempt, GPUs, time, fields of a progress report): one progress report of a running job.
Reporter = Callable[[JobId, int, int, float, Mapping[str, float]], None]


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
    job: Job | None = None  # set for jobs a WorkModel covers
    whole_gpus: int = 0
    layout: tuple[int, ...] = ()  # whole GPUs per node, in node-name order (model jobs)
    done_before: float = 0.0  # work done before this run began (model jobs)
    samples_before: float = 0.0
    steps_before: float = 0.0
    resizes: int = 0
    ends_at: float | None = None
    reported_at: float | None = None


@dataclass
class BackendStats:
    launches: int = 0
    resizes: int = 0
    resize_gpu_seconds: float = 0.0  # GPU-seconds spent restarting after resizes (also in penalty_gpu_seconds)
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
    capabilities = BackendCapabilities(multi_node=True, gpu_isolation=True, checkpoint_signal=True, resize=True)
    report_every_s = 300.0

    def __init__(
        self,
        clock: Clock,
        schedule: Schedule,
        work: dict[JobId, float | None],
        speed: Speed,
        settings: BackendSettings | None = None,
        model: WorkModel | None = None,
        reporter: Reporter | None = None,
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
        self.model = model
        self.reporter = reporter
        self._samples: dict[JobId, float] = {}
        self._steps: dict[JobId, float] = {}

    def launch(self, launch: Launch) -> None:
        job = launch.job
        run = self._running.get(job.id)
        if run is not None and run.attempt == launch.attempt:
            return
        now = self.clock.now()
        penalty = self.settings.restart_penalty_s if launch.attempt > 1 else 0.0
        self.stats.launches += 1
        self._start(launch, now, penalty)
        # Seen at the next step, whenever that is: an extra step at the same instant would change nothing.
        self._inbox.append(Observation(job.id, launch.attempt, ObservationKind.STARTED, now))

    def _start(self, launch: Launch, now: float, penalty: float, resizes: int = 0) -> None:
        """Run the attempt at `launch.workers` from `now` (after `penalty` s of restart) to its end."""
        job = launch.job
        gpus = sum(s.milli for w in launch.workers for s in w.gpus) / 1000.0
        covered = self.model is not None and self.model.covers(job)
        speed = 1.0 if covered else max(self.speed(job, launch.workers), 1e-9)
        every = self.settings.checkpoint_every_s
        if self.settings.per_job_checkpoints and job.checkpoint_interval is not None:
            every = job.checkpoint_interval
        done = self.stats.done.get(job.id, 0.0)
        run = _Run(launch.attempt, now, speed, penalty, gpus, every, resizes=resizes)
        if covered:
            run.job, run.whole_gpus, run.done_before = job, round(gpus), done
            run.layout = _layout(launch.workers)
            run.samples_before = self._samples.get(job.id, 0.0)
            run.steps_before = self._steps.get(job.id, 0.0)
        self._running[job.id] = run
        self._nodes_of[job.id] = frozenset(w.node for w in launch.workers)
        self.stats.penalty_gpu_seconds += penalty * gpus
        total = self._total(job)
        if total is not None:
            if run.job is not None and self.model is not None:
                compute = self.model.seconds(job, run.layout, done)
            else:
                compute = max(0.0, total - done) / speed
            end = run.ends_at = now + penalty + compute
            self.schedule(end, Observation(job.id, launch.attempt, ObservationKind.EXITED, end, exit_code=0))

    def _total(self, job: Job) -> float | None:
        if self.model is not None and self.model.covers(job):
            return self.model.total(job)
        return self.work.get(job.id)

    def resize(self, launch: Launch, grace_s: float, resize_count: int) -> None:
        """The attempt keeps its work (checkpointed on the signal), restarts at the new placement after the
        restart penalty, and RESIZED is reported at once. Idempotent per (job, attempt, resize_count)."""
        job = launch.job
        run = self._running.get(job.id)
        if run is None or run.attempt != launch.attempt or run.resizes >= resize_count:
            return
        now = self.clock.now()
        self._report_until(job.id, run, now)
        self._save(job.id, run, now)
        penalty = self.settings.restart_penalty_s
        self.stats.resizes += 1
        gpus = sum(s.milli for w in launch.workers for s in w.gpus) / 1000.0
        self.stats.resize_gpu_seconds += penalty * gpus
        self._start(launch, now, penalty, resize_count)
        self._inbox.append(Observation(job.id, launch.attempt, ObservationKind.RESIZED, now))

    def _save(self, job_id: JobId, run: _Run, now: float) -> None:
        """The run's work so far is kept (a checkpoint on the signal, or its last periodic one)."""
        progress = self._progress(job_id, run, now)
        saved = progress if self.settings.checkpoint_on_signal else self._periodic_saved(run, now, progress)[0]
        self.stats.done[job_id] = self.stats.done.get(job_id, 0.0) + saved
        if run.job is not None and self.model is not None:
            samples, steps = self.model.counts(run.job, run.layout, run.done_before, run.done_before + progress)
            self._samples[job_id] = run.samples_before + samples
            self._steps[job_id] = run.steps_before + steps
        lost = progress - saved
        self.stats.lost_work_seconds += lost
        self.stats.lost_gpu_seconds += lost / run.speed * run.gpus

    @staticmethod
    def _computed(run: _Run, now: float) -> float:
        return max(0.0, now - run.started - run.penalty)

    def report_until(self, now: float) -> None:
        """Running jobs of the work model report their progress up to `now` (every `report_every_s`)."""
        if self.reporter is None or self.model is None:
            return
        for job_id, run in sorted(self._running.items()):
            if run.job is not None:
                self._report_until(job_id, run, now)

    def _report_until(self, job_id: JobId, run: _Run, now: float) -> None:
        model, job, reporter = self.model, run.job, self.reporter
        if model is None or job is None or reporter is None:
            return
        every = self.report_every_s
        begin = run.started + run.penalty
        at = begin if run.reported_at is None else run.reported_at + every
        total = model.total(job)
        while at <= now:
            computed = at - begin
            done = model.done_after(job, run.layout, run.done_before, computed)
            if done >= total:
                break
            sqr, var = model.gradient(job, run.layout, done)
            samples, steps = model.counts(job, run.layout, run.done_before, done)
            batch, least, most, local = model.batch(job, run.layout, done)
            values = {
                "samples": run.samples_before + samples,
                "step": float(int(run.steps_before + steps)),
                "grad_sqr": sqr,
                "grad_var": var,
                "batch": batch,
                "min_batch": least,
                "max_batch": most,
                "max_local_batch": local,
                "gpus": float(run.whole_gpus),
                "nodes": float(len(run.layout)),
            }
            reporter(job_id, run.attempt, run.whole_gpus, at, values)
            run.reported_at = at
            at += every

    def _progress(self, job_id: JobId, run: _Run, now: float) -> float:
        """Work (reference seconds, or the model's units) this attempt did, capped at what was left to do."""
        if run.job is not None and self.model is not None:
            after = self.model.done_after(run.job, run.layout, run.done_before, self._computed(run, now))
            return max(0.0, after - run.done_before)
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
        self._report_until(job_id, run, now)
        self._forget(job_id)
        self.stats.stops += 1
        self._save(job_id, run, now)
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
            if run is None or run.attempt != observation.attempt or run.ends_at != observation.at:
                return  # an earlier attempt's end, or the end planned before a resize
            self._report_until(observation.job_id, run, observation.at)
            self._forget(observation.job_id)
            total = self._total(run.job) if run.job is not None else self.work.get(observation.job_id)
            self.stats.done[observation.job_id] = total or 0.0
        self._inbox.append(observation)

    def adopt(self, live: Sequence[Launch]) -> None:
        """The simulator starts with nothing running: there is nothing to adopt."""

    def poll(self) -> Sequence[Observation]:
        out, self._inbox = self._inbox, []
        return out


def _layout(workers: tuple[WorkerPlacement, ...]) -> tuple[int, ...]:
    """Whole GPUs per node the workers hold, in the order of the nodes' names."""
    per_node: dict[str, float] = {}
    for worker in workers:
        per_node[worker.node] = per_node.get(worker.node, 0.0) + sum(share.milli for share in worker.gpus) / 1000.0
    return tuple(round(per_node[node]) for node in sorted(per_node))
