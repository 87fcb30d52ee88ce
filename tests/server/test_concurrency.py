"""50 concurrent clients, each with its team's token, submit 2,000 jobs into quota-limited queues of one
cohort on a real `gpufleet up`: every accepted job is in the store, and replaying the store's transition
history shows no queue ever above its nominal quota plus borrowing limit, and the cohort never above the
sum of its nominal quotas."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from gpufleet.adapters.storage.codec import decode_record
from tests.server.live import start

pytestmark = pytest.mark.slow

QUEUES = {"team-a": 2, "team-b": 2, "team-c": 2, "team-d": 1}  # nominal GPUs; 7 of the 8 emulated
BORROWING_LIMIT = 2
CLIENTS = 50
JOBS = 2000
HOLDING = {"admitted", "launching", "running", "evicting"}


def test_concurrent_clients_never_push_a_queue_over_its_quota_and_every_accepted_job_is_kept(
    tmp_path: Path,
) -> None:
    live = start(tmp_path, "--stop-jobs")
    try:
        secrets: dict[str, str] = {}
        with live.http() as admin:
            for name, nominal in QUEUES.items():
                quota = {"gpu": {"nominal": nominal, "borrowing_limit": BORROWING_LIMIT}}
                response = admin.put(f"/v1/queues/{name}", json={"quotas": quota, "cohort": "lab"})
                assert response.status_code == 200, response.text
                token = admin.post("/v1/tokens", json={"name": f"{name}-ci", "role": "team", "queue": name})
                assert token.status_code == 201, token.text
                secrets[name] = token.json()["secret"]

        accepted: list[list[str]] = [[] for _ in range(CLIENTS)]
        refused: list[str] = []

        def client_work(index: int) -> None:
            queue = list(QUEUES)[index % len(QUEUES)]
            headers = {"Authorization": f"Bearer {secrets[queue]}"}
            with httpx.Client(base_url=live.url, headers=headers, timeout=60) as client:
                for n in range(JOBS // CLIENTS):
                    gpus = 2 if n % 5 == 0 else 1
                    body = {"name": f"c{index}-{n}", "command": ["sleep", "0.05"], "gpus": gpus}
                    response = client.post("/v1/jobs", json=body)  # no queue: a team token submits to its own
                    if response.status_code == 201:
                        accepted[index].append(response.json()["id"])
                    else:
                        refused.append(response.text)

        threads = [threading.Thread(target=client_work, args=(i,)) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert refused == []
        time.sleep(3.0)  # let the loop run jobs for a while: quota is checked while it churns
    finally:
        live.server.stop()

    ids = [job for per_client in accepted for job in per_client]
    assert len(ids) == JOBS == len(set(ids))
    db = sqlite3.connect(live.root / "data" / "state.db")
    stored = {job_id: decode_record(_json(record)) for job_id, record in db.execute("select id, record from jobs")}
    assert sorted(stored) == sorted(ids), "a job was lost or invented"
    for index, per_client in enumerate(accepted):
        assert {stored[job].job.queue for job in per_client} == {list(QUEUES)[index % len(QUEUES)]}

    gpus = {job: record.job.gpu_milli_total / 1000 for job, record in stored.items()}
    queue_of = {job: record.job.queue for job, record in stored.items()}
    use: dict[str, float] = defaultdict(float)
    placements = 0
    peak = 0.0
    for job, source, target in db.execute("select job_id, source, target from transitions order by id"):
        if source not in HOLDING and target in HOLDING:
            use[queue_of[job]] += gpus[job]
            placements += 1
        elif source in HOLDING and target not in HOLDING:
            use[queue_of[job]] -= gpus[job]
        for queue, nominal in QUEUES.items():
            assert use[queue] <= nominal + BORROWING_LIMIT, f"{queue} used {use[queue]} GPUs"
        assert sum(use.values()) <= sum(QUEUES.values()), f"the cohort used {sum(use.values())} GPUs"
        peak = max(peak, sum(use.values()))
    assert placements >= 20, f"only {placements} placements: the quota check saw too little"
    assert peak >= sum(QUEUES.values()) - 1, f"the cohort never came near its quota (peak {peak} GPUs)"


def _json(value: str | bytes) -> dict[str, object]:
    import json

    return dict(json.loads(value))
