"""Telemetry across the nodes of a real Ray cluster: each node's agent samples its GPUs (emulated here, and
labelled so), `/metrics` shows every node's GPUs under its own `Hostname` with the job that holds each, and
`gpufleet top` and `gpufleet nodes` list every node."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from tests.ray.conftest import NODES, RayPlane
from tests.ray.test_workers import _node_of

SERIES = re.compile(r"^DCGM_FI_DEV_GPU_UTIL\{([^}]*)\} (\S+)$", re.MULTILINE)


def _labels(text: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', text))


def _cli(plane: RayPlane, *args: str) -> str:
    live = plane.live
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet", *args, "--url", live.url, "--token", live.server.token],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_metrics_show_every_nodes_gpus_under_its_hostname_and_top_lists_every_node(plane: RayPlane) -> None:
    live = plane.live
    with plane.client() as client:
        job = live.submit(client, "sleep", "600", gpus=2)
        [started] = live.wait_events("start", job, timeout_s=60)
        node = _node_of(started)
        deadline = time.monotonic() + 30
        while True:
            series = [_labels(labels) for labels, _ in SERIES.findall(client.get("/metrics").text)]
            held = [s for s in series if s["job_id"] == job]
            if len(held) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    per_host = {name: sorted(int(s["gpu"]) for s in series if s["Hostname"] == name) for name in NODES}
    assert per_host == {name: list(range(8)) for name in NODES}
    assert {s["probe"] for s in series} == {"emulated"}
    assert {(s["Hostname"], s["UUID"].startswith(f"GPU-emulated-{s['Hostname']}-")) for s in held} == {(node, True)}

    top = _cli(plane, "top", "--once")
    nodes = _cli(plane, "nodes")
    for name in NODES:
        assert name in top
        assert f"{name} (emulated)" in nodes


def test_ray_node_labels_set_pool_and_zone_over_the_inventory_file(plane: RayPlane) -> None:
    nodes = plane.nodes()
    assert (nodes["node-3"]["pool"], nodes["node-3"]["zone"], nodes["node-3"]["rack"]) == ("reserved", "z-b", "r2")
    assert {(nodes[name]["pool"], nodes[name]["zone"]) for name in ("node-1", "node-2")} == {("on-demand", "")}
