"""Arrays and dependencies on the real Ray test cluster, through the Python SDK: an array waits for its parent,
never runs more tasks at once than its throttle, spreads over the nodes, and a dependency that can never be
met ends the job with the reason."""

from __future__ import annotations

import pytest

from gpufleet import Client
from tests.ray.conftest import RayPlane

pytestmark = pytest.mark.slow


def test_an_array_after_its_parent_keeps_its_throttle_across_the_nodes(plane: RayPlane) -> None:
    with Client(plane.live.url, plane.live.server.token, timeout=30.0) as fleet:
        parent = fleet.submit(command="sleep 2", name="ray-parent", queue="default")
        sweep = fleet.submit(
            command='sleep 1; echo "task $GPUFLEET_ARRAY_TASK_ID of $GPUFLEET_ARRAY_JOB_ID"',
            name="ray-sweep",
            queue="default",
            array="0-7%3",
            depends_on=f"afterok:{parent.id}",
            gpus=4,  # two tasks fill a node: the throttle, not the GPUs, keeps it to 3 at once
        )
        assert sweep.array_id is not None
        fleet.wait(sweep.array_id, timeout=240)
        status = fleet.array(sweep.array_id)
        assert dict(status.states) == {"succeeded": 8}, status
        parent_end = fleet.job(parent.id).finished_at
        assert parent_end is not None
        tasks = fleet.jobs(array=sweep.array_id)
        spans = []
        nodes = set()
        for task in tasks:
            assert task.started_at is not None
            assert task.finished_at is not None
            assert task.started_at >= parent_end, (task.id, task.started_at, parent_end)
            spans.append((task.started_at, task.finished_at))
            nodes.update(w["node"] for w in task.raw["placement"])
            assert fleet.logs(task.id) == f"task {task.array_task} of {sweep.array_id}\n"
        most = max(sum(1 for s, e in spans if s <= at < e) for at, _ in spans)
        assert most <= 3, spans
        assert len(nodes) >= 2, nodes  # tasks of 4 GPUs each land on more than one node


def test_a_dependency_that_can_never_be_met_ends_the_job_on_ray_too(plane: RayPlane) -> None:
    with Client(plane.live.url, plane.live.server.token, timeout=30.0) as fleet:
        ok = fleet.run("true", queue="default", timeout=120)
        assert ok.state == "succeeded"
        never = fleet.submit(command="echo never", queue="default", depends_on=f"afternotok:{ok.id}")
        ended = fleet.wait(never.id, timeout=120)
        assert ended.state == "cancelled"
        assert ended.raw["waiting_code"] == "DependencyNeverSatisfied", ended.raw
        assert ended.started_at is None
