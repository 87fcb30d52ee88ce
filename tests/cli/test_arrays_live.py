"""Job arrays and dependencies through the CLI as a child process, against a real `gpufleet up` running real
jobs with the local executor: each task's own ids in its environment, an array's throttle held, afterok and
afternotok on a failed parent, a never-satisfiable dependency ended with its reason, and refusals at submit."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.cli.conftest import Cli

pytestmark = pytest.mark.slow

HERE = ("--workdir", "-")


TICK_S = 0.02


def _jobs(cli: Cli, ids: list[str], timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """The jobs once every one has ended."""
    deadline = time.monotonic() + timeout_s
    with cli.live.http() as client:
        while True:
            jobs = [cli.live.job(client, job_id) for job_id in ids]
            if all(j["state"] in ("succeeded", "failed", "cancelled") for j in jobs):
                return jobs
            assert time.monotonic() < deadline, [(j["id"], j["state"]) for j in jobs]
            time.sleep(0.1)


def _log(cli: Cli, job_id: str) -> str:
    done = cli("logs", job_id)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_array_gives_each_task_its_ids_and_never_runs_more_than_its_throttle(cli: Cli) -> None:
    script = 'echo "task $GPUFLEET_ARRAY_JOB_ID $GPUFLEET_ARRAY_TASK_ID"; sleep 1'
    done = cli("run", *HERE, "--array", "0-6:2,9%2", "--json", "--", "sh", "-c", script)
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout)
    array_id = first["array_id"]
    assert first["array_tasks"] == 5
    assert first["id"] == f"{array_id}_0"
    ids = [f"{array_id}_{n}" for n in (0, 2, 4, 6, 9)]
    jobs = _jobs(cli, ids)
    assert [j["state"] for j in jobs] == ["succeeded"] * 5
    for job, n in zip(jobs, (0, 2, 4, 6, 9), strict=True):
        assert _log(cli, job["id"]).strip() == f"task {array_id} {n}"
        assert job["array_task"] == n
    # Never more than 2 at once: at any task's start, at most one other had started and not yet ended. Each time is
    # stamped by a task's own shim (its start after the fork, its end once it has reaped its command and closed the
    # log), so a task that starts the moment another's end is seen may carry a start a few milliseconds before that
    # end's stamp: overlaps shorter than TICK_S are the stamps', not the tasks'.
    spans = [(j["first_started_at"], j["finished_at"]) for j in jobs]
    for start, _ in spans:
        overlapping = sum(1 for s, e in spans if s <= start < e - TICK_S)
        assert overlapping <= 2, spans
    plain = cli("submit", "-", *HERE, "--array", "0-3", stdin="command: [sh, -c, 'exit 0']\n")
    assert plain.returncode == 0, plain.stderr
    assert "submitted array j-" in plain.stdout
    assert "(4 tasks)" in plain.stdout


def test_afterok_and_afternotok_follow_a_failed_parent(cli: Cli) -> None:
    # The parent fails once the test has seen its children wait (a file the test makes), not after a fixed time: on a
    # loaded machine the five CLI calls below took longer than the eight seconds it once slept.
    release = cli.live.shared / "release-failing-parent"
    release.unlink(missing_ok=True)
    wait = f"for i in $(seq 600); do [ -e {release} ] && break; sleep 0.1; done; exit 3"
    parent = cli("run", "--no-wait", *HERE, "--", "sh", "-c", wait).stdout.strip()
    ok = cli("run", "--no-wait", *HERE, "--dependency", f"afterok:{parent}", "--", "true").stdout.strip()
    notok = cli("run", "--no-wait", *HERE, "-d", f"afternotok:{parent}", "--", "true").stdout.strip()
    chained = cli("run", "--no-wait", *HERE, "-d", f"afterany:{ok}", "--", "true").stdout.strip()
    why = cli("explain", ok)
    assert why.returncode == 0, why.stderr
    assert f"afterok:{parent}" in why.stdout, why.stdout
    assert "waiting for its dependencies" in why.stdout, why.stdout
    release.touch()
    p, o, n, c = _jobs(cli, [parent, ok, notok, chained])
    assert p["state"] == "failed"
    assert o["state"] == "cancelled"
    assert o["reason"].startswith("DependencyNeverSatisfied"), o["reason"]
    assert o["first_started_at"] is None
    assert n["state"] == "succeeded"
    assert n["first_started_at"] >= p["finished_at"]
    assert c["state"] == "succeeded"  # afterany: its parent ended (cancelled)


def test_a_dependency_on_an_unknown_job_is_refused_at_submit(cli: Cli) -> None:
    done = cli("run", "--no-wait", *HERE, "--dependency", "afterok:j-00000000", "--", "true")
    assert done.returncode == 2
    assert "j-00000000" in done.stderr, done.stderr
    assert "does not exist" in done.stderr, done.stderr
    bad = cli("run", "--no-wait", *HERE, "--dependency", "afterwards:j-1", "--", "true")
    assert bad.returncode == 2, bad.stderr
    assert "unknown type" in bad.stderr, bad.stderr
    array = cli("run", "--no-wait", *HERE, "--array", "5-1", "--", "true")
    assert array.returncode == 2, array.stderr
    assert "array" in array.stderr, array.stderr
