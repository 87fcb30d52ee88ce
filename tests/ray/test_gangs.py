"""Multi-node gangs on a real Ray cluster: the environment gpufleet gives each worker, and a real PyTorch
program (gloo, on the CPU) that forms its process group from that environment alone and all-reduces a tensor
across every rank, started directly and through torchrun."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.kit.jobusers import python_for_anyone, share, shared_ledger
from tests.ray.conftest import RayPlane

pytestmark = pytest.mark.slow

ALL_REDUCE = r"""
import datetime, json, os, sys
import torch
import torch.distributed as dist

out = sys.argv[1]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
env = {k: v for k, v in os.environ.items() if k.startswith(("CUDA_VISIBLE", "MASTER", "RANK", "WORLD", "LOCAL_",
       "NODE_RANK", "GPUFLEET_NODE_IPS", "GPUFLEET_GPU_INDICES", "GPUFLEET_ATTEMPT", "GROUP_RANK"))}
with open(out, "a") as f:
    f.write(json.dumps({"rank": rank, "world": world, "sum": value.item(), "env": env}) + "\n")
dist.barrier()
dist.destroy_process_group()
"""


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# Jobs run as their queue's own user, who cannot reach this interpreter under /root: the system's Python with
# this environment's packages (PyTorch among them) on its path.
PYTHON, PYTHON_ENV = python_for_anyone()


def _run(plane: RayPlane, spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    with plane.client() as client:
        response = client.post("/v1/jobs", json={"queue": "default", "env": PYTHON_ENV, **spec})
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        done = plane.live.wait_state(client, job_id, "succeeded", "failed", "cancelled", timeout_s=timeout_s)
        if done["state"] != "succeeded":
            events = client.get(f"/v1/jobs/{job_id}/events").json()["events"]
            logs = [client.get(f"/v1/jobs/{job_id}/logs", params={"worker": w}).json()["text"][-1500:] for w in (0, 1)]
            raise AssertionError(f"{done['state']}: {[e['reason'] for e in events]}; logs of workers 0, 1: {logs}")
    return done


def test_16_ranks_on_2_nodes_get_disjoint_gpus_one_rendezvous_and_all_reduce_with_gloo(plane: RayPlane) -> None:
    program = share(plane.live.shared / "all_reduce.py", ALL_REDUCE)
    out = shared_ledger(plane.live.shared / "all_reduce.jsonl")
    spec = {"command": [PYTHON, str(program), str(out)], "workers": 16, "gpus": 1, "cpu": 0.1, "memory": "1GiB"}
    _run(plane, spec, timeout_s=300)

    records = _records(out)
    assert sorted(r["rank"] for r in records) == list(range(16))
    assert {r["world"] for r in records} == {16}
    assert {r["sum"] for r in records} == {sum(range(1, 17))}  # every rank's contribution, on every rank
    envs = [r["env"] for r in records]
    assert sorted(int(e["RANK"]) for e in envs) == list(range(16))
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {(envs[0]["MASTER_ADDR"], envs[0]["MASTER_PORT"])}
    # Two nodes of 8: each node's workers hold disjoint GPUs, and all 8 of that node.
    by_node = Counter(e["CUDA_VISIBLE_DEVICES"].rsplit("-", 1)[0] for e in envs)
    assert sorted(by_node.values()) == [8, 8], by_node
    gpus = [e["CUDA_VISIBLE_DEVICES"] for e in envs]
    assert len(set(gpus)) == 16, gpus
    for e in envs:
        assert e["WORLD_SIZE"] == "16"
        assert e["LOCAL_WORLD_SIZE"] == "8"
        assert int(e["LOCAL_RANK"]) in range(8)
        assert e["NODE_RANK"] in ("0", "1")
        ips = e["GPUFLEET_NODE_IPS"].split("\n")
        assert len(ips) == 2
        assert ips[0] == e["MASTER_ADDR"]
    rank0 = next(e for e in envs if e["RANK"] == "0")
    assert (rank0["NODE_RANK"], rank0["LOCAL_RANK"]) == ("0", "0")


def test_the_same_job_through_torchrun_from_the_env_gpufleet_gave(plane: RayPlane) -> None:
    program = share(plane.live.shared / "all_reduce_torchrun.py", ALL_REDUCE)
    out = shared_ledger(plane.live.shared / "all_reduce_torchrun.jsonl")
    torchrun = (
        f"{PYTHON} -m torch.distributed.run --nnodes=2 --nproc-per-node=8 --node-rank=$NODE_RANK "
        f"--master-addr=$MASTER_ADDR --master-port=$MASTER_PORT {program} {out}"
    )
    spec = {"command": torchrun, "workers": 2, "gpus": 8, "cpu": 1, "memory": "8GiB"}
    _run(plane, spec, timeout_s=300)

    records = _records(out)
    assert sorted(r["rank"] for r in records) == list(range(16))
    assert {r["sum"] for r in records} == {sum(range(1, 17))}
    # torchrun's children see the node's 8 GPUs gpufleet chose; the two nodes' sets are disjoint.
    visible = {r["env"]["CUDA_VISIBLE_DEVICES"] for r in records}
    assert len(visible) == 2
    first, second = (set(v.split(",")) for v in visible)
    assert len(first) == len(second) == 8
    assert not first & second


def test_a_gang_member_failing_on_one_node_stops_the_others_on_theirs(plane: RayPlane) -> None:
    live = plane.live
    program = " ".join(live.command("sleep", "600"))
    # Rank 1 fails once rank 0 (on another node, and sleeping for ten minutes) has started.
    started = f'grep -q "\\"job\\": \\"$GPUFLEET_JOB_ID\\", \\"attempt\\": 1, \\"rank\\": 0" {live.ledger}'
    command = f'if [ "$RANK" = 1 ]; then until {started}; do sleep 0.1; done; exit 3; fi; exec {program}'
    with plane.client() as client:
        response = client.post(
            "/v1/jobs", json={"queue": "default", "command": command, "workers": 2, "gpus": 8, "grace_period": "2s"}
        )
        assert response.status_code == 201, response.text
        job = response.json()["id"]
        done = live.wait_state(client, job, "failed", timeout_s=90)
    assert done["exit_code"] == 3
    assert "worker 1 exited 3 on node node-" in done["reason"]
    [rank0] = live.events("start", job)
    assert live.events("end", job)[0]["how"] == "signal"  # stopped on its own node, not left running
    assert rank0["rank"] == 0
