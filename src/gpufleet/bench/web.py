"""`gpufleet bench web`: how long the dashboard's pages take to render on the server, with a big store.

A real `gpufleet up` runs on loopback with an emulated inventory of 8 nodes x 8 A100 (64 GPUs) and a fresh
data directory. `jobs` jobs are submitted through the API (most wait behind a queue without quota, 48 run
and hold GPUs), then every page is requested by a signed-in client. Each answer carries the time the server
spent on it (`Server-Timing: app;dur=…`, the handler from request to rendered page); the first request
of each page and the best of `repeats` are reported, with the goal of 300 ms per page. The Jobs page must
stay paginated: the rows it renders are counted.
"""

from __future__ import annotations

import re
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from gpufleet.bench.api import LocalServer
from gpufleet.domain.errors import GpufleetError

GOAL_MS = 300.0
RUNNING = 48
INVENTORY = "nodes:\n" + "".join(
    f"  - name: node-{i}\n    gpus: 8xA100-80GB\n    cpu: 64\n    memory: 512GiB\n    rack: r{i // 4}\n"
    for i in range(8)
)
_TIMING = re.compile(r"app;dur=([0-9.]+)")


def _fill(server: LocalServer, jobs: int, clients: int = 8) -> float:
    with server.client() as client:
        for queue, quota in (("waiting", 0), ("busy", 64)):
            client.put(f"/v1/queues/{queue}", json={"quotas": {"gpu": quota}}).raise_for_status()
        for i in range(RUNNING):
            body = {"queue": "busy", "command": ["sleep", "3600"], "gpus": 1, "name": f"run-{i}"}
            client.post("/v1/jobs", json=body).raise_for_status()
    errors: list[str] = []
    waiting = jobs - RUNNING

    def work(index: int) -> None:
        with server.client() as client:
            for n in range(index, waiting, clients):
                body = {"queue": "waiting", "command": ["true"], "gpus": 1 + n % 4, "name": f"train-{n % 97}-{n}"}
                response = client.post("/v1/jobs", json=body)
                if response.status_code != 201:
                    errors.append(response.text[:200])

    started = time.perf_counter()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise GpufleetError(f"{len(errors)} submits failed, e.g. {errors[0]}", "see server.log")
    return time.perf_counter() - started


def _signed_in(server: LocalServer) -> httpx.Client:
    client = httpx.Client(base_url=server.url, timeout=60, follow_redirects=True)
    form = client.get("/signin")
    nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
    if nonce is None:
        raise GpufleetError("the sign-in page has no form", "see server.log")
    answer = client.post("/signin", data={"token": server.token, "nonce": nonce.group(1)})
    if answer.status_code != 200 or "Sign out" not in answer.text:
        raise GpufleetError(f"could not sign in ({answer.status_code})", "see server.log")
    return client


def _server_ms(response: httpx.Response) -> float:
    found = _TIMING.search(response.headers.get("server-timing", ""))
    if response.status_code != 200 or found is None:
        raise GpufleetError(f"{response.url} answered {response.status_code}", "see server.log")
    return float(found.group(1))


def run(jobs: int = 10_000, repeats: int = 5) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-web-"))
    try:
        inventory = root / "inventory.yaml"
        inventory.write_text(INVENTORY)
        (root / "data").mkdir()
        server = LocalServer(root / "data", emulate=None, extra=("--inventory", str(inventory), "--stop-jobs"))
        try:
            fill_s = _fill(server, jobs)
            time.sleep(2.0)  # let the loop decide the backlog once and the telemetry tick
            with server.client() as api:
                some_job = api.get("/v1/jobs", params={"limit": 1}).json()["jobs"][0]["id"]
            pages = {
                "overview": "/",
                "queues": "/queues",
                "jobs": "/jobs",
                "jobs_sorted_by_name": "/jobs?sort=name&order=asc",
                "jobs_filtered_user_name": "/jobs?user=admin&name=train-5",
                "jobs_last_page": f"/jobs?page={-(-jobs // 50)}",
                "job": f"/jobs/{some_job}",
                "nodes": "/nodes",
                "simulator": "/simulator",
            }
            figures: dict[str, object] = {}
            worst = 0.0
            client = _signed_in(server)
            try:
                rows = client.get("/jobs").text.count('<th scope="row"><a id="job-')
                for name, path in pages.items():
                    times = [_server_ms(client.get(path)) for _ in range(repeats)]
                    figures[name] = {
                        "first_ms": round(times[0], 1),
                        "best_ms": round(min(times), 1),
                        "median_ms": round(statistics.median(times), 1),
                    }
                    worst = max(worst, times[0])
            finally:
                client.close()
        finally:
            server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "store": "sqlite",
        "inventory": "emulated: 8 nodes x 8xA100-80GB (64 GPUs)",
        "jobs": jobs,
        "fill_seconds": round(fill_s, 1),
        "repeats": repeats,
        "pages": figures,
        "jobs_page_rows": rows,
        "worst_first_render_ms": round(worst, 1),
        "goal_ms": GOAL_MS,
        "goal_met": worst <= GOAL_MS,
    }
