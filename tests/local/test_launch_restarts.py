"""The control plane dies while it starts an attempt, or after it wrote a stop it never sent, and starts again
on the same SQLite store and state folder: the attempt runs (not lost, not retried), each of its workers'
commands started exactly once, with no folder or process of a worker given up left behind; a stop written
before the death is carried out after it.

Real processes, a real SQLite store and the real control loop. A death is an exception raised from inside the
first control plane at the chosen point (what it wrote to disk and to the store until then stays, its memory
is dropped), its workers running on as after a kill -9; then a new control plane adopts them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.adapters.local import supervisor as supervisor_module
from gpufleet.adapters.local.executor import LocalBackend
from gpufleet.adapters.local.isolation import WorkerSpec
from gpufleet.adapters.local.proc import is_running
from gpufleet.adapters.local.supervisor import WorkerSupervisor
from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.control.reconciler import Reconciler, ReconcilerSettings
from gpufleet.domain import Job, JobState, QueueSpec, WorkerRequest
from gpufleet.domain.jobs import RunSpec
from gpufleet.policies.catalog import profile
from gpufleet.ports import RequestKind
from tests.local.conftest import TIMEOUT_S, Harness, WallClock, wait_until

S = JobState
JOB = "gang"
RANKS = (0, 1)

# Appends its pid to OUT/starts-<rank> (a worker started twice shows two lines) and waits; SIGTERM ends it.
PROGRAM = r"""
import os, sys, time
out = sys.argv[1]
with open(os.path.join(out, "starts-" + os.environ["RANK"]), "a") as f:
    f.write(str(os.getpid()) + "\n")
while True:
    time.sleep(0.05)
"""


class CrashError(Exception):
    """The first control plane dies here (not an error of the code under test)."""


def crash(*_: object, **__: object) -> None:
    raise CrashError


Arm = Callable[[LocalBackend, pytest.MonkeyPatch], None]


def before_the_backend_is_asked(backend: LocalBackend, patch: pytest.MonkeyPatch) -> None:
    """The store says launching; nothing of the attempt is on disk."""
    patch.setattr(backend, "launch", crash)


def after_the_attempt_folder_before_its_record(backend: LocalBackend, patch: pytest.MonkeyPatch) -> None:
    """The attempt's folder exists, its `attempt.json` does not."""

    def begin(job_id: str, attempt: int, info: dict[str, Any]) -> Path:
        backend.workers.attempt_dir(job_id, attempt).mkdir(parents=True)
        raise CrashError

    patch.setattr(backend.workers, "begin_attempt", begin)


def after_the_record_before_any_worker(backend: LocalBackend, patch: pytest.MonkeyPatch) -> None:
    patch.setattr(backend.workers, "start", crash)


def after_a_worker_folder_before_its_spec(backend: LocalBackend, patch: pytest.MonkeyPatch) -> None:
    """Rank 0 runs; rank 1's folder and log exist, its cgroup and spec do not."""
    prepare = backend.workers.isolation.prepare

    def preparing(spec: WorkerSpec, job_dir: Path) -> Any:
        if spec.rank == 1:
            raise CrashError
        return prepare(spec, job_dir)

    patch.setattr(backend.workers.isolation, "prepare", preparing)


def after_a_worker_spec_before_its_spawn(backend: LocalBackend, patch: pytest.MonkeyPatch) -> None:
    """Rank 0 runs; rank 1's folder and spec exist, its shim was never spawned."""
    spawn = os.posix_spawn
    calls = []

    def spawning(*args: Any, **kwargs: Any) -> int:
        calls.append(args)
        if len(calls) == 2:
            raise CrashError
        return spawn(*args, **kwargs)

    patch.setattr(supervisor_module.os, "posix_spawn", spawning)


def after_a_spawn_before_it_is_recorded(backend: LocalBackend, patch: pytest.MonkeyPatch) -> None:
    """Both shims spawned; the control plane died before it wrote rank 1's `shim.pid` (its shim does)."""
    spawn = os.posix_spawn
    calls = []

    def spawning(*args: Any, **kwargs: Any) -> int:
        pid = spawn(*args, **kwargs)
        calls.append(pid)
        if len(calls) == 2:
            raise CrashError
        return pid

    patch.setattr(supervisor_module.os, "posix_spawn", spawning)


POINTS: dict[str, Arm] = {
    arm.__name__: arm
    for arm in (
        before_the_backend_is_asked,
        after_the_attempt_folder_before_its_record,
        after_the_record_before_any_worker,
        after_a_worker_folder_before_its_spec,
        after_a_worker_spec_before_its_spawn,
        after_a_spawn_before_it_is_recorded,
    )
}


@pytest.fixture
def store(tmp_path: Path, harness: Harness) -> Iterator[SqlStore]:
    opened = SqlStore.open(default_sqlite_url(tmp_path / "db"))
    opened.set_nodes([harness.node])
    opened.set_queue(QueueSpec("team-a"))
    yield opened
    opened.close()


