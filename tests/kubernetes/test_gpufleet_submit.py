"""Jobs submitted to gpufleet itself on Kubernetes: each attempt becomes pods in the team's namespace, placed by
gpufleet, with the environment a distributed job reads; cancel evicts them; what cannot run is refused or failed
with the fix."""

from __future__ import annotations

import time
from typing import Any

from gpufleet.adapters.kubernetes.kube_api import KubeApi, KubeApiError
from tests.kubernetes.kit import REPO, Plane, Pods, bound, create


def allow_jobs_in(admin: KubeApi, namespace: str) -> None:
    import yaml

    for doc in yaml.safe_load_all((REPO / "deploy/kubernetes/team/gpufleet.yaml").read_text()):
        doc["metadata"]["namespace"] = namespace
        kind = "roles" if doc["kind"] == "Role" else "rolebindings"
        create(admin, f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/{kind}", doc)


def submit(plane: Plane, **spec: Any) -> dict[str, Any]:
    with plane.client() as http:
        answer = http.post("/v1/jobs", json={"queue": "team-a", "command": ["python", "train.py"], **spec})
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def state(plane: Plane, job_id: str, *states: str, timeout_s: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        with plane.client() as http:
            job = http.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in states:
            return dict(job)
        assert time.monotonic() < deadline, job
        time.sleep(0.2)


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in pod["spec"]["containers"][0]["env"]}


def test_a_submitted_gang_runs_as_pods_with_a_rendezvous_and_cancel_evicts_them(
    admin: KubeApi, plane: Plane, pods: Pods
) -> None:
    allow_jobs_in(admin, "team-a")
    job = submit(plane, image="train:1", gpus=4, workers=2, grace_period="2s")
    state(plane, job["id"], "running")
    names = [f"{job['id']}-a1-w{rank}" for rank in range(2)]
    made = [pods.wait(name, bound) for name in names]
    envs = [env_of(pod) for pod in made if pod is not None]
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["MASTER_ADDR"] for e in envs} == {f"{job['id']}-a1.team-a.svc"}
    service = admin.call("GET", f"/api/v1/namespaces/team-a/services/{job['id']}-a1")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"]["gpufleet.io/rank"] == "0"
    assert made[0] is not None
    assert made[0]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    with plane.client() as http:
        assert http.post(f"/v1/jobs/{job['id']}/cancel").status_code in (200, 202)
    state(plane, job["id"], "cancelled")
    for name in names:
        pods.wait(name, lambda pod: pod is None)
    deadline = time.monotonic() + 10
    while service_exists(admin, f"{job['id']}-a1"):
        assert time.monotonic() < deadline, "the job's service outlived it"
        time.sleep(0.1)


def service_exists(admin: KubeApi, name: str) -> bool:
    try:
        admin.call("GET", f"/api/v1/namespaces/team-a/services/{name}")
    except KubeApiError as error:
        if error.status == 404:
            return False
        raise
    return True


def test_a_submitted_job_ends_as_its_pod_does(admin: KubeApi, plane: Plane, pods: Pods) -> None:
    allow_jobs_in(admin, "team-a")
    job = submit(plane, image="train:1", gpus=1)
    name = f"{job['id']}-a1-w0"
    pods.phase(name, "Running")
    # The kubelet (kwok) ends the container as its annotation says: exit code 7 after a second.
    patch = {"metadata": {"annotations": {"gpufleet.io/kwok-exit-code": "7", "gpufleet.io/kwok-run-s": "1"}}}
    admin.call(
        "PATCH", f"/api/v1/namespaces/team-a/pods/{name}", body=patch, content_type="application/merge-patch+json"
    )
    ended = state(plane, job["id"], "failed")
    assert ended["exit_code"] == 7


def test_a_job_without_an_image_is_refused_at_submit(plane: Plane) -> None:
    with plane.client() as http:
        answer = http.post("/v1/jobs", json={"queue": "team-a", "command": ["python", "train.py"]})
    assert answer.status_code == 422
    assert any(f["field"] == "image" for f in answer.json()["fields"])


def test_a_namespace_that_lets_gpufleet_make_no_pods_fails_the_job_with_the_fix(plane: Plane, pods: Pods) -> None:
    job = submit(plane, queue="team-b", image="train:1", gpus=1)
    ended = state(plane, job["id"], "failed")
    assert "deploy/kubernetes/team" in ended["reason"]
