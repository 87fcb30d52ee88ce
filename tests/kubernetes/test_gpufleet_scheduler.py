"""gpufleet as the GPU scheduler of a real Kubernetes cluster (API server, controller manager and etcd built from
Kubernetes' own sources; kwok plays the kubelets of the GPU nodes). gpufleet runs as `gpufleet up --kubernetes`
in a child process, with the token of the service account that deploy/kubernetes/base makes: not an admin."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpufleet.adapters.kubernetes.kube_api import KubeApi, KubeApiError
from gpufleet.bench.api import LocalServer
from gpufleet.domain.cluster import Gpu, Node

pytestmark = pytest.mark.kubernetes

REPO = Path(__file__).resolve().parents[2]
TEAMS = ("team-a", "team-b")
GiB = 2**30


def fleet_nodes(count: int = 4) -> list[Node]:
    return [
        Node(
            name=f"gpu-{i}",
            gpus=tuple(Gpu(j, f"GPU-{i}-{j}", "A100-80GB", 80 * GiB) for j in range(8)),
            cpu_milli=96_000,
            memory=1024 * GiB,
            rack=f"rack-{i // 2}",
            zone="zone-1",
        )
        for i in range(count)
    ]


def apply_manifest(api: KubeApi, path: Path) -> None:
    """What `kubectl apply` does for the few kinds these manifests hold: create, or leave what exists."""
    where = {
        "Namespace": "/api/v1/namespaces",
        "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
        "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
        "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
        "PriorityClass": "/apis/scheduling.k8s.io/v1/priorityclasses",
    }
    for doc in yaml.safe_load_all(path.read_text()):
        create(api, where[doc["kind"]].format(ns=doc["metadata"].get("namespace", "gpufleet-system")), doc)


def create(api: KubeApi, path: str, body: dict[str, Any]) -> None:
    try:
        api.create(path, body)
    except KubeApiError as error:
        if error.status != 409:
            raise


class Pods:
    """Pods made the way a team makes them: `schedulerName: gpufleet` and a GPU limit."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def make(
        self,
        name: str,
        gpus: int = 1,
        *,
        namespace: str = "team-a",
        run_s: float | None = None,
        exit_code: int | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        priority_class: str | None = None,
        grace_s: int | None = None,
    ) -> None:
        notes = dict(annotations or {})
        if run_s is not None:
            notes["gpufleet.io/kwok-run-s"] = str(run_s)
        if exit_code is not None:
            notes["gpufleet.io/kwok-exit-code"] = str(exit_code)
            notes.setdefault("gpufleet.io/kwok-run-s", "1")
        spec: dict[str, Any] = {
            "schedulerName": "gpufleet",
            "containers": [
                {
                    "name": "train",
                    "image": "train:1",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": "1", "memory": "1Gi"}},
                }
            ],
        }
        if priority_class:
            spec["priorityClassName"] = priority_class
        if grace_s is not None:
            spec["terminationGracePeriodSeconds"] = grace_s
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}, "annotations": notes},
            "spec": spec,
        }
        self.api.create(f"/api/v1/namespaces/{namespace}/pods", body)

    def get(self, name: str, namespace: str = "team-a") -> dict[str, Any] | None:
        try:
            pod = self.api.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise
        assert isinstance(pod, dict)
        return pod

    def wait(
        self, name: str, ok: Callable[[dict[str, Any] | None], bool], timeout_s: float = 30.0, namespace: str = "team-a"
    ) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout_s
        while True:
            pod = self.get(name, namespace)
            if ok(pod):
                return pod
            if time.monotonic() > deadline:
                raise AssertionError(f"pod {namespace}/{name} not as expected after {timeout_s} s: {pod}")
            time.sleep(0.1)

    def phase(self, name: str, *phases: str, timeout_s: float = 30.0) -> dict[str, Any]:
        pod = self.wait(name, lambda p: p is not None and p["status"].get("phase") in phases, timeout_s)
        assert pod is not None
        return pod

    def events(self, name: str, namespace: str = "team-a") -> list[dict[str, Any]]:
        found = self.api.list(f"/api/v1/namespaces/{namespace}/events", fieldSelector=f"involvedObject.name={name}")
        return list(found.get("items") or ())

    def clear(self) -> None:
        for namespace in TEAMS:
            for pod in self.api.list(f"/api/v1/namespaces/{namespace}/pods").get("items") or ():
                try:
                    self.api.delete_pod(namespace, pod["metadata"]["name"], 0)
                except KubeApiError as error:
                    if error.status != 404:
                        raise
        deadline = time.monotonic() + 30
        while any(self.api.list(f"/api/v1/namespaces/{ns}/pods").get("items") for ns in TEAMS):
            assert time.monotonic() < deadline, "pods still there 30 s after deletion"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def admin(k8s_cluster: Any) -> Iterator[KubeApi]:
    api = KubeApi(Path(k8s_cluster.admin_kubeconfig))
    for manifest in ("namespace.yaml", "serviceaccount.yaml", "clusterrole.yaml", "clusterrolebinding.yaml"):
        apply_manifest(api, REPO / "deploy/kubernetes/base" / manifest)
    for team in TEAMS:
        create(api, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": team}})
    for name, value in (("low", 100), ("high", 10_000)):
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        create(api, "/apis/scheduling.k8s.io/v1/priorityclasses", body)
    k8s_cluster.add_nodes(fleet_nodes())
    yield api
    api.close()


class Plane:
    """`gpufleet up --kubernetes` in a child process, restartable on the same data (a kill -9 test)."""

    def __init__(self, data: Path, kubeconfig: Path) -> None:
        self.data = data
        self.extra = ("--kubernetes", str(kubeconfig))
        self.server = LocalServer(data, emulate=None, extra=self.extra, ready_timeout_s=60)

    @property
    def url(self) -> str:
        return self.server.url

    def client(self) -> httpx.Client:
        return self.server.client()

    def kill_and_restart(self) -> None:
        self.server.process.send_signal(signal.SIGKILL)
        self.server.process.wait(10)
        self.server.log.close()
        self.server = LocalServer(
            self.data, emulate=None, extra=self.extra, token=self.server.token, ready_timeout_s=60
        )

    def jobs(self) -> dict[str, dict[str, Any]]:
        with self.client() as http:
            answer = http.get("/v1/jobs", params={"limit": 1000})
        assert answer.status_code == 200, answer.text
        return {job["name"]: job for job in answer.json()["jobs"]}


@pytest.fixture(scope="module")
def plane(k8s_cluster: Any, admin: KubeApi, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    token = k8s_cluster.service_account_token("gpufleet-system", "gpufleet")
    kubeconfig = Path(k8s_cluster.kubeconfig_for_token("gpufleet", token))
    running = Plane(tmp_path_factory.mktemp("k8s-plane") / "data", kubeconfig)
    with running.client() as http:
        for team in TEAMS:
            answer = http.put(f"/v1/queues/{team}", json={})
            assert answer.status_code in (200, 201), answer.text
    yield running
    running.server.stop()


@pytest.fixture
def pods(admin: KubeApi, plane: Plane) -> Iterator[Pods]:
    made = Pods(admin)
    yield made
    made.clear()


def bound(pod: dict[str, Any] | None) -> bool:
    return pod is not None and bool(pod["spec"].get("nodeName"))


def test_pods_are_bound_run_and_end_as_their_containers_do(pods: Pods, plane: Plane) -> None:
    pods.make("ok", gpus=2, run_s=1)
    pods.make("bad", gpus=2, exit_code=3)
    assert bound(pods.phase("ok", "Succeeded"))
    failed = pods.phase("bad", "Failed")
    assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    deadline = time.monotonic() + 20
    while (states := {name: job["state"] for name, job in plane.jobs().items()}) != {
        "team-a/ok": "succeeded",
        "team-a/bad": "failed",
    }:
        assert time.monotonic() < deadline, states
        time.sleep(0.2)


def test_a_gang_is_bound_all_or_nothing(pods: Pods) -> None:
    group = {"kueue.x-k8s.io/pod-group-name": "llm"}
    total = {"kueue.x-k8s.io/pod-group-total-count": "3"}
    pods.make("llm-0", gpus=8, labels=group, annotations=total)
    pods.make("llm-1", gpus=8, labels=group, annotations=total)
    time.sleep(3)
    assert not bound(pods.get("llm-0"))
    assert not bound(pods.get("llm-1"))
    pods.make("llm-2", gpus=8, labels=group, annotations=total)
    nodes = {pods.wait(f"llm-{i}", bound)["spec"]["nodeName"] for i in range(3)}  # type: ignore[index]
    assert len(nodes) == 3  # 8 GPUs each on nodes of 8: one node per pod


def test_a_pod_no_node_can_hold_waits_with_gpufleets_reason_where_kubectl_shows_it(pods: Pods) -> None:
    pods.make("huge", gpus=9)

    def says_why(pod: dict[str, Any] | None) -> bool:
        conditions = (pod or {}).get("status", {}).get("conditions") or []
        return any(
            c["type"] == "PodScheduled" and c["status"] == "False" and "GPU" in c.get("message", "") for c in conditions
        )

    pod = pods.wait("huge", says_why, timeout_s=20)
    assert not bound(pod)
    reasons = [e["reason"] for e in pods.events("huge") if e["source"].get("component") == "gpufleet"]
    assert "FailedScheduling" in reasons


def test_a_malformed_pod_group_is_reported_on_the_pod_and_nothing_crashes(pods: Pods, plane: Plane) -> None:
    pods.make(
        "odd",
        gpus=1,
        labels={"kueue.x-k8s.io/pod-group-name": "g"},
        annotations={"kueue.x-k8s.io/pod-group-total-count": "many"},
    )
    deadline = time.monotonic() + 20
    while not any("pod-group-total-count" in e["message"] for e in pods.events("odd")):
        assert time.monotonic() < deadline, pods.events("odd")
        time.sleep(0.2)
    pods.make("fine", gpus=1, run_s=1)
    pods.phase("fine", "Succeeded")
    assert httpx.get(f"{plane.url}/healthz").status_code == 200


def test_a_higher_priority_pod_evicts_a_lower_one_with_its_grace_period(pods: Pods) -> None:
    for i in range(4):
        pods.make(f"low-{i}", gpus=8, priority_class="low", grace_s=3)
    for i in range(4):
        pods.phase(f"low-{i}", "Running")
    pods.make("urgent", gpus=8, priority_class="high")
    deadline = time.monotonic() + 20
    while True:
        terminating = [i for i in range(4) if (p := pods.get(f"low-{i}")) and p["metadata"].get("deletionTimestamp")]
        if terminating:
            break
        assert time.monotonic() < deadline, "no low-priority pod was evicted"
        time.sleep(0.1)
    seen = time.monotonic()
    assert not bound(pods.get("urgent"))  # the victim holds its GPUs through its grace period
    pods.wait(f"low-{terminating[0]}", lambda p: p is None, timeout_s=20)
    assert time.monotonic() - seen >= 1.5
    assert bound(pods.wait("urgent", bound, timeout_s=20))


def test_kill_9_in_a_burst_binds_no_pod_twice_and_loses_none(pods: Pods, plane: Plane) -> None:
    for i in range(24):
        pods.make(f"burst-{i}", gpus=1)
    time.sleep(0.5)
    plane.kill_and_restart()
    for i in range(24):
        pods.wait(f"burst-{i}", bound, timeout_s=40)
    assert "kubernetes: found" in plane.server.output()
    burst = [name for name in plane.jobs() if name.startswith("team-a/burst-")]
    assert len(burst) == 24  # one job per pod: none submitted twice
