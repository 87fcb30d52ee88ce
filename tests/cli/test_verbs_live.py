"""hold, release, requeue, update and bulk cancel through the CLI as a child process, against a real `gpufleet up`
running real jobs with the local executor (one node of 8 GPUs: a job of 8 GPUs keeps the next one waiting)."""

from __future__ import annotations

import json
import time

import pytest

from tests.cli.conftest import Cli

pytestmark = pytest.mark.slow

HERE = ("--workdir", "-")


def _start(cli: Cli, *args: str) -> str:
    done = cli("run", "--no-wait", *HERE, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_held_job_is_not_scheduled_until_released(cli: Cli) -> None:
    blocker = _start(cli, "--gpus", "8", "--", "sleep", "60")
    cli.until(blocker, lambda j: j["state"] == "running")
    waiting = _start(cli, "--gpus", "8", "--", "true")
    held = cli("hold", waiting)
    assert held.returncode == 0, held.stderr
    assert "hold requested for 1 job(s)" in held.stdout
    cli.until(waiting, lambda j: j["state"] == "held")
    assert cli("cancel", blocker).returncode == 0
    cli.until(blocker, lambda j: j["state"] == "cancelled")
    time.sleep(2)  # the GPUs are free: a held job still does not start
    assert cli.job(waiting)["state"] == "held"
    again = cli("hold", blocker)
    assert "hold requested for 0 job(s), 1 skipped" in again.stdout or "would" in again.stdout, again.stdout
    released = cli("release", waiting)
    assert released.returncode == 0, released.stderr
    done = cli.until(waiting, lambda j: j["state"] == "succeeded")
    assert done["first_started_at"] is not None


def test_update_changes_a_waiting_jobs_priority_runtime_and_gpus(cli: Cli) -> None:
    blocker = _start(cli, "--gpus", "8", "--", "sleep", "60")
    cli.until(blocker, lambda j: j["state"] == "running")
    waiting = _start(cli, "--gpus", "8", "--", "true")
    done = cli("update", waiting, "--priority", "7", "--max-runtime", "10m", "--gpus", "2")
    assert done.returncode == 0, done.stderr
    job = cli.until(waiting, lambda j: j["priority"] == 7)
    assert job["request"]["gpus"] == 2.0
    assert job["run"]["max_runtime"] == 600.0
    # 2 GPUs no longer need the blocker's: it starts beside it.
    cli.until(waiting, lambda j: j["state"] == "succeeded")
    late = cli("update", waiting, "--priority", "1")
    assert late.returncode == 2, late.stderr
    assert "only a pending or held job" in late.stderr, late.stderr
    too_big = _start(cli, "--gpus", "8", "--", "true")
    refused = cli("update", too_big, "--gpus", "16")
    assert refused.returncode == 2, refused.stderr
    cli("cancel", blocker, too_big)


def test_requeue_stops_a_running_job_and_starts_it_again(cli: Cli) -> None:
    job_id = _start(cli, "--", "sh", "-c", "sleep 60")
    cli.until(job_id, lambda j: j["state"] == "running")
    done = cli("requeue", job_id)
    assert done.returncode == 0, done.stderr
    job = cli.until(job_id, lambda j: j["attempt"] == 2 and j["state"] == "running")
    assert job["preemptions"] == 1
    events = json.loads(cli("explain", job_id, "--json").stdout)["events"]
    assert any("requeue" in e["reason"] for e in events), events
    cli("cancel", job_id)


def test_bulk_cancel_of_an_array_asks_and_jobs_folds_it(cli: Cli) -> None:
    blocker = _start(cli, "--gpus", "8", "--", "sleep", "60")
    cli.until(blocker, lambda j: j["state"] == "running")
    made = json.loads(cli("run", *HERE, "--gpus", "8", "--array", "0-11", "--json", "--", "true").stdout)
    array_id = made["array_id"]
    listed = cli("jobs").stdout
    assert f"{array_id} [12 tasks]" in listed, listed
    assert "pending:12" in listed, listed
    expanded = cli("jobs", "--expand").stdout
    assert f"{array_id}_11" in expanded
    refused = cli("cancel", array_id)  # stdin is not a terminal: no prompt, a refusal with its fix
    assert refused.returncode == 2
    assert "12 jobs" in refused.stderr, refused.stderr
    assert "--yes" in refused.stderr, refused.stderr
    one = cli("cancel", f"{array_id}_3")
    assert "cancel requested for 1 job(s)" in one.stdout, one.stdout
    done = cli("cancel", array_id, "--yes")
    assert done.returncode == 0, done.stderr
    assert "cancel requested for 11 job(s)" in done.stdout, done.stdout
    for n in (0, 3, 11):
        cli.until(f"{array_id}_{n}", lambda j: j["state"] == "cancelled")
    by_name = cli("cancel", "--name", "nothing-has-this-name", "--yes")
    assert "0 job(s)" in by_name.stdout, by_name.stdout
    cli("cancel", blocker)
