"""What gpufleet may do on the cluster and what it honours there: least privilege for itself and for teams, the
queues' GPU ceilings as ResourceQuotas, PodDisruptionBudgets, and pods that other schedulers placed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.adapters.kubernetes.kube_api import KubeApi, KubeApiError
from tests.kubernetes.kit import REPO, Plane, Pods, bound, create


def status_of(call: Any) -> int:
    try:
        call()
    except KubeApiError as error:
        return error.status
    return 200


def team_api(k8s_cluster: Any, admin: KubeApi, team: str, person: str) -> KubeApi:
    """A person of `team` as the team role of deploy/kubernetes/team allows."""
    role = yaml_doc(REPO / "deploy/kubernetes/team/role.yaml")
    role["metadata"]["namespace"] = team
    create(admin, f"/apis/rbac.authorization.k8s.io/v1/namespaces/{team}/roles", role)
    token = k8s_cluster.service_account_token(team, person)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{person}-team", "namespace": team},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gpufleet-team"},
        "subjects": [{"kind": "ServiceAccount", "name": person, "namespace": team}],
    }
    create(admin, f"/apis/rbac.authorization.k8s.io/v1/namespaces/{team}/rolebindings", binding)
    return KubeApi(Path(k8s_cluster.kubeconfig_for_token(person, token)))


def yaml_doc(path: Path) -> dict[str, Any]:
    import yaml

    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_a_team_cannot_bind_its_pods_nor_read_another_teams(k8s_cluster: Any, admin: KubeApi, pods: Pods) -> None:
    alice = team_api(k8s_cluster, admin, "team-a", "alice")
    pods.api = alice  # the pod is made with alice's own rights
    pods.make("mine", gpus=1)
    pods.api = admin
    assert status_of(lambda: alice.bind("team-a", "mine", "gpu-0")) == 403
    assert status_of(lambda: alice.list("/api/v1/namespaces/team-b/pods")) == 403
    assert status_of(lambda: alice.list("/api/v1/namespaces/team-a/pods")) == 200
    assert bound(pods.wait("mine", bound))  # gpufleet binds it


def test_gpufleets_own_account_holds_only_what_it_needs(k8s_cluster: Any, admin: KubeApi, plane: Plane) -> None:
    token = k8s_cluster.service_account_token("gpufleet-system", "gpufleet")
    itself = KubeApi(Path(k8s_cluster.kubeconfig_for_token("gpufleet-check", token)))
    assert status_of(lambda: itself.list("/api/v1/namespaces/kube-system/secrets")) == 403
    assert status_of(lambda: itself.list("/api/v1/configmaps")) == 403
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "x"},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    assert status_of(lambda: itself.create("/api/v1/namespaces/team-a/pods", pod)) == 403
    assert status_of(lambda: itself.list("/api/v1/pods")) == 200
    itself.close()


def quota_hard(admin: KubeApi, namespace: str) -> str | None:
    try:
        quota = admin.call("GET", f"/api/v1/namespaces/{namespace}/resourcequotas/gpufleet-gpus")
    except KubeApiError as error:
        if error.status == 404:
            return None
        raise
    return str(quota["spec"]["hard"]["requests.nvidia.com/gpu"])


def wait_quota(admin: KubeApi, namespace: str, want: str | None) -> None:
    deadline = time.monotonic() + 20
    while (hard := quota_hard(admin, namespace)) != want:
        assert time.monotonic() < deadline, f"quota of {namespace} is {hard}, wanted {want}"
        time.sleep(0.2)


def test_a_queues_gpu_ceiling_is_its_namespaces_resourcequota(admin: KubeApi, plane: Plane, pods: Pods) -> None:
    with plane.client() as http:
        answer = http.put("/v1/queues/team-b", json={"quotas": {"gpu": {"nominal": 4, "borrowing_limit": 4}}})
        assert answer.status_code == 200, answer.text
    wait_quota(admin, "team-b", "8")
    with pytest.raises(KubeApiError) as refused:  # a pod made around gpufleet cannot exceed it either
        pods.make("greedy", gpus=9, namespace="team-b")
    assert refused.value.status == 403
    with plane.client() as http:
        http.put("/v1/queues/team-b", json={"quotas": {"gpu": {"nominal": 4, "borrowing_limit": 12}}})
    wait_quota(admin, "team-b", "16")
    with plane.client() as http:
        http.put("/v1/queues/team-b", json={})
    wait_quota(admin, "team-b", None)


def test_an_eviction_a_disruption_budget_refuses_waits_for_it(admin: KubeApi, pods: Pods) -> None:
    for i in range(4):
        pods.make(f"guarded-{i}", gpus=8, priority_class="low", labels={"app": "guarded"}, grace_s=0)
    for i in range(4):
        pods.phase(f"guarded-{i}", "Running")
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded", "namespace": "team-a"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    admin.create("/apis/policy/v1/namespaces/team-a/poddisruptionbudgets", budget)
    try:
        time.sleep(1.0)  # the disruption controller computes the budget's status
        pods.make("urgent", gpus=8, priority_class="high")
        time.sleep(6)
        assert all(pods.get(f"guarded-{i}") is not None for i in range(4))
        assert not bound(pods.get("urgent"))
    finally:
        admin.call("DELETE", "/apis/policy/v1/namespaces/team-a/poddisruptionbudgets/guarded")
    assert bound(pods.wait("urgent", bound, timeout_s=30))


def test_pods_other_schedulers_placed_count_as_used(admin: KubeApi, pods: Pods) -> None:
    # As a DaemonSet's pod is placed: nodeName set at creation, by no scheduler of gpufleet's.
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "placed-elsewhere", "namespace": "team-b"},
        "spec": {
            "nodeName": "gpu-0",
            "containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        },
    }
    admin.create("/api/v1/namespaces/team-b/pods", body)
    pods.wait("placed-elsewhere", lambda p: p is not None and p["status"].get("phase") == "Running", namespace="team-b")
    for i in range(4):
        pods.make(f"whole-{i}", gpus=8)
    deadline = time.monotonic() + 20
    while len(placed := [p for i in range(4) if bound(p := pods.get(f"whole-{i}"))]) < 3:
        assert time.monotonic() < deadline, f"{len(placed)} of 3 whole-node pods bound"
        time.sleep(0.1)
    time.sleep(2)  # the fourth has nowhere to go: gpu-0's GPUs are the other pod's
    placed = [p for i in range(4) if bound(p := pods.get(f"whole-{i}"))]
    assert len(placed) == 3
    assert "gpu-0" not in {pod["spec"]["nodeName"] for pod in placed if pod is not None}
