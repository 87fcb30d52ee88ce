"""Order: quasi-shortest service first with durations learned online (after Helios' QSSF, Hu et al., SC 2021).

Helios predicts a job's run time from the history of similar jobs (same user, job name, GPU count) and
runs the job with the least predicted GPU service (run time x GPUs) first. Here there is no user or job
name to go by, so "similar" is what every gpufleet job has: its queue and its GPU count. The prediction
is a low quantile (`q`, default 0.3) of the last `window` (20) run times of the same (queue, GPUs) class,
taken together with the run time so far of the class's jobs still running (`running_bound`); with fewer
than `min_samples` finished runs in the class, the queue's last finished runs of any size; then all
queues'; with no history at all, `prior_s`.

Why these choices (Philly, Oct-Nov 2017, Helios' VC cluster, arrivals compressed 8x; average JCT: strict
FIFO 63,777 s, FIFO with backfill 36,884 s, SJF with oracle durations 19,078 s, ratio 0.299):

- Recent history, not a long one: run times come in bursts (a team submits many short runs, then long
  ones), so the last 20 finishes of the class predict better than the last 40 or 50 (4-7% shorter JCT in
  a replay of the trace); the median of the last 20: 27,626 s.
- The running jobs of the class, at their run time so far: finished runs alone understate a class (its
  short runs finish first; under QSSF its long-predicted runs wait); a running job's run time so far is a
  lower bound of its own, which an online predictor can honestly know.
- A quantile below the median: a class is ranked by how short its typical jobs are (0.3: 26,739 s; with
  the running jobs: 26,627 s; 0.7 did worse, 28,181 s).
- These defaults, aging included, were the shortest of those tried on that window (the tuning data; what
  was compared is listed above and in `gpufleet.sim.tuned`). Their figures, on that window and on the months
  it was not tuned on, come from `gpufleet sim --reproduce helios-philly` (docs/results). The `default`
  profile adds LAS preemption inside a queue (`preempt/las.py`), which corrects the predictions that miss
  once a job has run long.

Differences under ~3% are noise on this trace (one ordering change early moves every later queue), so the
defaults were also checked, in an offline replay of the trace (each VC a GPU count, no node packing), at
load x6, x10 and x12 and on November and December: never worse than the median beyond that noise. Tried
in that replay and not kept, as they did no better: the mean, the geometric mean, a Kaplan-Meier quantile
treating running jobs as censored, the last finish alone, predictions by the submission order of the
class's jobs, classes split by the gap since the class's previous submission (or by a regular submission
cadence). The info that would order Philly much better (the run time of the job submitted just before in
the same class: 0.33 of FIFO in that replay) is not known when the job arrives, and its key is fixed then.

Never an oracle: `expected_duration` is not read. What a job ran is learned from what the plugin is
shown: it watches the running jobs of the states it is given (`state.holdings`) and, at the first job it
orders in a state with a later `now` than before, takes every job that ran earlier and no longer holds
resources as finished, with run time = now - start (+ any earlier attempts). A job being stopped (evicting)
when last seen counts as stopped, not finished. The run time learned is at most the time between two such
looks too long; only finished jobs count, so a prediction only ever uses jobs that ended before it is made.

A job's prediction is made once, the first time it is ordered (as Helios predicts at submission), and
kept, so its key does not move while it waits: the control loop keeps a pending job's key from intake.
A job that was preempted and waits again goes by the service it still has to get; past its prediction,
its total is assumed to be twice what it has had.

Starvation guard (`aging`, GPU-seconds credited per second waited): the key is predicted remaining service
+ aging x submitted_at. The wait (now - submitted_at) credit would be the same minus the `aging x now`
that every job shares, so keys never need recomputing. A job submitted at t0 with predicted service P
goes before every job of its priority submitted after t0 + P / aging. The default, 0.1 GPU-second per
second waited, lets a job predicted at one GPU-hour be overtaken by jobs submitted up to 10 hours after
it; on Philly x8 it costs nothing measurable (26,564 s vs 26,627 s without; 0.01 gave 27,294 s, noise of
the kind above; 1.0 with the median predictor 30,031 s vs 27,626 s: a real cost). It does not
shorten the longest waits there: those are large gangs that smaller jobs keep backfilling past, which only
a reservation for the queue head would fix.

Within one (queue, GPUs) class predictions made under the same history are equal, so such jobs go first
in, first out. Across sizes, smaller service goes first (the key is predicted GPU-seconds); set
`by_service=False` to order by predicted run time alone (Helios' Philly runs; 28,329 s here).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

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
DEFAULT_QUANTILE = 0.3
DEFAULT_RUNNING_BOUND = True
DEFAULT_AGING = 0.1

ClassKey = tuple[str, float]  # (queue, GPUs)


class Prediction(NamedTuple):
    """A job's predicted run time, the `submitted_at` it was made under, and the GPU-seconds it had attained
    then that earn it no credit (those of a reclaimed job)."""

    submitted_at: float
    seconds: float
    uncredited: float


@dataclass(frozen=True, slots=True)
class _Seen:
    """A running job as last seen: enough to learn its run time once it is gone."""

    queue: str
    gpus: float
    started_at: float
    earlier_s: float  # run time of earlier attempts (attained GPU-seconds / GPUs)
    evicting: bool


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values` (non-empty), interpolating linearly between order statistics; q=0.5 is the
    median."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    if low + 1 >= len(ordered):
        return ordered[-1]
    return ordered[low] + (ordered[low + 1] - ordered[low]) * (position - low)


class _History:
    """The last `window` run times of one class, with their quantile kept until the next one comes."""

    __slots__ = ("_cached", "runs")

    def __init__(self, window: int) -> None:
        self.runs: deque[float] = deque(maxlen=window)
        self._cached: tuple[float, float] | None = None  # (q, its quantile)

    def add(self, seconds: float) -> None:
        self.runs.append(seconds)
        self._cached = None

    def quantile(self, q: float) -> float:
        cached = self._cached
        if cached is None or cached[0] != q:
            cached = self._cached = (q, quantile(list(self.runs), q))
        return cached[1]


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
        *,
        q: float = DEFAULT_QUANTILE,
        running_bound: bool = DEFAULT_RUNNING_BOUND,
    ) -> None:
        problems = []
        if window < 1:
            problems.append(FieldProblem("window", f"is {window}", "give 1 or more finished jobs"))
        if not 1 <= min_samples <= max(window, 1):
            problems.append(FieldProblem("min_samples", f"is {min_samples}", f"give 1 to window ({window})"))
        if not prior_s > 0:
            problems.append(FieldProblem("prior_s", f"is {prior_s}", "give seconds > 0"))
        if not 0 < q < 1:
            problems.append(FieldProblem("q", f"is {q}", "give a quantile between 0 and 1 (0.5: the median)"))
        check(problems, "qssf duration predictor")
        self.window = window
        self.min_samples = min_samples
        self.prior_s = prior_s
        self.q = q
        self.running_bound = running_bound
        self.running: dict[JobId, _Seen] = {}
        self.running_by_class: dict[ClassKey, set[JobId]] = {}
        self.by_class: dict[ClassKey, _History] = {}
        self.by_queue: dict[str, _History] = {}
        self.overall = _History(window)
        self.learned = 0
        self.clock = float("-inf")  # `now` of the last state learned from
        self._log: list[JobId] | None = None  # the running log read last, and how far
        self._log_seen = 0

    def learn(self, state: CycleState) -> list[JobId]:
        """Take what finished since the last look, and note what runs now; return the jobs learned as finished.
        A state older than the last one looked at is ignored: its `now` would understate run times (a control
        loop's base state keeps the time it was built at; only the per-cycle forks carry the cycle's time)."""
        finished: list[JobId] = []
        if state.now < self.clock:
            return finished
        if state.now == self.clock:
            # Another state of the same moment (the loop's base, then its fork after this step's stop
            # requests): only which jobs are being stopped can differ, and a job stopped (a reclaimed one
            # too) must not be learned as finished when it is gone.
            self._note_evicting(state)
            return finished
        self.clock = state.now
        holdings = state.holdings
        running = self.running
        log = state.running_log
        if log is self._log:
            # The same control loop's base (or a fork of it): only jobs in its log since the last look changed.
            changed = log[self._log_seen :]
            gone = {j for j in changed if j in running and j not in holdings}
            new = [j for j in dict.fromkeys(changed) if j in holdings and j not in running]
        else:
            gone = running.keys() - holdings.keys()
            new = list(holdings.keys() - running.keys())
        self._log, self._log_seen = log, len(log)
        if gone:
            for job_id in sorted(gone, key=lambda j: (running[j].started_at, j)):
                seen = running.pop(job_id)
                self.running_by_class[(seen.queue, seen.gpus)].discard(job_id)
                if not seen.evicting:
                    self.add(seen.queue, seen.gpus, seen.earlier_s + max(0.0, state.now - seen.started_at))
                    finished.append(job_id)
        evicting = state.evicting
        for job_id in new:
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
            self.running_by_class.setdefault((job.queue, gpus), set()).add(job_id)
        self._note_evicting(state)
        return finished

    def _note_evicting(self, state: CycleState) -> None:
        running = self.running
        for job_id in state.evicting & running.keys():
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
        key = (job.queue, _gpus(job))
        own = self.by_class.get(key)
        if own is not None and len(own.runs) >= self.min_samples:
            return self._with_running(own, key) if self.running_bound else own.quantile(self.q)
        for history in (self.by_queue.get(job.queue), self.overall):
            if history is not None and len(history.runs) >= self.min_samples:
                return history.quantile(self.q)
        return self.prior_s

    def _with_running(self, history: _History, key: ClassKey) -> float:
        """The quantile of the class's finished run times together with the run time so far of its running
        jobs: a lower bound of theirs, which the finished ones alone miss (short runs finish first)."""
        ids = self.running_by_class.get(key)
        if not ids:
            return history.quantile(self.q)
        now = self.clock
        running = self.running
        so_far = [running[j].earlier_s + max(0.0, now - running[j].started_at) for j in ids]
        return quantile([*history.runs, *so_far], self.q)


class QuasiShortestServiceFirst:
    """Least predicted GPU service first, across all queues (no preemption of its own).

    `window`, `min_samples`, `prior_s`, `q`, `running_bound`: the `DurationPredictor`'s. `by_service`: order by
    predicted GPU-seconds (True) or run time. `aging`: credit per second waited, in the key's unit (GPU-seconds,
    or seconds without `by_service`); 0 turns the starvation guard off.
    """

    name: ClassVar[str] = NAME

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        prior_s: float = DEFAULT_PRIOR_S,
        *,
        by_service: bool = True,
        q: float = DEFAULT_QUANTILE,
        running_bound: bool = DEFAULT_RUNNING_BOUND,
        aging: float = DEFAULT_AGING,
    ) -> None:
        if not (aging >= 0 and math.isfinite(aging)):
            check(
                [FieldProblem("aging", f"is {aging}", "give the credit per second waited, >= 0 (0: no aging)")],
                "qssf order",
            )
        self.predictor = DurationPredictor(window, min_samples, prior_s, q=q, running_bound=running_bound)
        self.by_service = by_service
        self.aging = aging
        self.predicted: dict[JobId, Prediction] = {}
        self._last_state: CycleState | None = None

    def _prediction(self, job: Job, state: CycleState) -> Prediction:
        """`job`'s prediction, made the first time it is ordered (learning first from `state`). A job queued
        again with a new `submitted_at` (a reclaimed job goes to the back of its queue) is predicted afresh, as
        if submitted then, and what it ran before earns it no credit: it held its GPUs without using them, so
        it must not go straight back ahead of the jobs already waiting. A preempted job keeps its
        `submitted_at`, prediction and credit."""
        if state is not self._last_state:  # once per state: the first job it orders
            self._last_state = state
            for finished in self.predictor.learn(state):
                self.predicted.pop(finished, None)  # it will not be ordered again
        known = self.predicted.get(job.id)
        if known is None or known.submitted_at != job.submitted_at:
            uncredited = job.attained_gpu_seconds if known is not None else 0.0
            known = self.predicted[job.id] = Prediction(job.submitted_at, self.predictor.predict(job), uncredited)
        return known

    def remaining_service(self, job: Job, state: CycleState) -> float:
        """Predicted GPU-seconds (or seconds, without `by_service`) the job still needs."""
        prediction = self._prediction(job, state)
        predicted = prediction.seconds
        gpus = _gpus(job)
        ran = (job.attained_gpu_seconds - prediction.uncredited) / gpus if gpus else 0.0
        if ran > 0:
            predicted = max(predicted, 2.0 * ran) - ran
        return predicted * max(gpus, 1.0) if self.by_service else predicted

    def job_key(self, job: Job, state: CycleState) -> SortKey:
        return (
            -job.priority,
            self.remaining_service(job, state) + self.aging * job.submitted_at,
            job.submitted_at,
        )

    def queue_key(self, queue: str, state: CycleState) -> SortKey:
        return ()


class FairShareQssf(QuasiShortestServiceFirst):
    """`fair_share` between queues (queues inside their quota first, then the smallest dominant share), and
    priority, then least predicted service, inside a queue."""

    name: ClassVar[str] = FAIR_NAME

    def queue_key(self, queue: str, state: CycleState) -> SortKey:
        return (int(state.ledger.over_nominal(queue)), dominant_share(queue, state))
