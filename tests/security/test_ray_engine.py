"""A hostile job against the Ray engine under it (issue: "on Ray, one HTTP call from a job runs code as root").

On the Ray test cluster (tests/ray/conftest.py: real raylets, Ray's token authentication on, the engine
firewall on every node):

- the exact route: a job reads /proc/net/tcp, finds the node's Ray dashboard agent among the listening ports,
  and POSTs `/api/job_agent/jobs/` with an entrypoint that would write a marker: the connection is refused,
  as is every other port of the cluster; and without the firewall (root, which it does not hold), the agent
  answers 401 to a call without the cluster's token;
- a job's `ray.init(address=<the GCS>)` fails;
- `up --ray ADDRESS` on a cluster without authentication is refused with its fix, and runs with
  `--ray-insecure`, which `up` and `gpufleet nodes` then say;
- `up --ray local` outlives its own kill -9: the next start on the same data finds the cluster running and
  adopts the job on it (same PID, started once), and says how many jobs it adopted.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.adapters.ray import ray_token
from gpufleet.adapters.ray.local_cluster import HEAD, LocalRayCluster, _children, _lease_block, _release
from gpufleet.bench.api import LocalServer, free_port
from tests.kit.jobusers import python_for_anyone, reachable_by_jobs, share, shared_ledger, users_created_here
from tests.ray.conftest import PLANE_START_S, RayPlane, plane, ray_cluster, ray_plane, within  # noqa: F401 - the Ray tests' fixtures
from tests.server.live import JOB_PROGRAM, Live, alive

pytestmark = pytest.mark.slow

PYTHON, PYTHON_ENV = python_for_anyone()

ATTACK = r"""
import json, socket, subprocess, sys, urllib.error, urllib.request
out, agent_port, gcs, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
listening = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        rows = open(table).read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        fields = row.split()
        if fields[3] == "0A":  # LISTEN
            listening.add(int(fields[1].rsplit(":", 1)[1], 16))
reached = []
for port in sorted(listening):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        reached.append(port)
    except OSError:
        pass
