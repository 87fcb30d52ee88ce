"""`gpufleet reservation` against a real control plane: a maintenance window ahead keeps a job that would run into
it off the node (and says why), lets a short one run, and stops a running job its grace period before it starts."""

from __future__ import annotations

import json
import time

import pytest

from tests.cli.conftest import Cli

pytestmark = pytest.mark.slow

HERE = ("--workdir", "-", "--name")


def _start(cli: Cli, name: str, *args: str) -> str:
    done = cli("run", "--no-wait", *HERE, name, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_maintenance_window_keeps_long_jobs_off_and_stops_running_ones_before_it(cli: Cli) -> None:
    node = json.loads(cli("nodes", "--json").stdout)[0]["name"]
    running = _start(cli, "before", "--gpus", "4", "--set", "grace_period=5s", "--", "sleep", "600")
    cli.until(running, lambda j: j["state"] == "running")
    made = cli("reservation", "create", "fw", "--nodes", node, "--start", "+30s", "--end", "+1h", "--maintenance")
    assert made.returncode == 0, made.stderr
    assert f"reservation fw: {node} for maintenance" in made.stdout
    listed = json.loads(cli("reservation", "list", "--json").stdout)["reservations"]
    assert [(r["name"], r["state"]) for r in listed] == [("fw", "upcoming")]
    long = _start(cli, "long", "--gpus", "2", "--max-runtime", "2h", "--", "sleep", "600")
    short = _start(cli, "short", "--gpus", "2", "--max-runtime", "10s", "--", "true")
    cli.until(short, lambda j: j["state"] == "succeeded")
    time.sleep(2)
    waiting = cli.job(long)
    assert waiting["state"] == "pending"
    explained = cli("explain", long)
    assert "reservation fw (maintenance" in explained.stdout, explained.stdout
    # The running job without a limit gets its stop signal its grace (5 s) before the window (30 s from creation).
    stopped = cli.until(running, lambda j: j["state"] == "pending", timeout_s=60)
    assert "reservation fw" in json.dumps(stopped)
    deleted = cli("reservation", "delete", "fw")
    assert deleted.returncode == 0, deleted.stderr
    cli.until(long, lambda j: j["state"] == "running")
    for job_id in (running, long):
        assert cli("cancel", job_id).returncode == 0
    bad = cli("reservation", "create", "bad", "--nodes", "nowhere", "--start", "+1h", "--end", "+2h", "--maintenance")
    assert bad.returncode != 0
    assert "nowhere" in bad.stderr
    assert "gpufleet nodes" in bad.stderr


def test_the_readme_reservation_commands_run_as_written(cli: Cli) -> None:
    import re

    from tests.cli.test_readme_live import README

    block = re.search(r"```bash\n(\.venv/bin/gpufleet reservation create.*?)```", README.read_text(), re.S)
    assert block is not None, "the README lost its reservation commands"
    node = json.loads(cli("nodes", "--json").stdout)[0]["name"]
    with cli.live.http() as client:
        assert client.put("/v1/queues/team-a", json={"quotas": {"gpu": 4}}).status_code in (200, 201)
    for line in block.group(1).strip().splitlines():
        args = re.sub(r"node-[0-9](,node-[0-9])*", node, line).split()[1:]
        done = cli(*args)
        assert done.returncode == 0, (line, done.stderr)
    listed = json.loads(cli("reservation", "list", "--json").stdout)["reservations"]
    assert [r["name"] for r in listed] == ["holidays", "paper-deadline"]  # fw-upgrade was deleted by the last line
    assert listed[0]["nodes"] == [node]
    assert (listed[1]["queue"], listed[1]["state"]) == ("team-a", "upcoming")
    for name in ("holidays", "paper-deadline"):
        assert cli("reservation", "delete", name).returncode == 0
