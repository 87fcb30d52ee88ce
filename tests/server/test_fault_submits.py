"""kill -9 of the control plane at random moments while clients submit, through the CLI's own HTTP client (an
Idempotency-Key per job, retries on connection errors): every job a client was told about exists exactly
once, none is lost, none runs twice. Real server processes, SQLite and job processes.

Prints one JSON line with the figures (run with -s): submits, kills, jobs lost, jobs duplicated, jobs run
twice, requests that needed a retry."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from gpufleet.bench.api import LocalServer
from gpufleet.client import Client
from gpufleet.client.transport import IDEMPOTENCY_HEADER, Target
from gpufleet.domain.errors import GpufleetError
from tests.server.live import TERMINAL, start

pytestmark = pytest.mark.slow

CLIENTS = 6
JOBS_PER_CLIENT = 30
KILLS = 4


def test_kill_9_during_submits_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    rng = random.Random(20270115)
    live = start(tmp_path)
    ledger = live.shared / "runs.txt"  # where the jobs (their queue's own user) may write
    command = ["/bin/sh", "-c", f'echo "$GPUFLEET_JOB_ID $GPUFLEET_ATTEMPT" >> {ledger}']
    told: dict[str, str] = {}  # job name -> the id a client was answered with
    failed: list[str] = []
    retried = Counter[str]()
    lock = threading.Lock()
    done = threading.Event()
    # Each client holds its last submit until every kill has landed, so all kills fall while clients submit
    # (on a fast machine the clients could otherwise finish before the last kill).
    all_killed = threading.Event()

    def submit_all(index: int) -> None:
        with Client(target=Target(live.url, live.server.token), timeout=10.0) as client:
            for n in range(JOBS_PER_CLIENT):
                name = f"c{index}-{n}"
                if n == JOBS_PER_CLIENT - 1:
                    all_killed.wait(180)
                body = {"queue": "default", "name": name, "command": command}
                try:
                    job = client.call(
                        "POST", "/v1/jobs", json_body=body, headers={IDEMPOTENCY_HEADER: str(uuid.uuid4())},
                        retry_s=90.0, on_retry=lambda _note, name=name: retried.update([name]),
                    )  # fmt: skip
                except GpufleetError as error:
                    with lock:
                        failed.append(f"{name}: {error}")
                    continue
                with lock:
                    told[name] = job["id"]
                time.sleep(rng.uniform(0.0, 0.05))

    threads = [threading.Thread(target=submit_all, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    kills = 0
    try:
        while kills < KILLS and any(t.is_alive() for t in threads):
            time.sleep(rng.uniform(0.3, 1.5))
            live.server.kill()
            kills += 1
            # On the same port: the clients keep the address they were given, as a user's CLI does.
            live.server = LocalServer(live.root / "data", extra=(), token=live.server.token, port=live.server.port)
        all_killed.set()
        for thread in threads:
            thread.join(180)
        done.set()
        with live.http() as client:
            deadline = time.monotonic() + 120
            while True:
                listed = client.get("/v1/jobs", params={"limit": 1000}).json()["jobs"]
                if all(j["state"] in TERMINAL for j in listed) or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
    finally:
        all_killed.set()
        live.server.stop()

    names = Counter(j["name"] for j in listed)
    duplicated = sorted(name for name, count in names.items() if count > 1)
    by_name = {j["name"]: j for j in listed}
    lost = sorted(name for name, job_id in told.items() if by_name.get(name, {}).get("id") != job_id)
    # Name, state and the job's own words, so that a failure says which way it went wrong.
    unfinished = sorted(
        f'{j["name"]}: {j["state"]} {json.dumps({k: v for k, v in j.items() if k not in ("command", "env")})}'
        for j in listed if j["state"] != "succeeded"
    )  # fmt: skip
    runs = Counter(line.split()[0] for line in ledger.read_text().splitlines() if line.strip())
    twice = sorted(job_id for job_id, count in runs.items() if count > 1)
    figures = {
        "submits": CLIENTS * JOBS_PER_CLIENT,
        "kills": kills,
        "answered": len(told),
        "client_errors": len(failed),
        "requests_retried": len(retried),
        "jobs_stored": len(listed),
        "jobs_lost": len(lost),
        "jobs_duplicated": len(duplicated),
        "jobs_not_succeeded": len(unfinished),
        "jobs_run_twice": len(twice),
    }
    print("faults:", json.dumps(figures))
    assert kills == KILLS
    assert failed == []
    assert len(told) == CLIENTS * JOBS_PER_CLIENT
    assert retried  # the kills did land while clients were submitting
    assert duplicated == []
    assert lost == []
    assert len(listed) == CLIENTS * JOBS_PER_CLIENT
    assert unfinished == []
    assert twice == []
