"""A gang lost while one of its nodes is still starting it, on a real Ray cluster: the start that answers late
(or runs late on its node) leaves no worker of the lost attempt running there, where the job's next attempt
may be given the same GPUs."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.adapters.local.proc import is_running
from gpufleet.domain import GpuShare, Job, WorkerPlacement, WorkerRequest
from gpufleet.domain.jobs import RunSpec
from gpufleet.ports import Launch, Observation, ObservationKind
from tests.kit.jobusers import JOB_PYTHON, reachable_by_jobs, share, users_created_here
from tests.ray.conftest import within

K = ObservationKind

# Writes its pid to OUT-<rank>.json, then waits to be killed.
UP = r"""
import json, os, sys, time
out = sys.argv[1] + "-" + os.environ["RANK"]
with open(out + ".tmp", "w") as f:
    json.dump({"pid": os.getpid()}, f)
os.replace(out + ".tmp", out + ".json")
while True:
    time.sleep(0.05)
"""


class _HeldBack:
    """Ray as the backend sees it, with the answers of some calls held back while `holding`: a node (or the
    network to it) slow to answer. The calls themselves run on their nodes as ever."""

    def __init__(self, ray: Any, held: Callable[[Any], bool]) -> None:
        self._ray, self._held, self.holding = ray, held, True

    def wait(self, refs: list[Any], **kwargs: Any) -> tuple[list[Any], list[Any]]:
        ready, rest = self._ray.wait(refs, **kwargs)
        if not self.holding:
            return ready, rest
        late = [ref for ref in ready if self._held(ref)]
        return [ref for ref in ready if ref not in late], [*rest, *late]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ray, name)


def test_a_gang_lost_while_a_node_still_starts_it_leaves_no_worker_running_there(
    ray_cluster: Any, tmp_path: Path
) -> None:
    from gpufleet.adapters.ray.agent import AgentOptions
    from gpufleet.adapters.ray.backend import RayBackend
    from gpufleet.adapters.ray.ray_inventory import RayFleet

    cluster = ray_cluster
    shared = reachable_by_jobs(tmp_path / "torn")
    program = share(shared / "up.py", UP)
    out = str(shared / "up")
    options = AgentOptions(root=str(tmp_path / "agents"), jobs_home=str(reachable_by_jobs(tmp_path / "homes")))
    with users_created_here():
        # Agents of their own (their own namespace and folders) beside the plane's, driven from this process.
        nodes = tuple(cluster.specs.values())
        fleet = within(120, "joining the Ray cluster", lambda: RayFleet(cluster.address, options, emulated=nodes))
        try:
            within(120, "finding the nodes", lambda: fleet.first_scan((), wait_for=3))
            backend = RayBackend(fleet, _Clock())
            within(120, "adopting nothing", lambda: backend.adopt([]))
            held = _HeldBack(backend.ray, lambda ref: backend._calls.get(ref, ("", ""))[:2] == ("start", "node-2"))
            backend.ray = held
            job = Job("torn", "default", WorkerRequest(gpus=1), workers=2, run=RunSpec((JOB_PYTHON, str(program), out)))
            backend.launch(Launch(job, 1, (_at("node-1", 4), _at("node-2", 4))))

            # Both workers run; the backend has not heard node-2's answer yet.
            seen: list[Observation] = []
            pids = within(240, "both workers", lambda: _poll_until(backend, seen, lambda: _pids(out, 2)))
            assert "node-2" not in backend._live[("torn", 1)].started_nodes
            # Rank 0's node is lost (as the fleet reports it once Ray declares a node dead): so is the gang.
            backend.node_lost("node-1")
            within(120, "the gang lost", lambda: _poll_until(backend, seen, lambda: _has(seen, K.LOST)))
            [lost] = [o for o in seen if o.kind is K.LOST]
            assert (lost.detail or "").startswith("node node-1 lost")
            # Killed on both nodes, node-2's answer still not heard (a stop signal and a kill take well under this).
            dead = lambda: not any(map(_alive, pids))  # noqa: E731
            within(60, "its workers killed", lambda: _poll_until(backend, seen, dead, timeout_s=20.0))
            held.holding = False  # node-2's answer to its start arrives now, after the attempt's end
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                seen.extend(backend.poll())
                time.sleep(0.02)
            assert dead()
            assert [o.kind for o in seen if o.kind is not K.STARTED] == [K.LOST]
        finally:
            _dismiss(fleet)


def _poll_until(backend: Any, seen: list[Observation], done: Callable[[], Any], timeout_s: float = 100.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = done()
        if found:
            return found
        seen.extend(backend.poll())
        assert time.monotonic() < deadline, f"not done after {timeout_s} s; observed {seen}"
        time.sleep(0.02)


def _has(seen: list[Observation], kind: ObservationKind) -> bool:
    return any(o.kind is kind for o in seen)


def _pids(out: str, size: int) -> list[int] | None:
    paths = [Path(f"{out}-{rank}.json") for rank in range(size)]
    if not all(p.exists() for p in paths):
        return None
    return [int(json.loads(p.read_text())["pid"]) for p in paths]


def _alive(pid: int) -> bool:
    return is_running(pid, None)


def _dismiss(fleet: Any) -> None:
    """Kill the agents the test started, after they killed every worker they ran (workers outlive agents)."""
    for _, agent in fleet.agents():
        with contextlib.suppress(Exception):
            fleet.ray.get(agent.adopt.remote([]), timeout=60)
        fleet.ray.kill(agent, no_restart=True)
    fleet.close()


class _Clock:
    def now(self) -> float:
        return time.time()


def _at(node: str, gpu: int) -> WorkerPlacement:
    return WorkerPlacement(node, (GpuShare(gpu),))
