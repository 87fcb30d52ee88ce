"""`qssf`: run times learned from jobs that finished before the decision; least predicted service first.

The learner (`RunTimeLearner`) is fed the facts a control loop sees (a job started, a job ended on its own or
was stopped) and estimates jobs that become pending; the order plugin reads those estimates as data."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain import GPU, ClusterSnapshot, Job, WorkerRequest, make_node
from gpufleet.domain.cluster import GpuShare, WorkerPlacement
from gpufleet.domain.errors import SpecError
from gpufleet.domain.jobs import RunningJob
from gpufleet.domain.quotas import QueueSpec, Quota
from gpufleet.policies.catalog import profile
from gpufleet.policies.order.qssf import (
    DurationPredictor,
    FairShareQssf,
    QuasiShortestServiceFirst,
    RunTimeLearner,
    quantile,
)
from gpufleet.scheduling.cycle import run_cycle
from gpufleet.scheduling.plugin_api import ClusterView, RunEstimate
from gpufleet.scheduling.state import CycleState

GIB = 1024**3
NODES = tuple(make_node(f"n{i}", "A100", 8, 80 * GIB) for i in range(4))


def job(job_id: str, *, queue: str = "team", gpus: int = 1, at: float = 0.0, seq: int = 0, **extra: object) -> Job:
    return Job(
        id=job_id,
        queue=queue,
        request=WorkerRequest(gpus=gpus),
        submitted_at=at,
        submit_seq=seq,
        **extra,  # type: ignore[arg-type]
    )


def running(j: Job, node: int, first_gpu: int, started_at: float, evicting_for: str | None = None) -> RunningJob:
    gpus = tuple(GpuShare(first_gpu + g) for g in range(j.request.gpus))
    return RunningJob(j, (WorkerPlacement(f"n{node}", gpus),), started_at=started_at, evicting_for=evicting_for)


def view(now: float = 0.0, *runs: RunningJob, estimates: dict[str, RunEstimate] | None = None) -> ClusterView:
    return CycleState(ClusterSnapshot(NODES, runs, now=now), estimates=estimates).view


def ran(learner: RunTimeLearner | DurationPredictor, runs: Iterable[RunningJob], ended_at: float) -> None:
    """Each run started, then ended on its own at `ended_at`."""
    for run in runs:
        learner.started(run)
    for run in runs:
        learner.ended(run.id, ended_at, finished=True)


def key(order: QuasiShortestServiceFirst, learner: RunTimeLearner, j: Job, now: float) -> tuple[object, ...]:
    """The job's key when it becomes pending at `now` (estimated then, as the loop does)."""
    return order.job_key(j, view(now, estimates={j.id: learner.estimate(j, now, None)}))


def test_prediction_uses_only_jobs_that_finished_before_it() -> None:
    learner, order = RunTimeLearner(min_samples=1, prior_s=500.0), QuasiShortestServiceFirst(aging=0.0)
    a = job("a", at=0.0)
    learner.started(running(a, 0, 0, started_at=0.0))
    # `a` runs: nothing has finished, so a job estimated now gets the prior.
    early = job("early", at=5.0, seq=1)
    estimate = learner.estimate(early, 10.0, None)
    assert order.job_key(early, view(10.0, estimates={"early": estimate})) == (0, 500.0, 5.0)
    # `a` ended on its own at t=120: it ran 120 s; a job estimated now gets that.
    learner.ended("a", 120.0, finished=True)
    assert key(order, learner, job("late", at=110.0, seq=2), 120.0) == (0, 120.0, 110.0)
    # The early job keeps the estimate it had while it waits.
    assert learner.estimate(early, 130.0, estimate) is estimate
    assert learner.predictor.learned == 1


def test_a_job_without_an_estimate_counts_at_the_orders_prior() -> None:
    order = QuasiShortestServiceFirst(prior_s=700.0, aging=0.0)
    assert order.job_key(job("j", gpus=2), view()) == (0, 1400.0, 0.0)


def test_oracle_durations_are_never_read() -> None:
    learner, order = RunTimeLearner(prior_s=700.0), QuasiShortestServiceFirst()
    short = job("short", expected_duration=1.0)
    long = job("long", expected_duration=1e6, seq=1)
    assert key(order, learner, short, 0.0) == key(order, learner, long, 0.0) == (0, 700.0, 0.0)


