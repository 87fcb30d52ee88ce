"""Fixtures for the local executor tests: real processes, run from a small worker program the tests write.

The worker program (`worker.py`) does what the test tells it through its arguments:
    env DIR          write its environment and cwd to DIR/env-<RANK>.json, then exit 0
    exit CODE        exit with CODE
    wait FILE CODE   wait until FILE exists, then exit with CODE (a run the test ends when it wants)
    ignore-term READY  ignore SIGTERM, create READY, and wait forever (only SIGKILL ends it)
    checkpoint FILE  on the checkpoint signal write FILE and exit 0; FILE.ready once the handler is in
    fail-rank R CODE the worker of rank R exits CODE at once, the others wait forever
    count FILE       append a line to FILE, then wait forever
    print            write a line to stdout and one to stderr, exit 0
    elastic DIR      write its environment to DIR/env-<GPUFLEET_RESIZE_COUNT>-<RANK>.json and a line to stdout; on
                     SIGTERM write DIR/ckpt-<count>-<rank> and exit 0; wait forever
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpufleet.adapters.inventory.emulated_inventory import parse_emulate
from gpufleet.adapters.local.executor import LocalBackend
from gpufleet.adapters.local.proc import is_running, read_json
from gpufleet.domain import GiB, GpuShare, Job, Node, WorkerPlacement, WorkerRequest
from gpufleet.domain.jobs import RunSpec
from gpufleet.ports import Launch, Observation, ObservationKind

WORKER = """
import json, os, signal, sys, time

def forever():
    while True:
        time.sleep(0.05)

mode, args = sys.argv[1], sys.argv[2:]
if mode == "env":
    path = os.path.join(args[0], "env-" + os.environ["RANK"] + ".json")
    with open(path + ".tmp", "w") as f:
        json.dump({"env": dict(os.environ), "cwd": os.getcwd()}, f)
    os.replace(path + ".tmp", path)
elif mode == "exit":
    sys.exit(int(args[0]))
elif mode == "wait":
    while not os.path.exists(args[0]):
        time.sleep(0.02)
    sys.exit(int(args[1]))
elif mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(args[0], "w").close()
    forever()
elif mode == "checkpoint":
    def save(signum, frame):
        with open(args[0], "w") as f:
            f.write("saved on " + signal.Signals(signum).name)
        sys.exit(0)
    for name in ("SIGTERM", "SIGUSR1", "SIGINT"):
        signal.signal(getattr(signal, name), save)
    open(args[0] + ".ready", "w").close()
    forever()
elif mode == "fail-rank":
    if os.environ["RANK"] == args[0]:
        sys.exit(int(args[1]))
    forever()
elif mode == "count":
    with open(args[0], "a") as f:
        f.write("started\\n")
    forever()
elif mode == "elastic":
    me = os.environ["GPUFLEET_RESIZE_COUNT"] + "-" + os.environ["RANK"]
    def save(signum, frame):
        open(os.path.join(args[0], "ckpt-" + me), "w").close()
        sys.exit(0)
    signal.signal(signal.SIGTERM, save)
    with open(os.path.join(args[0], "env-" + me + ".json.tmp"), "w") as f:
        json.dump({"env": dict(os.environ), "pid": os.getpid()}, f)
    os.replace(os.path.join(args[0], "env-" + me + ".json.tmp"), os.path.join(args[0], "env-" + me + ".json"))
    print("worker " + me + " up", flush=True)
    forever()
elif mode == "print":
    print("to stdout", flush=True)
    print("to stderr", file=sys.stderr, flush=True)
