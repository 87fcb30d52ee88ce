"""Gavel's isolated reference (`gpufleet.sim.isolated`) and its finish-time fairness (`reproduce.gavel_rho`):
completion times worked out by hand on small clusters, in Gavel's rounds and followed exactly (fluid)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.adapters.inventory.emulated_inventory import parse_emulate
from gpufleet.domain import Job, QueueSpec, WorkerRequest
from gpufleet.domain.throughput_table import ThroughputEntry, ThroughputTable
from gpufleet.sim.isolated import GAVEL_RESET_INTERVAL_S, GAVEL_ROUND_S, fluid_isolated_jcts, isolated_jcts
from gpufleet.sim.reproduce import gavel_rho
from gpufleet.sim.workload import TraceJob, Workload

# "fast" runs twice as fast on A100 as on the reference V100; "slow" runs only on V100.
TABLE = ThroughputTable(
    (
        ThroughputEntry("fast", "A100-80GB", 1, 2.0),
        ThroughputEntry("fast", "V100-32GB", 1, 1.0),
        ThroughputEntry("fast", "A100-80GB", 2, 4.0),
        ThroughputEntry("fast", "V100-32GB", 2, 2.0),
        ThroughputEntry("slow", "A100-80GB", 1, 0.0),
        ThroughputEntry("slow", "V100-32GB", 1, 1.0),
    ),
    source="test",
    reference="V100-32GB",
)


def workload(gpus: str, jobs: list[tuple[str, float, float, int]]) -> Workload:
    """`gpus`: e.g. "1xA100-80GB,1xV100-32GB"; `jobs`: (type, arrival s, duration s at V100 speed, GPUs)."""
    nodes = tuple(n for i, spec in enumerate(gpus.split(",")) for n in parse_emulate(spec, f"emu-{i}") if spec.strip())
    trace = tuple(
        TraceJob(
            Job(
                id=f"j{i}",
                queue="q",
                request=WorkerRequest(gpus=count),
                submit_seq=i,
                submitted_at=arrival,
                job_type=job_type,
            ),
            duration,
        )
        for i, (job_type, arrival, duration, count) in enumerate(jobs)
    )
    return Workload(
        name="isolated-test",
        citation="synthetic",
        license="-",
        nodes=nodes,
        queues=(QueueSpec("q"),),
        jobs=trace,
        throughput=TABLE,
    )


def test_fluid_a_job_alone_gets_an_equal_time_on_every_model() -> None:
    # 1 A100 + 1 V100, one job: half its time on each, at 2x and 1x: 1.5x the reference speed.
    jct = fluid_isolated_jcts(workload("1xA100-80GB,1xV100-32GB", [("fast", 10.0, 3000.0, 1)]))
    assert jct == {"j0": pytest.approx(2000.0)}


def test_fluid_jobs_share_the_cluster_one_nth_each() -> None:
    # One V100, two jobs from t=0: each runs at 1/2 until the shorter is done (at 2 x 100 s), then alone.
    jct = fluid_isolated_jcts(workload("1xV100-32GB", [("fast", 0.0, 100.0, 1), ("fast", 0.0, 300.0, 1)]))
    assert jct == {"j0": pytest.approx(200.0), "j1": pytest.approx(400.0)}


def test_fluid_a_later_arrival_slows_the_jobs_already_there() -> None:
    # One V100: j0 alone for 50 s (50 done), then at 1/2 with j1: 50 left take 100 s more.
    jct = fluid_isolated_jcts(workload("1xV100-32GB", [("fast", 0.0, 100.0, 1), ("fast", 50.0, 1000.0, 1)]))
    assert jct["j0"] == pytest.approx(150.0)
    assert jct["j1"] == pytest.approx(100.0 + 950.0)  # 100 s at 1/2 (50 done), then 950 s alone


def test_fluid_share_is_over_the_jobs_gpus_and_models_it_cannot_use_are_left_out() -> None:
    # 2 V100 + 2 A100; a 2-GPU job alone: 2/2 of each model's GPUs, capped at 1 in all: half its time on each
    # (4/2 = 2x on A100, 1x on V100): 1.5x. The "slow" job cannot use the A100s: all its time on the V100s.
    jct = fluid_isolated_jcts(workload("2xA100-80GB,2xV100-32GB", [("fast", 0.0, 3000.0, 2)]))
    assert jct == {"j0": pytest.approx(2000.0)}
    alone = fluid_isolated_jcts(workload("2xA100-80GB,2xV100-32GB", [("slow", 0.0, 3000.0, 1)]))
    assert alone == {"j0": pytest.approx(3000.0)}


def test_gavel_rho_is_the_mean_ratio_over_jobs_finished_in_both() -> None:
    assert gavel_rho({"a": 100.0, "b": 300.0, "c": 50.0}, {"a": 200.0, "b": 100.0}) == pytest.approx((0.5 + 3.0) / 2)
    assert gavel_rho({"a": 1.0}, {}) is None


def test_rounds_a_job_alone_runs_to_its_end_within_the_last_round() -> None:
    # One V100: rounds of 360 s from its arrival; it finishes 280 s into the third round.
    jct = isolated_jcts(workload("1xV100-32GB", [("fast", 10.0, 1000.0, 1)]))
    assert jct == {"j0": pytest.approx(1000.0)}


def test_rounds_jobs_take_turns_a_round_each() -> None:
    # One V100, two 720 s jobs from t=0: equal allocations; the job with less time on the model goes next.
    jct = isolated_jcts(workload("1xV100-32GB", [("fast", 0.0, 720.0, 1), ("fast", 0.0, 720.0, 1)]))
    assert jct == {"j0": pytest.approx(3 * GAVEL_ROUND_S), "j1": pytest.approx(4 * GAVEL_ROUND_S)}


def test_rounds_an_arrival_waits_for_the_next_recomputation_of_the_allocation() -> None:
    # Two V100s; j0 from t=0 (allocation computed then). j1 arrives at 100 s, joins at the round's end (360 s),
    # but has no allocation until 1920 s after the last recomputation: it idles beside a free GPU until then,
    # although j0 is done at 1000 s. The fluid run starts it at once.
    jobs = [("fast", 0.0, 1000.0, 1), ("fast", 100.0, 100.0, 1)]
    jct = isolated_jcts(workload("2xV100-32GB", jobs))
    assert jct["j0"] == pytest.approx(1000.0)
    assert jct["j1"] == pytest.approx(GAVEL_RESET_INTERVAL_S + 100.0 - 100.0)
    assert fluid_isolated_jcts(workload("2xV100-32GB", jobs))["j1"] == pytest.approx(100.0)


def test_rounds_a_job_alone_spends_its_rounds_on_models_drawn_each_round() -> None:
    # 1 A100 (2x) + 1 V100: each round runs on the model the shuffle puts first: between all on A100 and all on V100.
    jct = isolated_jcts(workload("1xA100-80GB,1xV100-32GB", [("fast", 0.0, 3600.0, 1)]))["j0"]
    assert 1800.0 <= jct <= 3600.0
    assert jct not in (1800.0, 3600.0)  # 10 rounds on V100 or 5 on A100 alone: the draw mixes them


def test_rounds_stop_once_the_awaited_jobs_are_done() -> None:
    jobs = [("fast", 0.0, 100.0, 1), ("fast", 0.0, 10_000.0, 1)]
    assert set(isolated_jcts(workload("2xV100-32GB", jobs), until_done={"j0"})) == {"j0"}
    assert set(isolated_jcts(workload("2xV100-32GB", jobs))) == {"j0", "j1"}


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["fast", "slow"]), st.floats(0.0, 5000.0), st.floats(1.0, 4000.0)),
        min_size=1,
        max_size=12,
    )
)
def test_rounds_every_job_finishes_no_faster_than_alone_on_its_fastest_model(
    jobs: list[tuple[str, float, float]],
) -> None:
    # 1 A100 + 2 V100: a "fast" job runs at most 2x the reference speed, a "slow" one at most 1x (V100 only).
    jobs = sorted(jobs, key=lambda job: job[1])  # a workload lists its jobs in arrival order
    trace = [(kind, arrival, duration, 1) for kind, arrival, duration in jobs]
    jct = isolated_jcts(workload("1xA100-80GB,2xV100-32GB", trace))
    assert set(jct) == {f"j{i}" for i in range(len(jobs))}
    for i, (kind, _, duration) in enumerate(jobs):
        fastest = 2.0 if kind == "fast" else 1.0
        assert jct[f"j{i}"] >= duration / fastest - 1e-6
