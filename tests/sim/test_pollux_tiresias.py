"""The Pollux workloads and the Tiresias trace and cluster specs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpufleet.domain import GiB
from gpufleet.sim.workload import WorkloadError
from gpufleet.sim.workloads import load_cluster_spec, load_pollux, load_tiresias


@pytest.mark.parametrize("n", range(1, 9))
def test_each_pollux_workload_has_160_jobs_of_six_applications(traces_root: Path, n: int) -> None:
    w = load_pollux(traces_root / "pollux-osdi21", workload=n)
    assert len(w.jobs) == 160
    assert w.name == f"pollux-workload-{n}"
    assert {tj.job_type for tj in w.jobs} <= {"cifar10", "ncf", "deepspeech2", "bert", "yolov3", "imagenet"}
    assert w.gpu_count == 64
    assert w.models == {"T4"}
    assert all(tj.duration is None for tj in w.jobs)
    assert max(tj.arrival for tj in w.jobs) <= 8 * 3600


def test_pollux_workload_1_spot_checks(traces_root: Path) -> None:
    w = load_pollux(traces_root / "pollux-osdi21" / "workloads" / "workload-1.csv")
    by_id = {tj.id: tj for tj in w.jobs}
    # cifar10-0,107,cifar10,6,2048 -> 6 GPUs on 4-GPU nodes: a gang of 2 x 3
    first = by_id["cifar10-0"]
    assert (first.arrival, first.job_type, first.job.workers, first.job.request.gpus) == (107.0, "cifar10", 2, 3)
    # deepspeech2-3,262,deepspeech2,12,640 -> 3 x 4
    assert (by_id["deepspeech2-3"].job.workers, by_id["deepspeech2-3"].job.request.gpus) == (3, 4)
    assert Counter(tj.job_type for tj in w.jobs) == {
        "ncf": 68,
        "cifar10": 66,
        "deepspeech2": 12,
        "bert": 7,
        "imagenet": 4,
        "yolov3": 3,
    }


def test_pollux_application_durations(traces_root: Path) -> None:
    w = load_pollux(traces_root / "pollux-osdi21", workload=1, application_durations={"cifar10": 600.0})
    assert {tj.duration for tj in w.jobs if tj.job_type == "cifar10"} == {600.0}
    assert any("missing for" in a for a in w.assumptions)
    with pytest.raises(WorkloadError, match="seconds > 0"):
        load_pollux(traces_root / "pollux-osdi21", application_durations={"ncf": 0.0})


def test_pollux_unknown_workload(traces_root: Path) -> None:
    with pytest.raises(WorkloadError, match="workload-8"):
        load_pollux(traces_root / "pollux-osdi21", workload=9)


def test_tiresias_60_jobs_on_16_nodes_of_4(traces_root: Path) -> None:
    w = load_tiresias(traces_root / "tiresias-nsdi19")
    assert len(w.jobs) == 60
    assert (len(w.nodes), w.gpu_count) == (16, 64)
    node = w.nodes[0]
    assert (node.cpu_milli, node.memory, node.rack) == (128_000, 254 * GiB, "switch-0")
    assert Counter(tj.job.workers * tj.job.request.gpus for tj in w.jobs) == {1: 30, 2: 10, 4: 10, 8: 10}
    by_id = {tj.id: tj for tj in w.jobs}
    # 0,1,0,606,vgg19,164,30 and 1,8,30,133,vgg11,147,23
    assert (by_id["tiresias-0"].arrival, by_id["tiresias-0"].duration, by_id["tiresias-0"].job_type) == (
        0.0,
        164.0,
        "vgg19",
    )
    eight = by_id["tiresias-1"]
    assert (eight.arrival, eight.duration, eight.job.workers, eight.job.request.gpus) == (30.0, 147.0, 2, 4)
    assert "NSDI 2019" in w.citation


@pytest.mark.parametrize(("spec", "nodes", "gpus", "racks"), [("n32g4", 32, 128, 1), ("n160g8", 160, 1280, 5)])
def test_tiresias_cluster_specs(traces_root: Path, spec: str, nodes: int, gpus: int, racks: int) -> None:
    cluster = load_cluster_spec(traces_root / "tiresias-nsdi19" / f"{spec}.csv")
    assert (len(cluster), sum(len(n.gpus) for n in cluster)) == (nodes, gpus)
    assert len({n.rack for n in cluster}) == racks
    w = load_tiresias(traces_root / "tiresias-nsdi19", cluster=spec)
    assert w.gpu_count == gpus


def test_tiresias_unknown_cluster(traces_root: Path) -> None:
    with pytest.raises(WorkloadError, match="n160g8"):
        load_tiresias(traces_root / "tiresias-nsdi19", cluster="n999")
