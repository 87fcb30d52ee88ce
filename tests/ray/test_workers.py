"""Workers on the nodes of a real Ray cluster: logs followed through the node's agent, cancel, a worker that
ignores SIGTERM killed after its grace period, a working folder missing on its node, and `submit` from a folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tests.kit.jobusers import python_for_anyone, reachable_by_jobs, shared_ledger
from tests.kit.submit_here import submit_from
from tests.ray.conftest import NODES, RayPlane
from tests.server.live import DeathWatch


def _node_of(start_event: dict) -> str:
    """The node a worker ran on, from its GPUs' UUIDs (`GPU-emulated-<node>-<i>`)."""
    return start_event["env"]["CUDA_VISIBLE_DEVICES"].split(",")[0].removeprefix("GPU-emulated-").rsplit("-", 1)[0]


def test_logs_follow_and_cancel_a_worker_on_a_non_head_node(plane: RayPlane) -> None:
    live = plane.live
    with plane.client() as client:
        job = live.submit(client, "sleep", "600", gpus=1)
        [started] = live.wait_events("start", job, timeout_s=60)
        assert _node_of(started) in NODES  # a GPU node: never the head, which has none
        follow = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "logs", "-f", job, "--url", live.url, "--token", live.server.token],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        try:
            time.sleep(1.0)  # following: it prints what is there and waits for more
            assert follow.poll() is None
            response = client.post(f"/v1/jobs/{job}/cancel")
            assert response.status_code == 202, response.text
            done = live.wait_state(client, job, "cancelled", timeout_s=60)
            out, err = follow.communicate(timeout=60)  # `-f` ends once the job has ended
        finally:
            if follow.poll() is None:
                follow.kill()
    # `logs -f` exits as the job did; a cancelled job ends without a code of its own: 1, as `--help` says
    assert follow.returncode == 1, err
    assert f"hello from rank 0 of job {job}" in out
    assert "by admin" in done["reason"]  # who cancelled it
    assert live.events("end", job)[0]["how"] == "signal"  # the checkpoint signal reached it on its node


def test_a_worker_that_ignores_sigterm_is_killed_after_its_grace_period(plane: RayPlane) -> None:
    live = plane.live
    watch = DeathWatch(live)
    watch.start()
    try:
        with plane.client() as client:
            job = live.submit(client, "ignore-term", gpus=2, grace_period="2s")
            [started] = live.wait_events("start", job, timeout_s=60)
            asked = time.time()
            assert client.post(f"/v1/jobs/{job}/cancel").status_code == 202
            live.wait_state(client, job, "cancelled", timeout_s=60)
    finally:
        died = watch.stop()
    assert started["pid"] in died
    took = died[started["pid"]] - asked
    assert 1.9 <= took <= 20.0, took  # not before its grace, and killed (SIGKILL) after it
    assert not live.events("end", job)  # it never ended by itself


def test_a_working_folder_missing_on_the_node_fails_the_worker_with_the_reason(plane: RayPlane) -> None:
    live = plane.live
    with plane.client() as client:
        job = live.submit(client, "exit", "0", gpus=1, workdir="/no/such/folder")
        done = live.wait_state(client, job, "failed", timeout_s=60)
    assert "its working folder /no/such/folder does not exist on node node-" in done["reason"]
    assert "to fix: put it on a file system every node mounts" in done["reason"]


def test_submit_runs_a_relative_command_in_the_folder_it_was_called_from(plane: RayPlane) -> None:
    project = reachable_by_jobs(plane.live.root / "project")
    out = shared_ledger(project / "out.jsonl")
    python, env = python_for_anyone()
    printed = submit_from(project, plane.live.url, plane.live.server.token, python, env, out)
    assert "succeeded" in printed
    assert [json.loads(line)["cwd"] for line in out.read_text().splitlines()] == [str(project)]


def test_drain_of_a_node_moves_its_job_to_another_node(plane: RayPlane) -> None:
    live = plane.live
    with plane.client() as client:
        job = live.submit(client, "sleep", "600", gpus=4)
        [first] = live.wait_events("start", job, timeout_s=60)
        node = _node_of(first)
        try:
            response = client.post(f"/v1/nodes/{node}/drain")
            assert response.status_code == 200, response.text
            assert response.json()["requeued"] == [job]
            starts = live.wait_events("start", job, count=2, timeout_s=60)
        finally:
            client.post(f"/v1/nodes/{node}/uncordon")
    assert live.events("end", job)[0]["how"] == "signal"  # stopped with its checkpoint signal on its node
    assert _node_of(starts[1]) != node
