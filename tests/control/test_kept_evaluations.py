"""A control loop's base keeps its forks' filter evaluations and kept scores between cycles
(`LoopState.keep_from`); the decisions are exactly those of evaluating every cycle afresh."""

from __future__ import annotations

import json
from dataclasses import asdict
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.control import loop_state
from gpufleet.policies.catalog import profile
from gpufleet.sim.engine import Simulation
from gpufleet.sim.workloads import generate_synthetic

# Heavy contention on a small fleet: queueing, preemption, reclaim, fractional GPUs and gangs.
POLICIES = ("default", "fair-binpack", "fifo-backfill", "tiresias", "fgd-plus", "best-fit")


def event_log(seed: int, policy: str) -> bytes:
    workload = generate_synthetic(seed=seed, jobs=90, nodes=4, arrival_rate_per_hour=600.0, duration_median_s=900.0)
    run = Simulation(workload, profile(policy)).run()
    return json.dumps([asdict(t) for t in run.store.log]).encode()


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(POLICIES))
def test_kept_evaluations_decide_as_fresh_ones(seed: int, policy: str) -> None:
    kept = event_log(seed, policy)
    with patch.object(loop_state, "KEPT_EVALUATIONS", 0):
        fresh = event_log(seed, policy)
    assert kept == fresh
    assert kept.count(b'"target": "admitted"') >= 50  # most jobs were placed: the comparison says something
