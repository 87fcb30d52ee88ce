"""A real `gpufleet up` in a child process, real jobs (a small Python program written by the tests), and
a ledger the jobs append to, so that tests check what actually ran, where and when."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gpufleet.bench.api import LocalServer
from tests.kit.jobusers import JOB_PYTHON, reachable_by_jobs, share, shared_ledger

JOB_PROGRAM = r"""
import json, os, signal, sys, time
ledger, mode, arg = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""
env = {k: v for k, v in os.environ.items() if k.startswith(("CUDA", "NVIDIA", "MASTER", "RANK", "WORLD",
       "LOCAL", "NODE_RANK", "GPUFLEET", "XLA", "TF_"))}

def note(event, **more):
    line = json.dumps({"event": event, "job": env.get("GPUFLEET_JOB_ID"),
                       "attempt": int(env.get("GPUFLEET_ATTEMPT", 0)), "rank": int(env.get("RANK", 0)),
                       "pid": os.getpid(), "ppid": os.getppid(), "t": time.time(), **more})
    with open(ledger, "a") as f:
        f.write(line + "\n")

def on_term(signo, frame):
    note("end", how="signal")
    sys.exit(0)

# The handler is in place before the start is noted: a test that stops the job once it saw it start must
# find it ready for the signal.
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore-term" else on_term)
note("start", env=env)
print(f"hello from rank {env.get('RANK')} of job {env.get('GPUFLEET_JOB_ID')}", flush=True)

if mode == "ignore-term":
    while True:
        time.sleep(0.05)
if mode == "sleep":
    time.sleep(float(arg))
elif mode == "wait-file":
    while not os.path.exists(arg):
        time.sleep(0.02)
elif mode == "exit":
    note("end", how="exit")
    sys.exit(int(arg))
elif mode == "fill":  # write 64 MiB of output (a disk may fill up), then wait for the file `arg`, exit 3
    chunk = "y" * 65535 + "\n"
    for _ in range(1024):
        sys.stdout.write(chunk)
    sys.stdout.flush()
    while not os.path.exists(arg):
        time.sleep(0.02)
    note("end", how="exit")
    sys.exit(3)
note("end", how="done")
"""

TERMINAL = {"succeeded", "failed", "cancelled"}


@dataclass
class Live:
    server: LocalServer
    root: Path
    program: Path
    ledger: Path

    @property
    def shared(self) -> Path:
        """The folder the jobs can reach (they run as their queue's own user): for files they wait for."""
        return self.program.parent

    @property
    def url(self) -> str:
        return self.server.url

    def http(self) -> httpx.Client:
        return self.server.client()

    def command(self, mode: str, arg: str = "") -> list[str]:
        return [JOB_PYTHON, str(self.program), str(self.ledger), mode, *([arg] if arg else [])]

    def submit(self, client: httpx.Client, mode: str, arg: str = "", **spec: Any) -> str:
        body = {"queue": "default", "command": self.command(mode, arg), **spec}
        response = client.post("/v1/jobs", json=body)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def job(self, client: httpx.Client, job_id: str) -> dict[str, Any]:
        response = client.get(f"/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def wait(
        self, client: httpx.Client, job_id: str, done: Callable[[dict[str, Any]], bool], timeout_s: float = 20.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.job(client, job_id)
            if done(job):
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {job['state']} after {timeout_s} s: {job}")
            time.sleep(0.05)

    def wait_state(self, client: httpx.Client, job_id: str, *states: str, timeout_s: float = 20.0) -> dict[str, Any]:
        return self.wait(client, job_id, lambda j: j["state"] in states, timeout_s)

    def events(self, kind: str | None = None, job: str | None = None) -> list[dict[str, Any]]:
        if not self.ledger.exists():
            return []
        # Only complete lines: a job may be writing the last one right now.
        complete = self.ledger.read_text().split("\n")[:-1]
        lines = [json.loads(line) for line in complete if line.strip()]
        return [e for e in lines if (kind is None or e["event"] == kind) and (job is None or e["job"] == job)]

    def wait_events(self, kind: str, job: str, count: int = 1, timeout_s: float = 20.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while len(found := self.events(kind, job)) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job}: {len(found)} {kind!r} events after {timeout_s} s, wanted {count}")
            time.sleep(0.02)
        return found

    def restart(self, *extra: str) -> None:
        self.server = LocalServer(self.root / "data", extra=extra, token=self.server.token)


def start(root: Path, *extra: str, emulate: str = "8xA100-80GB") -> Live:
    """`gpufleet up` on `root/data`; the jobs' program and ledger in `root/shared`, which jobs running as
    their queue's own user can reach."""
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    shared = reachable_by_jobs(root / "shared")
    program = share(shared / "job.py", JOB_PROGRAM)
    ledger = shared_ledger(shared / "ledger.jsonl")
    return Live(LocalServer(data, emulate=emulate, extra=extra), root, program, ledger)


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class DeathWatch(threading.Thread):
    """Notes, independently of the control plane, when each job process the ledger names stops running
    (within ~10 ms): a process killed with SIGKILL writes no end line."""

    def __init__(self, live: Live) -> None:
        super().__init__(daemon=True)
        self.live = live
        self.died: dict[int, float] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for event in self.live.events("start"):
                pid = event["pid"]
                if pid not in self.died and not alive(pid):
                    self.died[pid] = time.time()
            self._halt.wait(0.01)

    def stop(self) -> dict[int, float]:
        self._halt.set()
        self.join()
        return self.died


def kill_quietly(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def intervals(
    events: list[dict[str, Any]], died: dict[int, float], now: float
) -> Iterator[tuple[str, int, float, float, frozenset[str]]]:
    """(job, attempt, start, end, GPUs) per started worker: it ends at its end line, or when it was seen
    dead, or runs until `now`."""
    ends = {(e["job"], e["attempt"], e["rank"]): e["t"] for e in events if e["event"] == "end"}
    for e in events:
        if e["event"] == "start":
            gpus = frozenset(g for g in e["env"].get("CUDA_VISIBLE_DEVICES", "").split(",") if g)
            end = min(ends.get((e["job"], e["attempt"], e["rank"]), now), died.get(e["pid"], now))
            yield e["job"], e["attempt"], e["t"], end, gpus
