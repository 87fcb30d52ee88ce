"""A snapshot of a real control plane replays in the simulator: same nodes and queues, its jobs arriving
when they were submitted and running as long as they ran."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.sim.workload import WorkloadError
from gpufleet.sim.workloads.live_cluster import load_snapshot
from gpufleet.sim.workloads.sources import load_workload
from tests.server.live import start

pytestmark = pytest.mark.slow


def test_a_snapshot_of_the_live_cluster_replays_in_the_simulator(tmp_path: Path) -> None:
    live = start(tmp_path, "--stop-jobs", emulate="4xA100-80GB")
    snap = tmp_path / "week.json"
    try:
        with live.http() as client:
            done = [live.submit(client, "sleep", "0.3", name=f"d{i}", gpus=2) for i in range(3)]
            for job in done:
                live.wait_state(client, job, "succeeded")
            blocker = live.submit(client, "wait-file", str(tmp_path / "never"), name="blocker", gpus=1, priority=5)
            live.wait_state(client, blocker, "running")
            waiting = live.submit(client, "sleep", "5", name="big", gpus=4, priority=-1)
            live.wait(client, waiting, lambda j: bool(j["waiting_reason"]))
            node = client.get("/v1/nodes").json()["nodes"][0]["name"]
            window_start = time.time() + 3_600
            held = {"nodes": [node], "start": window_start, "end": window_start + 7_200, "maintenance": True}
            assert client.put("/v1/reservations/fw", json=held).status_code == 201
        env = {"GPUFLEET_URL": live.url, "GPUFLEET_TOKEN": live.server.token, "PATH": "/usr/bin:/bin"}
        result = subprocess.run(
            [sys.executable, "-m", "gpufleet", "snapshot", "--out", str(snap), "--since", "1h"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
    finally:
        live.server.stop()

    workload = load_workload(snap)
    assert [n.name for n in workload.nodes] == [n["name"] for n in json.loads(snap.read_text())["nodes"]]
    assert workload.gpu_count == 4
    assert {tj.id for tj in workload.jobs} == {*done, waiting, blocker}
    runs = {tj.id: tj.duration for tj in workload.jobs}
    for job in done:
        assert 0.25 <= runs[job] <= 2.0  # it slept 0.3 s
    assert runs[waiting] == pytest.approx(sorted(runs[j] for j in done)[1])  # never ran: its queue's median
    assert "snapshot of a gpufleet control plane (emulated GPUs)" in workload.citation
    # The maintenance window comes along, on the workload's clock (seconds from the first submission).
    (window,) = workload.windows
    first = min(r["submitted_at"] for r in json.loads(snap.read_text())["jobs"])
    assert (window.name, window.nodes, window.maintenance) == ("fw", (node,), True)
    assert window.start == pytest.approx(window_start - first)

    sim = subprocess.run(
        [sys.executable, "-m", "gpufleet", "sim", "--workload", str(snap), "--policies", "fifo,best-fit", "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert sim.returncode == 0, sim.stderr
    results = json.loads(sim.stdout)
    assert "snapshot" in json.dumps(results)


def test_a_file_that_is_not_a_snapshot_is_refused_with_a_fix(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"format": "gpufleet-snapshot", "version": 7}')
    with pytest.raises(WorkloadError, match="version 7"):
        load_snapshot(bad)
    bad.write_text('{"format": "gpufleet-snapshot", "version": 1, "nodes": []}')
    with pytest.raises(WorkloadError, match="to fix: take one with `gpufleet snapshot"):
        load_snapshot(bad)
