"""LAS preemption keeps a group's ranking across cycles (`LasPreemption._ranked`): on Gavel's trace under load,
the decisions are the same as ranking every group afresh in every cycle, with and without a minimum run."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpufleet.policies.catalog import profile
from gpufleet.policies.preempt.las import LasPreemption, Run
from gpufleet.scheduling.plugin_api import ClusterView
from gpufleet.sim.experiment import policy_data, run_policy
from gpufleet.sim.workloads import load_gavel


class Counting(LasPreemption):
    """Counts rankings made; with `fresh`, ranks every group in every cycle (the reference)."""

    def __init__(self, *, min_run_s: float, fresh: bool) -> None:
        super().__init__(min_run_s=min_run_s)
        self.fresh = fresh
        self.made = 0

    def _ranked(self, group: tuple[str, int], members: Sequence[str], cluster: ClusterView) -> list[tuple[int, str]]:
        if self.fresh:
            self._rankings.clear()
        return super()._ranked(group, members, cluster)

    def _rank(self, runs: tuple[Run, ...], cluster: ClusterView) -> tuple[list[tuple[int, str]], float]:
        self.made += 1
        return super()._rank(runs, cluster)


@pytest.mark.parametrize("min_run_s", [0.0, 900.0])
def test_kept_rankings_decide_as_fresh_ones(traces_root: Path, min_run_s: float) -> None:
    workload = load_gavel(traces_root / "gavel-osdi20", rate_per_hour=6.0, seed=0, num_jobs=1000)
    base = profile("tiresias", policy_data(workload))
    outcomes = []
    plugins = []
    for fresh in (False, True):
        las = Counting(min_run_s=min_run_s, fresh=fresh)
        run = run_policy(workload, dataclasses.replace(base, preempt=las)).run
        outcomes.append(sorted((r.id, r.finished_at, r.attempt, r.preemptions) for r in run.store.all()))
        plugins.append(las)
    kept, fresh = plugins
    assert fresh.made > 0
    assert kept.made < fresh.made  # rankings were kept across cycles ...
    # ... and every job finished at the same time, after as many attempts and preemptions
    assert outcomes[0] == outcomes[1]
