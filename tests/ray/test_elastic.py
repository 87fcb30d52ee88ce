"""Elastic jobs on a real Ray cluster: workers get their attempt's report token as on the local executor, and
the Ray backend resizes a running attempt across nodes (checkpoint signal on every node, then the new set
with the new WORLD_SIZE under the same attempt)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.domain import GpuShare, Job, WorkerPlacement, WorkerRequest
from gpufleet.domain.jobs import RunSpec
from gpufleet.ports import Launch, Observation, ObservationKind
from tests.kit.jobusers import JOB_PYTHON, reachable_by_jobs, share, users_created_here
from tests.ray.conftest import RayPlane, within
from tests.server.live import alive

K = ObservationKind

# Writes its environment to OUT-<resize count>-<rank>.json; on SIGTERM writes OUT-ckpt-<count>-<rank>, exits 0.
ELASTIC = r"""
import json, os, signal, sys, time
out = sys.argv[1]
me = os.environ["GPUFLEET_RESIZE_COUNT"] + "-" + os.environ["RANK"]
def save(signum, frame):
    open(out + "-ckpt-" + me, "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
with open(out + "-" + me + ".tmp", "w") as f:
    json.dump({"env": dict(os.environ), "pid": os.getpid()}, f)
os.replace(out + "-" + me + ".tmp", out + "-" + me + ".json")
while True:
    time.sleep(0.05)
"""


def test_ray_workers_get_their_attempts_report_token_and_reports_with_it_are_taken(plane: RayPlane) -> None:
    live = plane.live
    with plane.client() as client:
        job = live.submit(client, "sleep", "600", gpus=1)
        [started] = live.wait_events("start", job, timeout_s=120)
        env = started["env"]
        token, url = env["GPUFLEET_REPORT_TOKEN"], env["GPUFLEET_REPORT_URL"]
        assert url.startswith(live.url)
        assert job in url
        report = {"reports": [{"kind": "progress", "step": 7, "samples": 448, "loss": 1.25}]}
        taken = httpx.post(url, json=report, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert taken.status_code < 300, taken.text
        refused = httpx.post(url, json=report, headers={"Authorization": "Bearer job-1.forged"}, timeout=10)
        assert refused.status_code == 401, refused.text
        progress = client.get(f"/v1/jobs/{job}/progress").json()
        assert progress["step"] == 7
        client.post(f"/v1/jobs/{job}/cancel")
        live.wait_state(client, job, "cancelled", timeout_s=60)


def test_the_ray_backend_resizes_an_attempt_across_nodes(ray_cluster: Any, tmp_path: Path) -> None:
    from gpufleet.adapters.ray.agent import AgentOptions
    from gpufleet.adapters.ray.backend import RayBackend
    from gpufleet.adapters.ray.ray_inventory import RayFleet

    cluster = ray_cluster
    shared = reachable_by_jobs(tmp_path / "elastic")
    program = share(shared / "elastic.py", ELASTIC)
    out = str(shared / "found")
    options = AgentOptions(root=str(tmp_path / "agents"))
    with users_created_here():
        # Agents of their own (their own namespace and folders) beside the plane's, driven from this process.
        nodes = tuple(cluster.specs.values())  # the emulated nodes' GPUs
        fleet = within(120, "joining the Ray cluster", lambda: RayFleet(cluster.address, options, emulated=nodes))
        try:
            within(120, "finding the nodes", lambda: fleet.first_scan((), wait_for=3))
            token = {"GPUFLEET_REPORT_TOKEN": "tok-ray-el"}
            backend = RayBackend(fleet, _Clock(), job_env=lambda job_id, attempt: token)
            assert backend.capabilities.resize
            within(120, "adopting nothing", lambda: backend.adopt([]))
            run = RunSpec((JOB_PYTHON, str(program), out))
            job = Job("ray-elastic", "default", WorkerRequest(gpus=1), workers=2, run=run)
            launch = Launch(job, 1, (_at("node-1", 6), _at("node-2", 6)))
            backend.launch(launch)
            seen = within(240, "the start", lambda: _wait(backend, lambda s: _has(s, K.STARTED)))
            before = [_read(f"{out}-0-{rank}.json") for rank in (0, 1)]

            bigger = replace(launch, workers=(_at("node-2", 7), _at("node-3", 6), _at("node-3", 7)))
            asked = time.monotonic()
            backend.resize(bigger, grace_s=30.0, resize_count=1)
            seen += within(240, "the resize", lambda: _wait(backend, lambda s: _has(s, K.RESIZED)))
            latency = time.monotonic() - asked
            assert all(Path(f"{out}-ckpt-0-{rank}").exists() for rank in (0, 1))  # both saved, each on its node
            after = [_read(f"{out}-1-{rank}.json")["env"] for rank in range(3)]
            assert [e["WORLD_SIZE"] for e in after] == ["3", "3", "3"]
            assert [e["RANK"] for e in after] == ["0", "1", "2"]
            assert {e["GPUFLEET_RESIZE_COUNT"] for e in after} == {"1"}
            assert {e["GPUFLEET_ATTEMPT"] for e in after} == {"1"}
            assert {e["GPUFLEET_REPORT_TOKEN"] for e in after} == {"tok-ray-el"}
            assert [e["NODE_RANK"] for e in after] == ["0", "1", "1"]
            assert len({e["MASTER_PORT"] for e in after}) == 1  # one rendezvous, leased on rank 0's node
            assert after[0]["CUDA_VISIBLE_DEVICES"].startswith("GPU-emulated-node-2-")
            assert before[0]["env"]["WORLD_SIZE"] == "2"
            assert [o.kind for o in seen] == [K.STARTED, K.RESIZED]  # the old workers' ends are not reported

            backend.stop("ray-elastic", 1, 30.0, "done")
            seen += within(240, "the stop", lambda: _wait(backend, lambda s: _has(s, K.STOPPED)))
            assert [o.detail for o in seen if o.kind is K.STOPPED] == ["done"]
            assert all(Path(f"{out}-ckpt-1-{rank}").exists() for rank in range(3))
            print(json.dumps({"ray_resize_latency_s": round(latency, 3)}))
        finally:
            _dismiss(fleet)


def _before_the_backend_is_asked(backend: Any) -> None:
    backend.resize = _die  # the store says resizing; the agents never heard of it


def _once_the_old_workers_were_told(backend: Any) -> None:
    resize = backend.resize

    def resize_then_die(*args: Any, **kwargs: Any) -> None:
        resize(*args, **kwargs)
        raise _Died

    backend.resize = resize_then_die


def _once_rank_0s_node_started_the_new_set(backend: Any) -> None:
    started = backend._started

    def starting(key: Any, node: str, port: int | None) -> None:
        job = backend._live.get(key)
        if job is not None and job.resize_count > 0 and node == job.nodes[0]:
            raise _Died  # before the other nodes are asked to start theirs
        started(key, node, port)

    backend._started = starting


def _before_the_store_takes_resized(backend: Any) -> None:
    poll = backend.poll

    def polling() -> Any:
        seen = poll()
        if any(o.kind is K.RESIZED for o in seen):
            raise _Died
        return seen

    backend.poll = polling


@pytest.mark.parametrize(
    "die",
    [
        _before_the_backend_is_asked,
        _once_the_old_workers_were_told,
        _once_rank_0s_node_started_the_new_set,
        _before_the_store_takes_resized,
    ],
)
def test_a_restart_of_the_control_plane_mid_resize_on_ray_completes_the_resize(
    ray_cluster: Any, tmp_path: Path, die: Callable[[Any], None]
) -> None:
    """The real loop on a real SQLite store grows a job from 2 nodes to 3 (a worker is a whole node) and dies
    at a point of the resize; a new loop on the same store and agents completes the resize under the same
    attempt instead of losing it."""
    from gpufleet.adapters.ray.agent import AgentOptions
    from gpufleet.adapters.ray.backend import RayBackend
    from gpufleet.adapters.ray.ray_inventory import RayFleet
    from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
    from gpufleet.control.reconciler import Reconciler, ReconcilerSettings
    from gpufleet.domain import JobState, QueueSpec
    from gpufleet.policies.catalog import profile
    from gpufleet.ports import RequestKind
    from tests.kit.scripted_resize import ScriptedResize

    cluster = ray_cluster
    shared = reachable_by_jobs(tmp_path / "elastic")
    program = share(shared / "elastic.py", ELASTIC)
    out = str(shared / "found")
    options = AgentOptions(root=str(tmp_path / "agents"))
    clock = _Clock()
    policy = ScriptedResize()
    grow_later = dataclasses.replace(profile("default"), resize=policy, resize_every_s=0.05, elastic_grow=False)
    settings = ReconcilerSettings(grace_s=30.0)
    with users_created_here(), SqlStore.open(default_sqlite_url(tmp_path / "db")) as store:
        nodes = tuple(cluster.specs.values())
        fleet = within(120, "joining the Ray cluster", lambda: RayFleet(cluster.address, options, emulated=nodes))
        try:
            store.set_nodes(within(120, "finding the nodes", lambda: fleet.first_scan((), wait_for=3)))
            store.set_queue(QueueSpec("default"))
            run = RunSpec((JOB_PYTHON, str(program), out), grace_s=30.0)
            job = Job("ray-mid", "default", WorkerRequest(gpus=8), workers=3, min_workers=2, run=run)
            store.submit(job, clock.now())
            first = RayBackend(fleet, clock)
            loop = Reconciler(store, first, clock, grow_later, settings=settings)
            within(
                240,
                "the first workers",
                lambda: _step_until(loop, lambda: all(Path(f"{out}-0-{r}.json").exists() for r in (0, 1))),
            )
            old = [_read(f"{out}-0-{rank}.json")["pid"] for rank in (0, 1)]

            die(first)
            policy.want[job.id] = 24
            with pytest.raises(_Died):
                within(120, "the resize", lambda: _step_until(loop, lambda: False))
            del loop, first  # the control plane dies; agents and workers run on

            second = RayBackend(fleet, clock)
            loop = Reconciler(store, second, clock, grow_later, settings=settings)
            within(240, "the resize after the restart", lambda: _step_until(loop, lambda: not _record(store).resizing))
            record = _record(store)
            assert (record.state, record.attempt, record.failures, record.resizes) == (JobState.RUNNING, 1, 0, 1)
            assert len(record.workers) == 3
            after = [_read(f"{out}-1-{rank}.json")["env"] for rank in range(3)]
            assert [e["WORLD_SIZE"] for e in after] == ["3", "3", "3"]
            assert {e["GPUFLEET_ATTEMPT"] for e in after} == {"1"}
            # The GPUs the store says the job holds are those its running workers were given.
            held = {fleet.gpu_uuid(w.node, i) for w in record.workers for i in w.gpu_indices}
            assert {uuid for e in after for uuid in e["CUDA_VISIBLE_DEVICES"].split(",")} == held
            assert len(held) == 24
            assert all(Path(f"{out}-ckpt-0-{rank}").exists() for rank in (0, 1))  # the old set saved, then ended
            assert not any(alive(pid) for pid in old)
            assert sorted(Path(out).parent.glob("found-1-*.json")) == [Path(f"{out}-1-{r}.json") for r in range(3)]

            store.request(job.id, RequestKind.CANCEL, "done", clock.now())
            within(240, "the cancel", lambda: _step_until(loop, lambda: _record(store).state is JobState.CANCELLED))
            assert all(Path(f"{out}-ckpt-1-{rank}").exists() for rank in range(3))
        finally:
            _dismiss(fleet)


class _Died(Exception):  # noqa: N818 - not an error: the control plane dies here on purpose
    pass


def _die(*_: Any, **__: Any) -> None:
    raise _Died


def _record(store: Any) -> Any:
    record = store.get("ray-mid")
    assert record is not None
    return record


def _step_until(loop: Any, done: Callable[[], bool]) -> None:
    while not done():
        loop.step()
        time.sleep(0.02)


def _dismiss(fleet: Any) -> None:
    """Kill the agents a test started, after they killed every worker they ran (workers outlive agents)."""
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


def _has(seen: list[Observation], kind: ObservationKind) -> bool:
    return any(o.kind is kind for o in seen)


def _wait(backend: Any, done: Callable[[list[Observation]], bool], timeout_s: float = 200.0) -> list[Observation]:
    seen: list[Observation] = []
    deadline = time.monotonic() + timeout_s
    while not done(seen):
        seen.extend(backend.poll())
        assert not _has(seen, K.LOST), seen
        if time.monotonic() > deadline:
            jobs = {key: (job.workers, job.started_nodes, job.resize_count) for key, job in backend._live.items()}
            raise AssertionError(f"after {timeout_s} s: observed {seen}; the backend's jobs: {jobs}")
        time.sleep(0.02)
    return seen


def _read(path: str, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while not Path(path).exists():
        assert time.monotonic() < deadline, f"no {path} after {timeout_s} s"
        time.sleep(0.05)
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data
