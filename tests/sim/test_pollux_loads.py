"""Pollux's workloads at other loads: arrivals scaled, beside Pollux's published figure at that job load."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.sim.reproduce_pollux import reproduce_pollux
from gpufleet.sim.workload import WorkloadError


def test_load_2_packs_the_same_jobs_into_half_the_time(traces_root: Path) -> None:
    one = reproduce_pollux(traces_root, policies=("tiresias",), workloads=(1,))
    two = reproduce_pollux(traces_root, policies=("tiresias",), workloads=(1,), load=2.0)
    jobs_1, jobs_2 = (c.experiments[0].workload.jobs for c in (one, two))
    assert [tj.job.id for tj in jobs_1] == [tj.job.id for tj in jobs_2]
    span_1 = jobs_1[-1].arrival - jobs_1[0].arrival
    span_2 = jobs_2[-1].arrival - jobs_2[0].arrival
    assert span_2 == pytest.approx(span_1 / 2)
    assert [tj.duration for tj in jobs_1] == [tj.duration for tj in jobs_2]
    row_1, row_2 = (next(r for r in c.rows if r[1] == "1") for c in (one, two))
    assert row_2[3] == 6186.26  # Pollux's published job load 2.0, workload 1 (more jobs, not these)
    assert row_2[2] > row_1[2]  # more load, longer average JCT
    assert "load 2" in two.title
    assert any(note.startswith("Load 2: our arrivals are scaled") for note in two.notes)


def test_a_load_out_of_range_is_refused(traces_root: Path) -> None:
    with pytest.raises(WorkloadError, match="out of range"):
        reproduce_pollux(traces_root, policies=("tiresias",), workloads=(1,), load=0.0)
