"""The local executor under the real control loop: jobs submitted to the store run as processes and their
ends come back as job states; a restart of the control plane adopts what still runs."""

from __future__ import annotations

import dataclasses
import json
import time

from gpufleet.adapters.local.executor import LocalBackend
from gpufleet.adapters.storage.memory import InMemoryStore
from gpufleet.control.reconciler import Reconciler, ReconcilerSettings
from gpufleet.domain import Job, JobState, WorkerRequest
from gpufleet.policies.catalog import profile
from gpufleet.policies.resize.goodput import GoodputResize
from gpufleet.ports import RequestKind
from tests.local.conftest import TIMEOUT_S, Harness, WallClock

S = JobState


def run_until(loop: Reconciler, store: InMemoryStore, done, timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            states = {r.job.id: r.state.value for r in store.all()}
            raise AssertionError(f"timed out; job states: {states}")
        loop.step()
        time.sleep(0.01)


def test_jobs_run_to_their_end_states_and_survive_a_restart(harness: Harness) -> None:
    clock = WallClock()
    store = InMemoryStore([harness.node])
    gate = harness.root / "go"
    jobs = [
        Job("ok", "team-a", WorkerRequest(gpus=1), run=harness.run("exit", "0")),
        Job("bad", "team-a", WorkerRequest(gpus=1), run=harness.run("exit", "3")),
        Job("gang", "team-a", WorkerRequest(gpus=2), workers=2, run=harness.run("exit", "0")),
        Job("half", "team-a", WorkerRequest(gpus=1, gpu_milli=500), run=harness.run("exit", "0")),
        Job("long", "team-a", WorkerRequest(gpus=1), run=harness.run("wait", str(gate), "0")),
    ]
    for job in jobs:
        store.submit(job, clock.now())
    loop = Reconciler(store, harness.backend(), clock, profile("default"), settings=ReconcilerSettings(grace_s=1.0))
    state = lambda job_id: store.get(job_id).state  # noqa: E731
    run_until(loop, store, lambda: all(state(j) in (S.SUCCEEDED, S.FAILED) for j in ("ok", "bad", "gang", "half")))
    assert [state(j) for j in ("ok", "bad", "gang", "half")] == [S.SUCCEEDED, S.FAILED, S.SUCCEEDED, S.SUCCEEDED]
    assert store.get("bad").exit_code == 3
    run_until(loop, store, lambda: state("long") is S.RUNNING)
    # The control plane goes away while "long" runs; a new one on the same store and state folder adopts it.
    del loop
    loop = Reconciler(store, harness.backend(), clock, profile("default"), settings=ReconcilerSettings(grace_s=1.0))
    loop.step()
    assert state("long") is S.RUNNING
    gate.touch()
    run_until(loop, store, lambda: state("long") is S.SUCCEEDED)
    assert isinstance(loop.backend, LocalBackend)
    assert loop.backend.ports.held == {}
    # One attempt each: nothing was started twice.
    assert all(store.get(j.id).attempt == 1 for j in jobs)


def test_a_cancel_reaches_the_process_as_its_checkpoint_signal(harness: Harness) -> None:
    clock = WallClock()
    store = InMemoryStore([harness.node])
    saved = harness.root / "ckpt"
    run = harness.run("checkpoint", str(saved), checkpoint_signal="SIGINT", grace_s=5.0)
    store.submit(Job("c", "team-a", WorkerRequest(gpus=1), run=run), clock.now())
    loop = Reconciler(store, harness.backend(), clock, profile("default"))
    run_until(loop, store, lambda: store.get("c").state is S.RUNNING and saved.with_suffix(".ready").exists())
    store.request("c", RequestKind.CANCEL, "not needed any more", clock.now())
    run_until(loop, store, lambda: store.get("c").state is S.CANCELLED)
    assert saved.read_text() == "saved on SIGINT"


def test_the_loop_grows_an_elastic_job_into_idle_gpus_through_the_local_executor(harness: Harness) -> None:
    """End to end: the goodput policy decides, the reconciler records the resize on the same attempt, and the
    real executor checkpoints the workers and starts the grown set with the new WORLD_SIZE."""
    clock = WallClock()
    store = InMemoryStore([harness.node])
    out = harness.root / "elastic-out"
    out.mkdir()
    gate = harness.root / "release"
    store.submit(Job("fixed", "team-a", WorkerRequest(gpus=1), workers=6, run=harness.run("wait", str(gate), "0")), 0)
    elastic = Job("el", "team-a", WorkerRequest(gpus=1), workers=4, min_workers=1, run=harness.run("elastic", str(out)))
    store.submit(elastic, clock.now())
    # The default profile with its resize policy asked often and allowed to resize a job every second.
    often = dataclasses.replace(profile("default"), resize_every_s=0.2, resize=GoodputResize(min_interval_s=1.0))
    loop = Reconciler(store, harness.backend(), clock, often, settings=ReconcilerSettings(grace_s=5.0))

    def settled_at(size: int) -> bool:
        record = store.get("el")
        return record.state is S.RUNNING and len(record.workers) == size and not record.resizing

    run_until(loop, store, lambda: settled_at(2) and store.get("fixed").state is S.RUNNING, timeout=60.0)
    before = store.get("el").resizes  # it may have started at its minimum and grown into the 2 GPUs left
    gate.touch()  # the fixed job ends: 6 GPUs idle
    run_until(loop, store, lambda: settled_at(4), timeout=60.0)
    record = store.get("el")
    count = record.resizes
    assert (record.attempt, record.failures) == (1, 0)
    assert count > before  # grown as a resize of the same attempt, not a retry
    paths = [out / f"env-{count}-{rank}.json" for rank in range(4)]
    run_until(loop, store, lambda: all(path.exists() for path in paths))
    envs = [json.loads(path.read_text())["env"] for path in paths]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert {e["GPUFLEET_RESIZE_COUNT"] for e in envs} == {str(count)}
    assert {e["GPUFLEET_ATTEMPT"] for e in envs} == {"1"}
    assert f"ckpt-{count - 1}-0" in {p.name for p in out.glob("ckpt-*")}  # the set before saved on the signal
    held = sorted(i for w in record.workers for i in w.gpu_indices)
    assert held == sorted(int(e["GPUFLEET_GPU_INDICES"]) for e in envs)
    store.request("el", RequestKind.CANCEL, "done", clock.now())
    run_until(loop, store, lambda: store.get("el").state is S.CANCELLED)
