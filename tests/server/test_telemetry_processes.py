"""GPU processes mapped to gpufleet jobs through their process trees, with real processes.

- A real `gpufleet up` over our fake NVML library (an emulation for tests, tests/telemetry/fakenvml: no GPU
  behind it) whose per-process list is re-read from a file at every query: the test starts jobs, reads the
  pids their programs wrote (a grandchild of the worker's shim, a fractional job's own process) and a stranger
  it started itself, and names them to the fake library. The control plane must attribute the grandchild's
  memory to its job, flag the fractional job that uses more than its share, and report the stranger's memory
  as no job's.
- On an emulated inventory, the emulated GPUs report the real pids of the jobs' workers (from a real local
  executor), so the same mapping runs there: two fractional jobs on one GPU split its memory by their shares.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.adapters.inventory.emulated_inventory import parse_emulate
from gpufleet.adapters.local.executor import LocalBackend
from gpufleet.adapters.metrics import render
from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.bench.api import TOKEN, free_port
from gpufleet.domain.cluster import GpuShare, WorkerPlacement
from gpufleet.domain.jobs import Job, RunningJob, RunSpec
from gpufleet.domain.resources import WorkerRequest
from gpufleet.ports import Launch
from gpufleet.scheduling.state import Holding
from gpufleet.server.gpu_monitor import LoopView, Telemetry
from tests.kit.jobusers import JOB_PYTHON, reachable_by_jobs
from tests.kit.jobusers import share as share_file
from tests.telemetry.fakenvml import CONFIG_ENV, build_library, write_config, write_procs

GiB = 1024**3

# A job that starts a child of its own (a grandchild of the worker's shim: a data loader, say) and writes both
# pids and the GPUs it was given to the file named by its first argument; SIGTERM ends both.
JOB = r"""
import json, os, signal, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
def stop(signo, frame):
    helper.kill()
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
out = sys.argv[1]
with open(out + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "grandchild": helper.pid, "gpus": os.environ["GPUFLEET_GPU_INDICES"]}, f)
os.replace(out + ".tmp", out)
time.sleep(120)
"""


class WallClock:
    def now(self) -> float:
        return time.time()


def _polled(backend: LocalBackend) -> bool:
    backend.poll()  # brings the executor's view of its workers up to date
    return True


def _series(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return [(dict(s.labels), s.value) for s in family.samples]
    return []


def _until(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _wait_file(path: Path, timeout_s: float = 20) -> dict[str, Any]:
    _until(path.exists, timeout_s, f"{path.name}")
    return dict(json.loads(path.read_text()))


@dataclass
class NvmlUp:
    url: str
    token: str
    procs: Path
    log: Path
    root: Path


@pytest.fixture
def up_on_fake_nvml(tmp_path: Path) -> Iterator[NvmlUp]:
    lib = build_library(tmp_path)
    procs = tmp_path / "procs.txt"
    gpu = {"name": "NVIDIA A100-SXM4-80GB", "memory_total": 80 * GiB, "util_gpu": [90], "power_limit_mw": 400_000}
    config = write_config(
        tmp_path / "gpus.conf",
        [{**gpu, "uuid": "GPU-proc-0"}, {**gpu, "uuid": "GPU-proc-1"}],
        procs_file=procs,
    )
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", CONFIG_ENV)}
    env |= {"LD_LIBRARY_PATH": str(lib), CONFIG_ENV: str(config), "GPUFLEET_CLIENT_CONFIG": str(tmp_path / "c.toml")}
    port = free_port()
    log = tmp_path / "server.log"
    command = [sys.executable, "-m", "gpufleet", "up", "--data-dir", str(tmp_path / "data"), "--port", str(port)]
    command += ["--sample-interval", "0.2"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        _until(lambda: "Ctrl-C" in log.read_text(errors="replace") or process.poll() is not None, 30, "up")
        text = log.read_text(errors="replace")
        match = TOKEN.search(text)
        assert match, text
        yield NvmlUp(f"http://127.0.0.1:{port}", match.group(1), procs, log, tmp_path)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
        assert process.wait() == 0, log.read_text()[-2000:]


def test_nvml_processes_are_mapped_to_jobs_through_their_process_trees(up_on_fake_nvml: NvmlUp) -> None:
    up = up_on_fake_nvml
    shared = reachable_by_jobs(up.root / "shared")  # jobs run as their queue's user: reachable by it
    program = share_file(shared / "job.py", JOB)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    started: list[dict[str, Any]] = []
    try:
        with httpx.Client(base_url=up.url, headers={"Authorization": f"Bearer {up.token}"}, timeout=30) as client:

            def submit(name: str, gpus: float) -> str:
                body = {"queue": "default", "command": [JOB_PYTHON, str(program), str(shared / name)]}
                response = client.post("/v1/jobs", json={**body, "gpus": gpus})
                assert response.status_code == 201, response.text
                return str(response.json()["id"])

            whole = submit("whole.json", 1)
            half = submit("half.json", 0.5)
            a, b = _wait_file(shared / "whole.json"), _wait_file(shared / "half.json")
            started += [a, b]
            gpu_a, gpu_b = int(a["gpus"]), int(b["gpus"])
            # NVML (the fake) now reports: the whole job's grandchild with 10 GiB, the half job's own process
            # with 50 GiB (more than its half of 80 GiB), and a process of nobody's with 3 GiB on the whole
            # job's GPU.
            write_procs(
                up.procs,
                [(gpu_a, a["grandchild"], 10 * GiB), (gpu_b, b["pid"], 50 * GiB), (gpu_a, stranger.pid, 3 * GiB)],
            )

            def attributed() -> str | None:
                text = client.get("/metrics").text
                return text if len(_series(text, "gpufleet_job_gpu_memory_used_bytes")) == 2 else None

            text = _until(attributed, 15, "both jobs' GPU memory in /metrics")
            series = _series(text, "gpufleet_job_gpu_memory_used_bytes")
            used = {labels["job_id"]: (labels, value) for labels, value in series}
            labels_a = {"job_id": whole, "queue": "default", "gpu": str(gpu_a), "uuid": f"GPU-proc-{gpu_a}"}
            assert used[whole][0].items() >= labels_a.items()
            assert used[whole][0]["hostname"]
            assert used[whole][1] == 10.0 * GiB
            assert used[half][1] == 50.0 * GiB
            assert used[half][0]["gpu"] == str(gpu_b)
            over = {labels["job_id"]: value for labels, value in _series(text, "gpufleet_job_gpu_memory_over_share")}
            assert over == {whole: 0.0, half: 1.0}
            share = {labels["job_id"]: value for labels, value in _series(text, "gpufleet_job_gpu_memory_share_bytes")}
            assert share == {whole: 80.0 * GiB, half: 40.0 * GiB}
            stray = {labels["gpu"]: value for labels, value in _series(text, "gpufleet_gpu_unattributed_memory_bytes")}
            assert stray == {str(gpu_a): 3.0 * GiB, str(gpu_b): 0.0}
            count = {labels["gpu"]: value for labels, value in _series(text, "gpufleet_gpu_unattributed_processes")}
            assert count == {str(gpu_a): 1.0, str(gpu_b): 0.0}

            usage = client.get(f"/v1/jobs/{whole}/usage").json()
            assert usage["processes_attributed"] is True
            assert usage["gpu_memory_used"] == 10 * GiB
            assert usage["over_share"] is False
            assert [(g["index"], g["used"], g["pids"]) for g in usage["gpu_memory"]] == [
                (gpu_a, 10 * GiB, [a["grandchild"]])
            ]
            half_usage = client.get(f"/v1/jobs/{half}/usage").json()
            assert half_usage["over_share"] is True
            assert half_usage["gpu_memory"][0]["share"] == 40 * GiB
            gpus = {g["index"]: g for g in client.get("/v1/telemetry").json()["gpus"]}
            assert (gpus[gpu_a]["unattributed_memory"], gpus[gpu_a]["unattributed_pids"]) == (3 * GiB, [stranger.pid])
            assert gpus[gpu_b]["unattributed_memory"] == 0
            assert f"process {stranger.pid} uses 3072 MiB of GPU memory and belongs to no gpufleet job" in (
                up.log.read_text()
            )

            # The whole job ends: its grandchild's pid, still listed by NVML, is no job's any more.
            client.post(f"/v1/jobs/{whole}/cancel")
            _until(lambda: client.get(f"/v1/jobs/{whole}").json()["state"] == "cancelled", 15, "the cancel")

            def released() -> bool:
                text = client.get("/metrics").text
                jobs = {labels["job_id"] for labels, _ in _series(text, "gpufleet_job_gpu_memory_used_bytes")}
                return jobs == {half}

            _until(released, 15, "the ended job's memory to leave /metrics")
            client.post(f"/v1/jobs/{half}/cancel")
            _until(lambda: client.get(f"/v1/jobs/{half}").json()["state"] == "cancelled", 15, "the cancel")
    finally:
        stranger.kill()
        stranger.wait()
        for job in started:
            for pid in (job["pid"], job["grandchild"]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_emulated_gpus_report_the_workers_real_pids_split_by_share(tmp_path: Path) -> None:
    node = parse_emulate("3xA100-80GB", "box")[0]
    backend = LocalBackend(tmp_path / "state", [node], WallClock(), emulated=True)
    store = SqlStore.open(default_sqlite_url(tmp_path))
    sleep = RunSpec((sys.executable, "-c", "import time; time.sleep(60)"))
    jobs = {
        "small": (WorkerPlacement(node.name, (GpuShare(0, 300),)),),
        "large": (WorkerPlacement(node.name, (GpuShare(0, 700),)),),
        "pair": (WorkerPlacement(node.name, (GpuShare(1),)), WorkerPlacement(node.name, (GpuShare(2),))),
    }
    holdings = {}
    try:
        for job_id, workers in jobs.items():
            job = Job(job_id, "default", WorkerRequest(gpus=1), workers=len(workers), run=sleep)
            backend.launch(Launch(job, 1, workers))
            holdings[job_id] = Holding(job, workers, (), RunningJob(job, workers, started_at=time.time()))
        _until(lambda: _polled(backend) and len(backend.running_commands()) == 4, 15, "every worker's command")
        telemetry = Telemetry(store, [node], emulated=True, hostname="box", processes=backend)
        telemetry.observer.view = LoopView(time.time(), {}, holdings, frozenset())
        telemetry.tick()
        samples = {s.index: s for s in telemetry.latest_samples()}
        commands = backend.running_commands()
        assert {pid for pid, _ in samples[0].processes} == {commands[("small", 1, 0)], commands[("large", 1, 0)]}
        state = telemetry.scheduler_state()
        assert state.processes_attributed
        memory = {(m.job, m.index): m for m in state.job_memory}
        small, large = memory[("small", 0)], memory[("large", 0)]
        assert small.used_bytes * 7 == pytest.approx(large.used_bytes * 3, rel=1e-6)  # 30 % and 70 % of it
        assert small.share_bytes == 80 * GiB * 300 // 1000
        assert not small.over_share
        assert not large.over_share
        assert {(m.job, m.index) for m in state.job_memory if m.index > 0} == {("pair", 1), ("pair", 2)}
        assert [u.used_bytes for u in state.unattributed] == [0, 0, 0]
        body = render(telemetry.registry).decode()
        assert len(_series(body, "gpufleet_job_gpu_memory_used_bytes")) == 4
    finally:
        for job_id in jobs:
            backend.stop(job_id, 1, 0.0, "test over")
        _until(lambda: _polled(backend) and not backend.running_commands(), 15, "the workers to stop")
        store.close()
