"""Spot in the simulator: interruptions drawn from the NSDI'24 statistics hit only spot nodes, the breaker
(the same code as live) gates them, and the study prices GPU-hours per pool with the live price code."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.domain.costs import Pool, Price, PriceTable
from gpufleet.sim.spot_study import (
    SpotStudy,
    SpotTrace,
    load_spot_trace,
    parse_spot_pool,
    run_spot_study,
    spot_workload,
)
from gpufleet.sim.workload import WorkloadError
from gpufleet.sim.workloads.synthetic import generate_synthetic
from tests.kit.traces import price_tables, spot_traces

TRACE = SpotTrace("us-east-1a", "availability", "v100_1", 0.5, 1.0, 1000.0)
PRICES = PriceTable(
    tuple(
        Price(model, pool, usd)
        for model in ("A100-80GB", "H100-80GB")
        for pool, usd in ((Pool.ON_DEMAND, 4.0), (Pool.SPOT, 1.5))
    )
)


@pytest.fixture(scope="module")
def study() -> dict:  # type: ignore[type-arg]
    workload = generate_synthetic(seed=2, jobs=80, nodes=8, arrival_rate_per_hour=30.0)
    return run_spot_study(workload, SpotStudy("us-east-1a", fraction=0.5, seed=1), TRACE, PRICES, policy="fifo")


def test_spot_workload_marks_an_even_share_of_nodes_and_seeds_who_checkpoints() -> None:
    workload = generate_synthetic(seed=0, jobs=40, nodes=8)
    spot = spot_workload(workload, SpotStudy("z", fraction=0.25, checkpointing_share=0.5, seed=3), spot=True)
    assert [n.name for n in spot.nodes if n.pool == "spot"] == sorted(n.name for n in workload.nodes)[::4]
    assert {n.zone for n in spot.nodes if n.pool == "spot"} == {"z"}
    assert {t.job.request.spot for t in spot.jobs} == {"allowed"}
    saving = [t.job.request.checkpoints for t in spot.jobs]
    assert 0 < sum(saving) < len(saving)
    assert all((t.job.checkpoint_interval is not None) == t.job.request.checkpoints for t in spot.jobs)
    again = spot_workload(workload, SpotStudy("z", fraction=0.25, checkpointing_share=0.5, seed=3), spot=True)
    assert again == spot
    assert all(n.pool == "on-demand" for n in spot_workload(workload, SpotStudy("z"), spot=False).nodes)


def test_the_three_variants_price_per_pool_and_only_spot_nodes_are_interrupted(study: dict) -> None:  # type: ignore[type-arg]
    off, no_breaker, breaker = (study["variants"][v] for v in ("spot off", "breaker off", "breaker on"))
    assert off["gpu_hours_by_pool"].keys() == {"on-demand"}
    assert off["spot_interruptions"] == 0
    assert off["lost_gpu_hours"] >= 0
    assert no_breaker["spot_interruptions"] > 0
    assert no_breaker["breaker_events"] == 0
    assert "spot" in no_breaker["gpu_hours_by_pool"]
    assert breaker["breaker_events"] > 0  # 0.5 interruptions per node-hour is above the 0.3 threshold
    for row in (off, no_breaker, breaker):
        assert row["jobs_finished"] + row["jobs_unfinished"] == 80
        by_pool = row["gpu_hours_by_pool"]
        expected = 4.0 * by_pool.get("on-demand", 0.0) + 1.5 * by_pool.get("spot", 0.0)
        assert row["cost_usd"] == pytest.approx(expected, abs=0.05)
    assert study["citations"][0].startswith("spot interruptions: Wu, Chiang")


def test_the_study_is_deterministic(study: dict) -> None:  # type: ignore[type-arg]
    workload = generate_synthetic(seed=2, jobs=80, nodes=8, arrival_rate_per_hour=30.0)
    again = run_spot_study(workload, SpotStudy("us-east-1a", fraction=0.5, seed=1), TRACE, PRICES, policy="fifo")
    assert again == study


def test_spot_trace_statistics_and_bad_inputs() -> None:
    trace = load_spot_trace(spot_traces(), "us-east-1a")
    assert (trace.instance, trace.interruptions_per_hour) == ("v100_1", 0.2317)
    other = load_spot_trace(spot_traces(), "us-east-1c")  # a V100 preemption trace, not intel_64
    assert (other.instance, other.kind, other.interruptions_per_hour) == ("v100_1", "preemption", 0.2311)
    with pytest.raises(WorkloadError, match=r"give one of: .*us-east-1c"):
        load_spot_trace(spot_traces(), "mars-1a")
    assert parse_spot_pool("us-east-1a") == ("us-east-1a", 0.5)
    with pytest.raises(WorkloadError, match="ZONE"):
        parse_spot_pool("us-east-1a:1.5")


def test_sim_spot_pool_from_the_command_line() -> None:
    args = ["sim", "--workload", "synthetic", "--seed", "1", "--set", "nodes=4", "--set", "jobs=30"]
    args += ["--spot-pool", "us-east-1c:0.5", "--spot-traces", str(spot_traces())]
    args += ["--prices", str(price_tables()), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert set(report["variants"]) == {"spot off", "breaker off", "breaker on"}
    assert report["spot_pool"]["trace"]["zone"] == "us-east-1c"
    assert report["variants"]["spot off"]["unpriced_gpu_hours"] == 0.0  # H100-80GB priced as H100
    bad = CliRunner().invoke(
        app,
        [
            *args[:-7],
            "--spot-pool",
            "nowhere",
            "--spot-traces",
            str(spot_traces()),
            "--prices",
            str(price_tables()),
        ],
    )
    assert bad.exit_code != 0
    assert "no 1-node spot trace for zone 'nowhere'" in bad.output
