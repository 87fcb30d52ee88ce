"""`qssf` on a slice of Philly: learned run times, no oracle, and shorter JCT than strict FIFO under contention."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.policies.catalog import profile
from gpufleet.sim.experiment import run_policy, scale_load
from gpufleet.sim.metrics import PolicyMetrics
from gpufleet.sim.workload import Workload
from gpufleet.sim.workloads import load_philly

# Two days of October, arrivals compressed 8x: 1,692 jobs, enough queueing to order, seconds to simulate.
SLICE = ("2017-10-02 00:00:00", "2017-10-03 23:59:59")


@pytest.fixture(scope="module")
def workload(traces_root: Path) -> Workload:
    return scale_load(load_philly(traces_root / "philly-2017", start=SLICE[0], end=SLICE[1]), 8)


@pytest.fixture(scope="module")
def fifo(workload: Workload) -> PolicyMetrics:
    return run_policy(workload, profile("fifo")).metrics


@pytest.mark.parametrize("name", ["qssf", "default-qssf", "default"])
def test_qssf_ignores_oracle_durations_and_beats_strict_fifo(
    workload: Workload, fifo: PolicyMetrics, name: str
) -> None:
    qssf = run_policy(workload, profile(name))
    with_oracle = run_policy(workload.with_expected_durations(), profile(name))
    # The same decisions whether or not jobs carry their trace run times: the oracle is never read.
    assert with_oracle.metrics.jct.avg == qssf.metrics.jct.avg
    assert with_oracle.metrics.queueing.avg == qssf.metrics.queueing.avg
    assert qssf.metrics.jobs_unfinished == fifo.jobs_unfinished == 0
    fifo_queueing, fifo_jct, jct = fifo.queueing.avg, fifo.jct.avg, qssf.metrics.jct.avg
    assert fifo_queueing is not None
    assert fifo_jct is not None
    assert jct is not None
    assert fifo_queueing > 600  # the slice does queue under FIFO, so ordering matters
    # Measured: 10,059 s vs 11,956 s (0.84); most of it is backfill (fifo-backfill: 10,058 s), not the prediction.
    assert jct < 0.9 * fifo_jct
