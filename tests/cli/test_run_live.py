"""`run`, `submit -`, `--set`, exit codes, `logs --tail`/`-f`, `show`'s times, piped `jobs` and `--format`, the
admission check at submit and `top` off a terminal: each through the CLI as a child process against a real
`gpufleet up` running real jobs with the local executor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.cli.conftest import Cli

pytestmark = pytest.mark.slow

HERE = ("--workdir", "-")  # the job's own folder: the test's folders are not its queue user's to enter


def test_run_writes_the_output_and_exits_with_the_jobs_code(cli: Cli) -> None:
    done = cli("run", *HERE, "--name", "three", "--", "sh", "-c", "echo to-out; echo to-err >&2; exit 3")
    assert done.returncode == 3, done.stderr
    assert "to-out" in done.stdout
    assert "to-err" in done.stdout  # worker 0's log holds both streams
    assert "submitted j-" in done.stderr
    assert "failed (exit code 3)" in done.stderr
    ok = cli("run", *HERE, "--", "sh", "-c", "echo fine")
    assert (ok.returncode, ok.stdout) == (0, "fine\n")


def test_a_job_killed_by_a_signal_exits_128_plus_the_signal(cli: Cli) -> None:
    done = cli("run", *HERE, "--", "sh", "-c", "kill -TERM $$")
    assert done.returncode == 143, (done.stdout, done.stderr)
    done = cli("run", *HERE, "--", "sh", "-c", "kill -KILL $$")
    assert done.returncode == 137, (done.stdout, done.stderr)


def test_options_after_the_command_are_the_commands(cli: Cli) -> None:
    done = cli("run", *HERE, "--gpus", "1", "sh", "-c", 'echo "$0 $1"', "--gpus", "x")
    assert (done.returncode, done.stdout) == (0, "--gpus x\n"), done.stderr


def test_run_no_wait_prints_the_id_and_logs_follow_exits_with_the_code(cli: Cli) -> None:
    done = cli("run", "--no-wait", *HERE, "--", "sh", "-c", "sleep 1; seq 1 5; exit 4")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert job_id.startswith("j-")
    follow = cli("logs", "-f", job_id)
    assert follow.returncode == 4, follow.stderr
    assert follow.stdout == "1\n2\n3\n4\n5\n"
    tail = cli("logs", job_id, "--tail", "2")
    assert (tail.returncode, tail.stdout) == (0, "4\n5\n")
    assert cli("logs", job_id, "--tail", "0").stdout == ""
    assert cli("logs", job_id, "--tail", "50").stdout == "1\n2\n3\n4\n5\n"
    shown = cli("show", job_id).stdout
    times = next(line for line in shown.splitlines() if line.startswith("times: "))
    for part in ("submitted ", "waited ", "started ", "ended ", "elapsed "):
        assert part in times, times
    assert "exit code: 4" in shown


def test_submit_reads_a_spec_from_stdin_and_waits_for_its_code(cli: Cli) -> None:
    spec = "name: from-stdin\ncommand: [sh, -c, 'exit 5']\n"
    done = cli("submit", "-", "--wait", *HERE, stdin=spec)
    assert done.returncode == 5, done.stderr
    assert "failed (exit code 5)" in done.stdout
    good = cli("submit", "-", "--wait", *HERE, "--set", "command=[sh, -c, 'exit 0']", stdin=spec)
    assert good.returncode == 0, good.stderr


def test_set_reaches_every_field_and_is_checked_as_the_server_checks(cli: Cli) -> None:
    spec = "command: [sh, -c, 'exit 0']\n"
    done = cli(
        "submit", "-", "--json", *HERE, "--set", "env.SEED=7", "--set", "priority=3", "--set", "preemptible=false",
        "--set", "max_runtime=1h", "--env", "MODE=fast", "--name", "flags", stdin=spec,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    assert job["run"]["env"] == {"SEED": "7", "MODE": "fast"}
    assert (job["priority"], job["preemptible"], job["name"]) == (3, False, "flags")
    assert job["run"]["max_runtime"] == 3600
    bad = cli("submit", "-", "--set", "gpus=1.5", "--set", "colour=red", stdin=spec)
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: invalid job spec")
    assert "gpus: is 1.5" in bad.stderr
    assert "colour: is not a known field" in bad.stderr
    assert "not KEY=VALUE" in cli("submit", "-", "--set", "gpus", stdin=spec).stderr
    assert "run a command with `gpufleet run" in cli("submit", "-", "extra", stdin=spec).stderr


def test_a_job_no_node_can_hold_is_refused_at_submit_with_the_reason(cli: Cli) -> None:
    too_big = cli("run", *HERE, "--gpus", "16", "--", "true")
    assert too_big.returncode == 2
    assert "gpus: cannot run on this fleet: needs 16 GPUs (any model) on one node; the largest node has 8" in (
        too_big.stderr
    )
    assert "to fix:" in too_big.stderr
    model = cli("run", *HERE, "--gpus", "1", "--gpu-models", "H100", "--", "true")
    assert model.returncode == 2
    assert "gpu_models: cannot run on this fleet: no node has GPU model H100 (the cluster has: A100-80GB)" in (
        model.stderr
    )
    cpus = cli("run", *HERE, "--cpu", "100000", "--", "true")
    assert (cpus.returncode, "cpu: cannot run on this fleet" in cpus.stderr) == (2, True), cpus.stderr
    memory = cli("run", *HERE, "--memory", "100TiB", "--", "true")
    assert (memory.returncode, "memory: cannot run on this fleet" in memory.stderr) == (2, True), memory.stderr
    listed = json.loads(cli("jobs", "--all", "--json").stdout)
    assert all(job["request"]["gpus"] != 16 for job in listed)


def test_a_job_above_its_queues_quota_is_accepted_with_a_warning(cli: Cli) -> None:
    assert cli("quota", "set", "small", "--gpu", "2").returncode == 0
    done = cli("run", "--no-wait", *HERE, "--queue", "small", "--gpus", "4", "--", "true")
    assert done.returncode == 0, done.stderr
    assert "warning: queue 'small''s quota can never admit this job as it stands" in done.stderr, done.stderr
    job_id = done.stdout.strip()
    shown = cli("show", job_id, "--json")
    assert json.loads(shown.stdout)["state"] == "pending", shown
    cancelled = cli("cancel", job_id)
    assert cancelled.returncode == 0, cancelled
    fits = cli("run", "--no-wait", *HERE, "--queue", "small", "--gpus", "2", "--", "true")
    assert (fits.returncode, "warning" in fits.stderr) == (0, False), fits


def test_piped_jobs_are_never_cut_short_and_take_columns(cli: Cli) -> None:
    queue = "a-team-with-a-rather-long-queue-name-" + "x" * 20
    assert cli("quota", "set", queue).returncode == 0
    job_id = cli("run", "--no-wait", *HERE, "--queue", queue, "--name", "n" * 60, "--", "sleep", "30").stdout.strip()
    table = cli("jobs", "--all", "--queue", queue).stdout  # COLUMNS=80, and a pipe
    row = next(line for line in table.splitlines() if job_id in line)
    assert queue in row
    assert "n" * 60 in row
    assert "…" not in table
    picked = cli("jobs", "--all", "--queue", queue, "--format", "id,queue,gpus", "--no-header").stdout
    assert picked.split() == [job_id, queue, "0"]
    wrong = cli("jobs", "--format", "id,colour")
    assert wrong.returncode == 2
    assert "unknown column 'colour'" in wrong.stderr
    cli("cancel", job_id)


def test_top_off_a_terminal_prints_one_snapshot_and_exits(cli: Cli) -> None:
    done = cli("top")
    assert done.returncode == 0, done.stderr
    assert "gpufleet top" in done.stdout
    assert "QUEUE" in done.stdout


def test_run_follows_each_attempt_of_a_retried_job(cli: Cli) -> None:
    command = 'echo "attempt $GPUFLEET_ATTEMPT"; [ "$GPUFLEET_ATTEMPT" = 2 ] || exit 9'
    done = cli("run", *HERE, "--retries", "1", "--", "sh", "-c", command)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "attempt 1\nattempt 2\n"
    assert "note: attempt 2 of j-" in done.stderr


def test_interrupting_run_cancels_the_job_and_exits_130(cli: Cli) -> None:
    full = {**os.environ, "GPUFLEET_URL": cli.live.url, "GPUFLEET_TOKEN": cli.live.server.token}
    waiting = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "run", *HERE, "--", "sh", "-c", "echo started; sleep 600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full,
    )
    assert waiting.stdout is not None
    assert waiting.stdout.readline() == "started\n"  # the job runs, and its output came through
    waiting.send_signal(signal.SIGINT)
    _, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 130, err
    job_id = err.split("submitted ", 1)[1].split()[0]
    with cli.live.http() as client:
        job = cli.live.wait_state(client, job_id, "cancelled", timeout_s=60)
    assert job["state"] == "cancelled"
