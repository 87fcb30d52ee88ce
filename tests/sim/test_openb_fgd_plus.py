"""Fidelity of `fgd-plus` on the FGD paper's openb protocol: GPU allocation at 100 % arrived load, seed 42,
against the FGD authors' published figures (fgd_atc23_expected_results_summary.csv).

Each run stops after the arrival that brings the load to 100 % (the protocol's 130 % sample, cut there: pods
never leave, so what comes later cannot change the 100 % step), about 10 s per trace. Ten-seed numbers are in
docs/ARCHITECTURE.md; seed 42 is one of the ten.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gpufleet.policies.catalog import profile
from gpufleet.sim.experiment import policy_data, run_policy
from gpufleet.sim.workloads import fgd_workload, load_fgd_expected_results

pytestmark = pytest.mark.slow


def alloc_at_100(openb_dir: Path, pods: str, policy: str) -> float:
    workload = fgd_workload(openb_dir, seed=42, pods=pods)
    data = policy_data(workload)  # FGD's target from the whole 130 % sample, as the full run has it
    arrived = np.cumsum([tj.gpu_milli_total for tj in workload.jobs])
    last = int(np.searchsorted(arrived, workload.gpu_capacity_milli)) + 1
    cut = replace(workload, jobs=workload.jobs[:last])
    result = run_policy(cut, profile(policy, data), fgd_protocol=True)
    steps = {s.arrived_pct: s for s in result.metrics.fgd_steps}
    assert steps[100].arrived_gpu_pct >= 100.0
    return steps[100].gpu_alloc_pct


# `default` places with fgd-plus's scores (plus topology, neutral on openb's single-group nodes).
@pytest.mark.parametrize("policy", ["fgd-plus", "default"])
def test_fgd_plus_beats_every_published_fgd_seed_on_gpuspec33(openb_dir: Path, policy: str) -> None:
    """Model-bound pods (29 %): FGD fills the scarce T4s with free pods; fgd-plus keeps them for the T4-bound."""
    published = load_fgd_expected_results(openb_dir)
    ours = alloc_at_100(openb_dir, "gpuspec33", policy)
    # measured 94.44 (ten seeds: 93.57-94.85); the best published FGD seed is 88.09
    assert ours > published.get("gpuspec33", "06-FGD", "gpu_alloc_pct", "max").at(100) + 5


@pytest.mark.parametrize("policy", ["fgd-plus", "default"])
def test_fgd_plus_reaches_published_fgd_on_default(openb_dir: Path, policy: str) -> None:
    """No model-bound pods: the scarcity score is neutral and fgd-plus places as fgd-bf."""
    published = load_fgd_expected_results(openb_dir)
    ours = alloc_at_100(openb_dir, "default", policy)
    # measured 95.51 (ten seeds: 94.91-95.51, mean 95.29); published FGD mean 95.23
    assert ours >= published.get("default", "06-FGD", "gpu_alloc_pct").at(100)
