"""Order: quasi-shortest service first with durations learned online (after Helios' QSSF, Hu et al., SC 2021).

Helios predicts a job's run time from the history of similar jobs (same user, job name, GPU count) and
runs the job with the least predicted GPU service (run time x GPUs) first. Here there is no user or job
name to go by, so "similar" is what every gpufleet job has: its queue and its GPU count. The prediction
is the median run time of the last `window` finished jobs of the same (queue, GPUs) class; with fewer
than `min_samples` of those, of the queue's last finished jobs of any size; then of all queues'; with no
history at all, `prior_s`. The median of recent finishes follows bursts (a team submitting many short
runs, then long ones), which is where most of its ordering power comes from on Philly.

Never an oracle: `expected_duration` is not read. What a job ran is learned from what the plugin is
shown: it watches the running jobs of the states it is given (`state.holdings`) and, at the first job it
orders in a state with a later `now` than before, takes every job that ran earlier and no longer holds
resources as finished, with run time = now - start (+ any earlier attempts). A job being stopped (evicting) when last
seen counts as stopped, not finished. The run time learned is at most the time between two such looks
too long; only finished jobs count, so a prediction only ever uses jobs that ended before it is made.

A job's prediction is made once, the first time it is ordered (as Helios predicts at submission), and
kept, so its key does not move while it waits. A job that was preempted and waits again goes by the
service it still has to get; past its prediction, its total is assumed to be twice what it has had.

Within one (queue, GPUs) class predictions are equal at any moment, so such jobs go first in, first
out, unless they were submitted under different recent histories. Across sizes, smaller service goes
first (the key is predicted GPU-seconds); set `by_service=False` to order by predicted run time alone
(Helios' Philly runs).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import ClassVar

from gpufleet.domain.errors import FieldProblem, check
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.policies.order.fair_share import dominant_share
from gpufleet.scheduling.plugins import SortKey
from gpufleet.scheduling.state import CycleState

NAME = "qssf"
FAIR_NAME = "fair_qssf"
DEFAULT_WINDOW = 20
DEFAULT_MIN_SAMPLES = 3
DEFAULT_PRIOR_S = 3_600.0

ClassKey = tuple[str, float]  # (queue, GPUs)


@dataclass(frozen=True, slots=True)
class _Seen:
    """A running job as last seen: enough to learn its run time once it is gone."""

    queue: str
    gpus: float
    started_at: float
    earlier_s: float  # run time of earlier attempts (attained GPU-seconds / GPUs)
    evicting: bool


class _History:
    """The last `window` run times of one class, with their median kept until the next one comes."""

    __slots__ = ("_median", "runs")

    def __init__(self, window: int) -> None:
        self.runs: deque[float] = deque(maxlen=window)
        self._median: float | None = None

    def add(self, seconds: float) -> None:
        self.runs.append(seconds)
        self._median = None

    def median(self) -> float:
        if self._median is None:
            self._median = statistics.median(self.runs)
        return self._median


def _gpus(job: Job) -> float:
    return job.gpu_milli_total / MILLI_PER_GPU


class DurationPredictor:
    """Run times of finished jobs, learned from the running jobs of successive states; predicts a new job's.

    `learn(state)` takes the jobs that ran when last looked at and no longer hold resources as finished;
    `predict(job)` uses only what was learned so far. Deterministic: finished jobs are learned in order of
    (start time, id), whatever the order of the state's dictionaries.
    """

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        prior_s: float = DEFAULT_PRIOR_S,
    ) -> None:
        problems = []
        if window < 1:
            problems.append(FieldProblem("window", f"is {window}", "give 1 or more finished jobs"))
        if not 1 <= min_samples <= max(window, 1):
            problems.append(FieldProblem("min_samples", f"is {min_samples}", f"give 1 to window ({window})"))
        if not prior_s > 0:
            problems.append(FieldProblem("prior_s", f"is {prior_s}", "give seconds > 0"))
        check(problems, "qssf duration predictor")
        self.window = window
        self.min_samples = min_samples
        self.prior_s = prior_s
        self.running: dict[JobId, _Seen] = {}
        self.by_class: dict[ClassKey, _History] = {}
        self.by_queue: dict[str, _History] = {}
        self.overall = _History(window)
        self.learned = 0
        self.clock = float("-inf")  # `now` of the last state learned from

    def learn(self, state: CycleState) -> None:
        """Take what finished since the last look, and note what runs now. A state older than the last one
        looked at is ignored: its `now` would understate run times (a control loop's base state keeps the
        time it was built at; only the per-cycle forks carry the cycle's time)."""
        if state.now < self.clock:
            return
        self.clock = state.now
        holdings = state.holdings
        running = self.running
        gone = running.keys() - holdings.keys()
        if gone:
            for job_id in sorted(gone, key=lambda j: (running[j].started_at, j)):
                seen = running.pop(job_id)
                if not seen.evicting:
                    self.add(seen.queue, seen.gpus, seen.earlier_s + max(0.0, state.now - seen.started_at))
        evicting = state.evicting
        for job_id in holdings.keys() - running.keys():
            holding = holdings[job_id]
            run = holding.running
            if run is None:  # placed in this cycle: not started yet
                continue
            job = holding.job
            gpus = _gpus(job)
            running[job_id] = _Seen(
                job.queue,
                gpus,
                run.started_at,
                job.attained_gpu_seconds / gpus if gpus else 0.0,
                run.evicting_for is not None or job_id in evicting,
            )
        for job_id in evicting & running.keys():
            seen = running[job_id]
            if not seen.evicting:
                running[job_id] = _Seen(seen.queue, seen.gpus, seen.started_at, seen.earlier_s, True)

    def add(self, queue: str, gpus: float, seconds: float) -> None:
        """Record one finished job's run time."""
        window = self.window
        self.by_class.setdefault((queue, gpus), _History(window)).add(seconds)
        self.by_queue.setdefault(queue, _History(window)).add(seconds)
        self.overall.add(seconds)
        self.learned += 1

    def predict(self, job: Job) -> float:
        """Predicted run time (s) of `job`, from the most specific history with enough samples."""
        for history in (self.by_class.get((job.queue, _gpus(job))), self.by_queue.get(job.queue), self.overall):
            if history is not None and len(history.runs) >= self.min_samples:
                return history.median()
        return self.prior_s


class QuasiShortestServiceFirst:
    """Least predicted GPU service first, across all queues (no preemption of its own)."""

    name: ClassVar[str] = NAME

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        prior_s: float = DEFAULT_PRIOR_S,
        *,
        by_service: bool = True,
    ) -> None:
        self.predictor = DurationPredictor(window, min_samples, prior_s)
        self.by_service = by_service
        self.predicted: dict[JobId, float] = {}

    def predicted_seconds(self, job: Job, state: CycleState) -> float:
        """The run time predicted for `job` the first time it was ordered (learning first from `state`)."""
        predictor = self.predictor
        if state.now > predictor.clock:
            predictor.learn(state)
        predicted = self.predicted.get(job.id)
        if predicted is None:
            predicted = self.predicted[job.id] = predictor.predict(job)
        return predicted

    def remaining_service(self, job: Job, state: CycleState) -> float:
        """Predicted GPU-seconds (or seconds, without `by_service`) the job still needs."""
        predicted = self.predicted_seconds(job, state)
        gpus = _gpus(job)
        ran = job.attained_gpu_seconds / gpus if gpus else 0.0
        if ran > 0:
            predicted = max(predicted, 2.0 * ran) - ran
        return predicted * max(gpus, 1.0) if self.by_service else predicted

    def job_key(self, job: Job, state: CycleState) -> SortKey:
        return (-job.priority, self.remaining_service(job, state), job.submitted_at)

    def queue_key(self, queue: str, state: CycleState) -> SortKey:
        return ()


class FairShareQssf(QuasiShortestServiceFirst):
    """`fair_share` between queues (queues inside their quota first, then the smallest dominant share), and
    priority, then least predicted service, inside a queue."""

    name: ClassVar[str] = FAIR_NAME

    def queue_key(self, queue: str, state: CycleState) -> SortKey:
        return (int(state.ledger.over_nominal(queue)), dominant_share(queue, state))
