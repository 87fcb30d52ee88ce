"""Order: quasi-shortest service first with durations learned online (after Helios' QSSF, Hu et al., SC 2021).

Helios predicts a job's run time from the history of similar jobs (same user, job name, GPU count) and
runs the job with the least predicted GPU service (run time x GPUs) first. Here there is no user or job
name to go by, so "similar" is what every gpufleet job has: its queue and its GPU count. The prediction
is a low quantile (`q`, default 0.3) of the last `window` (20) run times of the same (queue, GPUs) class,
taken together with the run time so far of the class's jobs still running (`running_bound`); with fewer
than `min_samples` finished runs in the class, the queue's last finished runs of any size; then all
queues'; with no history at all, `prior_s`.

Why these choices (Philly, Oct-Nov 2017, Helios' VC cluster, arrivals compressed 8x; average JCT: strict
FIFO 63,777 s, FIFO with backfill 36,884 s, SJF with oracle durations 19,078 s, ratio 0.299; the QSSF
figures below were measured while the learner still ran inside the cycle, see docs/ARCHITECTURE.md):

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

Never an oracle: `expected_duration` is not read. Run times are learned by `RunTimeLearner`, outside the
cycle: the control loop tells it when a job starts holding resources and when it releases them, and whether
it ran to its own end (exited) or was stopped, preempted or lost; a run that ended on its own is learned
with run time = its end - its start (+ any earlier attempts), at the time the loop saw it end. Only
finished runs count, so a prediction only ever uses jobs that ended before it is made.

A job's prediction is made once, when it becomes pending (as Helios predicts at submission), and kept, so its
key does not move while it waits: the loop hands it to every cycle as data (`ClusterView.estimates`), and the
order plugin reads it there. A job no learner predicted (a cycle run on its own) counts at `prior_s`.
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
from typing import ClassVar

from gpufleet.domain.errors import FieldProblem, check
from gpufleet.domain.jobs import Job, JobId, RunningJob
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.policies.order.fair_share import dominant_share
from gpufleet.scheduling.plugin_api import ClusterView, RunEstimate, SortKey

NAME = "qssf"
FAIR_NAME = "fair_qssf"
DEFAULT_WINDOW = 20
DEFAULT_MIN_SAMPLES = 3
DEFAULT_PRIOR_S = 3_600.0
DEFAULT_QUANTILE = 0.3
DEFAULT_RUNNING_BOUND = True
DEFAULT_AGING = 0.1

ClassKey = tuple[str, float]  # (queue, GPUs)


@dataclass(frozen=True, slots=True)
class _Seen:
    """A running job as it started: enough to learn its run time once it ends."""

    queue: str
    gpus: float
    started_at: float
    earlier_s: float  # run time of earlier attempts (attained GPU-seconds / GPUs)


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
    """Run times of finished jobs, and of the jobs running now so far; predicts a new job's.

    `started(run)` notes a job that began holding resources; `ended(job_id, now, finished=...)` learns its run
    time if it ran to its own end; `predict(job, now)` uses only what was learned so far.
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
        # A class's quantile with its running jobs, at one time: every job that becomes pending in one loop step
        # is predicted at the same time, and sorting the class's runs once per job was most of a step's intake.
        # Dropped for a class whenever its runs or its running jobs change.
        self._with_running_at: dict[ClassKey, tuple[float, float]] = {}  # class -> (now, its quantile)

    def started(self, run: RunningJob) -> None:
        """A job began holding resources (a job already running is kept as first seen)."""
        if run.id in self.running:
            return
        job = run.job
        gpus = _gpus(job)
        self.running[run.id] = _Seen(job.queue, gpus, run.started_at, job.attained_gpu_seconds / gpus if gpus else 0.0)
        self.running_by_class.setdefault((job.queue, gpus), set()).add(run.id)
        self._with_running_at.pop((job.queue, gpus), None)

    def ended(self, job_id: JobId, now: float, *, finished: bool) -> None:
        """A job released its resources at `now`; its run is learned if it `finished` (exited on its own)."""
        seen = self.running.pop(job_id, None)
        if seen is None:
            return
        self.running_by_class[(seen.queue, seen.gpus)].discard(job_id)
        self._with_running_at.pop((seen.queue, seen.gpus), None)
        if finished:
            self.add(seen.queue, seen.gpus, seen.earlier_s + max(0.0, now - seen.started_at))

    def add(self, queue: str, gpus: float, seconds: float) -> None:
        """Record one finished job's run time."""
        window = self.window
        self.by_class.setdefault((queue, gpus), _History(window)).add(seconds)
        self._with_running_at.pop((queue, gpus), None)
        self.by_queue.setdefault(queue, _History(window)).add(seconds)
        self.overall.add(seconds)
        self.learned += 1

    def predict(self, job: Job, now: float) -> float:
        """Predicted run time (s) of `job` at `now`, from the most specific history with enough samples."""
        key = (job.queue, _gpus(job))
        own = self.by_class.get(key)
        if own is not None and len(own.runs) >= self.min_samples:
            return self._with_running(own, key, now) if self.running_bound else own.quantile(self.q)
        for history in (self.by_queue.get(job.queue), self.overall):
            if history is not None and len(history.runs) >= self.min_samples:
                return history.quantile(self.q)
        return self.prior_s

    def _with_running(self, history: _History, key: ClassKey, now: float) -> float:
        """The quantile of the class's finished run times together with the run time so far of its running
        jobs: a lower bound of theirs, which the finished ones alone miss (short runs finish first)."""
        ids = self.running_by_class.get(key)
        if not ids:
            return history.quantile(self.q)
        cached = self._with_running_at.get(key)
        if cached is not None and cached[0] == now:
            return cached[1]
        running = self.running
        so_far = [running[j].earlier_s + max(0.0, now - running[j].started_at) for j in ids]
        value = quantile([*history.runs, *so_far], self.q)
        self._with_running_at[key] = (now, value)
        return value


