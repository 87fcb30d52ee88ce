"""A job that is not Python reports its checkpoints with `python -m gpufleet.runtime checkpoint` (a real
subprocess, over HTTP to a real uvicorn server, with its job token); the loop takes it; `gpufleet show` prints
the interval the next start is given and `gpufleet report lost-work` the work a preemption lost."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gpufleet
from gpufleet.server.job_tokens import JobTokens
from tests.server.test_cli_live import Live, live  # noqa: F401 - the fixture
from tests.server.test_cost_api import HOUR, Loop


def report_checkpoint(url: str, token: str, duration: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "GPUFLEET_REPORT_URL": url,
        "GPUFLEET_REPORT_TOKEN": token,
        "PYTHONPATH": str(Path(gpufleet.__file__).resolve().parents[1]),
    }
    argv = [sys.executable, "-m", "gpufleet.runtime", "checkpoint", "--duration", duration]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_a_shell_job_reports_a_checkpoint_and_the_cli_shows_interval_and_lost_work(
    live: Live,  # noqa: F811
    tmp_path: Path,
) -> None:
    live.cli("price", "set", "A100-80GB", "2.0")
    loop = Loop(live)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: train\ncommand: [sh, train.sh]\ngpus: 2\ngpu_models: A100-80GB\n")
    job_id = live.cli("submit", str(spec), token=live.team).split()[1]
    loop.start(job_id)
    assert "checkpoint interval: none given" in live.cli("show", job_id, token=live.team)
    token = JobTokens(live.ctx.store).token(job_id, 1)
    done = report_checkpoint(f"{live.url}/v1/jobs/{job_id}/reports", token, "30")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    loop.reconciler.step()
    record = live.ctx.store.get(job_id)
    assert record is not None
    assert record.checkpoint_cost_s == 30.0
    assert record.last_checkpoint_at is not None
    # Preempted an hour after that checkpoint, it is placed again with an interval from C = 30 s.
    live.ctx.clock.t = record.last_checkpoint_at + HOUR  # type: ignore[attr-defined]
    high = tmp_path / "high.yaml"
    high.write_text("name: urgent\ncommand: [sh, go.sh]\ngpus: 4\ngpu_models: A100-80GB\npriority: 9\n")
    urgent = live.cli("submit", str(high), token=live.team).split()[1]
    loop.reconciler.step()
    loop.backend.stopped(job_id, live.ctx.clock.now())
    loop.reconciler.step()
    loop.backend.started(urgent, live.ctx.clock.now())
    loop.finish(urgent)
    loop.reconciler.step()
    shown = live.cli("show", job_id, token=live.team)
    assert "checkpoint interval:" in shown
    assert "C 30 s" in shown
    assert "Llama 3" in shown
    report = live.cli("report", "lost-work", "--since", "1970-01-01")
    assert "team-a" in report
    lost = json.loads(live.cli("report", "lost-work", "--since", "1970-01-01", "--json"))
    assert lost["total"]["gpu_hours"] == pytest.approx(2.0, rel=1e-3)  # 1 h of 2 GPUs
    assert lost["total"]["usd"] == pytest.approx(4.0, rel=1e-3)
    bad = live.cli("report", "lost-work", "--by", "model", code=2)
    assert "give queue or user" in bad


def test_the_report_command_exits_0_at_once_when_nothing_listens() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: connections are refused
    started = time.monotonic()
    done = report_checkpoint(f"http://127.0.0.1:{port}/v1/jobs/j-1/reports", "gfj_1.abc", "12")
    assert done.returncode == 0
    assert time.monotonic() - started < 15.0
    assert "not delivered" in done.stderr
    malformed = report_checkpoint(f"http://127.0.0.1:{port}/v1/jobs/j-1/reports", "gfj_1.abc", "soon")
    assert malformed.returncode == 2
    assert "--duration" in malformed.stderr
    outside = subprocess.run(
        [sys.executable, "-m", "gpufleet.runtime", "checkpoint", "--duration", "1"],
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert outside.returncode == 0
    assert "not inside a gpufleet job" in outside.stderr
