"""A real job under a real `gpufleet up` (local executor): its first attempt reports a checkpoint with the
shell command and fails; the retry's worker finds GPUFLEET_CHECKPOINT_INTERVAL_S in its environment, the
interval the job view shows, and the failed attempt's lost work is in the report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gpufleet.domain.checkpoints import DEFAULT_GPU_FAILURES_PER_HOUR
from tests.kit.jobusers import python_for_anyone, reachable_by_jobs, share, shared_ledger
from tests.server.live import start

PROGRAM = r"""
import json, os, subprocess, sys
attempt = int(os.environ["GPUFLEET_ATTEMPT"])
if attempt == 1:
    done = subprocess.run([sys.executable, "-m", "gpufleet.runtime", "checkpoint", "--duration", "45"])
    sys.exit(3 if done.returncode == 0 else 9)
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"interval": os.environ.get("GPUFLEET_CHECKPOINT_INTERVAL_S")}) + "\n")
"""


@pytest.mark.slow
def test_the_retry_of_a_job_that_reported_a_checkpoint_is_given_the_interval(tmp_path: Path) -> None:
    live = start(tmp_path)
    try:
        shared = reachable_by_jobs(tmp_path / "ckpt")
        program = share(shared / "train.py", PROGRAM)
        out = shared_ledger(shared / "out.jsonl")
        python, env = python_for_anyone()
        with live.http() as client:
            body = {
                "queue": "default",
                "command": [python, str(program), str(out)],
                "env": env,
                "gpus": 2,
                "retries": 1,
            }
            response = client.post("/v1/jobs", json=body)
            assert response.status_code == 201, response.text
            job_id = response.json()["id"]
            job = live.wait_state(client, job_id, "succeeded", "failed", timeout_s=90)
            assert job["state"] == "succeeded", job
            assert job["attempt"] == 2
            plan = job["checkpoint_plan"]
            lost = client.get("/v1/reports/lost-work", params={"since": 0}).json()
        [seen] = [json.loads(line) for line in out.read_text().splitlines()]
        assert plan is not None
        assert plan["cost_s"] == 45.0
        gpus = 8  # the emulated node: 8 GPUs, any of which stops the job
        assert plan["mtbf_s"] == pytest.approx(3600 / (gpus * DEFAULT_GPU_FAILURES_PER_HOUR))
        assert seen["interval"] == f"{math.sqrt(2 * 45.0 * plan['mtbf_s']):.0f}"
        assert lost["total"]["attempts"] == 1
        assert set(lost["total"]["gpu_hours_by_cause"]) == {"failed"}
    finally:
        live.server.stop()
