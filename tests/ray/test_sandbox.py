"""A hostile job on the nodes of the real Ray cluster (the same attacks as tests/security/test_private_tmp.py on
the local executor): it cannot read the command lines of Ray's own processes (run as root, they name the
cluster's addresses), sees only its own user's processes, and has a /tmp of its own (not Ray's /tmp/ray, with
its sessions and sockets), which the node's agent removes once the job has ended."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from gpufleet.adapters.local import namespaces
from tests.kit.jobusers import JOB_PYTHON, share
from tests.local.conftest import wait_until
from tests.local.isolation_kit import read_out, require_root
from tests.ray.conftest import RayPlane
from tests.security.test_private_tmp import TENANT


def _ray_processes() -> list[str]:
    """The pids of the Ray cluster's own processes on this machine (GCS, raylets, agents): run as root, their
    command lines hold the cluster's addresses."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if any(name in cmdline for name in (b"gcs_server", b"raylet", b"dashboard/agent.py")):
            found.append(pid)
    return found


@pytest.mark.slow
def test_on_ray_a_job_reads_no_ray_process_and_has_a_tmp_of_its_own(plane: RayPlane) -> None:
    require_root()
    live = plane.live
    program = share(live.shared / "tenant.py", TENANT)
    ray_pids = _ray_processes()
    assert ray_pids, "no Ray process found on this machine"
    result = str(live.shared / f"ray-ps-{secrets.token_hex(3)}.json")
    with plane.client() as client:
        command = [JOB_PYTHON, str(program), "ps", result, "-", *ray_pids]
        answer = client.post("/v1/jobs", json={"queue": "default", "command": command, "gpus": 1})
        assert answer.status_code == 201, answer.text
        job = live.wait_state(client, answer.json()["id"], "succeeded", "failed", timeout_s=60)
    assert job["state"] == "succeeded", job
    found = read_out(result)
    assert found["cmdlines"] == dict.fromkeys(ray_pids, "absent"), found["cmdlines"]
    assert set(found["procs"].values()) == {found["uid"]}, found["procs"]
    assert found["tmp_seen"] == [], found  # not /tmp/ray: Ray's sessions, sockets and the cluster's address
    # The node's agent detached the attempt's tmpfs once the control plane took the job's end.
    wait_until(
        lambda: not [m for m in namespaces.attempt_mounts() if m.startswith(str(live.root))],
        timeout=30,
        what="the agent to remove the attempt's tmpfs",
    )
