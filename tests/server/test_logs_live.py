"""Job logs on a real `gpufleet up`: kept off the store's file system with --log-dir, capped per worker with
--log-cap (the API serves the newest part, which says what was dropped), and removed once a finished job's
logs are older than --log-max-age."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpufleet.bench.api import LocalServer
from tests.kit.jobusers import JOB_PYTHON, users_created_here
from tests.server.live import start

pytestmark = pytest.mark.slow

FLOOD = "import sys\nfor n in range(20000): print(f'line {n:06d} ' + 'x' * 60)\nprint('the end')\n"


def test_logs_go_to_the_log_dir_capped_and_are_removed_after_their_retention(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    with users_created_here():
        live = start(tmp_path, "--log-dir", str(logs), "--log-cap", "64KiB")
        try:
            with live.http() as client:
                response = client.post("/v1/jobs", json={"command": [JOB_PYTHON, "-c", FLOOD]})
                assert response.status_code == 201, response.text
                job = response.json()["id"]
                live.wait_state(client, job, "succeeded")
                text = client.get(f"/v1/jobs/{job}/logs").json()["text"]
        finally:
            live.server.stop()
        assert text.startswith("[gpufleet: this log is capped at 64 KiB: the first ")
        assert text.endswith("the end\n")
        assert len(text.encode()) <= 64 * 1024
        assert (logs / job / "attempt-1" / "worker-0.log").exists()
        assert not (tmp_path / "data" / "jobs" / "logs" / job).exists()
        time.sleep(1.5)
        again = LocalServer(
            tmp_path / "data",
            extra=("--log-dir", str(logs), "--log-max-age", "1s"),
            token=live.server.token,
        )
        try:
            with again.client() as client:
                gone = client.get(f"/v1/jobs/{job}/logs")
            output = again.output()
        finally:
            again.stop()
    assert not (logs / job).exists()
    assert gone.status_code == 404
    assert "log retention: removed the logs of 1 finished job(s)" in output
