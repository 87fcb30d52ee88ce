"""gpufleet.runtime's reports when the control plane is down or stalled: a job never fails, never waits on
a report, and exits within the bounded final flush (a real subprocess, as a job runs it)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import gpufleet
from gpufleet import runtime

JOB = """
import json, sys, time
t0 = time.monotonic()
from gpufleet import runtime
for step in range(20_000):
    runtime.report(step=step, samples=step * 32, loss=1.0 / (step + 1), lr=0.1, note="not a number")
runtime.checkpoint_saved(duration_s=3.0)
calls_s = time.monotonic() - t0
heavy = sorted(m for m in ("gpufleet.domain", "gpufleet.server", "numpy") if m in sys.modules)
print(json.dumps({"calls_s": calls_s, "heavy": heavy, "dropped": runtime._state["reporter"].dropped}))
"""


def run_job(url: str) -> tuple[dict[str, object], float, str]:
    env = {**os.environ, "GPUFLEET_REPORT_URL": url, "GPUFLEET_REPORT_TOKEN": "gfj_1.abc", "RANK": "0"}
    env["PYTHONPATH"] = str(Path(gpufleet.__file__).resolve().parents[1])
    start = time.monotonic()
    argv = [sys.executable, "-S", "-c", JOB]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    wall = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), wall, done.stderr


def test_a_job_runs_and_exits_on_time_when_nothing_listens() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: connections are refused
    out, wall, stderr = run_job(f"http://127.0.0.1:{port}/v1/jobs/j-1/reports")
    assert out["calls_s"] < 5.0  # 20,001 calls; sending never happens on the job's thread
    assert out["heavy"] == []
    assert out["dropped"] == 20_001 - runtime.BUFFER  # bounded: the oldest went
    assert wall < 15.0  # interpreter start + calls + at most EXIT_FLUSH_S at exit
    assert "unreachable" in stderr  # said once, not per report
    assert stderr.count("unreachable") == 1


def test_a_job_exits_on_time_when_the_control_plane_accepts_but_never_answers() -> None:
    with socket.socket() as stalled:
        stalled.bind(("127.0.0.1", 0))
        stalled.listen(64)  # connections complete in the kernel; nobody ever reads or answers
        port = stalled.getsockname()[1]
        out, wall, _stderr = run_job(f"http://127.0.0.1:{port}/v1/jobs/j-1/reports")
    assert out["calls_s"] < 5.0
    assert wall < out["calls_s"] + runtime.EXIT_FLUSH_S + 8.0


def test_outside_gpufleet_and_on_other_ranks_reports_do_nothing(monkeypatch) -> None:
    monkeypatch.delenv("GPUFLEET_REPORT_URL", raising=False)
    monkeypatch.setattr(runtime, "_state", {})
    runtime.report(step=1, samples=2, loss=3.0)
    assert runtime._state == {"reporter": None}
    monkeypatch.setenv("GPUFLEET_REPORT_URL", "http://127.0.0.1:9/x")
    monkeypatch.setenv("GPUFLEET_REPORT_TOKEN", "gfj_1.x")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setattr(runtime, "_state", {})
    runtime.checkpoint_saved(duration_s=1.0)
    assert runtime._state == {"reporter": None}
