"""The FGD workload sampling protocol and the published FGD results."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpufleet.domain import Job, QueueSpec, WorkerRequest
from gpufleet.sim.workload import TraceJob, Workload, WorkloadError
from gpufleet.sim.workloads import fgd_sample_pods, fgd_workload, load_fgd_expected_results
from gpufleet.sim.workloads.openb_fgd import gpu_share_pct, with_gpu_share

CAPACITY = 6212 * 1000


def _pod(name: str, gpus: int, milli: int = 1000) -> TraceJob:
    request = WorkerRequest(gpus=gpus, gpu_milli=milli if gpus else 1000)
    return TraceJob(Job(id=name, queue="default", request=request))


SMALL = (_pod("a", 1, 500), _pod("b", 2), _pod("c", 0), _pod("d", 8), _pod("e", 1, 250))


def test_same_seed_same_order_and_different_seed_differs(openb_default: Workload) -> None:
    first = fgd_sample_pods(openb_default.jobs, CAPACITY, seed=42)
    again = fgd_sample_pods(openb_default.jobs, CAPACITY, seed=42)
    other = fgd_sample_pods(openb_default.jobs, CAPACITY, seed=43)
    assert first == again
    assert [tj.id for tj in first] != [tj.id for tj in other]


def test_stop_rule_reaches_130_percent_and_stops_at_the_first_draw_that_does(openb_default: Workload) -> None:
    for seed in (42, 51):
        pods = fgd_sample_pods(openb_default.jobs, CAPACITY, seed=seed)
        target = 1.3 * CAPACITY
        # the last draw (in draw order, the '#k' suffix) is the one that reached the target
        by_draw = sorted(pods, key=lambda tj: int(tj.id.rsplit("#", 1)[1]))
        total = sum(tj.gpu_milli_total for tj in pods)
        assert total >= target
        assert total - by_draw[-1].gpu_milli_total < target
        assert by_draw[-1].gpu_milli_total > 0


def test_sample_is_shuffled_renamed_and_has_no_durations(openb_default: Workload) -> None:
    pods = fgd_sample_pods(openb_default.jobs, CAPACITY, seed=42)
    assert len({tj.id for tj in pods}) == len(pods)
    assert [tj.seq for tj in pods] == list(range(len(pods)))
    assert [tj.arrival for tj in pods] == [float(i) for i in range(len(pods))]
    assert all(tj.duration is None for tj in pods)
    draw_numbers = [int(tj.id.rsplit("#", 1)[1]) for tj in pods]
    assert draw_numbers != sorted(draw_numbers)  # shuffled
    # with replacement: some pods are drawn more than once
    sources = Counter(tj.id.rsplit("#", 1)[0] for tj in pods)
    assert max(sources.values()) > 1
    assert all(name.startswith("openb-pod-") for name in sources)


def test_sampled_copies_keep_the_request_of_their_pod(openb_default: Workload) -> None:
    by_id = {tj.id: tj for tj in openb_default.jobs}
    for tj in fgd_sample_pods(openb_default.jobs, CAPACITY, seed=7)[:200]:
        assert tj.job.request == by_id[tj.id.rsplit("#", 1)[0]].job.request


def test_target_percent_is_a_parameter() -> None:
    pods = fgd_sample_pods(SMALL, 10_000, seed=1, target_pct=50)
    total = sum(tj.gpu_milli_total for tj in pods)
    last = max(pods, key=lambda tj: int(tj.id.rsplit("#", 1)[1]))
    assert 5_000 <= total < 5_000 + last.gpu_milli_total


def test_keep_originals_follows_the_upstream_rule() -> None:
    pods = fgd_sample_pods(SMALL, 10_000, seed=3, keep_originals=True)
    ids = [tj.id for tj in pods]
    assert {"a", "b", "c", "d", "e"} <= set(ids)  # every pod once, under its own name
    total = sum(tj.gpu_milli_total for tj in pods)
    assert total <= 13_000  # never above the target
    assert fgd_sample_pods(SMALL, 10_000, seed=3, keep_originals=True) == pods


def test_keep_originals_on_the_trace(openb_default: Workload) -> None:
    pods = fgd_sample_pods(openb_default.jobs, CAPACITY, seed=42, keep_originals=True)
    total = sum(tj.gpu_milli_total for tj in pods)
    assert 1.3 * CAPACITY - 8000 < total <= 1.3 * CAPACITY
    assert sum(1 for tj in pods if "#" not in tj.id) == 8152


@pytest.mark.parametrize(
    ("pods", "capacity", "pct", "match"),
    [
        ((), 1000, 130.0, "no pods"),
        (SMALL, 0, 130.0, "capacity"),
        (SMALL, 1000, 0.0, "target"),
        ((_pod("cpu", 0),), 1000, 130.0, "no pod requests a GPU"),
    ],
)
def test_sampling_errors(pods: tuple[TraceJob, ...], capacity: int, pct: float, match: str) -> None:
    with pytest.raises(WorkloadError, match=match):
        fgd_sample_pods(pods, capacity, seed=0, target_pct=pct)


def test_fgd_workload_is_the_gpu_cluster_with_the_sample(openb_dir: Path) -> None:
    w = fgd_workload(openb_dir, seed=42)
    assert len(w.nodes) == 1213
    assert w.gpu_count == 6212
    assert w.queues == (QueueSpec("default"),)
    assert w.name == "openb-fgd-default-seed42"
    assert sum(tj.gpu_milli_total for tj in w.jobs) >= 1.3 * w.gpu_capacity_milli
    assert w == fgd_workload(openb_dir, seed=42)
    constrained = fgd_workload(openb_dir, seed=42, pods="gpuspec33")
    assert any(tj.job.request.models for tj in constrained.jobs)


def test_expected_results_shape(openb_dir: Path) -> None:
    results = load_fgd_expected_results(openb_dir)
    assert len(results.series) == 918
    assert results.policies == ("01-Random", "02-DotProd", "03-GpuClustering", "04-GpuPacking", "05-BestFit", "06-FGD")
    assert len(results.workloads) == 17
    series = results.get("default", "06-FGD", "gpu_alloc_pct")
    assert series.arrived_pct == tuple(range(0, 131, 5))
    assert series.n_seeds == 10


@pytest.mark.parametrize(
    ("policy", "at100", "at130"),
    [
        ("06-FGD", 95.23, 95.39),
        ("05-BestFit", 92.86, 93.08),
        ("04-GpuPacking", 91.78, 92.00),
        ("03-GpuClustering", 91.65, 91.88),
        ("02-DotProd", 90.62, 90.85),
        ("01-Random", 86.30, 87.47),
    ],
)
def test_expected_results_headline_from_the_readme(openb_dir: Path, policy: str, at100: float, at130: float) -> None:
    results = load_fgd_expected_results(openb_dir / "fgd_atc23_expected_results_summary.csv")
    assert results.point("openb_pod_list_default", policy, 100).gpu_alloc_pct == at100
    assert results.get("default", policy, "gpu_alloc_pct").at(130) == at130


def test_expected_results_point_and_lookup_errors(openb_dir: Path) -> None:
    results = load_fgd_expected_results(openb_dir)
    point = results.point("default", "06-FGD", 100)
    assert (point.frag_gpu_pct_of_capacity, point.frag_ratio_pct_of_idle) == (4.73, 99.07)
    assert results.get("default", "06-FGD", "gpu_alloc_pct", "min").at(0) <= point.gpu_alloc_pct
    with pytest.raises(WorkloadError, match="06-FGD"):
        results.get("default", "07-Nope", "gpu_alloc_pct")
    with pytest.raises(WorkloadError, match="130"):
        results.get("default", "06-FGD", "gpu_alloc_pct").at(3)


@pytest.mark.parametrize("share", [40.0, 80.0, 100.0])
def test_resampled_lists_have_the_asked_gpu_sharing(openb_default: Workload, share: float) -> None:
    pods = openb_default.jobs
    assert gpu_share_pct(pods) == pytest.approx(28.5, abs=0.1)  # the default list's own share
    resampled = with_gpu_share(pods, share, seed=0)
    assert gpu_share_pct(resampled) == pytest.approx(share, abs=1.0)
    gpu_pods = sum(1 for tj in pods if tj.job.request.gpus)
    assert sum(1 for tj in resampled if tj.job.request.gpus) == gpu_pods
    assert [tj.id for tj in resampled if not tj.job.request.gpus] == [tj.id for tj in pods if not tj.job.request.gpus]
    assert len({tj.id for tj in resampled}) == len(resampled)
    assert {tj.job.request for tj in resampled} <= {tj.job.request for tj in pods}  # drawn from the list
    assert with_gpu_share(pods, share, seed=0) == resampled
    assert with_gpu_share(pods, share, seed=1) != resampled


def test_resampling_errors(openb_default: Workload) -> None:
    with pytest.raises(WorkloadError, match="GPU-sharing share is 0 %"):
        with_gpu_share(openb_default.jobs, 0.0)
    whole_only = tuple(tj for tj in openb_default.jobs if tj.job.request.gpus and not tj.job.request.fractional)
    with pytest.raises(WorkloadError, match="lacks fractional or whole-GPU pods"):
        with_gpu_share(whole_only, 50.0)