body = json.dumps({"entrypoint": f"id > {marker}"}).encode()
request = urllib.request.Request(f"http://127.0.0.1:{agent_port}/api/job_agent/jobs/", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
try:
    with urllib.request.urlopen(request, timeout=10) as answer:
        post = f"answered {answer.status}"
except urllib.error.HTTPError as error:
    post = f"answered {error.code}"
except OSError as error:
    post = f"failed: {error}"
init = "import ray; ray.init(address=%r, log_to_driver=False); print('CONNECTED', flush=True)" % gcs
try:
    done = subprocess.run([sys.executable, "-c", init], check=False,
 capture_output=True, text=True, timeout=60)
    ray_init = "CONNECTED" if "CONNECTED" in done.stdout else f"failed ({done.returncode}): {done.stderr[-300:]}"
except subprocess.TimeoutExpired:
    ray_init = "failed: still not connected after 60 s"
with open(out, "w") as f:
    json.dump({"listening": sorted(listening), "reached": reached, "post": post, "ray_init": ray_init}, f)
"""


def _in_engine(port: int, spans: list[tuple[int, int]]) -> bool:
    return any(low <= port <= high for low, high in spans)


def test_a_job_finds_the_dashboard_agent_and_posts_a_job_and_calls_ray_init_and_both_fail(plane: RayPlane) -> None:  # noqa: F811
    cluster = plane.cluster
    shared = plane.live.shared
    program = share(shared / "attack.py", ATTACK)
    out, marker = shared / "attack.json", shared / "pwned"
    agent_port = cluster.node_ports("node-1")["dashboard_agent_listen_port"]
    command = [PYTHON, str(program), str(out), str(agent_port), cluster.address, str(marker)]
    with plane.client() as client:
        spec = {"queue": "default", "command": command, "gpus": 1, "env": PYTHON_ENV}
        response = client.post("/v1/jobs", json=spec)
        assert response.status_code == 201, response.text
        job = plane.live.wait_state(client, response.json()["id"], "succeeded", "failed", timeout_s=240)
        assert job["state"] == "succeeded", job
    found = json.loads(out.read_text())
    engine = cluster.engine_ports()
    # The route is real: the job saw the agent's port listening (and other ports of the cluster)...
    assert agent_port in found["listening"]
    assert int(cluster.address.rpartition(":")[2]) in found["listening"]  # the GCS
    # ...and could open none of them, nor POST a job, nor join the cluster.
    assert [p for p in found["reached"] if _in_engine(p, engine)] == []
    assert found["post"].startswith("failed"), found["post"]
    assert "refused" in found["post"].lower() or "reset" in found["post"].lower(), found["post"]
    assert found["ray_init"].startswith("failed"), found["ray_init"]
    time.sleep(1.0)
    assert not marker.exists()


def test_without_the_token_the_dashboard_agent_answers_401_even_to_root(ray_cluster: Any, tmp_path: Path) -> None:  # noqa: F811
    """The token layer alone (root is not held by the firewall): no token, no job; a wrong one neither."""
    marker = tmp_path / "pwned-as-root"
    port = ray_cluster.node_ports("node-2")["dashboard_agent_listen_port"]
    url = f"http://127.0.0.1:{port}/api/job_agent/jobs/"
    body = {"entrypoint": f"id > {marker}"}
    assert httpx.post(url, json=body, timeout=10).status_code == 401
    wrong = {"Authorization": "Bearer " + "0" * 64}
    assert httpx.post(url, json=body, headers=wrong, timeout=10).status_code == 403
    token_file = Path(ray_cluster.token_path)
    assert token_file.stat().st_mode & 0o077 == 0  # only root reads the token
    assert ray_token.probe_auth(ray_cluster.address)  # the GCS too refuses a call without it
    time.sleep(1.0)
    assert not marker.exists()


# --- joining a cluster without authentication ------------------------------------------------------------------

INSECURE_INVENTORY = "nodes:\n  - {name: insecure-1, gpus: 1xA100-80GB, cpu: 4, memory: 16GiB}\n"


def _launch(args: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet.adapters.ray.node_launch"],
        input=json.dumps(args),
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **env},
        timeout=120,
        start_new_session=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


@pytest.fixture
def open_cluster(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A Ray cluster as an admin might have started it: no token authentication (a head and one GPU node)."""
    env = {"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN_PATH": "", "RAY_AUTH_TOKEN": ""}
    owner = str(tmp_path)
    blocks = [_lease_block(owner), _lease_block(owner)]
    pids: list[int] = []
    temp = Path("/tmp") / f"gfopen-{os.getpid()}"
    try:
        head_block, node_block = blocks
        common = {
            "node_ip_address": "127.0.0.1",
            "num_cpus": 1,
            "include_log_monitor": False,
            "temp_dir": str(temp),
            "object_store_memory": 150 << 20,
        }
        head = _launch(
            {
                **common,
                "head": True,
                "num_gpus": 0,
                "gcs_server_port": head_block + 6,
                "no_monitor": True,
                "include_dashboard": False,
                "node_manager_port": head_block,
                "raylet_socket_name": f"{temp}/r0",
                "plasma_store_socket_name": f"{temp}/p0",
                "min_worker_port": head_block + 16,
                "max_worker_port": head_block + 63,
            },
            env,
        )
        pids += [p for ps in head["pids"].values() for p in ps]
        node = _launch(
            {
                **common,
                "gcs_address": head["address"],
                "num_gpus": 1,
                "resources": {"gpufleet-node:insecure-1": 1},
                "node_manager_port": node_block,
                "raylet_socket_name": f"{temp}/r1",
                "plasma_store_socket_name": f"{temp}/p1",
                "min_worker_port": node_block + 16,
                "max_worker_port": node_block + 63,
            },
            env,
        )
        pids += [p for ps in node["pids"].values() for p in ps]
        inventory = tmp_path / "insecure.yaml"
        inventory.write_text(INSECURE_INVENTORY)
        yield head["address"], inventory
    finally:
        for pid in pids:
            for doomed in [*_children(pid), pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(doomed, 9)
        for block in blocks:
            _release(block, owner)


def test_up_refuses_a_ray_cluster_without_authentication_unless_told_and_then_says_so(
    open_cluster: tuple[str, Path], tmp_path: Path
) -> None:
    address, inventory = open_cluster
    assert not ray_token.probe_auth(address)
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "up",
            "--data-dir",
            str(tmp_path / "refused"),
            "--port",
            str(free_port()),
            "--ray",
            address,
            "--inventory",
            str(inventory),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "runs without authentication" in refused.stderr
    assert "to fix:" in refused.stderr
    assert "--ray-insecure" in refused.stderr
    assert "RAY_AUTH_MODE=token" in refused.stderr

    with users_created_here():
        extra = ("--ray", address, "--inventory", str(inventory), "--ray-insecure")
        server = LocalServer(tmp_path / "insecure", emulate=None, extra=extra, ready_timeout_s=PLANE_START_S)
        try:
            assert "WITHOUT authentication" in server.output()
            with server.client() as client:
                answer = client.get("/v1/nodes").json()
            assert any("WITHOUT authentication" in note for note in answer["isolation"]["notes"]), answer["isolation"]
            listed = subprocess.run(
                [sys.executable, "-m", "gpufleet", "nodes"],
                check=False,
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "GPUFLEET_URL": server.url, "GPUFLEET_TOKEN": server.token},
            )
            assert "WITHOUT authentication" in listed.stdout, listed.stdout + listed.stderr
        finally:
            server.stop()


# --- kill -9 of `up --ray local` --------------------------------------------------------------------------------

LOCAL_INVENTORY = "nodes:\n  - {name: local-1, gpus: 2xA100-80GB, cpu: 8, memory: 32GiB}\n"


def test_up_ray_local_survives_its_own_kill_9_and_adopts_the_running_job(tmp_path: Path) -> None:
    shared = reachable_by_jobs(tmp_path / "shared")
    program = share(shared / "job.py", JOB_PROGRAM)
    ledger = shared_ledger(shared / "ledger.jsonl")
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text(LOCAL_INVENTORY)
    data = tmp_path / "data"
    extra = ("--ray", "local", "--inventory", str(inventory))
    state = data / "ray-local"
    with users_created_here():
        live = Live(
            LocalServer(data, emulate=None, extra=extra, ready_timeout_s=PLANE_START_S), tmp_path, program, ledger
        )
        try:
            assert "adopted 0 running job(s)" in live.server.output()
            record = json.loads((state / "cluster.json").read_text())
            assert (state / "auth_token").stat().st_mode & 0o077 == 0
            with live.http() as client:
                job = live.submit(client, "sleep", "600", gpus=1)
                live.wait_state(client, job, "running", timeout_s=120)
            [start] = live.wait_events("start", job, timeout_s=60)
            live.server.kill()  # kill -9: no shutdown of any kind
            time.sleep(2.0)
            # The cluster and the job outlived it.
            assert all(alive(pid) for pids in record["nodes"][HEAD]["pids"].values() for pid in pids)
            assert alive(start["pid"])
            live.server = LocalServer(
                data, emulate=None, extra=extra, token=live.server.token, ready_timeout_s=PLANE_START_S
            )
            output = live.server.output()
            assert "adopted 1 running job(s)" in output, output[-3000:]
            assert "reused" in output
            with live.http() as client:
                record_now = live.job(client, job)
                assert record_now["state"] == "running", record_now
                assert record_now["attempt"] == 1, record_now
            time.sleep(2.0)  # a second start would show by now
            assert [e["pid"] for e in live.events("start", job)] == [start["pid"]]
            assert alive(start["pid"])
            with live.http() as client:
                client.post(f"/v1/jobs/{job}/cancel")
                live.wait_state(client, job, "cancelled", timeout_s=60)
        finally:
            live.server.stop()
            left = LocalRayCluster.reuse(state, ())
            if left is not None:
                within(120, "stopping the local Ray cluster", left.shutdown)
