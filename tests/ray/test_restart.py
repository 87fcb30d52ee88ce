"""kill -9 of the control plane while 20 jobs run on the 3 nodes of a real Ray cluster: the agents and their
workers keep running, and the next start adopts every job through the agents: none is started twice, and a
job that ended while the control plane was down is reported as it ended."""

from __future__ import annotations

import time

import pytest

from tests.ray.conftest import RayPlane
from tests.ray.test_workers import _node_of
from tests.server.live import alive

pytestmark = pytest.mark.slow


def test_kill_9_of_the_control_plane_with_20_jobs_on_3_nodes_adopts_them_all(plane: RayPlane) -> None:
    live = plane.live
    done_file = live.shared / "let-the-last-one-end"
    with plane.client() as client:
        jobs = [live.submit(client, "sleep", "600", gpus=1, name=f"adopt-{i}") for i in range(19)]
        ends_while_down = live.submit(client, "wait-file", str(done_file), gpus=1, name="adopt-ends")
        for job in [*jobs, ends_while_down]:
            live.wait_state(client, job, "running", timeout_s=120)
            live.wait_events("start", job, timeout_s=60)
    starts = {e["job"]: e for e in live.events("start") if e["job"] in {*jobs, ends_while_down}}
    assert len(starts) == 20
    assert {_node_of(e) for e in starts.values()} == {"node-1", "node-2", "node-3"}

    live.server.kill()  # kill -9: no shutdown of any kind
    done_file.write_text("")
    live.wait_events("end", ends_while_down, timeout_s=30)  # it ended while nobody watched
    assert all(alive(starts[j]["pid"]) for j in jobs)
    plane.restart()

    with plane.client() as client:
        finished = live.wait_state(client, ends_while_down, "succeeded", timeout_s=60)
        assert finished["exit_code"] == 0
        for job in jobs:
            record = live.job(client, job)
            assert record["state"] == "running", record
            assert record["attempt"] == 1, record
    time.sleep(1.0)  # a job started twice would show a second start line by now
    again = [e for e in live.events("start") if e["job"] in jobs]
    assert len(again) == 19  # none started twice
    assert all(alive(starts[j]["pid"]) for j in jobs)