def step_until(loop: Reconciler, done: Callable[[], bool], what: str, timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {loop.store.get(JOB)}"
        loop.step()
        time.sleep(0.01)


def starts(out: Path, rank: int) -> list[int]:
    path = out / f"starts-{rank}"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def submit_gang(harness: Harness, store: SqlStore, clock: WallClock) -> Path:
    out = harness.root / "out"
    out.mkdir()
    program = harness.root / "gang.py"
    program.write_text(PROGRAM)
    run = RunSpec((sys.executable, str(program), str(out)), grace_s=5.0)
    store.submit(Job(JOB, "team-a", WorkerRequest(gpus=1), workers=len(RANKS), run=run), clock.now())
    return out


@pytest.mark.parametrize("point", list(POINTS))
def test_a_restart_at_any_point_of_a_launch_starts_each_worker_once(
    harness: Harness, store: SqlStore, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    clock = WallClock()
    out = submit_gang(harness, store, clock)
    settings = ReconcilerSettings(grace_s=5.0)
    first = harness.backend()
    with monkeypatch.context() as patch:
        POINTS[point](first, patch)
        loop = Reconciler(store, first, clock, profile("default"), settings=settings)
        with pytest.raises(CrashError):
            step_until(loop, lambda: False, f"the control plane to die {point.replace('_', ' ')}")
    del loop, first  # the control plane is gone; what it started runs on

    second = harness.backend()
    loop = Reconciler(store, second, clock, profile("default"), settings=settings)
    step_until(loop, lambda: store.get(JOB).state is S.RUNNING, "the attempt to run")
    wait_until(lambda: all(starts(out, r) for r in RANKS), what="every worker's command")
    for _ in range(20):  # a shim that ran late would start its command in this time
        loop.step()
        time.sleep(0.01)

    record = store.get(JOB)
    assert (record.state, record.attempt, record.failures) == (S.RUNNING, 1, 0)
    assert [len(starts(out, r)) for r in RANKS] == [1, 1]  # each command started once
    pids = [starts(out, r)[0] for r in RANKS]
    assert all(is_running(pid, None) for pid in pids)
    attempt = harness.state / "run" / JOB / "attempt-1"
    assert sorted(p.name for p in attempt.iterdir() if p.is_dir()) == ["worker-0", "worker-1"]
    children = [harness.child_pid(harness.launch(JOB, None), r) for r in RANKS]
    assert children == pids  # the workers the backend watches are those that run

    store.request(JOB, RequestKind.CANCEL, "done", clock.now())
    step_until(loop, lambda: store.get(JOB).state is S.CANCELLED, "the cancel")
    assert not any(is_running(pid, None) for pid in pids)
    assert second.ports.held == {}


@pytest.mark.parametrize("kind", [RequestKind.CANCEL, RequestKind.REQUEUE])
def test_a_stop_written_but_never_sent_is_carried_out_after_a_restart(
    harness: Harness, store: SqlStore, monkeypatch: pytest.MonkeyPatch, kind: RequestKind
) -> None:
    clock = WallClock()
    out = submit_gang(harness, store, clock)
    settings = ReconcilerSettings(grace_s=5.0)
    first = harness.backend()
    loop = Reconciler(store, first, clock, profile("default"), settings=settings)
    step_until(loop, lambda: store.get(JOB).state is S.RUNNING, "the attempt to run")
    wait_until(lambda: all(starts(out, r) for r in RANKS), what="every worker's command")
    pids = [starts(out, r)[0] for r in RANKS]
    with monkeypatch.context() as patch:
        patch.setattr(first, "stop", crash)  # the store says evicting; the workers were never told
        store.request(JOB, kind, "asked", clock.now())
        with pytest.raises(CrashError):
            step_until(loop, lambda: False, "the control plane to die before the stop is sent")
    assert store.get(JOB).state is S.EVICTING
    del loop, first

    second = harness.backend()
    loop = Reconciler(store, second, clock, profile("default"), settings=settings)
    after = S.CANCELLED if kind is RequestKind.CANCEL else S.RUNNING
    step_until(
        loop,
        lambda: store.get(JOB).state is after and store.get(JOB).attempt == 1 + (after is S.RUNNING),
        f"the job {after.value}",
    )
    assert not any(is_running(pid, None) for pid in pids)


def test_a_shim_that_runs_after_its_worker_was_started_again_starts_nothing(harness: Harness) -> None:
    """The control plane died between making a worker's spec and its shim's start (or the shim was slow to
    run): the restart starts the worker again, and the first shim, running late, must not start it twice."""
    out = harness.root / "out"
    out.mkdir()
    program = harness.root / "gang.py"
    program.write_text(PROGRAM)
    supervisor = WorkerSupervisor(harness.state)
    spec = WorkerSpec(JOB, 1, 0, "team-a", (sys.executable, str(program), str(out)), {"RANK": "0"})
    supervisor.begin_attempt(JOB, 1, {"job_id": JOB, "attempt": 1, "workers": 1, "port": None})
    held: list[list[str]] = []

    def not_yet(path: str, argv: list[str], *args: Any, **kwargs: Any) -> int:
        held.append(argv)  # spawned only later, by the test
        raise CrashError

    real_spawn = os.posix_spawn
    supervisor_module.os.posix_spawn = not_yet  # type: ignore[assignment]
    try:
        with pytest.raises(CrashError):
            supervisor.start(spec)
    finally:
        supervisor_module.os.posix_spawn = real_spawn
    worker_dir = supervisor.layout.worker_dir(JOB, 1, 0)
    assert (worker_dir / "spec.json").exists()

    again = WorkerSupervisor(harness.state)
    assert again.void_unspawned(JOB, 1, 0)
    assert not worker_dir.exists()
    worker = again.start(spec)
    wait_until(lambda: len(starts(out, 0)) == 1, what="the worker started again")
    recorded = (worker_dir / "shim.pid").read_text()

    late = subprocess.run([sys.executable, *held[0][1:]], env=supervisor_module.SHIM_ENV, timeout=30, check=False)
    assert late.returncode == 0
    time.sleep(0.3)
    assert len(starts(out, 0)) == 1  # the late shim started nothing
    assert (worker_dir / "shim.pid").read_text() == recorded  # and wrote nothing into the new worker's folder
    assert not again.void_unspawned(JOB, 1, 0)  # the running worker is never given up for a new one
    again.refresh(worker)
    again.abandon(worker)
    wait_until(lambda: not is_running(starts(out, 0)[0], None), what="the worker to end")
