"""After a restart of the control plane: a new LocalBackend on the same state folder adopts what runs.

A "restart" here drops the backend object and makes a new one on the same state folder, as a new control
plane process would; the workers are real processes that went on running meanwhile.
"""

from __future__ import annotations

import os
import signal

from gpufleet.ports import ObservationKind
from tests.local.conftest import Harness, ended, has, only, pid_alive, wait_for, wait_until

K = ObservationKind


def test_a_running_job_is_adopted_and_its_end_observed(harness: Harness) -> None:
    gate = harness.root / "go"
    launch = harness.launch("long", harness.run("wait", str(gate), "5"))
    first = harness.backend()
    first.launch(launch)
    wait_for(first, has("long", K.STARTED))
    port = next(iter(first.ports.held))
    del first
    second = harness.backend()
    second.adopt([launch])
    assert second.ports.held == {port: "long#1"}  # the running job keeps its MASTER_PORT
    seen = wait_for(second, has("long", K.STARTED))
    assert not ended("long")(seen)
    gate.touch()
    seen = wait_for(second, ended("long"), seen=seen)
    exited = only(seen, "long", K.EXITED)
    assert exited.exit_code == 5
    assert second.ports.held == {}
    second.launch(launch)  # idempotent after adoption too: nothing starts again
    assert second.poll() == []


def test_a_job_that_ended_while_down_reports_its_exit(harness: Harness) -> None:
    gate = harness.root / "go"
    launch = harness.launch("short", harness.run("wait", str(gate), "3"), gpus=((0,), (1,)))
    first = harness.backend()
    first.launch(launch)
    wait_for(first, has("short", K.STARTED))
    del first
    gate.touch()
    wait_until(lambda: all(harness.worker_file(launch, r, "exit.json") for r in (0, 1)), what="both exits")
    second = harness.backend()
    second.adopt([launch])
    seen = wait_for(second, ended("short"))
    exited = only(seen, "short", K.EXITED)
    assert exited.exit_code == 3
    # The first worker to fail is the one named.
    ends = {r: harness.worker_file(launch, r, "exit.json")["ended_at"] for r in (0, 1)}  # type: ignore[index]
    assert exited.detail == f"worker {min(ends, key=ends.__getitem__)} exited 3"


def test_a_dead_shim_and_child_make_the_job_lost(harness: Harness) -> None:
    launch = harness.launch("gone", harness.run("ignore-term", str(harness.root / "ready")))
    first = harness.backend()
    first.launch(launch)
    wait_for(first, has("gone", K.STARTED))
    shim, child = harness.shim_pid(launch), harness.child_pid(launch)
    del first
    os.kill(shim, signal.SIGKILL)
    os.killpg(child, signal.SIGKILL)
    wait_until(lambda: not pid_alive(shim) and not pid_alive(child), what="both to die")
    second = harness.backend()
    second.adopt([launch])
    seen = wait_for(second, ended("gone"))
    assert only(seen, "gone", K.LOST).detail == "worker died while the control plane was down"
    assert second.ports.held == {}


def test_a_launch_never_made_is_made_at_adoption(harness: Harness) -> None:
    # The store wrote the launch; the control plane died before the executor heard of it: it starts now.
    launch = harness.launch("ghost", harness.run("exit", "0"))
    backend = harness.backend()
    backend.adopt([launch])
    seen = wait_for(backend, ended("ghost"))
    assert [o.kind for o in seen] == [K.STARTED, K.EXITED]
    assert only(seen, "ghost", K.EXITED).exit_code == 0


def test_workers_not_in_live_are_killed(harness: Harness) -> None:
    keep = harness.launch("keep", harness.run("wait", str(harness.root / "never"), "0"))
    orphan = harness.launch("orphan", harness.run("ignore-term", str(harness.root / "ready")), gpus=((0,), (1,)))
    old_attempt = harness.launch("keep", harness.run("ignore-term", str(harness.root / "ready2")), attempt=1)
    first = harness.backend()
    first.launch(orphan)
    first.launch(old_attempt)
    wait_for(first, lambda seen: has("orphan", K.STARTED)(seen) and has("keep", K.STARTED)(seen))
    keep_retry = harness.launch("keep", keep.job.run, attempt=2)
    first.launch(keep_retry)
    wait_for(first, lambda seen: any(o.job_id == "keep" and o.attempt == 2 for o in seen))
    victims = [harness.child_pid(orphan, 0), harness.child_pid(orphan, 1), harness.child_pid(old_attempt)]
    kept = harness.child_pid(keep_retry)
    del first
    second = harness.backend()
    # The store says only attempt 2 of "keep" holds resources: attempt 1 and "orphan" must not run.
    second.adopt([keep_retry])
    wait_until(lambda: not any(pid_alive(pid) for pid in victims), what="the orphans to be killed")
    assert pid_alive(kept)
    assert {o.job_id for o in second.poll()} == {"keep"}  # only what it adopted is reported
    # Should a later start be told it runs after all, it is reported lost, not stopped or exited.
    third = harness.backend()
    third.adopt([orphan, keep_retry])
    seen = wait_for(third, ended("orphan"))
    assert "killed at a restart" in only(seen, "orphan", K.LOST).detail


def test_a_stop_asked_before_the_restart_still_holds(harness: Harness) -> None:
    ready = harness.root / "ready"
    launch = harness.launch("evicting", harness.run("ignore-term", str(ready)))
    first = harness.backend()
    first.launch(launch)
    wait_for(first, has("evicting", K.STARTED))
    wait_until(ready.exists, what="the program to ignore SIGTERM")
    first.stop("evicting", 1, grace_s=0.3, reason="preempted for vip")
    del first
    second = harness.backend()
    second.adopt([launch])
    # The new backend kills it once the grace that began before the restart is over, and reports STOPPED.
    seen = wait_for(second, ended("evicting"))
    assert only(seen, "evicting", K.STOPPED).detail == "preempted for vip"


def test_shutdown_leaving_jobs_running_lets_the_next_start_adopt_them(harness: Harness) -> None:
    gate = harness.root / "go"
    launch = harness.launch("stay", harness.run("wait", str(gate), "0"))
    first = harness.backend()
    first.launch(launch)
    wait_for(first, has("stay", K.STARTED))
    child = harness.child_pid(launch)
    first.shutdown(stop_jobs=False, grace_s=0.0)
    assert pid_alive(child)
    second = harness.backend()
    second.adopt([launch])
    gate.touch()
    seen = wait_for(second, ended("stay"))
    assert only(seen, "stay", K.EXITED).exit_code == 0


def test_a_gang_failing_across_a_restart_still_reports_the_failure(harness: Harness) -> None:
    launch = harness.launch("gang", harness.run("fail-rank", "0", "9"), gpus=((0,), (1,)))
    first = harness.backend()
    first.launch(launch)
    # The first backend sees the failure and starts stopping the other member, then goes away.
    wait_until(lambda: harness.worker_file(launch, 0, "exit.json") is not None, what="rank 0 to fail")
    wait_for(first, lambda seen: (harness.root / "state/run/gang/attempt-1/stop.json").exists())
    del first
    second = harness.backend()
    second.adopt([launch])
    seen = wait_for(second, ended("gang"))
    exited = only(seen, "gang", K.EXITED)
    assert (exited.exit_code, exited.detail) == (9, "worker 0 exited 9")