def test_stopped_jobs_are_not_learned_as_finished() -> None:
    learner, order = RunTimeLearner(min_samples=1, prior_s=500.0), QuasiShortestServiceFirst()
    learner.started(running(job("victim"), 0, 0, started_at=0.0))
    learner.ended("victim", 50.0, finished=False)  # preempted, cancelled, timed out or lost
    assert learner.predictor.learned == 0
    assert key(order, learner, job("next", seq=1), 60.0) == (0, 500.0, 0.0)


def test_an_end_without_a_start_and_a_second_start_teach_nothing() -> None:
    p = DurationPredictor(min_samples=1)
    p.ended("ghost", 10.0, finished=True)  # never seen starting (e.g. it started before the loop)
    a = running(job("a"), 0, 0, started_at=5.0)
    p.started(a)
    p.started(dataclasses.replace(a, started_at=50.0))  # seen again (the loop rebuilt its state): first seen counts
    p.ended("a", 105.0, finished=True)
    assert list(p.overall.runs) == [100.0]


def test_fallbacks_class_then_queue_then_all_then_prior() -> None:
    p = DurationPredictor(window=5, min_samples=2, prior_s=999.0, q=0.5)
    one = job("x", queue="q", gpus=1)
    four = job("y", queue="q", gpus=4)
    other = job("z", queue="r", gpus=1)
    assert p.predict(one, 0.0) == 999.0
    p.add("q", 4.0, 100.0)
    p.add("q", 4.0, 300.0)
    assert p.predict(four, 0.0) == 200.0  # its class
    assert p.predict(one, 0.0) == 200.0  # no 1-GPU history in q: the queue's
    p.add("q", 1.0, 10.0)
    assert p.predict(one, 0.0) == 100.0  # one 1-GPU sample is too few: still the queue's (10, 100, 300)
    assert p.predict(other, 0.0) == 100.0  # unknown queue: everyone's
    for _ in range(5):
        p.add("q", 4.0, 50.0)
    assert p.predict(four, 0.0) == 50.0  # only the last `window` runs count


def test_multi_gpu_and_gang_jobs_learn_their_wall_time_and_order_by_gpu_seconds() -> None:
    learner, order = RunTimeLearner(min_samples=1), QuasiShortestServiceFirst()
    ran(learner, [running(job("big", gpus=4), 0, 0, 0.0), running(job("small", seq=1), 1, 0, 0.0)], 100.0)
    assert learner.predictor.predict(job("b2", gpus=4), 100.0) == learner.predictor.predict(job("s2"), 100.0) == 100.0
    assert key(order, learner, job("b2", gpus=4), 100.0) == (0, 400.0, 0.0)
    by_time = QuasiShortestServiceFirst(by_service=False)
    assert by_time.job_key(job("b3", gpus=4), view(0.0))[1] == 3600


def test_a_requeued_job_goes_by_what_it_still_needs() -> None:
    learner, order = RunTimeLearner(min_samples=1, prior_s=1000.0), QuasiShortestServiceFirst()
    assert key(order, learner, job("j", attained_gpu_seconds=400.0), 0.0) == (0, 600.0, 0.0)
    # Past its prediction: assumed to need as much again as it has had.
    assert key(order, learner, job("k", seq=1, attained_gpu_seconds=3000.0), 0.0) == (0, 3000.0, 0.0)


def test_cycle_runs_the_class_learned_short_first() -> None:
    # Learn: 2-GPU jobs of the queue ran 60 s, 1-GPU jobs ran 10 h.
    prof = profile("qssf")
    learner = prof.learner
    assert isinstance(learner, RunTimeLearner)
    ran(learner, [running(job(f"two{i}", gpus=2), 1 + i, 0, 0.0) for i in range(3)], 60.0)
    ran(learner, [running(job(f"one{i}"), 0, i, 0.0) for i in range(3)], 36_000.0)
    # Two GPUs left, room for one of the two: the 2-GPU job (120 GPU-s predicted) before the 1-GPU job (36,000).
    pending = [job("wide", gpus=2, at=2.0, seq=10), job("narrow", at=1.0, seq=11)]
    estimates = {j.id: learner.estimate(j, 36_200.0, None) for j in pending}
    busy = ClusterSnapshot(NODES[:1], (running(job("b6", gpus=6), 0, 0, 0.0),), now=36_200.0)
    assert [p.job for p in run_cycle(busy, pending, prof, estimates=estimates).placements] == ["wide"]
    # Without estimates both count at the prior run time: the 1-GPU job needs less service.
    assert [p.job for p in run_cycle(busy, pending, prof).placements] == ["narrow"]


