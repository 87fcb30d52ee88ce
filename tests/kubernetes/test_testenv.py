"""The test cluster itself is real: authentication and RBAC hold, kwok nodes look like GPU nodes with GPU feature
discovery's labels, pods on them live and end as the annotations say, evictions honour the grace period, and the
controllers compute ResourceQuota usage."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpufleet.adapters.inventory.emulated_inventory import load_inventory_yaml

T = TypeVar("T")
INVENTORY = """\
nodes:
  - {name: tenv-a100, gpus: 8xA100-80GB, cpu: 64, memory: 512GiB, rack: r1, zone: z-a}
  - {name: tenv-mixed, gpus: "2xT4,4xL4", cpu: 32, memory: 128GiB, rack: r2, zone: z-b}
"""
IMAGE = ("registry.example/train:1.0", 7_340_032_000)
NO_SCHEDULER = "tenv-none"  # a scheduler that does not exist: the tests bind their pods themselves


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 30) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s", pytrace=False)
        time.sleep(0.1)


@pytest.fixture(scope="module")
def core(k8s_cluster: Any) -> Iterator[Any]:
    from kubernetes import client

    api = k8s_cluster.api_client()
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()


@pytest.fixture(scope="module")
def nodes(k8s_cluster: Any, core: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    inventory = tmp_path_factory.mktemp("inventory") / "fleet.yaml"
    inventory.write_text(INVENTORY)
    k8s_cluster.add_nodes(load_inventory_yaml(inventory), images={"tenv-a100": [IMAGE]})
    try:
        yield {n.metadata.name: n for n in core.list_node().items if n.metadata.name.startswith("tenv-")}
    finally:
        for name in ("tenv-a100", "tenv-mixed"):
            core.delete_node(name)


@pytest.fixture
def namespace(k8s_cluster: Any, core: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    name = "tenv-" + request.node.name.removeprefix("test_").replace("_", "-")[:40].rstrip("-")
    k8s_cluster.ensure_namespace(name)
    try:
        yield name
    finally:
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)


def pod(name: str, gpus: int = 0, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    container = {"name": "main", "image": IMAGE[0], "resources": resources}
    return {
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"schedulerName": NO_SCHEDULER, "containers": [container]},
    }


def terminated(found: Any) -> Any:
    return found.status.container_statuses[0].state.terminated


def test_anonymous_and_unprivileged_clients_are_refused(k8s_cluster: Any, core: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    from kubernetes import client

    context = ssl.create_default_context(cafile=str(k8s_cluster.ca_file))
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(f"{k8s_cluster.server}/api/v1/pods", context=context, timeout=10)
    assert anonymous.value.code == 403
    assert "system:anonymous" in json.loads(anonymous.value.read())["message"]

    for name in ("tenv-own", "tenv-other"):
        k8s_cluster.ensure_namespace(name)
    token = k8s_cluster.service_account_token("tenv-own", "nobody", seconds=600)
    kubeconfig = k8s_cluster.kubeconfig_for_token("tenv-nobody", token)
    assert Path(kubeconfig).is_file()
    api = k8s_cluster.api_client(kubeconfig)
    try:
        review = client.AuthenticationV1Api(api).create_self_subject_review({"apiVersion": "authentication.k8s.io/v1"})
        assert review.status.user_info.username == "system:serviceaccount:tenv-own:nobody"
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(api).list_namespaced_pod("tenv-other")
        assert refused.value.status == 403
    finally:
        api.close()
    assert core.list_namespaced_pod("tenv-other").items == []  # the admin may


def test_nodes_carry_gpus_feature_discovery_labels_and_images(nodes: dict[str, Any]) -> None:
    a100, mixed = nodes["tenv-a100"], nodes["tenv-mixed"]
    for node in (a100, mixed):
        assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"
        assert not node.spec.taints
        assert node.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
    assert a100.status.capacity["nvidia.com/gpu"] == a100.status.allocatable["nvidia.com/gpu"] == "8"
    assert a100.status.allocatable["cpu"] == "64"
    assert a100.status.allocatable["memory"] == str(512 * 2**30)
    assert a100.status.allocatable["pods"] == "110"
    gpu_feature_discovery = {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.count": "8",
    }
    topology = {"topology.kubernetes.io/zone": "z-a", "gpufleet.io/rack": "r1", "gpufleet.io/nvlink-domain": "0"}
    assert a100.metadata.labels.items() >= (gpu_feature_discovery | topology).items()
    assert a100.metadata.labels["kubernetes.io/hostname"] == "tenv-a100"
    assert [(i.names, i.size_bytes) for i in a100.status.images] == [([IMAGE[0]], IMAGE[1])]
    # PCIe GPUs have no NVLink island of several GPUs; GPU feature discovery labels the first model's product.
    assert mixed.status.capacity["nvidia.com/gpu"] == "6"
    assert mixed.metadata.labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert mixed.metadata.labels["nvidia.com/gpu.count"] == "6"
    assert "gpufleet.io/nvlink-domain" not in mixed.metadata.labels
    assert not mixed.status.images


def test_pods_bound_to_a_kwok_node_run_succeed_and_fail(
    k8s_cluster: Any, core: Any, nodes: dict[str, Any], namespace: str
) -> None:
    annotations = {
        "runs": {},
        "succeeds": {"gpufleet.io/kwok-run-s": "2"},
        "fails": {"gpufleet.io/kwok-exit-code": "3"},
    }
    for name, annotated in annotations.items():
        core.create_namespaced_pod(namespace, pod(name, 1, annotated))
        k8s_cluster.bind_pod(namespace, name, "tenv-a100")

    def phase(name: str, wanted: str) -> Any:
        found = core.read_namespaced_pod(name, namespace)
        return found if found.status.phase == wanted else None

    running = wait_for("the pod to run", lambda: phase("runs", "Running"))
    status = running.status.container_statuses[0]
    assert status.ready
    assert status.started
    assert status.state.running is not None
    assert running.spec.node_name == "tenv-a100"
    failed = wait_for("the pod with exit code 3 to fail", lambda: phase("fails", "Failed"))
    assert terminated(failed).exit_code == 3
    succeeded = wait_for("the pod with run-s 2 to succeed", lambda: phase("succeeds", "Succeeded"), 10)
    assert terminated(succeeded).exit_code == 0
    # The API keeps whole seconds: the run is run-s long by its own recorded times.
    assert (terminated(succeeded).finished_at - succeeded.status.start_time).total_seconds() == 2
    assert core.read_namespaced_pod("runs", namespace).status.phase == "Running"  # no run-s: runs until deleted


def test_an_evicted_pod_terminates_for_its_grace_period(
    k8s_cluster: Any, core: Any, nodes: dict[str, Any], namespace: str
) -> None:
    from kubernetes.client.exceptions import ApiException

    core.create_namespaced_pod(namespace, pod("evicted"))
    k8s_cluster.bind_pod(namespace, "evicted", "tenv-a100")
    wait_for("the pod to run", lambda: core.read_namespaced_pod("evicted", namespace).status.phase == "Running")
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "evicted", "namespace": namespace},
        "deleteOptions": {"gracePeriodSeconds": 3},
    }
    core.create_namespaced_pod_eviction("evicted", namespace, eviction)
    evicted_at = time.monotonic()

    def gone() -> bool:
        try:
            found = core.read_namespaced_pod("evicted", namespace)
        except ApiException as error:
            return error.status == 404
        assert found.metadata.deletion_timestamp is not None  # Terminating from the eviction on
        return False

    time.sleep(1)
    assert not gone()
    wait_for("the evicted pod to go", gone, 10)
    # deletionTimestamp has whole seconds: the end of the grace period comes up to a second early.
    assert 2 <= time.monotonic() - evicted_at <= 5


def test_resource_quota_usage_of_gpus_is_computed(
    k8s_cluster: Any, core: Any, nodes: dict[str, Any], namespace: str
) -> None:
    from kubernetes.client.exceptions import ApiException

    quota = {"metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}}
    core.create_namespaced_resource_quota(namespace, quota)
    wait_for(
        "the quota to be counted",
        lambda: (
            (core.read_namespaced_resource_quota("gpus", namespace).status.used or {}).get("requests.nvidia.com/gpu")
            == "0"
        ),
    )
    core.create_namespaced_pod(namespace, pod("two-gpus", 2))
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(namespace, pod("three-more", 3))
    assert refused.value.status == 403
    assert "exceeded quota" in refused.value.body

    def used() -> str | None:
        return (core.read_namespaced_resource_quota("gpus", namespace).status.used or {}).get("requests.nvidia.com/gpu")

    wait_for("the quota controller to count 2 GPUs", lambda: used() == "2")
    core.delete_namespaced_pod("two-gpus", namespace, grace_period_seconds=0)
    wait_for("the quota controller to count 0 GPUs", lambda: used() == "0")


def test_kube_scheduler_places_gpu_pods_and_reset_clears_them(
    k8s_cluster: Any, core: Any, nodes: dict[str, Any], namespace: str
) -> None:
    k8s_cluster.start_scheduler()
    try:
        body = pod("scheduled", 4)
        body["spec"]["schedulerName"] = "default-scheduler"
        body["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "Tesla-T4"}
        core.create_namespaced_pod(namespace, body)
        placed = wait_for(
            "kube-scheduler to place the pod and kwok to run it",
            lambda: (p := core.read_namespaced_pod("scheduled", namespace)).status.phase == "Running" and p,
        )
        assert placed.spec.node_name == "tenv-mixed"
    finally:
        k8s_cluster.stop_scheduler()
    assert "kube-scheduler" not in k8s_cluster.processes
    k8s_cluster.reset()
    assert core.list_namespaced_pod(namespace).items == []
