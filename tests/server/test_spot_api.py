"""The spot breakers live: a spot node lost on the real SQL store opens its pool's breaker, the gate reaches
the real control loop as node data, `explain` and `/v1/spot-pools` say why, and a probe closes it again."""

from __future__ import annotations

import dataclasses

from gpufleet.domain.cluster import make_node
from gpufleet.domain.resources import GiB
from gpufleet.server.spot_watch import SpotWatch
from tests.server.conftest import Api
from tests.server.test_api import JOB, submit
from tests.server.test_cost_api import Loop

MIN = 60.0


def spot_node(name: str):  # type: ignore[no-untyped-def]
    return dataclasses.replace(make_node(name, "T4", 4, 16 * GiB, zone="us-east-1a"), pool="spot")


def test_a_lost_spot_node_opens_the_breaker_which_gates_placements_until_a_probe_survives(api: Api) -> None:
    api.store.set_nodes([*api.store.nodes(), spot_node("s0"), spot_node("s1")])
    watch = SpotWatch(api.store, api.clock)
    api.ctx.spot = watch
    loop = Loop(api)
    assert [p.state for p in watch.check()] == ["closed"]
    api.clock.t += MIN
    api.store.set_node_flags("s0", healthy=False)  # the cloud took it back
    (pool,) = watch.check()
    assert pool.state == "open"
    assert pool.interruptions_total == 1
    assert "1 interruption in 1 h" in pool.reason
    assert {n.name: n.admits for n in api.store.nodes()} == {
        "node-a": "all",
        "node-h": "all",
        "s0": "checkpointing",
        "s1": "checkpointing",
    }
    audit = api.client.get("/v1/audit", headers=api.as_admin()).json()["entries"]
    assert any(e["action"] == "spot.open" and e["target"] == "us-east-1a" for e in audit)

    plain = submit(api, api.team_a, gpus=1, gpu_models=["T4"], spot="allowed")
    loop.reconciler.step()
    why = api.client.get(f"/v1/jobs/{plain['id']}/explain", headers=api.h(api.team_a)).json()
    assert why["state"] == "pending"
    assert "only jobs that checkpoint" in why["waiting_reason"]
    assert why["spot_pools"][0].startswith("spot pool us-east-1a open since")
    saving = submit(api, api.team_a, gpus=1, gpu_models=["T4"], spot="allowed", checkpoint_interval="10m")
    loop.start(saving["id"])

    api.clock.t += 30 * MIN
    (pool,) = watch.check()
    assert pool.state == "half-open"
    assert {n.name: n.admits for n in api.store.nodes() if n.pool == "spot"} == {"s0": "probe", "s1": "probe"}
    other = submit(api, api.team_a, gpus=1, gpu_models=["T4"], spot="allowed")
    loop.start(plain["id"])  # the probe; the same cycle leaves `other` out of the half-open pool
    other_record = api.store.get(other["id"])
    assert other_record is not None
    assert other_record.state.value == "pending"
    assert "took its one probe job" in other_record.waiting_reason
    api.clock.t += MIN
    (pool,) = watch.check()
    assert pool.probe == plain["id"]
    assert api.store.get(saving["id"]) is not None
    assert {n.admits for n in api.store.nodes() if n.pool == "spot"} == {"checkpointing"}  # one probe at a time
    api.clock.t += 30 * MIN
    (pool,) = watch.check()
    assert pool.state == "closed"
    assert "probe job survived" in pool.reason
    listed = api.client.get("/v1/spot-pools", headers=api.h(api.team_b)).json()
    assert listed["enabled"] is True
    assert listed["threshold_per_node_hour"] == 0.3
    assert [(p["pool"], p["state"]) for p in listed["pools"]] == [("us-east-1a", "closed")]


def test_spot_never_jobs_do_not_use_spot_nodes_and_spot_pools_without_a_watch_say_so(api: Api) -> None:
    api.store.set_nodes([spot_node("s0")])
    # a job that never takes spot capacity, on a fleet of spot nodes only, could never run: refused at submit
    # with the scheduler's own reason
    refused = api.client.post("/v1/jobs", json={**JOB, "gpus": 1}, headers=api.h(api.team_a))
    assert refused.status_code == 422, refused.text
    assert "spot capacity, which the job does not allow" in refused.json()["message"]
    assert api.client.get("/v1/spot-pools", headers=api.as_admin()).json() == {
        "enabled": False,
        "threshold_per_node_hour": None,
        "pools": [],
    }
