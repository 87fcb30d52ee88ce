"""The host limits on the nodes of the real Ray cluster (as tests/security/test_host_limits.py checks them on
the local executor): a job that gives no `memory` gets its queue's `memory_per_gpu` per GPU it holds from the
node's agent, and is OOM-killed past it; the administrator's setting changes it."""

from __future__ import annotations

import pytest

from tests.kit.jobusers import JOB_PYTHON
from tests.local.isolation_kit import require_root
from tests.ray.conftest import RayPlane
from tests.security.test_host_limits import HOG, set_queue, submit


@pytest.mark.slow
def test_on_ray_a_job_without_memory_gets_its_queues_share_per_gpu(plane: RayPlane) -> None:
    require_root()
    live = plane.live
    with plane.client() as client:
        assert set_queue(client, "hl-ray-m", memory_per_gpu="64MiB").status_code == 200
        small = submit(client, "hl-ray-m", [JOB_PYTHON, "-c", HOG])
        ended = live.wait_state(client, small, "failed", "succeeded", timeout_s=120)
        assert ended["state"] == "failed"
        assert "out of memory (limit 64 MiB)" in str(ended["reason"]), ended
        assert set_queue(client, "hl-ray-m", memory_per_gpu="512MiB").status_code == 200
        roomy = submit(client, "hl-ray-m", [JOB_PYTHON, "-c", HOG])
        assert live.wait_state(client, roomy, "failed", "succeeded", timeout_s=120)["state"] == "succeeded"