"""

TIMEOUT_S = 15.0


class WallClock:
    def now(self) -> float:
        return time.time()


@dataclass
class Harness:
    """A state folder, an emulated node, the worker program, and helpers to launch and wait."""

    root: Path
    node: Node
    program: Path
    backends: list[LocalBackend] = field(default_factory=list)

    @property
    def state(self) -> Path:
        return self.root / "state"

    def backend(self, **kwargs: object) -> LocalBackend:
        backend = LocalBackend(self.state, [self.node], WallClock(), emulated=True, **kwargs)  # type: ignore[arg-type]
        self.backends.append(backend)
        return backend

    def backend_at(self, state: Path, **kwargs: object) -> LocalBackend:
        """A backend whose state folder is elsewhere (a small disk); its workers are killed afterwards too."""
        backend = LocalBackend(state, [self.node], WallClock(), emulated=True, **kwargs)  # type: ignore[arg-type]
        self.backends.append(backend)
        return backend

    def run(self, *args: str, **kwargs: object) -> RunSpec:
        return RunSpec((sys.executable, str(self.program), *args), **kwargs)  # type: ignore[arg-type]

    def run_code(self, code: str, *args: str) -> RunSpec:
        return RunSpec((sys.executable, "-c", code, *args))

    def launch(
        self,
        job_id: str,
        run: RunSpec | None,
        *,
        gpus: Sequence[Sequence[int]] = ((0,),),
        attempt: int = 1,
        request: WorkerRequest | None = None,
        name: str = "",
    ) -> Launch:
        workers = tuple(WorkerPlacement(self.node.name, tuple(GpuShare(i) for i in g)) for g in gpus)
        per_worker = max((len(g) for g in gpus), default=0)
        job = Job(
            job_id,
            "team-a",
            request or WorkerRequest(gpus=per_worker),
            workers=len(workers),
            name=name,
            run=run,
        )
        return Launch(job, attempt, workers)

    def worker_file(self, launch: Launch, rank: int, name: str) -> dict[str, object] | None:
        return read_json(self.state / "run" / launch.job.id / f"attempt-{launch.attempt}" / f"worker-{rank}" / name)

    def child_pid(self, launch: Launch, rank: int = 0) -> int:
        child = self.worker_file(launch, rank, "child.pid")
        assert child is not None, "the worker has not started"
        return int(child["pid"])  # type: ignore[call-overload]

    def shim_pid(self, launch: Launch, rank: int = 0) -> int:
        shim = self.worker_file(launch, rank, "shim.pid")
        assert shim is not None
        return int(shim["pid"])  # type: ignore[call-overload]


def wait_for(
    backend: LocalBackend,
    want: Callable[[list[Observation]], bool],
    timeout: float = TIMEOUT_S,
    seen: list[Observation] | None = None,
) -> list[Observation]:
    """Poll until `want(all observations so far)`; fail with what was seen after `timeout`."""
    seen = seen if seen is not None else []
    deadline = time.monotonic() + timeout
    while True:
        seen.extend(backend.poll())
        if want(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s; observed {seen}")
        time.sleep(0.005)


def has(job_id: str, kind: ObservationKind) -> Callable[[list[Observation]], bool]:
    return lambda seen: any(o.job_id == job_id and o.kind is kind for o in seen)


def ended(job_id: str) -> Callable[[list[Observation]], bool]:
    final = {ObservationKind.EXITED, ObservationKind.STOPPED, ObservationKind.LOST}
    return lambda seen: any(o.job_id == job_id and o.kind in final for o in seen)


def only(seen: list[Observation], job_id: str, kind: ObservationKind) -> Observation:
    matches = [o for o in seen if o.job_id == job_id and o.kind is kind]
    assert len(matches) == 1, f"expected one {kind} for {job_id}, got {seen}"
    return matches[0]


def wait_until(condition: Callable[[], bool], timeout: float = TIMEOUT_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


def pid_alive(pid: int) -> bool:
    return is_running(pid, None)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    program = tmp_path / "worker.py"
    program.write_text(WORKER)
    node = parse_emulate("8xA100-80GB", "box")[0]
    assert node.gpus[0].memory == 80 * GiB
    h = Harness(tmp_path, node, program)
    yield h
    for elsewhere in {b.layout.root for b in h.backends} - {h.state}:
        with contextlib.suppress(OSError):
            LocalBackend(elsewhere, [node], WallClock(), emulated=True).adopt([])
    # Whatever a test left running is killed: a fresh backend adopting nothing kills every worker it finds.
    if (h.state / "run").exists():
        LocalBackend(h.state, [node], WallClock(), emulated=True).adopt([])
        children = (h.state / "run").glob("*/attempt-*/worker-*/child.pid")
        after_resizes = (h.state / "run").glob("*/attempt-*/resize-*/worker-*/child.pid")
        for pid_file in [*children, *after_resizes]:
            child = read_json(pid_file)
            if child is not None:
                with contextlib.suppress(OSError):
                    os.killpg(int(child["pgid"]), signal.SIGKILL)
        # The shims are children of this test process: wait for them, so none is left a zombie.
        shims = (h.state / "run").glob("*/attempt-*/worker-*/shim.pid")
        for pid_file in [*shims, *(h.state / "run").glob("*/attempt-*/resize-*/worker-*/shim.pid")]:
            shim = read_json(pid_file)
            if shim is not None:
                pid, ticks = shim["pid"], shim["ticks"]
                wait_until(lambda pid=pid, ticks=ticks: not is_running(pid, ticks), 5.0, "a shim to end")
