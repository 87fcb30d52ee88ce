"""`gpufleet up` without `--emulate` finds its GPUs through NVML: here the real nvidia-ml-py binding over our
fake libnvidia-ml.so.1 (an emulation built by the tests; no GPU is here). The inventory says nvml, not
emulated, and jobs get the UUIDs NVML reported."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpufleet.bench.api import LocalServer
from tests.kit.jobusers import reachable_by_jobs, share, shared_ledger
from tests.server.live import JOB_PROGRAM
from tests.telemetry.fakenvml import CONFIG_ENV, write_config

pytestmark = pytest.mark.slow
GiB = 1024**3


def test_up_discovers_gpus_through_nvml_and_hands_out_their_uuids(tmp_path: Path, fake_nvml: Path) -> None:
    config = write_config(
        tmp_path / "two.conf",
        [
            {"name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-11111111-aaaa", "memory_total": 80 * GiB},
            {"name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-22222222-bbbb", "memory_total": 80 * GiB},
        ],
    )
    data = tmp_path / "data"
    data.mkdir()
    shared = reachable_by_jobs(tmp_path / "shared")  # jobs run as their queue's user: reachable by it
    program = share(shared / "job.py", JOB_PROGRAM)
    ledger = shared_ledger(shared / "ledger.jsonl")
    env = {"LD_LIBRARY_PATH": str(fake_nvml), CONFIG_ENV: str(config)}
    server = LocalServer(data, emulate=None, extra=("--stop-jobs",), env=env)
    try:
        with server.client() as client:
            info = client.get("/v1/info").json()
            assert info["emulated"] is False
            nodes = client.get("/v1/nodes").json()["nodes"]
            gpus = [(g["model"], g["uuid"]) for node in nodes for g in node["gpus"]]
            assert gpus == [("A100-80GB", "GPU-11111111-aaaa"), ("A100-80GB", "GPU-22222222-bbbb")]
            body = {"command": ["python3", str(program), str(ledger), "sleep", "0"], "gpus": 2}
            job = client.post("/v1/jobs", json=body).json()["id"]
            deadline = time.monotonic() + 20
            while client.get(f"/v1/jobs/{job}").json()["state"] != "succeeded":
                assert time.monotonic() < deadline, client.get(f"/v1/jobs/{job}").json()["reason"]
                time.sleep(0.05)
    finally:
        server.stop()
    assert "CUDA_VISIBLE_DEVICES" in ledger.read_text()
    assert '"CUDA_VISIBLE_DEVICES": "GPU-11111111-aaaa,GPU-22222222-bbbb"' in ledger.read_text()
    assert "emulated" not in server.output().split("GPUs:")[1].split("\n")[0]
