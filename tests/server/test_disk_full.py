"""The data folder fills up (a job's output filled it): the control plane answers 503 with "disk full at …",
says so once in its log, keeps the exit it saw and writes it once space is back, and never runs the job again,
not even after a kill -9 and a restart. The data folder is a real 16 MiB ext4 file system (loop-mounted); the
job is a real process."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpufleet.bench.api import LocalServer
from tests.kit.jobusers import users_created_here
from tests.kit.small_disk import fill_up
from tests.kit.small_disk import small_disk as small_disk_at
from tests.server.live import Live, start

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB file system for the data folder, 4 MiB of it held by a file the test gives back later."""
    with small_disk_at(tmp_path / "data", 16) as data, users_created_here():
        (data / "room").write_bytes(b"r" * (4 << 20))
        yield data


def grow(data: Path) -> None:
    """Space comes back (an operator deleted something)."""
    (data / "room").unlink()


def full(data: Path) -> bool:
    info = os.statvfs(data)
    return info.f_bavail * info.f_frsize < 64 * 1024


def until(condition, what: str, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def fill_the_disk(live: Live, client: httpx.Client, data: Path) -> tuple[str, Path]:
    """A job fills the data folder with its output and waits; returns it and the file that ends it (exit 3)."""
    trigger = live.program.parent / "end-fill"
    job = live.submit(client, "fill", str(trigger))
    try:
        until(lambda: full(data), "the job's output to fill the disk")
        fill_up(data)  # every last byte: nothing is left for a new file
    except AssertionError as error:  # say why: the job's state and the end of its log
        logs = client.get(f"/v1/jobs/{job}/logs").json().get("text", "")[-2000:]
        raise AssertionError(f"{error}: {live.job(client, job)['reason']}; log: {logs}") from None
    return job, trigger


def refused_with_disk_full(client: httpx.Client, live: Live) -> dict[str, object]:
    for _ in range(20):  # SQLite may still have room in its write-ahead log for a few writes
        response = client.post("/v1/jobs", json={"queue": "default", "command": live.command("exit", "0")})
        if response.status_code == 503:
            body: dict[str, object] = response.json()
            return body
        assert response.status_code == 201, response.text
    raise AssertionError("a full disk never turned into a 503")


def exit_recorded(data: Path, job: str) -> Path:
    return data / "jobs" / "run" / job / "attempt-1" / "worker-0" / "exit.json"


def setup(tmp_path: Path, data: Path) -> Live:
    live = start(tmp_path)  # start() uses tmp_path/data: the small disk
    live.server.stop()
    live.server = LocalServer(data, log_path=tmp_path / "server.log", token=live.server.token)
    return live


def test_a_full_disk_gives_503s_and_one_log_line_and_the_exit_is_written_once_space_is_back(
    tmp_path: Path, small_disk: Path
) -> None:
    live = setup(tmp_path, small_disk)
    try:
        with live.http() as client:
            job, trigger = fill_the_disk(live, client, small_disk)
            body = refused_with_disk_full(client, live)
            assert body["code"] == "disk_full"
            assert f"disk full at {small_disk}" in str(body["message"])
            assert "to fix" in str(body["message"])
            trigger.touch()
            until(lambda: exit_recorded(small_disk, job).exists(), "the shim to record the exit")
            until(lambda: "disk full at" in live.server.output(), "the loop to say the disk is full")
            time.sleep(2.5)  # the loop retries every second meanwhile
            assert live.job(client, job)["state"] == "running"  # seen, not yet written, and not dropped
            grow(small_disk)
            record = live.wait_state(client, job, "failed", "succeeded")
            assert (record["state"], record["exit_code"]) == ("failed", 3)
            again = client.post("/v1/jobs", json={"queue": "default", "command": live.command("exit", "0")})
            assert again.status_code == 201, again.text
            live.wait_state(client, again.json()["id"], "succeeded")
        output = live.server.output()
    finally:
        live.server.stop()
    assert len(live.events("start", job)) == 1
    assert output.count("disk full at") == 1, output  # once, not every second
    assert "Traceback" not in output
    assert "control loop: working again" in output


def test_an_exit_seen_on_a_full_disk_survives_a_kill_9_and_the_job_never_runs_again(
    tmp_path: Path, small_disk: Path
) -> None:
    live = setup(tmp_path, small_disk)
    try:
        with live.http() as client:
            job, trigger = fill_the_disk(live, client, small_disk)
            trigger.touch()
            until(lambda: exit_recorded(small_disk, job).exists(), "the shim to record the exit")
            assert exit_recorded(small_disk, job).stat().st_size > 0
    finally:
        live.server.kill()  # the exit was never written to the store
    grow(small_disk)
    live.server = LocalServer(small_disk, log_path=tmp_path / "server.log", token=live.server.token)
    try:
        with live.http() as client:
            record = live.wait_state(client, job, "failed", "succeeded")
            assert (record["state"], record["exit_code"], record["attempt"]) == ("failed", 3, 1)
            time.sleep(1.0)
            assert live.job(client, job)["state"] == "failed"
    finally:
        live.server.stop()
    assert len(live.events("start", job)) == 1  # ran once: its exit was not lost, so it was not retried
