"""What the tests of gpufleet on Kubernetes share: manifests applied as kubectl would, pods made as a team makes
them, and `gpufleet up --kubernetes` in a child process with the least-privilege service account's token."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from gpufleet.adapters.kubernetes.kube_api import KubeApi, KubeApiError
from gpufleet.bench.api import LocalServer
from gpufleet.domain.cluster import Gpu, Node

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


def bound(pod: dict[str, Any] | None) -> bool:
    return pod is not None and bool(pod["spec"].get("nodeName"))