class RunTimeLearner:
    """QSSF's learner (`api.Learner`): run times from finished jobs, a `RunEstimate` for each job that becomes
    pending. `window`, `min_samples`, `prior_s`, `q`, `running_bound`: the `DurationPredictor`'s.

    An estimate is kept while the job waits and after a preemption (it still has its submission time and
    credit); a job queued again with a new `submitted_at` (a reclaimed job goes to the back of its queue) is
    predicted afresh, as if submitted then, and what it ran before earns it no credit: it held its GPUs without
    using them, so it must not go straight back ahead of the jobs already waiting."""

    name: ClassVar[str] = NAME

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        prior_s: float = DEFAULT_PRIOR_S,
        *,
        q: float = DEFAULT_QUANTILE,
        running_bound: bool = DEFAULT_RUNNING_BOUND,
    ) -> None:
        self.predictor = DurationPredictor(window, min_samples, prior_s, q=q, running_bound=running_bound)

    def started(self, run: RunningJob) -> None:
        self.predictor.started(run)

    def ended(self, job_id: JobId, now: float, *, finished: bool) -> None:
        self.predictor.ended(job_id, now, finished=finished)

    def estimate(self, job: Job, now: float, earlier: RunEstimate | None) -> RunEstimate:
        if earlier is not None and earlier.submitted_at == job.submitted_at:
            return earlier
        uncredited = job.attained_gpu_seconds if earlier is not None else 0.0
        return RunEstimate(job.submitted_at, self.predictor.predict(job, now), uncredited)


class QuasiShortestServiceFirst:
    """Least predicted GPU service first, across all queues (no preemption of its own), by the estimates of
    the profile's `RunTimeLearner` (`cluster.estimates`).

    `prior_s`: the run time of a job without an estimate. `by_service`: order by predicted GPU-seconds (True) or
    run time. `aging`: credit per second waited, in the key's unit (GPU-seconds, or seconds without
    `by_service`); 0 turns the starvation guard off.
    """

    name: ClassVar[str] = NAME

    def __init__(
        self, prior_s: float = DEFAULT_PRIOR_S, *, by_service: bool = True, aging: float = DEFAULT_AGING
    ) -> None:
        problems = []
        if not prior_s > 0:
            problems.append(FieldProblem("prior_s", f"is {prior_s}", "give seconds > 0"))
        if not (aging >= 0 and math.isfinite(aging)):
            problems.append(
                FieldProblem("aging", f"is {aging}", "give the credit per second waited, >= 0 (0: no aging)")
            )
        check(problems, "qssf order")
        self.prior_s = prior_s
        self.by_service = by_service
        self.aging = aging

    def remaining_service(self, job: Job, cluster: ClusterView) -> float:
        """Predicted GPU-seconds (or seconds, without `by_service`) the job still needs."""
        estimate = cluster.estimates.get(job.id)
        predicted, uncredited = (self.prior_s, 0.0) if estimate is None else (estimate.seconds, estimate.uncredited)
        gpus = _gpus(job)
        ran = (job.attained_gpu_seconds - uncredited) / gpus if gpus else 0.0
        if ran > 0:
            predicted = max(predicted, 2.0 * ran) - ran
        return predicted * max(gpus, 1.0) if self.by_service else predicted

    def job_key(self, job: Job, cluster: ClusterView) -> SortKey:
        return (
            -job.priority,
            self.remaining_service(job, cluster) + self.aging * job.submitted_at,
            job.submitted_at,
        )

    def queue_key(self, queue: str, cluster: ClusterView) -> SortKey:
        return ()


class FairShareQssf(QuasiShortestServiceFirst):
    """`fair_share` between queues (queues inside their quota first, then the smallest dominant share), and
    priority, then least predicted service, inside a queue."""

    name: ClassVar[str] = FAIR_NAME

    def queue_key(self, queue: str, cluster: ClusterView) -> SortKey:
        return (int(cluster.quotas.over_nominal(queue)), dominant_share(queue, cluster))
