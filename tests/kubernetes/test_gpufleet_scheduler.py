"""gpufleet as the GPU scheduler of a real Kubernetes cluster (API server, controller manager and etcd built from
Kubernetes' own sources; kwok plays the kubelets of the GPU nodes). gpufleet runs as `gpufleet up --kubernetes`
in a child process, with the token of the service account that deploy/kubernetes/base makes: not an admin."""

from __future__ import annotations

import time
from typing import Any

import httpx

from tests.kubernetes.kit import Plane, Pods, bound


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


def condition_message(pod: dict[str, Any] | None) -> str:
    conditions = (pod or {}).get("status", {}).get("conditions") or []
    return " ".join(c.get("message", "") for c in conditions if c["type"] == "PodScheduled")


def test_a_gang_is_bound_all_or_nothing(pods: Pods) -> None:
    group = {"kueue.x-k8s.io/pod-group-name": "llm"}
    total = {"kueue.x-k8s.io/pod-group-total-count": "3"}
    pods.make("llm-0", gpus=8, labels=group, annotations=total)
    pods.make("llm-1", gpus=8, labels=group, annotations=total)
    waiting = pods.wait("llm-0", lambda p: "2 of its 3 pods exist" in condition_message(p), timeout_s=20)
    assert not bound(waiting)
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


def test_cancelling_a_waiting_pods_job_in_gpufleet_deletes_the_pod(pods: Pods, plane: Plane) -> None:
    pods.make("unwanted", gpus=9)
    deadline = time.monotonic() + 20
    while "team-a/unwanted" not in plane.jobs():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    job_id = plane.jobs()["team-a/unwanted"]["id"]
    with plane.client() as http:
        assert http.post(f"/v1/jobs/{job_id}/cancel").status_code in (200, 202)
    pods.wait("unwanted", lambda pod: pod is None, timeout_s=20)


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
