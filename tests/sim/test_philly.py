"""The Philly loader against the numbers its README states, and the Helios published results."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpufleet.domain import GPU
from gpufleet.sim.workload import Workload, WorkloadError
from gpufleet.sim.workloads import load_helios_results, load_philly, load_vc_nodes
from gpufleet.sim.workloads.philly import HELIOS_WINDOW, PHILLY_MODEL

VC_NODES = {
    "6214e9": 64,
    "b436b2": 64,
    "ee9e8c": 64,
    "7f04ca": 32,
    "6c71a0": 32,
    "0e4a51": 32,
    "11cb48": 16,
    "e13805": 16,
    "2869ce": 16,
    "ed69ec": 8,
    "103959": 8,
}


def test_82247_jobs_and_the_gpu_counts_of_the_readme(philly: Workload) -> None:
    assert len(philly.jobs) == 82247
    gpus = Counter(tj.job.workers * tj.job.request.gpus for tj in philly.jobs)
    assert gpus == {1: 76627, 2: 1818, 4: 1870, 8: 1643, 16: 199, 32: 67, 12: 7, 24: 7, 64: 6, 128: 3}


def test_jobs_per_vc_match_the_readme(philly: Workload) -> None:
    per_vc = Counter(tj.job.queue for tj in philly.jobs)
    assert len(per_vc) == 15
    assert per_vc["6214e9"] == 41226
    assert per_vc["11cb48"] == 16091
    assert per_vc["6c71a0"] == 9953
    assert per_vc["b436b2"] == 7423
    assert sum(1 for n in per_vc.values() if n < 10) == 4


def test_cluster_is_352_nodes_of_8_gpus(philly: Workload, traces_root: Path) -> None:
    assert len(philly.nodes) == 352
    assert philly.gpu_count == 2816
    assert philly.models == {PHILLY_MODEL}
    assert all(len(n.gpus) == 8 for n in philly.nodes)
    assert load_vc_nodes(traces_root / "philly-2017" / "philly_vc_nodes_helios.csv") == VC_NODES


def test_queues_are_vcs_with_gpu_quotas(philly: Workload) -> None:
    queues = {q.name: q for q in philly.queues}
    for vc, nodes in VC_NODES.items():
        quota = queues[vc].quotas[GPU]
        assert quota.nominal == nodes * 8 * 1000
        assert quota.borrowing_limit == 0
        assert queues[vc].cohort == "philly"
    unknown = set(queues) - set(VC_NODES)
    assert unknown == {"23dbec", "51b7ef", "925e2b", "795a4c"}
    assert all(queues[vc].quotas[GPU].nominal == 0 and queues[vc].quotas[GPU].borrowing_limit is None for vc in unknown)


def test_vc_borrowing_and_dropping_unknown_vcs(traces_root: Path) -> None:
    w = load_philly(traces_root / "philly-2017", vc_borrowing=True, drop_unknown_vcs=True)
    assert len(w.jobs) == 82247 - 18
    assert len(w.queues) == 11
    assert all(q.quotas[GPU].borrowing_limit is None for q in w.queues)


def test_big_jobs_become_gangs_of_at_most_8_gpus(philly: Workload) -> None:
    shapes = Counter((tj.job.workers, tj.job.request.gpus) for tj in philly.jobs if tj.job.workers > 1)
    assert shapes == {(2, 8): 199, (4, 8): 67, (2, 6): 7, (3, 8): 7, (8, 8): 6, (16, 8): 3}


def test_row_spot_checks(philly: Workload) -> None:
    by_id = {tj.id: tj for tj in philly.jobs}
    first = by_id["philly-00000"]  # 2017-10-09 07:01:55,66.0,1,66.0,11cb48
    assert (first.duration, first.gpu_seconds_total, first.job.queue) == (66.0, 66.0, "11cb48")
    assert first.job.request.gpus == 1
    assert first.seq == 0
    last = by_id["philly-82246"]  # 2017-11-08 07:33:10,1896.0,1,1896.0,6c71a0
    assert (last.duration, last.job.queue) == (1896.0, "6c71a0")
    # arrivals are seconds from the first submission, 2017-09-04 10:30:41
    assert first.arrival == (35 * 86400) - (10 * 3600 + 30 * 60 + 41) + (7 * 3600 + 1 * 60 + 55)
    assert min(tj.arrival for tj in philly.jobs) == 0.0


def test_sorted_by_arrival_then_row(philly: Workload) -> None:
    keys = [(tj.arrival, tj.seq) for tj in philly.jobs]
    assert keys == sorted(keys)
    assert all(tj.duration is not None and tj.duration >= 1 for tj in philly.jobs)


def test_helios_window_has_68510_jobs(traces_root: Path) -> None:
    w = load_philly(traces_root / "philly-2017", start=HELIOS_WINDOW[0], end=HELIOS_WINDOW[1])
    assert len(w.jobs) == 68510
    assert min(tj.arrival for tj in w.jobs) >= 0.0
    assert max(tj.arrival for tj in w.jobs) < 61 * 86400


def test_window_errors(traces_root: Path) -> None:
    with pytest.raises(WorkloadError, match="YYYY-MM-DD"):
        load_philly(traces_root / "philly-2017", start="October")
    with pytest.raises(WorkloadError, match="before start"):
        load_philly(traces_root / "philly-2017", start="2017-11-01 00:00:00", end="2017-10-01 00:00:00")
    with pytest.raises(WorkloadError, match="no job is left"):
        load_philly(traces_root / "philly-2017", start="2018-01-01 00:00:00")


def test_helios_results_headline(traces_root: Path) -> None:
    results = load_helios_results(traces_root / "philly-2017")
    assert len(results.rows) == 96
    assert results.value("fifo", "avg_jct_s") == 86072
    assert results.value("sjf", "avg_jct_s") == 34272
    assert results.value("srtf", "avg_jct_s") == 30683
    assert results.value("qssf", "avg_jct_s") == 37324
    assert results.value("fifo", "avg_queue_s") == 56531
    assert results.value("qssf", "avg_queue_s") == 7783
    assert results.value("fifo", "avg_jct_s", vc="6214e9") == 97501
    with pytest.raises(WorkloadError, match="policies"):
        results.value("lottery", "avg_jct_s")
