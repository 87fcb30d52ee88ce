"""The communication model live: a job spec declaring what it synchronises goes through the API to the real loop on
the SQL store; a spread above its limit waits and `explain` gives the estimate; `show`'s data carries the estimate
of the placement it gets."""

from __future__ import annotations

from gpufleet.domain.cluster import make_node
from gpufleet.domain.quotas import GPU, QueueSpec, Quota
from gpufleet.domain.resources import GiB
from tests.server.conftest import Api
from tests.server.test_api import run_on, submit
from tests.server.test_cost_api import Loop

SEVEN_B = {"params": "7B", "dtype": "bf16", "step_time": "1s"}


def a100(name: str, gpus: int = 8):  # type: ignore[no-untyped-def]
    return make_node(name, "A100-80GB", gpus, 80 * GiB)


def test_a_spread_gang_waits_with_the_estimate_then_takes_two_whole_nodes(api: Api) -> None:
    api.store.set_nodes([a100("a0"), a100("a1"), a100("a2", gpus=4)])
    api.store.set_queue(QueueSpec("team-a", {GPU: Quota(20_000)}))
    other = submit(api, api.team_a, gpus=4, preemptible=False)
    run_on(api, other["id"], "a1", (0, 1, 2, 3))  # free: 8 on a0, 4 on a1, 4 on a2
    loop = Loop(api)  # the loop starts from the store, as after a restart
    gang = submit(api, api.team_a, gpus=4, workers=4, max_comm_overhead=0.15, **SEVEN_B)
    loop.reconciler.step()
    why = api.client.get(f"/v1/jobs/{gang['id']}/explain", headers=api.h(api.team_a)).json()
    assert why["state"] == "pending"
    assert why["waiting_reason"].startswith(
        "spread over 3 nodes: ~21 % of each step in all-reduce (16 GPUs, slowest link network at 100 GB/s, "
        "262 ms a step), above its max_comm_overhead of 15 %; waits for 2 whole nodes (~12 %)"
    )
    loop.backend.launches.extend(loop.backend.adopted)  # the job it found running is the backend's to end
    loop.finish(other["id"])
    loop.start(gang["id"])
    shown = api.client.get(f"/v1/jobs/{gang['id']}", headers=api.h(api.team_a)).json()
    assert sorted({w["node"] for w in shown["placement"]}) == ["a0", "a1"]
    comm = shown["comm"]
    assert (comm["grad_bytes"], comm["step_time"], comm["max_comm_overhead"]) == (14_000_000_000, 1.0, 0.15)
    assert (comm["link"], comm["bus_gbps"]) == ("network", 200.0)
    assert abs(comm["overhead"] - 0.13125 / 1.13125) < 1e-9


def test_a_bad_communication_field_is_a_clear_422(api: Api) -> None:
    answer = api.client.post(
        "/v1/jobs",
        json={"command": ["x"], "gpus": 1, "grad_bytes": "1GB", "max_comm_overhead": 0.2},
        headers=api.h(api.team_a),
    )
    assert answer.status_code == 422, answer.text
    fields = {f["field"]: f for f in answer.json()["fields"]}
    assert "step_time" in fields
    assert "give grad_bytes (or params) and step_time together" in fields["step_time"]["fix"]


def test_nodes_show_their_interconnect(api: Api) -> None:
    api.store.set_nodes([a100("a0")])
    (node,) = api.client.get("/v1/nodes", headers=api.as_admin()).json()["nodes"]
    assert (node["nvlink_gbps"], node["pcie_gbps"], node["network_gbps"]) == (300.0, 32.0, 25.0)
