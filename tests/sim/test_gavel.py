"""The Gavel throughput table and Gavel's generated workload."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gpufleet.sim.workload import ThroughputTable, Workload, WorkloadError
from gpufleet.sim.workloads import load_gavel, load_throughput_table

RESNET18 = "ResNet-18 (batch size 16)"


@pytest.fixture(scope="module")
def gavel_dir(traces_root: Path) -> Path:
    return traces_root / "gavel-osdi20"


@pytest.fixture(scope="module")
def table(gavel_dir: Path) -> ThroughputTable:
    return load_throughput_table(gavel_dir)


@pytest.fixture(scope="module")
def multi(gavel_dir: Path) -> Workload:
    return load_gavel(gavel_dir, rate_per_hour=6.0, seed=0, multi_gpu=True)


def test_table_has_492_rows_26_job_types_3_models(table: ThroughputTable) -> None:
    assert len(table.entries) == 492
    assert len(table.job_types) == 26
    assert table.models == ("K80", "P100", "V100")
    assert table.scale_factors("A3C") == (1,)
    assert table.scale_factors(RESNET18) == (1, 2, 4, 8)


def test_speed_lookup_ignores_model_case(table: ThroughputTable) -> None:
    # k80,consolidated,A3C,1,3.4387678290723933
    assert table.speed("A3C", "k80", 1) == pytest.approx(3.4387678290723933)
    assert table.speed("A3C", "K80", 1) == table.speed("A3C", "k80", 1, consolidated=False)
    assert table.get("A3C", "K80", 2) is None


def test_speedups_over_k80_match_the_readme(table: ThroughputTable) -> None:
    v100 = [table.relative_speed(t, "V100", 1, reference="K80") for t in table.job_types]
    p100 = [table.relative_speed(t, "P100", 1, reference="K80") for t in table.job_types]
    assert statistics.median(v100) == pytest.approx(4.05, abs=0.01)
    assert statistics.median(p100) == pytest.approx(3.32, abs=0.01)
    assert min(v100) == pytest.approx(0.66, abs=0.01)
    assert max(v100) == pytest.approx(11.6, abs=0.05)
    # Recommendation is slower on V100 than on K80 in this table: kept as measured
    assert table.relative_speed("Recommendation (batch size 512)", "V100", 1, reference="K80") < 1.06


def test_zero_throughput_is_kept_and_is_not_a_reference(table: ThroughputTable) -> None:
    # k80,consolidated,ResNet-50 (batch size 128),2,0.0
    assert table.speed("ResNet-50 (batch size 128)", "K80", 2) == 0.0
    assert table.relative_speed("ResNet-50 (batch size 128)", "K80", 2, reference="V100") == 0.0
    with pytest.raises(WorkloadError, match="throughput 0"):
        table.relative_speed("ResNet-50 (batch size 128)", "V100", 2, reference="K80")


def test_missing_entry_error_names_what_exists(table: ThroughputTable) -> None:
    with pytest.raises(WorkloadError, match="GPU counts for 'A3C': 1"):
        table.speed("A3C", "V100", 4)
    with pytest.raises(WorkloadError, match="use a job type the table has"):
        table.speed("GPT-5", "V100", 1)


def test_cluster_is_36_of_each_model_in_4_gpu_nodes(multi: Workload, table: ThroughputTable) -> None:
    assert multi.gpus_by_model() == {"K80": 36, "P100": 36, "V100": 36}
    assert len(multi.nodes) == 27
    assert multi.throughput == table
    assert "OSDI 2020" in multi.citation


def test_generation_is_seeded(gavel_dir: Path, multi: Workload) -> None:
    assert load_gavel(gavel_dir, rate_per_hour=6.0, seed=0, multi_gpu=True) == multi
    other = load_gavel(gavel_dir, rate_per_hour=6.0, seed=1, multi_gpu=True)
    assert [tj.job.job_type for tj in other.jobs] != [tj.job.job_type for tj in multi.jobs]


def test_poisson_arrivals_at_the_rate(multi: Workload) -> None:
    arrivals = np.array([tj.arrival for tj in multi.jobs])
    gaps = np.diff(arrivals)
    assert len(multi.jobs) == 6000
    assert np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(600.0, rel=0.05)  # 6 jobs/hour
    assert gaps.std() == pytest.approx(600.0, rel=0.1)  # exponential: std = mean


def test_scale_factors_and_types_follow_gavel(multi: Workload, table: ThroughputTable) -> None:
    sizes = Counter(tj.job.workers * tj.job.request.gpus for tj in multi.jobs)
    n = len(multi.jobs)
    for size, p in ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05)):
        assert sizes[size] / n == pytest.approx(p, abs=0.02)
    single_only = {t for t in table.job_types if table.scale_factors(t) == (1,)}
    assert len(single_only) == 7  # Recommendation x5, A3C, CycleGAN
    for tj in multi.jobs:
        gpus = tj.job.workers * tj.job.request.gpus
        assert tj.job_type in table.job_types
        if gpus > 1:
            assert tj.job_type not in single_only
        if gpus == 8:
            assert (tj.job.workers, tj.job.request.gpus) == (2, 4)  # 4-GPU nodes


def test_durations_follow_the_two_range_mixture(multi: Workload) -> None:
    durations = np.array([tj.duration for tj in multi.jobs], dtype=float)
    assert durations.min() >= 60 * 10**1.5
    assert durations.max() <= 60 * 10**4
    long_share = float(np.mean(durations > 60 * 10**3))
    assert long_share == pytest.approx(0.2, abs=0.02)


def test_single_gpu_trace(gavel_dir: Path) -> None:
    w = load_gavel(gavel_dir, rate_per_hour=2.0, seed=5, num_jobs=300)
    assert len(w.jobs) == 300
    assert {(tj.job.workers, tj.job.request.gpus) for tj in w.jobs} == {(1, 1)}
    assert len({tj.job_type for tj in w.jobs}) == 26


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"rate_per_hour": 0.0}, "rate_per_hour"),
        ({"rate_per_hour": 1.0, "num_jobs": 0}, "num_jobs"),
        ({"rate_per_hour": 1.0, "gpus_per_node": 5}, "multiple"),
    ],
)
def test_bad_parameters(gavel_dir: Path, options: dict[str, float], match: str) -> None:
    with pytest.raises(WorkloadError, match=match):
        load_gavel(gavel_dir, **options)  # type: ignore[arg-type]


def test_table_reference_is_v100(table: ThroughputTable) -> None:
    assert table.reference == "V100"
    assert table.relative_speed(RESNET18, "K80", 1) == table.relative_speed(RESNET18, "K80", 1, reference="v100")
    assert table.relative_speed(RESNET18, "V100", 4) == 1.0


def test_the_round_plan_keeps_wide_resnet50_off_k80s(table: ThroughputTable) -> None:
    """ResNet-50 on 8 K80s is measured only on one node, at 0 (it does not fit): a job of two 4-GPU workers
    (unconsolidated) must count at 0 there too, not at the other models' mean, or the LP gives it K80 time on
    which it makes no progress."""
    from gpufleet.domain import Job, WorkerRequest
    from gpufleet.policies.rounds.plan import Planner

    job = Job(id="r50", queue="q", request=WorkerRequest(gpus=4), workers=2, job_type="ResNet-50 (batch size 128)")
    row = dict(
        zip(("K80", "P100", "V100"), Planner(table, round_s=360.0).row(("K80", "P100", "V100"), job), strict=True)
    )
    assert row["K80"] == 0.0
    assert row["V100"] == table.get(job.job_type, "v100", 8, consolidated=False)
    assert row["P100"] == table.get(job.job_type, "p100", 8, consolidated=False)
