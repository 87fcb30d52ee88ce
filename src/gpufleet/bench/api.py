"""`gpufleet bench api`: the control plane's API speed, through HTTP, on SQLite, as one JSON object.

A real `gpufleet up` runs as a separate process on loopback with an emulated inventory and a fresh data
directory. Measured:

- **submit throughput**: `clients` concurrent HTTP clients (keep-alive) submit `jobs` one-GPU jobs to one
  queue, each with its own `Idempotency-Key` as the CLI sends, within the default rate limits; jobs
  accepted per second of wall time (goal >= 500/s, the figure Slurm states).
- **submit -> process started**: on the then idle control plane, one job at a time whose command records
  the wall time it started; latency from just before the HTTP request to that time, p50 and p99 (goal
  p50 <= 100 ms).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from gpufleet.domain.errors import GpufleetError

GOAL_SUBMITS_PER_S = 500.0
GOAL_ARRAY_SUBMIT_S = 1.0  # one call that makes a 10,000-task array
GOAL_START_P50_MS = 100.0
TOKEN = re.compile(r"(gf_[A-Za-z0-9_\-]+)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalServer:
    """`gpufleet up` in a child process on a free loopback port; the admin token read from its banner."""

    def __init__(
        self,
        data_dir: Path,
        emulate: str | None = "8xA100-80GB",
        extra: tuple[str, ...] = (),
        token: str | None = None,
        port: int | None = None,
        env: dict[str, str] | None = None,
        python: str = sys.executable,
        prefix: tuple[str, ...] = (),
        log_path: Path | None = None,
        ready_timeout_s: float = 30.0,
    ) -> None:
        """`token`: the admin token of an earlier start on the same data directory (a restart prints none).
        `prefix` runs it through another command (e.g. `runuser -u USER --`); `log_path`: where its output
        goes (default: server.log in the data directory); `ready_timeout_s`: how long it may take to start
        (a Ray cluster's agents take longer than the local executor)."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        env = {**os.environ, "GPUFLEET_CLIENT_CONFIG": str(data_dir / "client.toml"), "COLUMNS": "200", **(env or {})}
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path or data_dir / "server.log"
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.log = open(self.log_path, "a")  # noqa: SIM115 - closed in stop()
        self._known_token = token
        command = [*prefix, python, "-m", "gpufleet", "up", "--data-dir", str(data_dir), "--port", str(self.port)]
        self.process = subprocess.Popen(
            [*command, *(["--emulate", emulate] if emulate else []), *extra],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.token = self._wait_ready(ready_timeout_s)

    def _wait_ready(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.close()
                raise GpufleetError(
                    f"gpufleet up exited with {self.process.returncode}: {self.output()[-2000:]}",
                    "see the server output above",
                )
            output = self.output()
            if "Ctrl-C" in output:
                match = TOKEN.search(output)
                if self._known_token is not None:
                    return self._known_token
                if match:
                    return match.group(1)
                raise GpufleetError("gpufleet up printed no admin token", "give the token of the earlier start")
            time.sleep(0.05)
        self.stop()
        raise GpufleetError(f"gpufleet up did not become ready in {timeout_s:g} s", "see its output in server.log")

    def output(self) -> str:
        """What this start of the server printed."""
        with open(self.log_path, "rb") as log:
            log.seek(self._log_start)
            return log.read().decode(errors="replace")

    def client(self, timeout_s: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=timeout_s)

    def kill(self) -> None:
        """kill -9: no shutdown of any kind."""
        self.process.kill()
        self.process.wait()
        self.log.close()

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        return self.process.returncode


def _submit_throughput(server: LocalServer, jobs: int, clients: int) -> dict[str, object]:
    spec = {"queue": "default", "command": ["sleep", "600"], "gpus": 1}
    accepted = [0] * clients
    errors: list[str] = []
    per_client = [jobs // clients + (1 if i < jobs % clients else 0) for i in range(clients)]

    def work(index: int) -> None:
        with server.client() as client:
            for n in range(per_client[index]):
                key = {"Idempotency-Key": str(uuid.uuid4())}
                response = client.post("/v1/jobs", json={**spec, "name": f"bench-{index}-{n}"}, headers=key)
                if response.status_code in (200, 201):
                    accepted[index] += 1
                else:
                    errors.append(f"{response.status_code} {response.text[:200]}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    total = sum(accepted)
    return {
        "submit_jobs": jobs,
        "submit_clients": clients,
        "submit_accepted": total,
        "submit_errors": len(errors),
        "submit_first_error": errors[0] if errors else None,
        "submit_seconds": round(seconds, 3),
        "submits_per_s": round(total / seconds, 1),
        "submits_per_s_goal": GOAL_SUBMITS_PER_S,
    }


def _array_submit(server: LocalServer, tasks: int) -> dict[str, object]:
    """One call that submits an array of `tasks` tasks: its wall time as the client sees it."""
    spec = {"queue": "default", "command": ["sleep", "600"], "gpus": 1, "array": f"0-{tasks - 1}"}
    with server.client(timeout_s=120.0) as client:
        started = time.perf_counter()
        response = client.post("/v1/jobs", json=spec, headers={"Idempotency-Key": str(uuid.uuid4())})
        seconds = time.perf_counter() - started
    made = response.json().get("array_tasks") if response.status_code == 201 else None
    return {
        "array_tasks": tasks,
        "array_made": made,
        "array_error": None if response.status_code == 201 else f"{response.status_code} {response.text[:200]}",
        "array_submit_seconds": round(seconds, 3),
        "array_submit_goal_s": GOAL_ARRAY_SUBMIT_S,
    }


def job_python() -> str:
    """A Python every user may run: this one, unless it lives where others cannot reach (a per-user
    install under /root); then the system's. Jobs run as their queue's own user when the control plane is
    root."""
    here = Path(sys.executable).resolve()
    if all(os.stat(p).st_mode & 0o001 for p in (here, *here.parents)):
        return sys.executable
    return shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable


def _start_latency(server: LocalServer, samples: int, marks: Path) -> dict[str, object]:
    latencies: list[float] = []
    python = job_python()
    with server.client() as client:
        for i in range(samples):
            mark = marks / f"{i}.t"
            command = [python, "-S", "-c", f"import time; open({str(mark)!r}, 'w').write(repr(time.time()))"]
            sent = time.time()
            response = client.post("/v1/jobs", json={"queue": "default", "command": command, "name": f"lat-{i}"})
            response.raise_for_status()
            deadline = time.monotonic() + 10.0
            while not mark.exists() or not mark.read_text():
                if time.monotonic() > deadline:
                    raise GpufleetError(f"job {i} did not start within 10 s", "see server.log")
                time.sleep(0.001)
            latencies.append((float(mark.read_text()) - sent) * 1000.0)
    latencies.sort()
    return {
        "start_samples": samples,
        "start_p50_ms": round(statistics.median(latencies), 1),
        "start_p99_ms": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1),
        "start_max_ms": round(latencies[-1], 1),
        "start_p50_ms_goal": GOAL_START_P50_MS,
    }


def run(jobs: int = 2000, clients: int = 16, latency_samples: int = 50, array_tasks: int = 10_000) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-api-"))
    # Jobs run as their queue's own user when the control plane is root: their marks go where they may write,
    # and not under /tmp, which is each job's own.
    marks = Path(tempfile.mkdtemp(prefix="gpufleet-bench-marks-", dir="/var/tmp"))
    marks.chmod(0o1777)
    try:
        server = LocalServer(root / "data", extra=("--stop-jobs",))
        try:
            result: dict[str, object] = {"store": "sqlite", "inventory": "emulated: 8xA100-80GB"}
            result |= _start_latency(server, latency_samples, marks)
            result |= _submit_throughput(server, jobs, clients)
            if array_tasks:
                result |= _array_submit(server, array_tasks)
        finally:
            server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(marks, ignore_errors=True)
    return result
