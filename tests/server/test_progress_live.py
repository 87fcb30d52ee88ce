"""A real job under a real `gpufleet up` reports through gpufleet.runtime with the token the executor gave
it; `gpufleet show` prints and plots what it reported; its token opens nothing else and dies with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.kit.jobusers import python_for_anyone, reachable_by_jobs, share, shared_ledger
from tests.server.live import start

PROGRAM = r"""
import json, os, sys, time, urllib.request, urllib.error
from gpufleet import runtime
for step in range(6):
    runtime.report(step=step, samples=step * 64, loss=2.0 / (step + 1), grad_sqr=1.5)
    time.sleep(0.3)
runtime.checkpoint_saved(duration_s=2.5)
token = os.environ["GPUFLEET_REPORT_TOKEN"]
url = os.environ["GPUFLEET_REPORT_URL"]
def status(path):
    base = url.split("/v1/")[0]
    request = urllib.request.Request(base + path, headers={"Authorization": "Bearer " + token})
    try:
        return urllib.request.urlopen(request, timeout=5).status
    except urllib.error.HTTPError as error:
        return error.code
seen = {"list": status("/v1/jobs"), "queues": status("/v1/queues"), "progress": status(url.split("/v1")[1]
        .replace("/reports", "/progress").join(["/v1", ""]))}
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"token": token, "url": url, "seen": seen,
                        "admin_env": sorted(k for k in os.environ if k in ("GPUFLEET_TOKEN", "GPUFLEET_URL"))}) + "\n")
"""


@pytest.mark.slow
def test_a_live_job_reports_progress_and_show_plots_it(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    live = start(tmp_path)
    try:
        shared = reachable_by_jobs(tmp_path / "progress")
        program = share(shared / "train.py", PROGRAM)
        out = shared_ledger(shared / "out.jsonl")
        python, env = python_for_anyone()
        with live.http() as client:
            body = {"queue": "default", "command": [python, str(program), str(out)], "env": env, "gpus": 2}
            response = client.post("/v1/jobs", json=body)
            assert response.status_code == 201, response.text
            job_id = response.json()["id"]
            live.wait_state(client, job_id, "succeeded", "failed", timeout_s=60)
            assert live.job(client, job_id)["state"] == "succeeded"
            progress = client.get(f"/v1/jobs/{job_id}/progress").json()
        assert progress["reports"] == 7
        assert progress["step"] == 5
        assert progress["loss_curve"][-1] == [320.0, pytest.approx(2.0 / 6)]
        assert progress["checkpoints"] == 1
        assert progress["checkpoint_duration_s"] == 2.5
        [size] = progress["throughput"]
        assert size["gpus"] == 2
        assert 64 / 0.3 * 0.5 < size["samples_per_s"] < 64 / 0.3 * 1.05  # slept 0.3 s per 64 samples
        [seen] = [json.loads(line) for line in out.read_text().splitlines()]
        # The job's token reads nothing and the control plane's own token and URL are not in its env.
        assert seen["seen"] == {"list": 401, "queues": 401, "progress": 401}
        assert seen["admin_env"] == []
        # Its attempt has ended: its token is refused now.
        refused = httpx.post(
            seen["url"],
            json={"reports": [{"kind": "progress", "samples": 1}]},
            headers={"Authorization": f"Bearer {seen['token']}"},
        )
        assert refused.status_code == 401
        png = tmp_path / "progress.png"
        cli = [sys.executable, "-m", "gpufleet", "show", job_id, "--progress", "--png", str(png)]
        cli_env = {"GPUFLEET_URL": live.url, "GPUFLEET_TOKEN": live.server.token, "COLUMNS": "200", "PATH": "/usr/bin"}
        shown = subprocess.run(cli, env=cli_env, capture_output=True, text=True, timeout=60, check=False)
        assert shown.returncode == 0, shown.stderr
        assert "throughput (samples/s): 2 GPUs A100-80GB " in shown.stdout  # measured on the model it held
        assert "loss curve (6 points kept)" in shown.stdout
        assert "last checkpoint:" in shown.stdout
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        live.server.stop()
