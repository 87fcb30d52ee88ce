"""The NVML path end to end, without a GPU: our fake libnvidia-ml.so.1 (an emulation built with gcc for tests,
tests/telemetry/fakenvml) on LD_LIBRARY_PATH, under the real nvidia-ml-py binding.

- `gpufleet up` without --emulate discovers the fake GPUs with NVML, samples them with the NVML probe
  (`probe="nvml"`), labels each GPU with the job that holds it, and flags a held GPU that NVML reports idle.
- `gpufleet exporter` serves the same GPUs (and, with --emulate, emulated ones) with no control plane.
"""

from __future__ import annotations

import ctypes.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.bench.api import TOKEN, free_port
from tests.telemetry.fakenvml import CONFIG_ENV, build_library, write_config
from tests.telemetry.prom import wait_for as _until

GiB = 1024**3
GPU = {
    "name": "NVIDIA A100-SXM4-80GB",
    "memory_total": 80 * GiB,
    "memory_used": 2 * GiB,
    "power_mw": 90_000,
    "power_limit_mw": 400_000,
    "temperature": 40,
    "sm_clock": 1410,
}


@pytest.fixture(scope="module")
def nvml_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for a child process that sees two emulated A100s through NVML: GPU 0 busy, GPU 1 idle."""
    root = tmp_path_factory.mktemp("fakenvml")
    try:
        lib = build_library(root)
    except RuntimeError as error:
        pytest.fail(str(error))
    config = write_config(
        root / "gpus.conf",
        [{**GPU, "uuid": "GPU-busy-0", "util_gpu": [93]}, {**GPU, "uuid": "GPU-idle-1", "util_gpu": [1]}],
        driver="000.00-fake",
    )
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", CONFIG_ENV)}
    return {**env, "LD_LIBRARY_PATH": str(lib), CONFIG_ENV: str(config), "COLUMNS": "200"}


def _wait_output(process: subprocess.Popen[bytes], log: Path, marker: str, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if marker in text:
            return text
        if process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode}: {text[-2000:]}")
        time.sleep(0.05)
    raise AssertionError(f"no {marker!r} after {timeout_s} s: {log.read_text(errors='replace')[-2000:]}")


def _stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def _series(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return [(dict(s.labels), s.value) for s in family.samples]
    return []


@pytest.fixture
def up_on_nvml(nvml_env: dict[str, str], tmp_path: Path) -> Iterator[tuple[str, str]]:
    port = free_port()
    log = tmp_path / "server.log"
    command = [sys.executable, "-m", "gpufleet", "up", "--data-dir", str(tmp_path / "data"), "--port", str(port)]
    command += ["--sample-interval", "0.2", "--idle-window", "1"]
    env = {**nvml_env, "GPUFLEET_CLIENT_CONFIG": str(tmp_path / "client.toml")}
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        text = _wait_output(process, log, "Ctrl-C")
        match = TOKEN.search(text)
        assert match, text
        assert "(EMULATED)" not in text
        assert "nvml" in text
        yield f"http://127.0.0.1:{port}", match.group(1)
    finally:
        assert _stop(process) == 0, log.read_text()[-2000:]


def test_up_on_nvml_labels_gpus_with_their_jobs_and_flags_the_idle_one(up_on_nvml: tuple[str, str]) -> None:
    url, token = up_on_nvml
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        info = client.get("/v1/info").json()
        assert info["emulated"] is False
        assert info["gpus"] == 2
        job = client.post("/v1/jobs", json={"queue": "default", "command": ["sleep", "60"], "gpus": 2}).json()["id"]

        def both_labelled() -> list[tuple[dict[str, str], float]] | None:
            found = _series(client.get("/metrics").text, "DCGM_FI_DEV_GPU_UTIL")
            return found if len(found) == 2 and all(labels["job_id"] == job for labels, _ in found) else None

        util = {labels["UUID"]: (labels, value) for labels, value in _until(both_labelled, 15, "the job's GPUs")}
        assert util["GPU-busy-0"][1] == 93
        assert util["GPU-idle-1"][1] == 1
        for labels, _ in util.values():
            assert labels["probe"] == "nvml"
            assert labels["modelName"] == "NVIDIA A100-SXM4-80GB"
            assert labels["queue"] == "default"
        # A gang is idle only when all its GPUs are: one busy GPU keeps the job from being flagged ...
        time.sleep(1.5)
        usage = client.get(f"/v1/jobs/{job}/usage").json()
        assert usage["probe"] == "nvml"
        assert usage["reserved_idle"] is False
        assert [(g["index"], g["flagged"]) for g in usage["gpus"]] == [(0, False), (1, True)]
        # ... but the idle GPU is counted as reserved-idle in the queue's metrics.
        idle = _series(client.get("/metrics").text, "gpufleet_queue_reserved_idle_gpus")
        assert idle == [({"queue": "default"}, 1.0)]
        client.post(f"/v1/jobs/{job}/cancel")


def _exporter(env: dict[str, str], tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    log = tmp_path / "exporter.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "exporter", "--port", str(port), "--interval", "0.1", *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    _wait_output(process, log, "/metrics")
    return process, f"http://127.0.0.1:{port}/metrics", log


def test_exporter_serves_nvml_gpus_under_dcgm_names(nvml_env: dict[str, str], tmp_path: Path) -> None:
    process, url, log = _exporter(nvml_env, tmp_path, "--hostname", "gpu-node-7")
    try:
        text = httpx.get(url, timeout=10).text
        util = {labels["UUID"]: (labels, value) for labels, value in _series(text, "DCGM_FI_DEV_GPU_UTIL")}
        assert {uuid: value for uuid, (_, value) in util.items()} == {"GPU-busy-0": 93.0, "GPU-idle-1": 1.0}
        for labels, _ in util.values():
            assert labels["probe"] == "nvml"
            assert labels["Hostname"] == "gpu-node-7"
            assert labels["job_id"] == ""
            assert labels["queue"] == ""
        assert [v for _, v in _series(text, "DCGM_FI_DEV_POWER_USAGE")] == [90.0, 90.0]
        assert "nvml probe, every 0.1s" in log.read_text()
    finally:
        assert _stop(process) == 0


def test_exporter_with_emulate_labels_every_gpu_emulated(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", CONFIG_ENV)}
    process, url, log = _exporter(env, tmp_path, "--emulate", "2xT4")
    try:
        util = _series(httpx.get(url, timeout=10).text, "DCGM_FI_DEV_GPU_UTIL")
        assert [(labels["gpu"], labels["probe"], value) for labels, value in util] == [
            ("0", "emulated", 0.0),
            ("1", "emulated", 0.0),
        ]
        assert "(EMULATED)" in log.read_text()
    finally:
        assert _stop(process) == 0


def test_exporter_without_nvml_refuses_clearly(tmp_path: Path) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has an NVIDIA driver: the refusal without NVML cannot be seen here")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", CONFIG_ENV)}
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet", "exporter", "--port", str(free_port())],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: ")
    assert "to fix" in done.stderr
    assert "Traceback" not in done.stderr
