"""How gpufleet reads Kubernetes Nodes and Pods (pure functions; the API server's own behaviour is tested
against a real one in tests/kubernetes)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from gpufleet.adapters.kubernetes.objects import (
    ObjectError,
    Usage,
    group_of,
    job_for_pods,
    job_id_for,
    milli,
    node_from_k8s,
    pod_info,
    quantity,
    rank_order,
)


def node(name: str = "n1", gpus: int = 8, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920", **labels},
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": str(gpus), "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(name: str = "p", gpus: int = 1, cpu: str = "4", scheduler: str = "gpufleet", **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "uid": f"uid-{name}"}
    meta.update(extra.pop("meta", {}))
    return {
        "metadata": meta,
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "c",
                    "image": "train:1",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": cpu, "memory": "8Gi"}},
                }
            ],
            **extra.pop("spec", {}),
        },
        "status": extra.pop("status", {"phase": "Pending"}),
    }


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("2", Decimal(2)),
        ("16Gi", Decimal(16 * 2**30)),
        ("1k", Decimal(1000)),
        ("1e3", Decimal(1000)),
    ],
)
def test_quantities_read_as_kubernetes_writes_them(text: str, value: Decimal) -> None:
    assert quantity(text) == value


def test_a_bad_quantity_says_how_to_write_one() -> None:
    with pytest.raises(ObjectError, match="to fix: write it as Kubernetes does"):
        milli("two cores")


def test_a_node_is_its_allocatable_less_what_other_schedulers_pods_hold() -> None:
    read = node_from_k8s(node(**{"topology.kubernetes.io/zone": "z1", "gpufleet.io/rack": "r7"}), Usage(4000, 2**30, 3))
    assert len(read.gpus) == 5
    assert read.gpus[0].model == "A100-80GB"
    assert read.gpus[0].memory == 80 * 2**30
    assert (read.cpu_milli, read.memory, read.zone, read.rack) == (92_000, 2**40 - 2**30, "z1", "r7")
    assert read.healthy
    assert not read.cordoned


def test_a_not_ready_or_unschedulable_node_is_unhealthy_or_cordoned() -> None:
    raw = node()
    raw["spec"]["unschedulable"] = True
    raw["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    read = node_from_k8s(raw)
    assert read.cordoned
    assert not read.healthy


def test_a_pod_asks_the_sum_of_its_containers_or_its_largest_init_container() -> None:
    raw = pod(spec={"initContainers": [{"name": "i", "resources": {"requests": {"cpu": "16"}}}]})
    raw["spec"]["containers"].append({"name": "side", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}})
    info = pod_info(raw)
    assert info.usage == Usage(16_000, 9 * 2**30, 1)
    assert info.ours
    assert not info.holds
    assert info.images == ("train:1",)


def test_exit_codes_come_from_terminated_containers() -> None:
    status = {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {"exitCode": 3}}}]}
    assert pod_info(pod(status=status)).exit_code == 3


def test_a_gang_needs_the_kueue_total_count_and_says_so_when_it_is_bad() -> None:
    labels = {
        "labels": {"kueue.x-k8s.io/pod-group-name": "g"},
        "annotations": {"kueue.x-k8s.io/pod-group-total-count": "4"},
    }
    assert group_of(pod_info(pod(meta=labels))) is not None
    labels["annotations"] = {"kueue.x-k8s.io/pod-group-total-count": "four"}
    with pytest.raises(ObjectError, match="pod-group-total-count"):
        group_of(pod_info(pod(meta=labels)))


def test_a_gang_of_pods_asking_different_resources_is_refused_with_both_named() -> None:
    pods = [pod_info(pod("a", gpus=2)), pod_info(pod("b", gpus=4))]
    with pytest.raises(ObjectError, match="pods a and b of one group ask for different resources"):
        job_for_pods("k8s-x", pods, 0, 0.0)


def test_a_pods_job_takes_queue_priority_model_and_rank_from_the_pods() -> None:
    meta = {"labels": {"gpufleet.io/queue": "research"}, "annotations": {}}
    spec = {"priority": 1000, "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
    pods = [
        pod_info(pod(n, gpus=8, meta={**meta, "annotations": {"gpufleet.io/rank": r}}, spec=spec))
        for n, r in (("z", "0"), ("a", "1"))
    ]
    ranked = rank_order(pods)
    assert [p.name for p in ranked] == ["z", "a"]
    job = job_for_pods("k8s-1", ranked, 0, 5.0)
    assert (job.queue, job.priority, job.workers, job.request.gpus, job.request.models) == (
        "research",
        1000,
        2,
        8,
        frozenset({"H100"}),
    )


def test_a_fractional_pod_names_its_share_and_no_whole_gpu() -> None:
    info = pod_info(pod(gpus=0, meta={"annotations": {"gpufleet.io/gpu-milli": "250"}}))
    job = job_for_pods("k8s-f", [info], 0, 0.0)
    assert (job.request.gpus, job.request.gpu_milli) == (1, 250)
    with pytest.raises(ObjectError, match="share of one GPU"):
        pod_info(pod(gpus=1, meta={"annotations": {"gpufleet.io/gpu-milli": "250"}}))


def test_job_ids_are_the_same_every_time_and_differ_between_pods() -> None:
    assert job_id_for("ns", "p", "u1") == job_id_for("ns", "p", "u1") != job_id_for("ns", "p", "u2")


def test_a_node_never_ends_below_a_gpu_gpufleet_placed_and_takes_nothing_new_while_it_would() -> None:
    # gpufleet holds index 6; other pods took 4 of the 8 GPUs since: 4 remain, but the numbering needs 7.
    read = node_from_k8s(node(), Usage(0, 0, 4), highest_held=6)
    assert len(read.gpus) == 7
    assert read.cordoned
    assert not node_from_k8s(node(), Usage(0, 0, 1), highest_held=6).cordoned
