"""A stop without grace (a forced cancel) kills at once with real processes: a fresh stop sends SIGKILL, not
the checkpoint signal, and a job already stopping with a long grace is killed now rather than when its
grace runs out."""

from __future__ import annotations

import time

from gpufleet.ports import ObservationKind
from tests.local.conftest import Harness, ended, has, only, wait_for, wait_until

K = ObservationKind


def test_a_stop_without_grace_kills_at_once_without_the_checkpoint_signal(harness: Harness) -> None:
    backend = harness.backend()
    saved = harness.root / "ckpt"
    launch = harness.launch("now", harness.run("checkpoint", str(saved), checkpoint_signal="SIGUSR1"))
    backend.launch(launch)
    wait_for(backend, has("now", K.STARTED))
    wait_until(lambda: saved.with_name("ckpt.ready").exists(), what="the program's handler")
    backend.stop("now", 1, grace_s=0.0, reason="force-cancelled")
    seen = wait_for(backend, ended("now"))
    assert only(seen, "now", K.STOPPED).detail == "force-cancelled"
    assert not saved.exists()  # it never got the checkpoint signal
    exit_record = harness.worker_file(launch, 0, "exit.json")
    assert exit_record is not None
    assert exit_record["code"] == 137


def test_a_job_stopping_with_an_hour_of_grace_is_killed_now_when_forced(harness: Harness) -> None:
    backend = harness.backend()
    ready = harness.root / "ready"
    launch = harness.launch("stubborn", harness.run("ignore-term", str(ready)))
    backend.launch(launch)
    wait_for(backend, has("stubborn", K.STARTED))
    wait_until(ready.exists, what="the program to ignore SIGTERM")
    backend.stop("stubborn", 1, grace_s=3600.0, reason="cancelled")
    time.sleep(0.3)
    assert not backend.poll()  # it ignores SIGTERM: still running, an hour to go
    asked = time.monotonic()
    backend.stop("stubborn", 1, grace_s=0.0, reason="force-cancelled")
    seen = wait_for(backend, ended("stubborn"))
    assert time.monotonic() - asked < 3.0
    assert only(seen, "stubborn", K.STOPPED).detail == "force-cancelled"
    exit_record = harness.worker_file(launch, 0, "exit.json")
    assert exit_record is not None
    assert exit_record["code"] == 137
