"""`gpufleet bench scheduler` at a small size: every cycle it times is a valid decision, and what it prints
(jobs and GPUs placed per second) adds up to those decisions."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpufleet.bench import scheduler
from gpufleet.cli.main import app
from gpufleet.policies.catalog import profile
from tests.kit.invariants import check_all

NODES, PENDING = 40, 400


@pytest.mark.parametrize("policy", ["default", "fair-binpack", "fifo"])
def test_every_benchmark_cycle_keeps_the_invariants(policy: str) -> None:
    fleet = scheduler.build_fleet(NODES, PENDING, seed=3)
    prof = profile(policy)
    seen = list(scheduler.cycles(fleet, prof))
    for cycle in seen:
        check_all(cycle.snapshot, cycle.pending, cycle.result, prof)
    last = seen[-1].result
    assert not last.placements
    assert not last.preemptions
    assert sum(len(c.result.placements) for c in seen) > 0


def test_fair_binpack_preempts_in_the_benchmark() -> None:
    """The benchmark exercises preemption (quota reclaim between the teams), not only placement."""
    fleet = scheduler.build_fleet(NODES, PENDING, seed=3)
    assert sum(len(c.result.preemptions) for c in scheduler.cycles(fleet, profile("fair-binpack"))) > 0


def test_printed_rates_count_jobs_and_gpus_of_the_decisions() -> None:
    fleet = scheduler.build_fleet(NODES, PENDING, seed=3)
    seen = list(scheduler.cycles(fleet, profile("default")))
    jobs = sum(len(c.result.placements) for c in seen)
    gpus = sum(scheduler.placed_gpus(p) for c in seen for p in c.result.placements)
    result = CliRunner().invoke(
        app, ["bench", "scheduler", "--nodes", str(NODES), "--pending", str(PENDING), "--seed", "3"]
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures["placed"] == jobs
    assert figures["gpus_placed"] == pytest.approx(gpus)
    assert figures["cycles"] == len(seen)
    assert figures["gpus_placed_per_s"] == pytest.approx(gpus / figures["seconds"], rel=0.01)
    assert figures["placements_per_s"] == pytest.approx(jobs / figures["seconds"], rel=0.01)
    # Fractional shares count as fractions: GPUs placed is not the job count.
    assert gpus != jobs
    for moment in ("host_yardstick_before", "host_yardstick_after"):
        assert figures[moment]["total_ms"] > 0  # the host's speed beside the figures