def test_fair_variant_ranks_queues_by_fair_share() -> None:
    queues = (QueueSpec("a", {GPU: Quota(nominal=8000)}), QueueSpec("b", {GPU: Quota(nominal=8000)}))
    hog = running(job("hog", queue="a", gpus=4), 0, 0, 0.0)
    s = CycleState(ClusterSnapshot(NODES, (hog,), queues, now=10.0)).view
    order = FairShareQssf()
    assert order.queue_key("b", s) < order.queue_key("a", s)
    assert order.job_key(job("x", queue="b", priority=5), s)[0] == -5


@settings(max_examples=40, deadline=None)
@given(
    runs=st.lists(st.tuples(st.integers(0, 3), st.floats(1.0, 1e5)), min_size=1, max_size=12),
    shuffle=st.randoms(use_true_random=False),
)
def test_learning_is_the_same_whatever_order_the_starts_come_in(runs: list[tuple[int, float]], shuffle: object) -> None:
    jobs = [
        (running(job(f"j{k}", queue=f"q{q}"), k // 8, k % 8, started_at=float(k)), float(k) + length)
        for k, (q, length) in enumerate(runs)
    ]
    histories = []
    for attempt in range(2):
        listed = list(jobs)
        if attempt:
            shuffle.shuffle(listed)  # type: ignore[attr-defined]
        p = DurationPredictor(window=20, min_samples=1)
        for r, _ in listed:
            p.started(r)
        for r, end in sorted(jobs, key=lambda item: (item[1], item[0].id)):
            p.ended(r.id, end, finished=True)
        histories.append(({k: list(h.runs) for k, h in p.by_class.items()}, list(p.overall.runs)))
        assert p.learned == len(jobs)
    assert histories[0] == histories[1]
    # Each run time is learned exactly: from its start to the moment it ended.
    assert sorted(histories[0][1]) == sorted(e - r.started_at for r, e in jobs)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"window": 0}, "window"),
        ({"min_samples": 0}, "min_samples"),
        ({"min_samples": 30}, "min_samples"),
        ({"prior_s": 0.0}, "prior_s"),
        ({"q": 0.0}, "q"),
        ({"q": 1.0}, "q"),
    ],
)
def test_bad_settings_are_refused_with_what_to_do(bad: dict[str, float], field: str) -> None:
    with pytest.raises(SpecError, match=field) as err:
        RunTimeLearner(**bad)  # type: ignore[arg-type]
    assert "give" in str(err.value)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.floats(0.0, 1e6), min_size=1, max_size=30), q=st.floats(0.01, 0.99))
def test_quantile_is_the_median_at_one_half_and_grows_with_q(values: list[float], q: float) -> None:
    assert quantile(values, 0.5) == pytest.approx(statistics.median(values))
    assert min(values) <= quantile(values, q) <= max(values)
    assert quantile(values, min(q, 0.5)) <= quantile(values, max(q, 0.5))


def test_a_lower_quantile_predicts_from_the_short_side_of_the_class() -> None:
    low, mid = DurationPredictor(window=5, min_samples=1, q=0.25), DurationPredictor(window=5, min_samples=1, q=0.5)
    for p in (low, mid):
        for seconds in (100.0, 200.0, 300.0, 400.0, 500.0):
            p.add("q", 1.0, seconds)
    assert low.predict(job("x", queue="q"), 0.0) == 200.0
    assert mid.predict(job("x", queue="q"), 0.0) == 300.0


def test_running_jobs_of_the_class_count_with_their_run_time_so_far() -> None:
    # Two short runs finished; two of the class have run 10,000 s and still run.
    plain = DurationPredictor(min_samples=1, q=0.5, running_bound=False)
    bounded = DurationPredictor(min_samples=1, q=0.5, running_bound=True)
    long_ones = [running(job(f"long{i}"), 0, i, started_at=0.0) for i in range(2)]
    shorts = [running(job(f"short{i}"), 1, i, started_at=0.0) for i in range(2)]
    for p in (plain, bounded):
        for r in long_ones:
            p.started(r)
        ran(p, shorts, 60.0)
    assert plain.predict(job("next"), 10_000.0) == 60.0  # only what finished: the short runs
    assert bounded.predict(job("next"), 10_000.0) == (60.0 + 10_000.0) / 2  # median of 60, 60, 10,000, 10,000
    # Other classes are not affected by this class's running jobs.
    assert bounded.predict(job("wide", gpus=2), 10_000.0) == 60.0  # falls back to the queue's finished runs
    bounded.ended("long0", 10_000.0, finished=False)  # stopped: no longer running, not learned
    assert bounded.predict(job("next"), 10_000.0) == 60.0  # median of 60, 60, 10,000


