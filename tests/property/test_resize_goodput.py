"""The goodput resize policy's guard rails, for any jobs, goodputs, free GPUs, quotas and waiting jobs:
sizes stay within [min, max] in whole workers, no GPU is given twice, no queue grows past its quota
headroom, jobs resized too recently and fixed-size jobs are untouched, nothing shrinks unless a waiting job
needs it, and a job whose goodput has flattened gets nothing."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.errors import SpecError
from gpufleet.policies.resize.goodput import GoodputResize
from gpufleet.scheduling.plugin_api import ElasticJob, ResizeInput

POLICY = GoodputResize(min_interval_s=300.0, restart_s=30.0, horizon_s=1800.0)
# `default`'s shape: it also moves GPUs between running jobs, sheds and weighs gains by service received.
MOVING = GoodputResize(
    min_interval_s=300.0,
    restart_s=30.0,
    horizon_s=1800.0,
    rebalance=True,
    rebalance_margin=3.0,
    shed=True,
    service_scale_s=7200.0,
    service_exponent=0.5,
)
QUEUES = ("a", "b", "c")


@st.composite
def elastic_job(draw: st.DrawFn, index: int) -> ElasticJob:
    step = draw(st.sampled_from((1, 2, 4)))
    lo = step * draw(st.integers(1, 3))
    hi = lo + step * draw(st.integers(0, 6))
    gpus = lo + step * draw(st.integers(0, (hi - lo) // step))
    # Concave goodput, possibly flat from some size on (a job whose loss stopped falling faster).
    rates = draw(st.lists(st.floats(0, 10), min_size=(hi - lo) // step + 1, max_size=(hi - lo) // step + 1))
    rates.sort(reverse=True)
    goodput, total = {}, 1.0
    for k, g in enumerate(range(lo, hi + 1, step)):
        total += rates[k] if k else 0.0
        goodput[g] = total
    last = draw(st.one_of(st.none(), st.floats(0, 2000)))
    return ElasticJob(
        id=f"j{index}",
        queue=draw(st.sampled_from(QUEUES)),
        gpus=gpus,
        min_gpus=lo,
        max_gpus=hi,
        step=step,
        goodput=goodput,
        last_resized_at=last,
        remaining_s=draw(st.one_of(st.none(), st.floats(0, 10_000))),
        attained_gpu_s=draw(st.floats(0, 1e6)),
    )


@st.composite
def inputs(draw: st.DrawFn) -> ResizeInput:
    count = draw(st.integers(0, 8))
    jobs = tuple(draw(elastic_job(i)) for i in range(count))
    headroom = {q: draw(st.integers(0, 40)) for q in QUEUES if draw(st.booleans())}
    waiting = tuple(draw(st.lists(st.tuples(st.sampled_from(QUEUES), st.integers(1, 16)), max_size=4)))
    return ResizeInput(now=2000.0, free_gpus=draw(st.integers(0, 32)), jobs=jobs, headroom=headroom, waiting=waiting)


@settings(max_examples=400, deadline=None)
@given(given_input=inputs())
def test_guard_rails_hold_for_any_input(given_input: ResizeInput) -> None:
    check_guard_rails(POLICY, given_input)
    if not given_input.waiting:
        jobs = {job.id: job for job in given_input.jobs}
        # Nothing shrinks unless a waiting job needs the GPUs (this policy neither sheds nor rebalances).
        assert all(gpus >= jobs[job_id].gpus for job_id, gpus in POLICY.resize(given_input).items())


@settings(max_examples=300, deadline=None)
@given(given_input=inputs())
def test_guard_rails_hold_when_jobs_also_move_shed_and_weigh_service(given_input: ResizeInput) -> None:
    check_guard_rails(MOVING, given_input)


def check_guard_rails(policy: GoodputResize, given_input: ResizeInput) -> None:
    new = policy.resize(given_input)
    assert new == policy.resize(given_input)  # deterministic
    jobs = {job.id: job for job in given_input.jobs}
    size = {job_id: new.get(job_id, job.gpus) for job_id, job in jobs.items()}
    for job_id, gpus in new.items():
        job = jobs[job_id]
        assert gpus != job.gpus
        assert job.min_gpus <= gpus <= job.max_gpus  # never below min, never above max
        assert (gpus - job.gpus) % job.step == 0  # whole workers
        assert job.min_gpus < job.max_gpus  # fixed-size jobs are never touched
        assert job.last_resized_at is None or given_input.now - job.last_resized_at >= policy.min_interval_s
    grown = sum(max(0, size[j] - jobs[j].gpus) for j in jobs)
    shrunk = sum(max(0, jobs[j].gpus - size[j]) for j in jobs)
    assert grown <= given_input.free_gpus + shrunk  # no GPU given twice
    for queue, room in given_input.headroom.items():
        growth = sum(size[j] - jobs[j].gpus for j in jobs if jobs[j].queue == queue)
        assert growth <= room  # a resize never takes a queue past its quota
    for job_id, job in jobs.items():
        flat = all(job.goodput[g] == job.goodput[job.gpus] for g in job.goodput if g > job.gpus)
        if flat:
            assert size[job_id] <= job.gpus  # a flattened job gets no more GPUs


def job(job_id: str, gpus: int, goodput: dict[int, float], **more: object) -> ElasticJob:
    fields = {"queue": "a", "min_gpus": min(goodput), "max_gpus": max(goodput), "step": 1, **more}
    return ElasticJob(id=job_id, gpus=gpus, goodput=goodput, **fields)  # type: ignore[arg-type]


def test_idle_gpus_go_to_the_job_that_gains_most_per_gpu() -> None:
    steep = job("steep", 1, {1: 1.0, 2: 1.9, 3: 2.7, 4: 3.4})
    flat = job("flat", 1, {1: 1.0, 2: 1.05, 3: 1.08, 4: 1.1})
    new = POLICY.resize(ResizeInput(0.0, 3, (steep, flat), {}))
    assert new == {"steep": 4}


def test_a_flattened_job_gives_back_first_to_admit_a_waiting_job() -> None:
    learning = job("learning", 4, {2: 2.0, 3: 2.9, 4: 3.7})
    flattened = job("flattened", 4, {2: 1.0, 3: 1.0, 4: 1.0})
    new = POLICY.resize(ResizeInput(0.0, 0, (learning, flattened), {}, waiting=(("b", 2),)))
    assert new == {"flattened": 2}


def test_no_one_shrinks_for_a_job_that_would_still_not_fit() -> None:
    one = job("one", 3, {2: 1.0, 3: 1.5})
    assert POLICY.resize(ResizeInput(0.0, 0, (one,), {}, waiting=(("b", 4),))) == {}


def test_a_grow_that_does_not_pay_its_restart_is_not_made() -> None:
    ending = job("ending", 1, {1: 1.0, 2: 1.9}, remaining_s=40.0)
    assert POLICY.resize(ResizeInput(0.0, 1, (ending,), {})) == {}
    assert POLICY.resize(ResizeInput(0.0, 1, (job("long", 1, {1: 1.0, 2: 1.9}),), {})) == {"long": 2}


def test_quota_headroom_and_recent_resizes_hold_growth() -> None:
    a = job("a1", 1, {1: 1.0, 2: 2.0, 3: 3.0})
    assert POLICY.resize(ResizeInput(0.0, 8, (a,), {"a": 1})) == {"a1": 2}
    recent = job("r", 1, {1: 1.0, 2: 2.0}, last_resized_at=-100.0)
    assert POLICY.resize(ResizeInput(0.0, 8, (recent,), {})) == {}


def test_of_two_jobs_that_gain_alike_the_one_served_less_grows_first() -> None:
    curve = {1: 1.0, 2: 1.9, 3: 2.7}
    served = job("a-served", 1, curve, attained_gpu_s=20_000.0)
    fresh = job("b-fresh", 1, curve, attained_gpu_s=600.0)
    weighing = GoodputResize(min_interval_s=300.0, service_scale_s=7200.0, service_exponent=0.5)
    assert weighing.resize(ResizeInput(0.0, 2, (served, fresh), {})) == {"b-fresh": 3}
    # Without the weight they share alike.
    assert POLICY.resize(ResizeInput(0.0, 2, (served, fresh), {})) == {"a-served": 2, "b-fresh": 2}


def test_the_job_served_most_gives_back_first_to_admit_a_waiting_job() -> None:
    curve = {2: 2.0, 3: 2.9, 4: 3.7}
    served = job("b-served", 4, curve, attained_gpu_s=50_000.0)
    fresh = job("a-fresh", 4, curve, attained_gpu_s=0.0)
    weighing = GoodputResize(min_interval_s=300.0, service_scale_s=7200.0, service_exponent=0.5)
    assert weighing.resize(ResizeInput(0.0, 0, (served, fresh), {}, waiting=(("b", 2),))) == {"b-served": 2}
    assert POLICY.resize(ResizeInput(0.0, 0, (served, fresh), {}, waiting=(("b", 2),))) == {"a-fresh": 3, "b-served": 3}


def test_a_well_served_job_grows_only_where_the_weighed_gain_pays_its_restart() -> None:
    # At 1 -> 2 GPUs a 2 % gain pays a 30 s restart over 1,800 s (2 % x 1,770 s > 30 s); weighed by a third
    # (attained 8 x the scale, exponent 0.5) it does not.
    curve = {1: 1.0, 2: 1.02}
    weighing = GoodputResize(min_interval_s=300.0, service_scale_s=7200.0, service_exponent=0.5)
    assert weighing.resize(ResizeInput(0.0, 1, (job("new", 1, curve),), {})) == {"new": 2}
    assert weighing.resize(ResizeInput(0.0, 1, (job("old", 1, curve, attained_gpu_s=8 * 7200.0),), {})) == {}


def test_settings_out_of_range_are_refused_with_every_bad_field_named() -> None:
    with pytest.raises(SpecError) as raised:
        GoodputResize(restart_s=-1.0, service_scale_s=0.0, service_exponent=math.nan)
    message = str(raised.value)
    for bad in ("restart_s", "service_scale_s", "service_exponent"):
        assert bad in message
    assert "min_interval_s" not in message
    GoodputResize(service_scale_s=None, service_exponent=0.0)  # no weight at all is valid
