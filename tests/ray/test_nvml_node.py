"""A node that is not emulated: its agent reads the GPUs through NVML on that node (here the real
nvidia-ml-py binding over our fake libnvidia-ml.so.1, an emulation built by the tests: no GPU is here). It
joins the running control plane within 10 s with NVML's models, UUIDs and NVLink islands, its samples say
`probe="nvml"` under its own `Hostname`, and a job there gets the UUIDs NVML reported."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.ray.conftest import RayPlane, within
from tests.telemetry.fakenvml import CONFIG_ENV, write_config

pytestmark = pytest.mark.slow
GiB = 1024**3
NAME = "nvml-node"


def test_a_node_with_nvml_gpus_joins_with_what_nvml_reports(plane: RayPlane, fake_nvml: Path) -> None:
    config = write_config(
        plane.live.root / "nvml-node.conf",
        [
            {"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-h100-{i}", "memory_total": 80 * GiB, "links": "switch"}
            for i in range(4)
        ],
    )
    env = {"LD_LIBRARY_PATH": str(fake_nvml), CONFIG_ENV: str(config)}
    within(120, "starting a Ray node with NVML GPUs", lambda: plane.cluster.add_gpu_node(NAME, 4, env))
    try:
        joined = time.monotonic()
        while NAME not in (nodes := plane.nodes()) or not nodes[NAME]["healthy"]:
            assert time.monotonic() - joined < 10.0, "the node did not join within 10 s"
            time.sleep(0.1)
        node = nodes[NAME]
        assert not node["emulated"]
        assert [(g["model"], g["uuid"]) for g in node["gpus"]] == [("H100", f"GPU-h100-{i}") for i in range(4)]
        live = plane.live
        with plane.client() as client:
            job = live.submit(client, "sleep", "600", gpus=4, gpu_models="H100")
            [started] = live.wait_events("start", job, timeout_s=60)
            assert started["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(f"GPU-h100-{i}" for i in range(4))
            deadline = time.monotonic() + 30
            sampled = re.compile(rf'DCGM_FI_DEV_GPU_UTIL\{{[^}}]*Hostname="{NAME}"[^}}]*probe="nvml"')
            while not sampled.search(client.get("/metrics").text):
                assert time.monotonic() < deadline, "no NVML sample of the node"
                time.sleep(0.2)
            client.post(f"/v1/jobs/{job}/cancel")
            live.wait_state(client, job, "cancelled", timeout_s=60)
    finally:
        within(60, f"stopping node {NAME}", lambda: plane.cluster.kill(NAME))