_EVENT = st.one_of(
    st.tuples(st.just("start"), st.integers(0, 5), st.integers(0, 1)),  # job k starts (queue k % 2)
    st.tuples(st.just("end"), st.integers(0, 5), st.booleans()),  # job k ends, on its own or stopped
    st.tuples(st.just("predict"), st.integers(0, 1), st.booleans()),  # a job of queue q; the clock moves or not
)


@settings(max_examples=150, deadline=None)
@given(events=st.lists(_EVENT, max_size=40), seed_runs=st.lists(st.floats(1.0, 1e4), min_size=1, max_size=4))
def test_predictions_with_running_jobs_follow_every_start_and_end_even_at_one_time(
    events: list[tuple[str, int, object]], seed_runs: list[float]
) -> None:
    # Many jobs are predicted at one loop step's time; whatever the predictor keeps between them, each prediction
    # is the quantile of the class's finished runs and its running jobs' run times so far at that moment.
    p = DurationPredictor(window=5, min_samples=1, q=0.3)
    for seconds in seed_runs:
        for queue in ("q0", "q1"):
            p.add(queue, 1.0, seconds)
    finished: dict[str, list[float]] = {"q0": list(seed_runs), "q1": list(seed_runs)}
    started: dict[str, tuple[str, float]] = {}  # job -> (queue, started at)
    now = 100.0
    for kind, number, flag in events:
        if kind == "start":
            j = job(f"j{number}", queue=f"q{flag}")
            if j.id not in started:
                started[j.id] = (j.queue, now)
            p.started(running(j, 0, 0, started_at=now))
        elif kind == "end":
            seen = started.pop(f"j{number}", None)
            p.ended(f"j{number}", now, finished=bool(flag))
            if seen is not None and flag:
                finished[seen[0]].append(now - seen[1])
        else:
            now += 7.0 if flag else 0.0
            queue = f"q{number}"
            so_far = [now - at for q, at in started.values() if q == queue]
            assert p.predict(job("new", queue=queue), now) == quantile([*finished[queue][-5:], *so_far], 0.3)


@settings(max_examples=80, deadline=None)
@given(
    alpha=st.floats(0.01, 100.0),
    history=st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.floats(1.0, 1e5)), max_size=10),
    a=st.tuples(st.sampled_from([1, 2, 4, 8]), st.floats(0.0, 1e6), st.floats(0.0, 5e4)),
    b=st.tuples(st.sampled_from([1, 2, 4, 8]), st.floats(1.0, 1e6), st.floats(0.0, 5e4)),
)
def test_aging_bounds_how_long_a_job_can_be_overtaken(
    alpha: float,
    history: list[tuple[int, float]],
    a: tuple[int, float, float],
    b: tuple[int, float, float],
) -> None:
    # A job submitted at t0 with predicted remaining service P goes before every job (of its priority)
    # submitted after t0 + P / alpha, whatever the other job's size, history or service received.
    learner, order = RunTimeLearner(min_samples=1), QuasiShortestServiceFirst(aging=alpha)
    for gpus, seconds in history:
        learner.predictor.add("team", float(gpus), seconds)
    first = job("a", gpus=a[0], at=a[1], attained_gpu_seconds=a[2])
    estimates = {"a": learner.estimate(first, 0.0, None)}
    bound = first.submitted_at + order.remaining_service(first, view(estimates=estimates)) / alpha
    gpus, after_bound, attained = b
    later = job("b", gpus=gpus, at=bound + after_bound, seq=1, attained_gpu_seconds=attained)
    estimates["b"] = learner.estimate(later, 0.0, None)
    s = view(estimates=estimates)
    assert order.job_key(first, s) < order.job_key(later, s)
    # Without aging, the later job may go first: the guard is what bounds it.
    if order.remaining_service(later, s) < order.remaining_service(first, s):
        plain = QuasiShortestServiceFirst(aging=0.0)
        assert plain.job_key(later, s) < plain.job_key(first, s)


