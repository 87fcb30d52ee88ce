"""Job logs: capped per worker (the newest part kept, and said so in the log), retention of finished jobs'
logs by age and total size, and a full disk that loses neither the log's account nor the worker's exit.
Real processes; the full disk is a real tmpfs of 1 MiB."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.adapters.local.isolation import Isolation
from gpufleet.adapters.local.layout import Layout
from gpufleet.adapters.local.logs import LogRetention, prune_logs
from gpufleet.ports import ObservationKind
from tests.kit.small_disk import fill_up, small_disk
from tests.local.conftest import Harness, ended, has, only, wait_for

K = ObservationKind
KiB = 1024


def test_a_log_past_its_cap_keeps_its_newest_part_and_says_so(harness: Harness) -> None:
    backend = harness.backend(isolation=Isolation.same_user(log_cap=64 * KiB))
    flood = "import sys\nfor n in range(20000): print(f'line {n:06d} ' + 'x' * 60)\nprint('the end')\n"
    backend.launch(harness.launch("chatty", harness.run_code(flood)))
    seen = wait_for(backend, ended("chatty"), timeout=30)
    assert only(seen, "chatty", K.EXITED).exit_code == 0
    text = backend.log_paths("chatty")[0].read_text()
    assert len(text.encode()) <= 64 * KiB
    first, _, rest = text.partition("\n")
    assert first.startswith("[gpufleet: this log is capped at 64 KiB: the first ")
    assert "bytes of output were dropped; the newest output follows]" in first
    assert rest.rstrip().endswith("line 019999 " + "x" * 60 + "\nthe end")
    dropped = int(first.split("the first ")[1].split(" bytes")[0])
    assert dropped + len(rest.encode()) >= 20000 * 73  # everything accounted for: kept or said dropped


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    with small_disk(tmp_path / "tiny", 4) as folder:
        yield folder


FILL_THEN = """
import os, sys, time
for _ in range(128):
    sys.stdout.write("y" * 65535 + "\\n")
sys.stdout.flush()
open(sys.argv[1] + ".written", "w").close()  # all of it went to the shim: more than the disk holds
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
print("after the disk had room again", flush=True)
sys.exit(int(sys.argv[2]))
"""


def test_a_worker_that_ends_on_a_full_disk_still_has_its_exit_recorded(harness: Harness, tiny_disk: Path) -> None:
    backend = harness.backend_at(tiny_disk / "state")  # the executor's state folder is on the tiny disk
    trigger = harness.root / "go"
    backend.launch(harness.launch("full", harness.run("wait", str(trigger), "3")))
    wait_for(backend, has("full", K.STARTED))
    fill_up(tiny_disk)  # as another job's output would
    trigger.touch()
    seen = wait_for(backend, ended("full"))
    assert only(seen, "full", K.EXITED).exit_code == 3  # not "process vanished": the exit was not lost


def test_output_a_full_disk_refused_is_noted_in_the_log_once_there_is_room(harness: Harness, tiny_disk: Path) -> None:
    (tiny_disk / "room").write_bytes(b"r" * (1 << 20))  # given back later
    backend = harness.backend_at(tiny_disk / "state")
    trigger = harness.root / "go"
    backend.launch(harness.launch("lossy", harness.run_code(FILL_THEN, str(trigger), "0")))
    wait_for(backend, has("lossy", K.STARTED))
    deadline = time.monotonic() + 20
    while not Path(f"{trigger}.written").exists():
        assert time.monotonic() < deadline, "the job did not write its output"
        time.sleep(0.02)
    # The job's flush returns once its output is in the pipe; let the shim write (or drop) all of it against the
    # full disk before room comes back, or a loaded machine lets the tail fit into the room given back.
    log = backend.log_paths("lossy")[0]
    settled, last = time.monotonic(), -1
    while time.monotonic() - settled < 0.5:
        assert time.monotonic() < deadline + 20, "the shim did not settle"
        size = log.stat().st_size
        if size != last:
            settled, last = time.monotonic(), size
        time.sleep(0.05)
    (tiny_disk / "room").unlink()
    trigger.touch()
    assert only(wait_for(backend, ended("lossy")), "lossy", K.EXITED).exit_code == 0
    tail = backend.log_paths("lossy")[0].read_bytes()[-200:].decode()
    assert "bytes of output were lost here: the disk was full]\nafter the disk had room again\n" in tail


def test_retention_removes_finished_jobs_logs_by_age_then_by_total_size(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "state")
    now = time.time()
    day = 86_400.0

    def logs(job_id: str, size: int, age_days: float) -> Path:
        path = layout.log_path(job_id, 1, 0)
        path.parent.mkdir(parents=True)
        path.write_bytes(b"x" * size)
        layout.run_dir(job_id).mkdir(parents=True)
        os.utime(path, (now - age_days * day, now - age_days * day))
        return layout.log_dir(job_id)

    old, recent, newest = logs("old", 100, 40), logs("recent", 300, 5), logs("newest", 200, 1)
    running = logs("run", 50, 90)
    finished = {"old", "recent", "newest"}.__contains__
    done = prune_logs(layout, LogRetention(max_age_s=30 * day), finished)
    assert done == {"jobs": 1, "bytes": 100}
    assert not old.exists()
    assert not layout.run_dir("old").exists()  # its run records (environment, exit) go with it
    assert recent.exists()
    assert running.exists()  # a job still active keeps its logs, however old
    # Over the total: the finished jobs written longest ago go first, until the rest fits.
    done = prune_logs(layout, LogRetention(max_age_s=None, max_total=300), finished)
    assert done == {"jobs": 1, "bytes": 300}
    assert (recent.exists(), newest.exists(), running.exists()) == (False, True, True)


def test_retention_removes_run_records_without_logs_of_finished_jobs_by_age(tmp_path: Path) -> None:
    # What a node agent keeps of an attempt given up before it started there: run records, and no log.
    layout = Layout(tmp_path / "state")
    now = time.time()
    day = 86_400.0

    def given_up(job_id: str, age_days: float) -> Path:
        record = layout.attempt_dir(job_id, 1) / "given_up.json"
        record.parent.mkdir(parents=True)
        record.write_text("{}")
        os.utime(record, (now - age_days * day, now - age_days * day))
        return layout.run_dir(job_id)

    old, recent, active = given_up("old", 40), given_up("recent", 5), given_up("active", 40)
    done = prune_logs(layout, LogRetention(max_age_s=30 * day), {"old", "recent"}.__contains__)
    assert done == {"jobs": 1, "bytes": 0}
    assert (old.exists(), recent.exists(), active.exists()) == (False, True, True)


def test_the_backend_never_prunes_a_live_jobs_logs(harness: Harness) -> None:
    backend = harness.backend()
    trigger = harness.root / "go"
    backend.launch(harness.launch("live", harness.run("wait", str(trigger), "0")))
    wait_for(backend, has("live", K.STARTED))
    assert backend.prune_logs(LogRetention(max_age_s=0.0), lambda _job: True) == {"jobs": 0, "bytes": 0}
    assert backend.log_paths("live")
    trigger.touch()
    wait_for(backend, ended("live"))
    time.sleep(0.01)
    assert backend.prune_logs(LogRetention(max_age_s=0.0), lambda _job: True)["jobs"] == 1
    assert backend.log_paths("live") == []
