"""A resized attempt's new workers are isolated exactly as the ones it was launched with: the queue's own
user, a clean environment, the same private working folder (where its checkpoint is), a cgroup of their own
with their limits and GPU devices. Real users, real cgroups, real processes."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpufleet.adapters.local import cgroups as cg
from gpufleet.domain import GpuShare, WorkerPlacement
from gpufleet.domain.jobs import RunSpec
from gpufleet.ports import ObservationKind
from tests.kit.jobusers import JOB_PYTHON
from tests.local.conftest import ended, has, only, wait_for
from tests.local.isolation_kit import Isolated, isolated_setup, pid_alive, read_out, require_cgroups, require_root

K = ObservationKind
MiB = 1 << 20

# Writes who it is, where, and in which cgroup to OUT-<resize count>-<rank>.json; on SIGTERM leaves a checkpoint
# in its working folder and exits 0.
ELASTIC = r"""
import json, os, signal, sys, time
me = os.environ["GPUFLEET_RESIZE_COUNT"] + "-" + os.environ["RANK"]
def save(signum, frame):
    with open("ckpt-" + me, "w") as f:
        f.write(me)
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
found = {"uid": os.getuid(), "env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid(),
         "cgroup": open("/proc/self/cgroup").read(), "listing": sorted(os.listdir("."))}
with open(sys.argv[1] + "-" + me + ".tmp", "w") as f:
    json.dump(found, f)
os.replace(sys.argv[1] + "-" + me + ".tmp", sys.argv[1] + "-" + me + ".json")
while True:
    time.sleep(0.05)
"""


@pytest.fixture
def iso(tmp_path: Path) -> Iterator[Isolated]:
    with isolated_setup(tmp_path) as iso:
        yield iso


def test_resized_workers_keep_the_queues_user_a_clean_environment_their_folder_and_a_cgroup_each(
    iso: Isolated, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_root()
    groups: cg.Cgroups = require_cgroups("test-iso-resize")
    monkeypatch.setenv("OPERATOR_SECRET", "s3cret")  # in the control plane's environment only
    token = {"GPUFLEET_JOB_TOKEN": "tok-iso"}
    backend = iso.backend(iso.per_queue_users(groups), job_env=lambda job_id, attempt: token)
    out = str(iso.shared / "found")
    launch = iso.launch("grow", RunSpec((JOB_PYTHON, "-c", ELASTIC, out)), gpus=(0,), memory=256 * MiB)
    backend.launch(launch)
    seen = wait_for(backend, has("grow", K.STARTED))
    before = read_out(f"{out}-0-0.json")
    node = launch.workers[0].node
    bigger = tuple(WorkerPlacement(node, (GpuShare(i),), 0, 256 * MiB) for i in (3, 4))
    backend.resize(replace(launch, workers=bigger), grace_s=10.0, resize_count=1)
    seen = wait_for(backend, has("grow", K.RESIZED), seen=seen)
    after = [read_out(f"{out}-1-{rank}.json") for rank in (0, 1)]
    user = pwd.getpwnam("gpufleet-iso-a")
    for rank, found in enumerate(after):
        assert found["uid"] == user.pw_uid != 0
        assert found["cwd"] == before["cwd"]  # the job's own folder: the checkpoint is there
        assert "ckpt-0-0" in found["listing"]
        env = found["env"]
        assert "OPERATOR_SECRET" not in env
        assert (env["USER"], env["WORLD_SIZE"], env["RANK"]) == ("gpufleet-iso-a", "2", str(rank))
        assert (env["GPUFLEET_RESIZE_COUNT"], env["GPUFLEET_JOB_TOKEN"]) == ("1", "tok-iso")
        # A cgroup of its own (named after the resize, so never one an old worker left), with its limits.
        assert any(line.endswith(f"/grow.1.{rank}.r1") for line in found["cgroup"].splitlines()), found["cgroup"]
        folder = next(f for f in groups.folders_for(f"grow.1.{rank}.r1") if "/memory" in f or groups.version == "v2")
        limit_file = "memory.limit_in_bytes" if groups.version == "v1" else "memory.max"
        assert int(Path(folder, limit_file).read_text()) == 256 * MiB
    assert not pid_alive(before["pid"])
    assert not any(os.path.exists(f) for f in groups.folders_for("grow.1.0"))  # the old worker's is gone
    backend.stop("grow", 1, 10.0, "done")
    seen = wait_for(backend, ended("grow"), seen=seen)
    assert only(seen, "grow", K.STOPPED).detail == "done"
    for rank in (0, 1):
        assert not any(os.path.exists(f) for f in groups.folders_for(f"grow.1.{rank}.r1"))
