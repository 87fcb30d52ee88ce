"""QSSF's learner reads what changed from the control loop's running log (`CycleState.running_log`)
instead of comparing every running job each step; it learns exactly what the full comparison learns."""

from __future__ import annotations

import json
from dataclasses import asdict
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.policies.catalog import profile
from gpufleet.scheduling import state as state_module
from gpufleet.sim.engine import Simulation
from gpufleet.sim.workloads import generate_synthetic


def event_log(seed: int, policy: str) -> bytes:
    workload = generate_synthetic(seed=seed, jobs=90, nodes=4, arrival_rate_per_hour=600.0, duration_median_s=900.0)
    run = Simulation(workload, profile(policy)).run()
    return json.dumps([asdict(t) for t in run.store.log]).encode()


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(("default", "qssf")))
def test_learning_from_the_log_decides_as_comparing_every_running_job(seed: int, policy: str) -> None:
    from_log = event_log(seed, policy)
    # A limit of 0 gives the base a new log at every change: the learner never recognises it and compares
    # every running job, as it does for states that are not a control loop's.
    with patch.object(state_module, "RUNNING_LOG_LIMIT", 0):
        compared = event_log(seed, policy)
    assert from_log == compared
    assert from_log.count(b'"target": "succeeded"') >= 50  # jobs finished: the learner had something to learn
