"""A gang lost while one of its nodes is still starting it, on a real Ray cluster: the start that answers late
(or runs late on its node) leaves no worker of the lost attempt running there, where the job's next attempt
may be given the same GPUs."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpufleet.adapters.local.proc import is_running
from gpufleet.domain import GpuShare, Job, WorkerPlacement, WorkerRequest
from gpufleet.domain.jobs import RunSpec
from gpufleet.ports import Launch, Observation, ObservationKind
from tests.kit.jobusers import JOB_PYTHON, reachable_by_jobs, share, users_created_here
from tests.ray.conftest import within

K = ObservationKind

# Appends its pid to OUT-<rank>.starts (a worker started twice shows two lines), writes its environment to
# OUT-<rank>.env and its pid to OUT-<rank>.json,
# then waits to be stopped.
UP = r"""
import json, os, sys, time
out = sys.argv[1] + "-" + os.environ["RANK"]
with open(out + ".starts", "a") as f:
    f.write(str(os.getpid()) + "\n")
with open(out + ".env", "w") as f:
    json.dump(dict(os.environ), f)
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


@contextlib.contextmanager
def _own_agents(cluster: Any, tmp_path: Path) -> Iterator[tuple[Any, str, RunSpec]]:
    """A Ray backend over agents of its own (their own namespace and folders) beside the plane's, driven from
    this process, and a job that runs the `UP` program (writing to the path given)."""
    from gpufleet.adapters.ray.agent import AgentOptions
    from gpufleet.adapters.ray.backend import RayBackend
    from gpufleet.adapters.ray.ray_inventory import RayFleet

    shared = reachable_by_jobs(tmp_path / "up")
    program = share(shared / "up.py", UP)
    out = str(shared / "up")
    options = AgentOptions(root=str(tmp_path / "agents"))
    with users_created_here():
        nodes = tuple(cluster.specs.values())
        fleet = within(120, "joining the Ray cluster", lambda: RayFleet(cluster.address, options, emulated=nodes))
        try:
            within(120, "finding the nodes", lambda: fleet.first_scan((), wait_for=3))
            backend = RayBackend(fleet, _Clock())
            yield backend, out, RunSpec((JOB_PYTHON, str(program), out))
        finally:
            _dismiss(fleet)


def test_a_gang_lost_while_a_node_still_starts_it_leaves_no_worker_running_there(
    ray_cluster: Any, tmp_path: Path
) -> None:
    with _own_agents(ray_cluster, tmp_path) as (backend, out, run):
        within(120, "adopting nothing", lambda: backend.adopt([]))
        held = _HeldBack(backend.ray, lambda ref: backend._calls.get(ref, ("", ""))[:2] == ("start", "node-2"))
        backend.ray = held
        job = Job("torn", "default", WorkerRequest(gpus=1), workers=2, run=run)
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


def test_a_launch_the_control_plane_never_sent_starts_when_it_is_adopted(ray_cluster: Any, tmp_path: Path) -> None:
    """The store says launching; the control plane died before it sent the start to any node. The next one
    starts it (each worker once), rather than report it lost."""
    with _own_agents(ray_cluster, tmp_path) as (backend, out, run):
        job = Job("unsent", "default", WorkerRequest(gpus=1), workers=2, run=run)
        launch = Launch(job, 1, (_at("node-2", 5), _at("node-3", 5)))
        within(120, "adopting the launch", lambda: backend.adopt([launch]))
        backend.launch(launch)  # asked again: nothing more starts
        seen: list[Observation] = []
        pids = within(240, "both workers", lambda: _poll_until(backend, seen, lambda: _pids(out, 2)))
        within(120, "the start", lambda: _poll_until(backend, seen, lambda: _has(seen, K.STARTED)))
        backend.stop("unsent", 1, 5.0, "done")
        within(120, "the stop", lambda: _poll_until(backend, seen, lambda: _has(seen, K.STOPPED)))
        assert [o.kind for o in seen] == [K.STARTED, K.STOPPED]
        assert not any(map(_alive, pids))
        assert [len(Path(f"{out}-{rank}.starts").read_text().split()) for rank in (0, 1)] == [1, 1]


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


def test_a_gang_started_on_rank_0s_node_only_starts_on_the_others_when_adopted(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """The control plane died once rank 0's node had started its workers, before it sent the start to the
    other node: the next one starts them there, with the rendezvous rank 0's node leased, each worker once."""
    with _own_agents(ray_cluster, tmp_path) as (backend, out, run):
        within(120, "adopting nothing", lambda: backend.adopt([]))
        job = Job("half", "default", WorkerRequest(gpus=1), workers=2, run=run)
        launch = Launch(job, 1, (_at("node-1", 6), _at("node-3", 6)))
        # What the first control plane did before it died: rank 0's start, sent to node-1's agent, answered.
        specs = backend._specs(launch, 0)
        info = {"job_id": "half", "attempt": 1, "workers": 2, "nodes": ["node-1", "node-3"]}
        master = backend.fleet.agent("node-1")
        port = within(60, "rank 0's start", lambda: backend.ray.get(master.start.remote(specs[:1], info, True)))
        assert port is not None

        second = type(backend)(backend.fleet, _Clock())
        within(120, "adopting the half-started gang", lambda: second.adopt([launch]))
        seen: list[Observation] = []
        pids = within(240, "both workers", lambda: _poll_until(second, seen, lambda: _pids(out, 2)))
        within(120, "the start", lambda: _poll_until(second, seen, lambda: _has(seen, K.STARTED)))
        envs = [json.loads(Path(f"{out}-{rank}.env").read_text()) for rank in (0, 1)]
        assert [e["MASTER_PORT"] for e in envs] == [str(port), str(port)]  # one rendezvous
        second.stop("half", 1, 5.0, "done")
        within(120, "the stop", lambda: _poll_until(second, seen, lambda: _has(seen, K.STOPPED)))
        assert [o.kind for o in seen] == [K.STARTED, K.STOPPED]
        assert not any(map(_alive, pids))
        assert [len(Path(f"{out}-{rank}.starts").read_text().split()) for rank in (0, 1)] == [1, 1]