def test_aging_is_a_fixed_credit_per_second_waited() -> None:
    learner, order = RunTimeLearner(min_samples=1, prior_s=1000.0), QuasiShortestServiceFirst(aging=2.0)
    # 1000 s predicted, submitted at 0 vs 400 s predicted, submitted 301 s later: the older job goes first.
    old = key(order, learner, job("old", at=0.0), 0.0)
    learner.predictor.add("team", 1.0, 400.0)
    assert old < key(order, learner, job("new", at=301.0, seq=1), 0.0)
    assert key(order, learner, job("old2", at=0.0, seq=2), 0.0) == (0, 400.0, 0.0)
    assert key(order, learner, job("new2", at=299.0, seq=3), 0.0) == (0, 400.0 + 598.0, 299.0)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"aging": -1.0}, "aging"),
        ({"aging": float("nan")}, "aging"),
        ({"aging": float("inf")}, "aging"),
        ({"prior_s": 0.0}, "prior_s"),
    ],
)
def test_bad_order_settings_are_refused_with_what_to_do(bad: dict[str, float], field: str) -> None:
    with pytest.raises(SpecError, match=field) as err:
        QuasiShortestServiceFirst(**bad)
    assert "give" in str(err.value)


@pytest.mark.parametrize(("aging", "first"), [(0.0, "fresh"), (0.1, "old")])
def test_a_cycle_runs_a_long_waiting_job_before_later_shorter_ones_only_with_aging(aging: float, first: str) -> None:
    # The 1-GPU class ran 100 s, the 2-GPU class 1,000 s. One GPU-pair free: room for one of the two.
    learner = RunTimeLearner(min_samples=1)
    learner.predictor.add("team", 1.0, 100.0)
    learner.predictor.add("team", 2.0, 1_000.0)
    prof = dataclasses.replace(profile("default-qssf"), order=FairShareQssf(aging=aging), learner=learner)
    busy = ClusterSnapshot(NODES[:1], (running(job("b6", gpus=6), 0, 0, 0.0),), now=30_000.0)
    # `old` (2,000 GPU-s predicted) was submitted 20,000 s before `fresh` (100 GPU-s): past 2,000 / 0.1 s.
    pending = [job("old", gpus=2, at=0.0, seq=1), job("fresh", gpus=1, at=20_000.0, seq=2)]
    estimates = {j.id: learner.estimate(j, j.submitted_at, None) for j in pending}
    placed = run_cycle(busy, pending, prof, estimates=estimates).placements
    assert [p.job for p in placed] == [first]  # the other no longer fits


def test_a_reclaimed_job_is_estimated_afresh_without_credit_for_what_it_held() -> None:
    learner, order = RunTimeLearner(min_samples=1, prior_s=1000.0), QuasiShortestServiceFirst(aging=0.0)
    first = job("r", at=0.0)
    estimate = learner.estimate(first, 0.0, None)
    assert order.job_key(first, view(estimates={"r": estimate})) == (0, 1000.0, 0.0)
    # Preempted: same submitted_at, the estimate is kept, 400 GPU-s attained count as progress.
    preempted = dataclasses.replace(first, attained_gpu_seconds=400.0)
    estimate = learner.estimate(preempted, 500.0, estimate)
    assert order.job_key(preempted, view(500.0, estimates={"r": estimate})) == (0, 600.0, 0.0)
    # Reclaimed (requeued at the back: a new submitted_at): as if submitted then, no credit for the 400 GPU-s.
    reclaimed = dataclasses.replace(preempted, submitted_at=900.0)
    estimate = learner.estimate(reclaimed, 900.0, estimate)
    assert estimate == RunEstimate(900.0, 1000.0, 400.0)
    assert order.job_key(reclaimed, view(900.0, estimates={"r": estimate})) == (0, 1000.0, 900.0)


def test_the_cycle_never_calls_the_learner() -> None:
    # Everything it learned reaches the cycle as data: a learner that fails when called changes nothing.
    class Refusing(RunTimeLearner):
        def started(self, run: RunningJob) -> None:
            raise AssertionError("called")

        def ended(self, job_id: str, now: float, *, finished: bool) -> None:
            raise AssertionError("called")

        def estimate(self, j: Job, now: float, earlier: RunEstimate | None) -> RunEstimate:
            raise AssertionError("called")

    pending = [job("a", gpus=2, seq=1), job("b", seq=2)]
    estimates = {"a": RunEstimate(0.0, 10.0), "b": RunEstimate(0.0, 100.0)}
    snapshot = ClusterSnapshot(NODES[:1], (running(job("b6", gpus=6), 0, 0, 0.0),), now=10.0)
    plain = run_cycle(snapshot, pending, profile("qssf"), estimates=estimates)
    refusing = run_cycle(
        snapshot, pending, dataclasses.replace(profile("qssf"), learner=Refusing()), estimates=estimates
    )
    assert refusing.to_json() == plain.to_json()
    assert [p.job for p in plain.placements] == ["a"]  # 20 GPU-s predicted before 100
