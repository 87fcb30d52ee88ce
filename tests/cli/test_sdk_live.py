"""`gpufleet.Client`, the Python SDK, against a real `gpufleet up` running real jobs with the local executor:
submit, run, wait, logs, cancel, hold, release, update, arrays and dependencies, and its errors."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpufleet import Client
from gpufleet.client import ApiError, Job, JobTimeoutError
from gpufleet.client.transport import Target
from gpufleet.domain.errors import GpufleetError, SpecError
from tests.cli.conftest import Cli

pytestmark = pytest.mark.slow


def _client(cli: Cli) -> Client:
    return Client(cli.live.url, cli.live.server.token, timeout=10.0)


def test_run_passes_the_output_on_and_returns_the_ended_job(cli: Cli) -> None:
    heard: list[str] = []
    with _client(cli) as fleet:
        job = fleet.run("echo hello; echo there >&2; exit 3", name="sdk-run", output=heard.append, timeout=60)
        assert isinstance(job, Job)
        assert (job.state, job.exit_code, job.exit_status, job.name) == ("failed", 3, 3, "sdk-run")
        assert "".join(heard) == "hello\nthere\n"
        assert job.started_at is not None
        assert job.finished_at is not None
        assert job.finished_at >= job.started_at
        ok = fleet.run(["sh", "-c", "echo fine"], timeout=60)
        assert (ok.state, ok.exit_status) == ("succeeded", 0)
        assert fleet.logs(ok.id) == "fine\n"


def test_a_spec_the_server_refuses_names_the_field_and_makes_no_job(cli: Cli) -> None:
    with _client(cli) as fleet:
        before = len(fleet.jobs(limit=1000))
        with pytest.raises(SpecError) as refused:
            fleet.submit(command="true", gpus=-1)
        assert any(problem.field == "gpus" for problem in refused.value.fields)
        with pytest.raises(SpecError) as unknown:
            fleet.submit({"command": "true", "gpu": 1})
        assert "gpu" in str(unknown.value)
        with pytest.raises(SpecError) as too_big:  # the admission check: no node has 64 GPUs
            fleet.submit(command="true", gpus=64)
        assert "cannot run on this fleet" in str(too_big.value)
        assert len(fleet.jobs(limit=1000)) == before


def test_wait_gives_up_with_the_job_as_it_stood_and_cancel_stops_it(cli: Cli) -> None:
    with _client(cli) as fleet:
        job = fleet.submit(command="sleep 60", name="sdk-slow")
        with pytest.raises(JobTimeoutError) as late:
            fleet.wait(job.id, timeout=0.5, poll_s=0.1)
        assert late.value.job.id == job.id
        assert not late.value.job.ended
        _until(fleet, job.id, "running")
        done = fleet.cancel(job.id)
        assert (done.verb, done.matched, done.requested) == ("cancel", 1, True)
        ended = fleet.wait(job.id, timeout=60)
        assert ended.state == "cancelled"
        assert ended.exit_status == 143, ended.raw  # SIGTERM, as a shell says it


def test_hold_update_and_release_a_pending_job(cli: Cli) -> None:
    with _client(cli) as fleet:
        blocker = fleet.submit(command="sleep 30", gpus=8, name="sdk-blocker")  # the whole node
        _until(fleet, blocker.id, "running")
        job = fleet.submit(command="echo held-then-ran", gpus=8, name="sdk-held")
        held = fleet.hold(job.id)
        assert held.matched == 1
        assert _until(fleet, job.id, "held").state == "held"
        updated = fleet.update(job.id, priority=7, gpus=4)
        assert updated.id == job.id
        fleet.cancel(blocker.id)
        time.sleep(1.0)
        assert fleet.job(job.id).state == "held"  # the node is free, yet a held job waits
        assert fleet.release(job.id).matched == 1
        ended = fleet.wait(job.id, timeout=60)
        assert ended.state == "succeeded", ended.reason
        assert ended.raw["priority"] == 7
        assert ended.raw["request"]["gpus"] == 4
        assert fleet.logs(ended.id) == "held-then-ran\n"


def test_an_array_after_its_parent_runs_every_task_once_the_parent_succeeded(cli: Cli) -> None:
    with _client(cli) as fleet:
        parent = fleet.submit(command="sleep 1; echo parent", name="sdk-parent")
        sweep = fleet.submit(
            command='echo "task $GPUFLEET_ARRAY_TASK_ID of $GPUFLEET_ARRAY_JOB_ID"',
            name="sdk-sweep",
            array="0-5%2",
            depends_on=f"afterok:{parent.id}",
            gpus=0.5,
        )
        assert sweep.array_id
        assert sweep.array_tasks == 6
        assert sweep.depends_on == (f"afterok:{parent.id}",)
        last = fleet.wait(sweep.array_id, timeout=120)
        assert last.array_id == sweep.array_id
        status = fleet.array(sweep.array_id)
        assert (status.tasks, dict(status.states), status.exit_status) == (6, {"succeeded": 6}, 0)
        tasks = fleet.jobs(array=sweep.array_id)
        assert sorted(t.array_task for t in tasks if t.array_task is not None) == list(range(6))
        parent_end = fleet.job(parent.id).finished_at
        assert parent_end is not None
        assert all(t.started_at is not None and t.started_at >= parent_end for t in tasks)
        for task in tasks:
            assert fleet.logs(task.id) == f"task {task.array_task} of {sweep.array_id}\n"


def test_a_dependency_that_can_never_be_met_ends_the_job_with_the_reason(cli: Cli) -> None:
    with _client(cli) as fleet:
        ok = fleet.run("true", timeout=60)
        never = fleet.submit(command="echo never", depends_on=f"afternotok:{ok.id}")
        ended = fleet.wait(never.id, timeout=60)
        assert ended.state == "cancelled"
        assert ended.raw["waiting_code"] == "DependencyNeverSatisfied", ended.raw
        assert ended.started_at is None


def test_logs_tail_lines_and_follow(cli: Cli) -> None:
    with _client(cli) as fleet:
        job = fleet.submit(command="for i in 1 2 3 4 5; do echo $i; sleep 0.2; done")
        assert "".join(fleet.follow(job.id)) == "1\n2\n3\n4\n5\n"
        assert fleet.logs(job.id, tail_lines=2) == "4\n5\n"


def test_the_client_finds_the_control_plane_in_the_environment(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_URL", cli.live.url)
    monkeypatch.setenv("GPUFLEET_TOKEN", cli.live.server.token)
    with Client() as fleet:
        assert fleet.target == Target(cli.live.url, cli.live.server.token)
        assert isinstance(fleet.jobs(limit=1), list)
    monkeypatch.delenv("GPUFLEET_TOKEN")
    monkeypatch.setenv("GPUFLEET_CLIENT_CONFIG", str(cli.live.root / "no-such-client.toml"))
    with Client() as anonymous, pytest.raises(ApiError) as refused:
        anonymous.jobs()
    assert refused.value.status == 401
    assert "GPUFLEET_TOKEN" in str(refused.value)


def test_an_unreachable_control_plane_is_an_error_with_its_fix() -> None:
    with Client("http://127.0.0.1:9", "t", timeout=2.0) as fleet, pytest.raises(GpufleetError) as failed:
        fleet.submit(command="true", retry_for=0)
    assert "cannot reach the control plane" in str(failed.value)
    assert "gpufleet up" in failed.value.fix


def test_importing_gpufleet_does_not_load_the_sdk() -> None:
    """Every job's shim imports the package: the SDK (and httpx) load only when `gpufleet.Client` is used."""
    code = "import sys, gpufleet; assert 'httpx' not in sys.modules; gpufleet.Client; assert 'httpx' in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def _until(fleet: Client, job_id: str, state: str, timeout_s: float = 60.0) -> Job:
    deadline = time.monotonic() + timeout_s
    while True:
        job = fleet.job(job_id)
        if job.state == state:
            return job
        assert not job.ended, f"{job_id} ended {job.state}, not {state}: {job.reason}"
        assert time.monotonic() < deadline, f"{job_id} is still {job.state}, not {state}"
        time.sleep(0.1)


