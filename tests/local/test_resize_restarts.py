"""The control plane dies at any point of a resize (grow or shrink) and starts again on the same SQLite store
and state folder: the resize completes, the job's `resizing` mark is cleared, the GPUs its record holds are
those of the workers that run, no worker is started twice and none of the old set is left running.

Real processes, a real SQLite store and the real control loop. A death is an exception raised from inside the
first control plane at the chosen point (what it wrote to disk and to the store until then stays, its memory
is dropped), its workers running on as after a kill -9; then a new control plane adopts them. Only the resize
policy is scripted (the test says when to resize and to what size)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.adapters.local import supervisor as supervisor_module
from gpufleet.adapters.local.executor import LocalBackend
from gpufleet.adapters.local.proc import is_running
from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.control.reconciler import Reconciler, ReconcilerSettings
from gpufleet.domain import Job, JobState, QueueSpec, WorkerRequest
from gpufleet.domain.jobs import RunSpec
from gpufleet.policies.catalog import profile
from gpufleet.ports import ObservationKind, RequestKind
from tests.kit.scripted_resize import ScriptedResize
from tests.local.conftest import TIMEOUT_S, Harness, WallClock

S = JobState
JOB = "el"

# Appends its pid to OUT/starts-<resize count>-<rank> (a worker started twice shows two lines), writes its
# environment to OUT/env-<count>-<rank>.json; on SIGTERM saves for a moment (a restart can find the old set still
# saving), writes OUT/ckpt-<count>-<rank> and exits 0.
PROGRAM = r"""
import json, os, signal, sys, time
out = sys.argv[1]
me = os.environ["GPUFLEET_RESIZE_COUNT"] + "-" + os.environ["RANK"]
with open(os.path.join(out, "starts-" + me), "a") as f:
    f.write(str(os.getpid()) + "\n")
def save(signum, frame):
    time.sleep(0.3)
    open(os.path.join(out, "ckpt-" + me), "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
path = os.path.join(out, "env-" + me + ".json")
with open(path + ".tmp", "w") as f:
    json.dump({"env": dict(os.environ), "pid": os.getpid()}, f)
os.replace(path + ".tmp", path)
while True:
    time.sleep(0.05)
"""


REAL_SPAWN = os.posix_spawn


class CrashError(Exception):
    """The first control plane dies here (not an error of the code under test)."""


Arm = Callable[[Reconciler, LocalBackend], None]


def crash(*_: object, **__: object) -> None:
    raise CrashError


def before_the_backend_is_asked(loop: Reconciler, backend: LocalBackend) -> None:
    """The store says resizing; the backend never heard of it."""
    backend.resize = crash  # type: ignore[method-assign]


def before_the_checkpoint_signal(loop: Reconciler, backend: LocalBackend) -> None:
    """The resize record is written; the old workers are neither marked stopping nor signalled."""
    mark = backend.workers.mark_stopping

    def marking(job_id: str, attempt: int, info: dict[str, Any], resize_count: int = 0) -> None:
        if "resize" in info:
            raise CrashError
        mark(job_id, attempt, info, resize_count)

    backend.workers.mark_stopping = marking  # type: ignore[method-assign]


def while_the_old_workers_save(loop: Reconciler, backend: LocalBackend) -> None:
    """Signalled; dies at once, the old workers still saving their checkpoint."""
    resize = backend.resize

    def resizing(*args: Any, **kwargs: Any) -> None:
        resize(*args, **kwargs)
        raise CrashError

    backend.resize = resizing  # type: ignore[method-assign]


def before_the_new_workers_are_recorded(loop: Reconciler, backend: LocalBackend) -> None:
    """Every old worker ended; the new set is not recorded yet."""
    backend.workers.begin_generation = crash  # type: ignore[method-assign]


def after_some_new_workers_started(loop: Reconciler, backend: LocalBackend) -> None:
    """Rank 0 of the new set started, rank 1 not."""
    start = backend.workers.start

    def starting(spec: Any) -> Any:
        if spec.resize_count > 0 and spec.rank == 1:
            raise CrashError
        return start(spec)

    backend.workers.start = starting  # type: ignore[method-assign]


def after_a_new_worker_folder_before_its_spec(loop: Reconciler, backend: LocalBackend) -> None:
    """Rank 0 of the new set started; rank 1's folder exists, its spec does not."""
    prepare = backend.workers.isolation.prepare

    def preparing(spec: Any, job_dir: Path) -> Any:
        if spec.resize_count > 0 and spec.rank == 1:
            raise CrashError
        return prepare(spec, job_dir)

    backend.workers.isolation.prepare = preparing  # type: ignore[method-assign]


def after_a_new_worker_spec_before_its_spawn(loop: Reconciler, backend: LocalBackend) -> None:
    """Rank 0 of the new set started; rank 1's folder and spec exist, its shim was never spawned (the test puts
    `os.posix_spawn` back once the control plane has died)."""

    def spawning(path: str, argv: list[str], *args: Any, **kwargs: Any) -> int:
        if argv[4].endswith("resize-1/worker-1"):
            raise CrashError
        return REAL_SPAWN(path, argv, *args, **kwargs)

    supervisor_module.os.posix_spawn = spawning  # type: ignore[assignment]


def before_the_resize_record_is_cleared(loop: Reconciler, backend: LocalBackend) -> None:
    """Every new worker started; the record of the resize under way is still there."""
    backend.workers.clear_resize = crash  # type: ignore[method-assign]


def before_the_store_takes_resized(loop: Reconciler, backend: LocalBackend) -> None:
    """The backend reported RESIZED; the store never got it."""
    poll = backend.poll

    def polling() -> Any:
        seen = poll()
        if any(o.kind is ObservationKind.RESIZED for o in seen):
            raise CrashError
        return seen

    backend.poll = polling  # type: ignore[method-assign]


POINTS: dict[str, Arm] = {
    arm.__name__: arm
    for arm in (
        before_the_backend_is_asked,
        before_the_checkpoint_signal,
        while_the_old_workers_save,
        before_the_new_workers_are_recorded,
        after_some_new_workers_started,
        after_a_new_worker_folder_before_its_spec,
        after_a_new_worker_spec_before_its_spawn,
        before_the_resize_record_is_cleared,
        before_the_store_takes_resized,
    )
}
# (workers at the start, workers after the resize)
SIZES = {"grow": (2, 3), "shrink": (3, 2)}


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


def read_env(out: Path, count: int, rank: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / f"env-{count}-{rank}.json").read_text())
    return data


