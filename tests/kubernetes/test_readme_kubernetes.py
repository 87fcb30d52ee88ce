"""The README's "Running on Kubernetes": its kubectl commands and its example pod, as written, on the test cluster
with gpufleet running."""

from __future__ import annotations

import re
from typing import Any

import yaml

from gpufleet.adapters.kubernetes.kube_api import KubeApi
from tests.kubernetes.kit import REPO, Plane, Pods, bound


def readme_block(language: str, start: str) -> str:
    found = re.search(rf"```{language}\n({re.escape(start)}.*?)```", (REPO / "README.md").read_text(), re.S)
    assert found is not None, f"the README lost its {language} block that starts with {start!r}"
    return found.group(1)


def test_the_readmes_kubectl_commands_apply_as_written(k8s_cluster: Any, admin: KubeApi) -> None:
    commands = readme_block("bash", "kubectl apply -k")
    try:
        for line in commands.splitlines():
            words = line.split("#")[0].split()
            if words and words[0] == "kubectl":
                done = k8s_cluster.kubectl(*words[1:], check=False)
                assert done.returncode == 0, f"{line}: {done.stderr}"
        deployment = admin.call("GET", "/apis/apps/v1/namespaces/gpufleet-system/deployments/gpufleet")
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "gpufleet"
    finally:
        # No image of gpufleet runs here: the Deployment's pod would wait forever (and its ReplicaSet make another).
        k8s_cluster.kubectl("-n", "gpufleet-system", "delete", "deployment/gpufleet", "pvc/gpufleet-data", check=False)


def test_the_readmes_pod_is_bound_by_gpufleet(admin: KubeApi, plane: Plane, pods: Pods) -> None:
    pod = yaml.safe_load(readme_block("yaml", "apiVersion: v1\nkind: Pod"))
    admin.create(f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods", pod)
    placed = pods.wait(pod["metadata"]["name"], bound)
    assert placed is not None
    assert placed["spec"]["nodeName"].startswith("gpu-")
