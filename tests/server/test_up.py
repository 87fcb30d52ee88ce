"""`gpufleet up` for real: a child process on loopback with an emulated inventory, running real jobs.

What the jobs saw (their environment, when they started and ended) comes from a ledger they append to."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.live import Live, alive, start

pytestmark = pytest.mark.slow


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    plane = start(tmp_path, "--stop-jobs")
    try:
        yield plane
    finally:
        plane.server.stop()


def test_jobs_get_their_own_gpus_a_free_master_port_and_ranks(live: Live) -> None:
    busy = socket.socket()
    try:
        busy.bind(("127.0.0.1", 29500))  # the default port every script hard-codes is taken
        busy.listen()
    except OSError:  # another program on this machine holds it already: the same situation
        pass
    try:
        with live.http() as client:
            gang = live.submit(client, "sleep", "0.5", name="gang", gpus=2, workers=2)
            single = live.submit(client, "sleep", "0.5", name="single", gpus=3)
            half = live.submit(client, "sleep", "0.5", name="half", gpus=0.5, gpu_memory="20GiB")
            for job in (gang, single, half):
                live.wait_state(client, job, "succeeded")
    finally:
        busy.close()
    starts = {(e["job"], e["rank"]): e["env"] for e in live.events("start")}
    gang_envs = [starts[(gang, 0)], starts[(gang, 1)]]
    assert [env["RANK"] for env in gang_envs] == ["0", "1"]
    assert {env["WORLD_SIZE"] for env in gang_envs} == {"2"}
    assert len({env["MASTER_PORT"] for env in gang_envs}) == 1
    ports = {starts[(gang, 0)]["MASTER_PORT"], starts[(single, 0)]["MASTER_PORT"], starts[(half, 0)]["MASTER_PORT"]}
    assert len(ports) == 3
    assert "29500" not in ports
    gpu_sets = [set(env["CUDA_VISIBLE_DEVICES"].split(",")) for env in (*gang_envs, starts[(single, 0)])]
    assert [len(g) for g in gpu_sets] == [2, 2, 3]
    assert sum(len(g) for g in gpu_sets) == len(set().union(*gpu_sets)), "a GPU was given to two workers"
    assert all(g.startswith("GPU-") for g in set().union(*gpu_sets))
    assert starts[(half, 0)]["GPUFLEET_GPU_FRACTION"] == "0.5"
    assert starts[(half, 0)]["GPUFLEET_GPU_MEMORY_BYTES"] == str(20 * 1024**3)
    assert starts[(gang, 0)]["GPUFLEET_EMULATED"] == "1"


def test_a_spec_that_sets_what_the_allocator_owns_is_refused_with_the_reason(live: Live) -> None:
    with live.http() as client:
        response = client.post(
            "/v1/jobs", json={"command": ["true"], "env": {"CUDA_VISIBLE_DEVICES": "0", "MASTER_PORT": "29500"}}
        )
        assert response.status_code == 422
        body = response.json()
        problems = " ".join(f["problem"] + f["fix"] for f in body["fields"] if f["field"] == "env")
        assert "CUDA_VISIBLE_DEVICES" in problems
        assert "MASTER_PORT" in problems
        assert client.get("/v1/jobs").json()["jobs"] == []


def test_exit_codes_logs_and_cancel_with_the_checkpoint_signal(live: Live) -> None:
    with live.http() as client:
        failing = live.submit(client, "exit", "3", name="fails")
        job = live.wait_state(client, failing, "failed")
        assert job["exit_code"] == 3
        logs = client.get(f"/v1/jobs/{failing}/logs").json()
        assert f"hello from rank 0 of job {failing}" in logs["text"]  # its own output, kept per job

        polite = live.submit(client, "wait-file", "/nonexistent", name="polite", grace_period="5s")
        stubborn = live.submit(client, "ignore-term", name="stubborn", grace_period="0.5s")
        live.wait_events("start", polite)
        live.wait_events("start", stubborn)
        for job_id in (polite, stubborn):
            assert client.post(f"/v1/jobs/{job_id}/cancel").status_code in (200, 202)
        assert live.wait_state(client, polite, "cancelled")["state"] == "cancelled"
        assert live.wait_state(client, stubborn, "cancelled")["state"] == "cancelled"
    assert [e["how"] for e in live.events("end", polite)] == ["signal"]  # it saw SIGTERM and could checkpoint
    assert live.events("end", stubborn) == []  # SIGTERM ignored: killed after its grace period
    assert not alive(live.events("start", stubborn)[0]["pid"])


def test_a_higher_priority_job_preempts_and_the_victim_goes_back_to_its_queue(live: Live) -> None:
    with live.http() as client:
        low = live.submit(client, "wait-file", str(live.root / "never"), name="low", gpus=8, priority=0)
        live.wait_events("start", low)
        high = live.submit(client, "sleep", "0.3", name="high", gpus=8, priority=10)
        live.wait_state(client, high, "succeeded")
        live.wait_events("start", low, count=2)  # back in its queue, then started again once high finished
        record = live.job(client, low)
        assert record["preemptions"] == 1
        assert record["attempt"] == 2
        events = client.get(f"/v1/jobs/{low}/events").json()
        assert any("preempted for " + high in e["reason"] for e in events["events"]), events


def test_a_restart_adopts_jobs_that_kept_running(tmp_path: Path) -> None:
    live = start(tmp_path)  # --keep-jobs: jobs outlive the control plane
    gate = live.shared / "go"  # where the job (its queue's own user) can see it
    try:
        with live.http() as client:
            job = live.submit(client, "wait-file", str(gate), name="long", gpus=4)
            live.wait_state(client, job, "running")
        pid = live.wait_events("start", job)[0]["pid"]
        assert live.server.stop() == 0
        assert alive(pid)
        live.restart("--stop-jobs")
        with live.http() as client:
            assert live.job(client, job)["state"] == "running"
            gate.touch()
            record = live.wait_state(client, job, "succeeded")
        assert record["attempt"] == 1
        assert len(live.events("start", job)) == 1
    finally:
        gate.touch()
        live.server.stop()


def test_a_second_control_plane_on_the_same_data_dir_is_refused(live: Live) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet", "up", "--data-dir", str(live.root / "data"), "--emulate", "1xT4"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "another gpufleet control plane is running" in result.stderr
    assert "Traceback" not in result.stderr


def test_without_gpus_or_emulation_up_refuses_with_a_fix(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet", "up", "--data-dir", str(tmp_path), "--port", "1"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path)},
    )
    assert result.returncode == 2
    assert "--emulate" in result.stderr
    assert "Traceback" not in result.stderr


def test_stop_jobs_on_exit_stops_them_with_their_signal_and_puts_them_back_in_their_queue(tmp_path: Path) -> None:
    live = start(tmp_path, "--stop-jobs")
    try:
        with live.http() as client:
            job = live.submit(client, "wait-file", str(tmp_path / "never"), name="long", gpus=1, grace_period="5s")
            live.wait_state(client, job, "running")
        pid = live.wait_events("start", job)[0]["pid"]
        assert live.server.stop() == 0
        assert [e["how"] for e in live.events("end", job)] == ["signal"]
        assert not alive(pid)
        live.restart("--stop-jobs")
        with live.http() as client:
            events = client.get(f"/v1/jobs/{job}/events").json()["events"]
            assert events[3]["target"] == "evicting"
            assert "stopped with --stop-jobs" in events[3]["reason"]
            assert events[4]["target"] == "pending"
            live.wait_events("start", job, count=2)  # and it runs again after the restart
    finally:
        live.server.stop()


def test_a_port_in_use_or_a_bad_host_is_refused_in_words(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        for args, words in (
            (["--port", str(port)], "Address already in use; to fix: pick a free port"),
            (["--host", "no-such-host.invalid"], "cannot listen on 'no-such-host.invalid'"),
        ):
            result = subprocess.run(
                [sys.executable, "-m", "gpufleet", "up", "--data-dir", str(tmp_path), "--emulate", "1xT4", *args],
                check=False,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert result.returncode == 2, result.stderr
            assert words in result.stderr
            assert "Traceback" not in result.stderr
    finally:
        taken.close()
