"""`gpufleet bench ray`: jobs launched on the nodes of a real Ray cluster, as one JSON object.

A local Ray cluster of `nodes` emulated nodes (`gpus_per_node` A100-80GB each, real raylets on this machine,
Ray's default health checks) and a real `gpufleet up --ray ADDRESS` in a child process. Measured:

- **submit -> all workers started**: jobs of a tenth of a GPU each (so few jobs wait for another to end), one
  in ten a gang of 2 workers of one GPU each; each worker's command records the wall time it started, and a job has
  started when its last worker has. Latency from just before its HTTP request. Two runs of `jobs` jobs each:
  *paced*, submitted at the throughput goal (20 jobs/s, by one client): p50 and p99 (goal p50 <= 1 s); and a
  *burst*, submitted as fast as 4 HTTP clients can: launches per second from the first request to the last
  start (goal >= 20/s), and its latencies (a burst's median is mostly its queue: jobs / launches per second / 2).
- **node death -> jobs requeued**: every node runs one whole-node job; one node's raylet is killed (SIGKILL)
  and the job on it is watched through the API until it is back in its queue (goal <= 45 s). The time is mostly
  Ray's own health checks declaring the node dead (reported from Ray's settings with the figure).
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from gpufleet.bench.api import LocalServer
from gpufleet.domain.errors import GpufleetError

GOAL_START_P50_S = 1.0
GOAL_LAUNCHES_PER_S = 20.0
GOAL_REQUEUE_S = 45.0
CLIENTS = 4


def run(nodes: int, gpus_per_node: int, jobs: int, timeout_s: float = 600.0) -> dict[str, object]:
    from gpufleet.adapters.inventory.emulated_inventory import load_inventory_yaml
    from gpufleet.adapters.ray.local_cluster import LocalRayCluster

    if nodes < 2:
        raise GpufleetError("the node-loss measure needs at least 2 nodes", "give --nodes 2 or more")
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-ray-", dir="/var/tmp"))  # not /tmp: each job has its own
    root.chmod(0o755)
    marks = root / "marks"
    marks.mkdir()
    inventory = root / "fleet.yaml"
    inventory.write_text(
        "nodes:\n"
        + "".join(
            f"  - {{name: bench-{i}, gpus: {gpus_per_node}xA100-80GB, cpu: 64, memory: 512GiB}}\n" for i in range(nodes)
        )
    )
    started = time.perf_counter()
    cluster = LocalRayCluster(load_inventory_yaml(inventory))
    cluster_s = time.perf_counter() - started
    server: LocalServer | None = None
    try:
        started = time.perf_counter()
        extra = ("--ray", cluster.address, "--ray-token-file", str(cluster.token_path), "--inventory", str(inventory))
        server = LocalServer(root / "data", emulate=None, extra=extra, ready_timeout_s=180.0)
        up_s = time.perf_counter() - started
        paced = _launch(server, jobs, marks / "paced", timeout_s, clients=1, rate=GOAL_LAUNCHES_PER_S)
        burst = _launch(server, jobs, marks / "burst", timeout_s, clients=CLIENTS, rate=None)
        loss = _node_loss(server, cluster, nodes, timeout_s)
    finally:
        if server is not None:
            server.stop()
        cluster.shutdown()
    return {
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "jobs": jobs,
        "cluster_start_s": round(cluster_s, 2),
        "control_plane_start_s": round(up_s, 2),
        "start_p50_s": paced["p50_s"],
        "start_p99_s": paced["p99_s"],
        "launches_per_s": burst["launches_per_s"],
        "paced": paced,
        "burst": burst,
        **loss,
        "goals": {
            "start_p50_s": GOAL_START_P50_S,
            "launches_per_s": GOAL_LAUNCHES_PER_S,
            "node_loss_requeued_s": GOAL_REQUEUE_S,
        },
    }


def _launch(
    server: LocalServer, jobs: int, marks: Path, timeout_s: float, *, clients: int, rate: float | None
) -> dict[str, object]:
    """Submit `jobs` jobs with `clients` HTTP clients (at `rate` per second in all, or as fast as they can),
    and time each from its request to the start of its last worker."""
    marks.mkdir()
    marks.chmod(0o1777)  # the jobs run as their queue's own user
    sent: dict[int, float] = {}
    workers = {n: 2 if n % 10 == 9 else 1 for n in range(jobs)}
    errors: list[str] = []
    lock = threading.Lock()
    begin = time.time()

    def submit(index: int) -> None:
        with server.client() as client:
            for n in range(index, jobs, clients):
                if rate is not None:
                    time.sleep(max(0.0, begin + n / rate - time.time()))
                body = {
                    "queue": "default",
                    "command": f"date +%s.%N > {marks}/{n}.$RANK",
                    "gpus": 1 if workers[n] > 1 else 0.1,  # gangs take whole GPUs
                    "workers": workers[n],
                    "name": f"launch-{n}",
                }
                at = time.time()
                response = client.post("/v1/jobs", json=body)
                with lock:
                    if response.status_code == 201:
                        sent[n] = at
                    else:
                        errors.append(f"{response.status_code} {response.text[:200]}")

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise GpufleetError(f"{len(errors)} submits failed, e.g. {errors[0]}", "see the server's log")
    deadline = time.monotonic() + timeout_s
    starts: dict[int, float] = {}
    while len(starts) < len(sent):
        if time.monotonic() > deadline:
            raise GpufleetError(f"only {len(starts)} of {len(sent)} jobs started in {timeout_s:g} s", "see server.log")
        for n in sent:
            if n not in starts:
                ranks = [_read(marks / f"{n}.{rank}") for rank in range(workers[n])]
                if all(ranks):
                    starts[n] = max(float(text) for text in ranks)
        time.sleep(0.05)
    latencies = sorted(starts[n] - sent[n] for n in sent)
    span = max(starts.values()) - min(sent.values())
    return {
        "jobs": len(latencies),
        "gangs": sum(1 for n in sent if workers[n] > 1),
        "p50_s": round(statistics.median(latencies), 3),
        "p99_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3),
        "max_s": round(latencies[-1], 3),
        "launches_per_s": round(len(latencies) / span, 1),
        "submitted_per_s": round(len(sent) / max(1e-9, max(sent.values()) - min(sent.values())), 1),
    }


def _node_loss(server: LocalServer, cluster: Any, nodes: int, timeout_s: float) -> dict[str, object]:
    with server.client() as client:
        ids = []
        for i in range(nodes):
            response = client.post(
                "/v1/jobs", json={"queue": "default", "command": "sleep 600", "gpus": 8, "name": f"whole-node-{i}"}
            )
            response.raise_for_status()
            ids.append(response.json()["id"])
        placed = _wait(client, ids, lambda j: j["state"] == "running", timeout_s)
        victim = "bench-0"
        on_victim = [j["id"] for j in placed if any(w["node"] == victim for w in j["placement"])]
        killed = time.monotonic()
        cluster.kill(victim)
        _wait(client, on_victim, lambda j: j["state"] == "pending", timeout_s)
        requeued_s = time.monotonic() - killed
        for job in ids:
            client.post(f"/v1/jobs/{job}/cancel")
    return {"node_loss_requeued_s": round(requeued_s, 2), "node_loss_jobs": len(on_victim)}


def _wait(client: httpx.Client, ids: list[str], done: Any, timeout_s: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = [client.get(f"/v1/jobs/{job}").json() for job in ids]
        if all(done(j) for j in jobs):
            return jobs
        if time.monotonic() > deadline:
            raise GpufleetError(f"jobs not there after {timeout_s:g} s: {[j['state'] for j in jobs]}", "see server.log")
        time.sleep(0.05)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