def test_logs_since_gives_what_was_written_from_then_on(cli: Cli) -> None:
    with _client(cli) as fleet:
        job = fleet.submit(command="echo early; sleep 3; echo late; sleep 1; echo last")
        fleet.wait(job.id, timeout=60)
        started = fleet.job(job.id).started_at
        assert started is not None
        assert fleet.logs(job.id) == "early\nlate\nlast\n"
        # Between "early" (at the start) and "late" (3 s after): to within a second before, only what came after.
        assert fleet.logs(job.id, since=started + 1.6) == "late\nlast\n"
        assert fleet.logs(job.id, since=started - 60) == "early\nlate\nlast\n"
        assert fleet.logs(job.id, since=started + 60) == ""
    done = cli("logs", job.id, "--since", str(started + 1.6))
    assert (done.returncode, done.stdout) == (0, "late\nlast\n"), done.stderr
    assert cli("logs", job.id, "--since", "1d").stdout == "early\nlate\nlast\n"
    both = cli("logs", job.id, "--since", "1d", "--tail", "1")
    assert both.returncode == 2
    assert "give one of them" in both.stderr
    bad = cli("logs", job.id, "--since", "yesterday")
    assert bad.returncode == 2
    assert "90s, 10m, 2h or 1d" in bad.stderr


def test_run_gives_up_after_its_timeout_and_the_job_goes_on(cli: Cli) -> None:
    with _client(cli) as fleet:
        heard: list[str] = []
        with pytest.raises(JobTimeoutError) as late:
            fleet.run("echo started; sleep 30", output=heard.append, timeout=2.0, name="sdk-late")
        assert "after 2 s" in str(late.value)
        job = late.value.job
        assert job.state in ("running", "launching", "admitted", "pending")
        assert fleet.cancel(job.id).matched == 1
        assert fleet.wait(job.id, timeout=60).state == "cancelled"
