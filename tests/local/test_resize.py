"""Resizing a running attempt on the local executor: the checkpoint signal to the workers, then the new set
started with the new WORLD_SIZE under the same attempt. Real processes throughout."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpufleet.adapters.local.executor import LocalBackend
from gpufleet.domain import GpuShare, WorkerPlacement
from gpufleet.domain.errors import GpufleetError
from gpufleet.ports import Launch, ObservationKind
from tests.local.conftest import Harness, ended, has, only, pid_alive, wait_for, wait_until

K = ObservationKind


def resized(launch: Launch, *gpus: tuple[int, ...]) -> Launch:
    """The same attempt at a new placement: one worker per tuple of GPU indices."""
    node = launch.workers[0].node
    return replace(launch, workers=tuple(WorkerPlacement(node, tuple(GpuShare(i) for i in g)) for g in gpus))


def env_of(folder: Path, count: int, rank: int) -> dict[str, Any]:
    path = folder / f"env-{count}-{rank}.json"
    wait_until(path.exists, what=f"{path.name}")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def count_of(kind: ObservationKind, seen: list[Any]) -> int:
    return sum(1 for o in seen if o.kind is kind)


def test_a_resize_checkpoints_the_workers_and_restarts_the_attempt_at_each_new_size(harness: Harness) -> None:
    out = harness.root / "out"
    out.mkdir()
    token = {"GPUFLEET_JOB_TOKEN": "tok-el-1", "GPUFLEET_REPORT_URL": "http://127.0.0.1:1/v1/report"}
    backend = harness.backend(job_env=lambda job_id, attempt: token)
    assert backend.capabilities.resize
    launch = harness.launch("el", harness.run("elastic", str(out)), gpus=((0,), (1,)))
    backend.launch(launch)
    seen = wait_for(backend, has("el", K.STARTED))
    first = [env_of(out, 0, r) for r in (0, 1)]
    assert [e["env"]["GPUFLEET_RESIZE_COUNT"] for e in first] == ["0", "0"]

    # Grow 2 -> 3.
    asked = time.monotonic()
    backend.resize(resized(launch, (2,), (3,), (4,)), grace_s=10.0, resize_count=1)
    seen = wait_for(backend, has("el", K.RESIZED), seen=seen)
    latency = time.monotonic() - asked
    assert {p.name for p in out.glob("ckpt-*")} == {"ckpt-0-0", "ckpt-0-1"}  # both saved on the signal
    grown = [env_of(out, 1, r)["env"] for r in range(3)]
    assert [e["WORLD_SIZE"] for e in grown] == ["3", "3", "3"]
    assert [e["RANK"] for e in grown] == ["0", "1", "2"]
    assert [e["GPUFLEET_RESIZE_COUNT"] for e in grown] == ["1", "1", "1"]
    assert [e["GPUFLEET_GPU_INDICES"] for e in grown] == ["2", "3", "4"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in grown] == [harness.node.gpus[i].uuid for i in (2, 3, 4)]
    assert {e["GPUFLEET_ATTEMPT"] for e in grown} == {"1"}  # the same attempt
    assert {e["GPUFLEET_JOB_TOKEN"] for e in grown} == {"tok-el-1"}  # its token still holds
    assert {e["MASTER_ADDR"] for e in grown} == {"127.0.0.1"}
    old_port, new_port = first[0]["env"]["MASTER_PORT"], grown[0]["MASTER_PORT"]
    assert {e["MASTER_PORT"] for e in grown} == {new_port}
    assert new_port != old_port  # a fresh rendezvous
    assert backend.ports.held == {int(new_port): "el#1"}
    assert not any(pid_alive(e["pid"]) for e in first)
    # Once: the same resize asked for again changes nothing.
    backend.resize(resized(launch, (2,), (3,), (4,)), grace_s=10.0, resize_count=1)
    assert backend.poll() == []

    # Shrink 3 -> 1.
    backend.resize(resized(launch, (6,)), grace_s=10.0, resize_count=2)
    seen = wait_for(backend, lambda s: count_of(K.RESIZED, s) == 2, seen=seen)
    shrunk = env_of(out, 2, 0)["env"]
    assert (shrunk["WORLD_SIZE"], shrunk["RANK"], shrunk["GPUFLEET_RESIZE_COUNT"]) == ("1", "0", "2")
    assert {p.name for p in out.glob("ckpt-1-*")} == {"ckpt-1-0", "ckpt-1-1", "ckpt-1-2"}
    # The old workers' ends were neither EXITED nor STOPPED: the attempt ran on.
    assert not ended("el")(seen)
    assert [o.kind for o in seen] == [K.STARTED, K.RESIZED, K.RESIZED]
    assert [o.detail for o in seen[1:]] == ["resize 1", "resize 2"]

    # Logs go on: rank 0's log holds every generation's output, each resize marked; rank 2's only its own.
    wait_until(lambda: "worker 2-0 up" in backend.log_paths("el")[0].read_text(), what="the last line")
    logs = {p.name: p.read_text() for p in backend.log_paths("el")}
    assert sorted(logs) == ["worker-0.log", "worker-1.log", "worker-2.log"]
    assert logs["worker-0.log"].splitlines() == [
        "worker 0-0 up",
        "[gpufleet: resize 1: worker 0 of 3 starts here]",
        "worker 1-0 up",
        "[gpufleet: resize 2: worker 0 of 1 starts here]",
        "worker 2-0 up",
    ]
    assert logs["worker-2.log"].splitlines() == ["[gpufleet: resize 1: worker 2 of 3 starts here]", "worker 1-2 up"]

    backend.stop("el", 1, 10.0, "done")
    seen = wait_for(backend, ended("el"), seen=seen)
    assert only(seen, "el", K.STOPPED).detail == "done"
    assert (out / "ckpt-2-0").exists()
    assert backend.ports.held == {}
    print(json.dumps({"resize_latency_s": round(latency, 3)}))


def test_workers_that_ignore_the_checkpoint_signal_are_killed_after_the_grace_period(harness: Harness) -> None:
    ready = harness.root / "ready"
    backend = harness.backend()
    launch = harness.launch("stubborn", harness.run("ignore-term", str(ready)), gpus=((0,),))
    backend.launch(launch)
    seen = wait_for(backend, has("stubborn", K.STARTED))
    wait_until(ready.exists, what="the handler")
    old = harness.child_pid(launch)
    asked = time.monotonic()
    backend.resize(resized(launch, (0,), (1,)), grace_s=0.5, resize_count=1)
    seen = wait_for(backend, has("stubborn", K.RESIZED), seen=seen)
    assert time.monotonic() - asked >= 0.5  # it had its grace period
    assert not pid_alive(old)
    assert not ended("stubborn")(seen)


def test_a_resize_to_a_placement_the_executor_cannot_run_is_lost(harness: Harness) -> None:
    out = harness.root / "out"
    out.mkdir()
    backend = harness.backend()
    launch = harness.launch("nowhere", harness.run("elastic", str(out)))
    backend.launch(launch)
    wait_for(backend, has("nowhere", K.STARTED))
    elsewhere = replace(launch, workers=(WorkerPlacement("other-node", (GpuShare(0),)),))
    backend.resize(elsewhere, grace_s=5.0, resize_count=1)
    seen = wait_for(backend, ended("nowhere"))
    lost = only(seen, "nowhere", K.LOST)
    assert lost.detail.startswith("resize 1: worker 0 is placed on node 'other-node'"), lost.detail
    assert backend.ports.held == {}
    with pytest.raises(GpufleetError, match="no workers"):
        backend.resize(replace(launch, workers=()), grace_s=5.0, resize_count=2)


def test_a_stop_during_a_resize_wins_and_nothing_new_starts(harness: Harness) -> None:
    ready = harness.root / "ready"
    backend = harness.backend()
    launch = harness.launch("halt", harness.run("ignore-term", str(ready)))
    backend.launch(launch)
    wait_for(backend, has("halt", K.STARTED))
    wait_until(ready.exists, what="the handler")
    backend.resize(resized(launch, (1,), (2,)), grace_s=30.0, resize_count=1)
    backend.poll()
    backend.stop("halt", 1, 0.0, "cancelled")
    seen = wait_for(backend, ended("halt"))
    assert only(seen, "halt", K.STOPPED).detail == "cancelled"
    assert not has("halt", K.RESIZED)(seen)
    assert not (harness.state / "run" / "halt" / "attempt-1" / "resize-1").exists()
    backend.resize(
        resized(
            launch,
            (1,),
        ),
        grace_s=1.0,
        resize_count=2,
    )  # ended: ignored
    assert backend.poll() == []


def stubborn_job(
    harness: Harness, job_id: str, gpus: tuple[tuple[int, ...], ...] = ((0,),)
) -> tuple[LocalBackend, Launch]:
    """A backend running `job_id`, whose workers ignore the checkpoint signal (only SIGKILL ends them): a
    resize of it is still under way when its control plane goes away."""
    ready = harness.root / f"ready-{job_id}"
    backend = harness.backend()
    launch = harness.launch(job_id, harness.run("ignore-term", str(ready)), gpus=gpus)
    backend.launch(launch)
    wait_for(backend, has(job_id, K.STARTED))
    wait_until(ready.exists, what="the handler")
    return backend, launch


def test_a_restart_in_the_middle_of_a_resize_completes_it_and_leaves_no_worker_behind(harness: Harness) -> None:
    first, launch = stubborn_job(harness, "mid", ((0,), (1,)))
    old = [harness.child_pid(launch, r) for r in (0, 1)]
    first.resize(resized(launch, (3,), (4,), (5,)), grace_s=1.0, resize_count=1)
    first.poll()
    del first  # the control plane dies with the old workers still stopping
    second = harness.backend()
    second.adopt([launch])  # the store's launch: the placement as first launched
    seen = wait_for(second, has("mid", K.RESIZED))
    assert not any(pid_alive(pid) for pid in old)
    new_dir = harness.state / "run" / "mid" / "attempt-1" / "resize-1"
    assert sorted(p.name for p in new_dir.glob("worker-*")) == ["worker-0", "worker-1", "worker-2"]
    assert not (harness.state / "run" / "mid" / "attempt-1" / "resize.json").exists()
    assert not ended("mid")(seen)
    # And again after the resize: the next start watches the three new workers, and stops them all.
    new = []
    for rank in range(3):
        child = json.loads((new_dir / f"worker-{rank}" / "child.pid").read_text())
        new.append(int(child["pid"]))
    del second
    third = harness.backend()
    third.adopt([launch])
    seen = wait_for(third, has("mid", K.RESIZED))  # said again: it may not have been seen before the restart
    third.stop("mid", 1, 0.0, "done")
    seen = wait_for(third, ended("mid"), seen=seen)
    assert only(seen, "mid", K.STOPPED).detail == "done"
    wait_until(lambda: not any(pid_alive(pid) for pid in new), what="the new workers to be killed")


def test_a_restart_that_does_not_list_a_resizing_job_kills_old_and_new_workers(harness: Harness) -> None:
    first, launch = stubborn_job(harness, "gone")
    first.resize(resized(launch, (3,), (4,)), grace_s=0.2, resize_count=1)
    wait_for(first, has("gone", K.RESIZED))
    new_dir = harness.state / "run" / "gone" / "attempt-1" / "resize-1"
    wait_until(lambda: all((new_dir / f"worker-{r}" / "child.pid").exists() for r in (0, 1)), what="children")
    pids = [int(json.loads((new_dir / f"worker-{r}" / "child.pid").read_text())["pid"]) for r in (0, 1)]
    del first
    harness.backend().adopt([])
    wait_until(lambda: not any(pid_alive(pid) for pid in pids), what="the resized workers to be killed")


def test_the_checkpoint_signal_is_the_jobs_own(harness: Harness) -> None:
    saved = harness.root / "saved"
    backend = harness.backend()
    run = replace(harness.run("checkpoint", str(saved)), checkpoint_signal="SIGUSR1")
    launch = harness.launch("usr1", run)
    backend.launch(launch)
    wait_for(backend, has("usr1", K.STARTED))
    wait_until(Path(f"{saved}.ready").exists, what="the handler")
    backend.resize(resized(launch, (1,)), grace_s=10.0, resize_count=1)
    wait_for(backend, has("usr1", K.RESIZED))
    assert saved.read_text() == f"saved on {signal.SIGUSR1.name}"