@pytest.mark.parametrize("point", list(POINTS))
@pytest.mark.parametrize("direction", list(SIZES))
def test_a_restart_at_any_point_of_a_resize_completes_it_consistently(
    harness: Harness, store: SqlStore, direction: str, point: str
) -> None:
    before, after = SIZES[direction]
    out = harness.root / "out"
    out.mkdir()
    program = harness.root / "elastic.py"
    program.write_text(PROGRAM)
    clock = WallClock()
    policy = ScriptedResize()
    # Starts at its maximum when growing at once is allowed (the shrink), else at its minimum (the grow).
    base = dataclasses.replace(profile("default"), resize=policy, resize_every_s=0.05, elastic_grow=before > after)
    run = RunSpec((sys.executable, str(program), str(out)), grace_s=10.0)
    store.submit(
        Job(JOB, "team-a", WorkerRequest(gpus=1), workers=max(before, after), min_workers=min(before, after), run=run),
        clock.now(),
    )
    settings = ReconcilerSettings(grace_s=10.0)

    first = harness.backend()
    loop = Reconciler(store, first, clock, base, settings=settings)
    step_until(loop, lambda: all((out / f"env-0-{r}.json").exists() for r in range(before)), "the first workers")
    assert len(store.get(JOB).workers) == before
    old_pids = [read_env(out, 0, r)["pid"] for r in range(before)]

    POINTS[point](loop, first)
    policy.want[JOB] = after
    try:
        with pytest.raises(CrashError):
            step_until(loop, lambda: False, f"the control plane to die {point.replace('_', ' ')}")
    finally:
        supervisor_module.os.posix_spawn = REAL_SPAWN
    del loop, first  # the control plane is gone; its workers run on

    second = harness.backend()
    loop = Reconciler(store, second, clock, base, settings=settings)
    step_until(loop, lambda: not store.get(JOB).resizing, "the resize to complete after the restart")
    step_until(loop, lambda: all((out / f"env-1-{r}.json").exists() for r in range(after)), "the new workers")

    record = store.get(JOB)
    assert (record.state, record.attempt, record.failures, record.resizes) == (S.RUNNING, 1, 0, 1)
    assert record.resize_to == ()
    assert len(record.workers) == after
    news = [read_env(out, 1, r) for r in range(after)]
    assert [e["env"]["WORLD_SIZE"] for e in news] == [str(after)] * after
    # The GPUs the store says it holds are those its running workers were given.
    held = sorted(i for w in record.workers for i in w.gpu_indices)
    assert held == sorted(int(e["env"]["GPUFLEET_GPU_INDICES"]) for e in news)
    # Each worker of each set started once; every old one saved and ended; every new one runs.
    for count, size in ((0, before), (1, after)):
        for rank in range(size):
            assert len((out / f"starts-{count}-{rank}").read_text().split()) == 1, (count, rank)
    assert sorted(p.name for p in out.glob("starts-*")) == sorted(
        [f"starts-0-{r}" for r in range(before)] + [f"starts-1-{r}" for r in range(after)]
    )
    assert all((out / f"ckpt-0-{r}").exists() for r in range(before))
    assert not any(is_running(pid, None) for pid in old_pids)
    assert all(is_running(e["pid"], None) for e in news)
    assert second.ports.held == {int(news[0]["env"]["MASTER_PORT"]): f"{JOB}#1"}
    assert not (harness.state / "run" / JOB / "attempt-1" / "resize.json").exists()

    # And it goes on as any job: a cancel ends every new worker.
    store.request(JOB, RequestKind.CANCEL, "done", clock.now())
    step_until(loop, lambda: store.get(JOB).state is S.CANCELLED, "the cancel")
    assert not any(is_running(e["pid"], None) for e in news)
    assert second.ports.held == {}
