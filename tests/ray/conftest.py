"""One real Ray cluster for the whole session: a head without GPUs and three nodes of 8 emulated A100-80GB
each (`node-1`, `node-2` in rack r1, `node-3` in rack r2, labelled reserved in zone z-b), all real raylets on
this machine bound to 127.0.0.1, with Ray's health checks tightened so a killed node is declared dead in a few
seconds. The cluster runs with Ray's token authentication, its token in a file only root reads.
One `gpufleet up --ray ADDRESS` serves every test (the kill -9 test restarts it on the same data);
each test cancels what it started, so the next one finds the cluster idle.

Every wait has a timeout: a Ray cluster on a wrong address hangs rather than fails.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.adapters.inventory.emulated_inventory import load_inventory_yaml
from tests.kit.deadline import within
from tests.kit.jobusers import reachable_by_jobs, share, shared_ledger
from tests.server.live import JOB_PROGRAM, Live

INVENTORY = """\
nodes:
  - {name: node-1, gpus: 8xA100-80GB, cpu: 16, memory: 64GiB, rack: r1}
  - {name: node-2, gpus: 8xA100-80GB, cpu: 16, memory: 64GiB, rack: r1}
  - {name: node-3, gpus: 8xA100-80GB, cpu: 16, memory: 64GiB, rack: r2}
"""
NODES = ("node-1", "node-2", "node-3")
# Ray node labels win over the inventory file: node-3 bills as reserved capacity in zone z-b.
LABELS = {"node-3": {"gpufleet.io/pool": "reserved", "gpufleet.io/zone": "z-b"}}
# Ray declares a node dead after `failure_threshold` missed checks `period_ms` apart (default: 5 x 3 s).
FAST_HEALTH_CHECKS = {
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 4,
}
CLUSTER_START_S = 180.0
PLANE_START_S = 120.0


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from gpufleet.adapters.ray.local_cluster import LocalRayCluster

    inventory = tmp_path_factory.mktemp("ray") / "fleet.yaml"
    inventory.write_text(INVENTORY)
    nodes = load_inventory_yaml(inventory)
    cluster = within(
        CLUSTER_START_S,
        "starting a Ray cluster of 3 nodes",
        lambda: LocalRayCluster(nodes, system_config=FAST_HEALTH_CHECKS, labels=LABELS),
    )
    cluster.inventory_file = inventory
    # The cluster runs with Ray's token authentication: fleets made in this process find its token here.
    saved = os.environ.get("RAY_AUTH_TOKEN_PATH")
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(cluster.token_path)
    try:
        yield cluster
    finally:
        if saved is None:
            os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
        else:
            os.environ["RAY_AUTH_TOKEN_PATH"] = saved
        within(120, "stopping the Ray cluster", cluster.shutdown)


@dataclass
class RayPlane:
    """The control plane on the Ray cluster, with the test kit's job program and ledger."""

    live: Live
    cluster: Any

    def client(self) -> httpx.Client:
        return self.live.http()

    def restart(self) -> None:
        self.live.server = _server(self.live.root / "data", self.cluster, token=self.live.server.token)

    def nodes(self) -> dict[str, dict[str, Any]]:
        with self.client() as client:
            response = client.get("/v1/nodes")
            assert response.status_code == 200, response.text
            return {n["name"]: n for n in response.json()["nodes"]}

    def cancel_all(self) -> None:
        with self.client() as client:
            active = client.get("/v1/jobs", params={"limit": 1000}).json()["jobs"]
            for job in active:
                client.post(f"/v1/jobs/{job['id']}/cancel")
            for job in active:
                self.live.wait_state(client, job["id"], "cancelled", "succeeded", "failed", timeout_s=60)


def _server(data: Path, cluster: Any, token: str | None = None) -> Any:
    from gpufleet.bench.api import LocalServer

    extra = (
        *("--ray", cluster.address, "--ray-token-file", str(cluster.token_path)),
        *("--inventory", str(cluster.inventory_file), "--sample-interval", "0.5"),
    )
    return LocalServer(data, emulate=None, extra=extra, token=token, ready_timeout_s=PLANE_START_S)


@pytest.fixture(scope="session")
def ray_plane(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayPlane]:
    root = tmp_path_factory.mktemp("ray-plane")
    shared = reachable_by_jobs(root / "shared")
    program = share(shared / "job.py", JOB_PROGRAM)
    ledger = shared_ledger(shared / "ledger.jsonl")
    live = Live(_server(root / "data", ray_cluster), root, program, ledger)
    plane = RayPlane(live, ray_cluster)
    try:
        yield plane
    finally:
        plane.cancel_all()
        plane.live.server.stop()


@pytest.fixture
def plane(ray_plane: RayPlane) -> Iterator[RayPlane]:
    """The session's control plane, left idle by each test (its jobs cancelled, even when it fails)."""
    yield ray_plane
    ray_plane.cancel_all()
