"""Cost control over the HTTP API on the real SQL store, with the real control loop placing jobs: prices,
each job's cost, the cost report, budgets at 80 % and 100 % with each action."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpufleet.control.reconciler import Reconciler
from gpufleet.domain.lifecycle import JobState
from gpufleet.policies.catalog import profile
from tests.kit.fake_backend import ScriptedBackend
from tests.kit.traces import price_tables
from tests.server.conftest import Api
from tests.server.test_api import assert_error, submit

HOUR = 3600.0


class Loop:
    """The real reconciler on the API's store, with a backend the test tells what the jobs do."""

    def __init__(self, api: Api | Any) -> None:
        self.store, self.clock = api.store, api.ctx.clock
        self.backend = ScriptedBackend()
        self.reconciler = Reconciler(self.store, self.backend, self.clock, profile("default"))

    def start(self, job_id: str) -> None:
        self.reconciler.step()
        self.backend.started(job_id, self.clock.t)
        self.reconciler.step()
        record = self.store.get(job_id)
        assert record is not None
        assert record.state is JobState.RUNNING, record

    def finish(self, job_id: str) -> None:
        self.backend.exited(job_id, self.clock.t)
        self.reconciler.step()


def set_price(api: Api, model: str, usd: float, pool: str = "on-demand") -> None:
    answer = api.client.put(f"/v1/prices/{model}", json={"usd_per_gpu_hour": usd, "pool": pool}, headers=api.as_admin())
    assert answer.status_code == 200, answer.text


def run_for(api: Api, loop: Loop, hours: float, secret: str | None = None, **spec: Any) -> str:
    job = submit(api, secret or api.team_a, **spec)
    loop.start(job["id"])
    api.clock.t += hours * HOUR
    loop.finish(job["id"])
    return str(job["id"])


def test_a_job_costs_its_gpu_hours_at_the_price_in_force_when_it_started(api: Api) -> None:
    set_price(api, "A100-80GB", 3.0)
    loop = Loop(api)
    job = submit(api, api.team_a, gpus=2, gpu_models=["A100-80GB"])
    loop.start(job["id"])
    set_price(api, "A100-80GB", 100.0)  # a later price applies to later attempts only
    api.clock.t += 1.5 * HOUR
    loop.finish(job["id"])
    cost = api.client.get(f"/v1/jobs/{job['id']}/cost", headers=api.h(api.team_a)).json()
    assert cost["gpu_hours"] == pytest.approx(3.0)
    assert cost["usd"] == pytest.approx(9.0)
    assert cost["used_usd"] == pytest.approx(9.0)
    assert cost["reserved_idle_usd"] == 0.0
    assert [(line["model"], line["pool"]) for line in cost["lines"]] == [("A100-80GB", "on-demand")]
    # another team's job answers as missing
    assert_error(api.client.get(f"/v1/jobs/{job['id']}/cost", headers=api.h(api.team_b)), 404)


def test_an_unpriced_model_is_counted_not_billed_and_the_report_says_so(api: Api) -> None:
    loop = Loop(api)
    run_for(api, loop, 2.0, gpus=1, gpu_models=["H100"])
    report = api.client.get("/v1/reports/cost", params={"since": 0}, headers=api.as_admin()).json()
    assert report["total"]["usd"] == 0.0
    assert report["total"]["unpriced_gpu_hours"] == pytest.approx(2.0)
    assert any("no price" in note for note in report["notes"])


def test_cost_report_groups_by_queue_user_model_and_pool(api: Api) -> None:
    set_price(api, "A100-80GB", 2.0)
    set_price(api, "H100", 5.0)
    loop = Loop(api)
    run_for(api, loop, 1.0, gpus=2, gpu_models=["A100-80GB"])
    run_for(api, loop, 2.0, api.team_b, gpus=1, gpu_models=["H100"])
    since = {"since": 0}
    by_queue = api.client.get("/v1/reports/cost", params=since, headers=api.as_admin()).json()
    assert {g["key"]: g["usd"] for g in by_queue["groups"]} == {"team-a": pytest.approx(4.0), "team-b": 10.0}
    assert by_queue["total"]["usd"] == pytest.approx(14.0)
    by_model = api.client.get("/v1/reports/cost", params={**since, "by": "model"}, headers=api.as_admin()).json()
    assert [g["key"] for g in by_model["groups"]] == ["H100", "A100-80GB"]  # largest cost first
    by_user = api.client.get("/v1/reports/cost", params={**since, "by": "user"}, headers=api.as_admin()).json()
    assert {g["key"] for g in by_user["groups"]} == {"alice", "bob"}
    by_pool = api.client.get("/v1/reports/cost", params={**since, "by": "pool"}, headers=api.as_admin()).json()
    assert [g["key"] for g in by_pool["groups"]] == ["on-demand"]
    # a team token sees its own queue only
    mine = api.client.get("/v1/reports/cost", params=since, headers=api.h(api.team_b)).json()
    assert [g["key"] for g in mine["groups"]] == ["team-b"]
    # the window clips: the last half hour of team-b's job only
    end = api.clock.t
    window = {"since": end - 0.5 * HOUR, "until": end}
    clipped = api.client.get("/v1/reports/cost", params=window, headers=api.as_admin()).json()
    assert clipped["total"]["usd"] == pytest.approx(2.5)


def test_prices_import_from_the_gcp_catalog_with_the_host_vm_share(api: Api) -> None:
    body = {
        "csv": (price_tables() / "gcp_gpu_prices_us.csv").read_text(),
        "source": "SkyPilot GCP catalog (Apache-2.0)",
    }
    answer = api.client.post("/v1/prices/import", json=body, headers=api.as_admin())
    assert answer.status_code == 200, answer.text
    prices = {
        (p["model"], p["pool"]): p["usd_per_gpu_hour"]
        for p in api.client.get("/v1/prices", headers=api.h(api.team_a)).json()["prices"]
    }
    # a2-highgpu: 2.93391 (GPU) + 5.91582 / 8 (host VM) = 3.673 $/h, the README's worked figure
    assert prices[("A100", "on-demand")] == pytest.approx(2.93391 + 5.91582 / 8)
    assert prices[("T4", "spot")] == pytest.approx(0.14)  # no host VM family: the accelerator alone
    assert ("B200", "spot") not in prices  # the catalog has no spot offer
    # a bad file changes nothing and says what was wrong
    before = api.client.get("/v1/prices", headers=api.as_admin()).json()
    bad = api.client.post(
        "/v1/prices/import", json={"csv": "model,pool,usd_per_gpu_hour\nA100,spot,cheap\n"}, headers=api.as_admin()
    )
    body_out = assert_error(bad, 422, "invalid")
    assert "line 2" in body_out["message"]
    assert "usd_per_gpu_hour" in body_out["message"]
    assert api.client.get("/v1/prices", headers=api.as_admin()).json() == before
    # only admins set prices
    assert_error(api.client.put("/v1/prices/A100", json={"usd_per_gpu_hour": 1.0}, headers=api.h(api.team_a)), 403)


def budget(api: Api, queue: str, **body: Any) -> dict[str, Any]:
    answer = api.client.put(f"/v1/queues/{queue}/budget", json=body, headers=api.as_admin())
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def check(api: Api) -> dict[str, dict[str, Any]]:
    answer = api.client.post("/v1/budgets/check", headers=api.as_admin())
    assert answer.status_code == 200, answer.text
    return {b["queue"]: b for b in answer.json()["budgets"]}


def test_budget_notice_at_80_percent_and_block_at_100_percent(api: Api) -> None:
    set_price(api, "A100-80GB", 10.0)
    loop = Loop(api)
    shown = budget(api, "team-a", amount=100.0, action="block")
    assert shown["level"] == "ok"
    assert shown["spent"] == 0.0
    run_for(api, loop, 0.85, gpus=1, gpu_models=["A100-80GB"])  # 10 $/h x 0.85 h = $8.50 of $100
    assert check(api)["team-a"]["level"] == "ok"
    run_for(api, loop, 7.5, gpus=1, gpu_models=["A100-80GB"])  # + $75 = $83.50: 84 %
    status = check(api)["team-a"]
    assert status["level"] == "notice"
    assert status["fraction"] == pytest.approx(0.835)
    queues = {q["name"]: q for q in api.client.get("/v1/queues", headers=api.as_admin()).json()["queues"]}
    assert queues["team-a"]["budget"]["level"] == "notice"
    assert queues["team-b"]["budget"] is None
    events = api.client.get("/v1/audit", headers=api.as_admin()).json()["entries"]
    assert any(e["action"] == "budget.notice" and e["target"] == "team-a" for e in events)
    submit(api, api.team_a)  # a notice does not block
    running = submit(api, api.team_a, gpus=1, gpu_models=["A100-80GB"])
    loop.start(running["id"])
    api.clock.t += 2 * HOUR  # + $20 while running: $103.50
    assert check(api)["team-a"]["level"] == "exceeded"
    refused = assert_error(api.client.post("/v1/jobs", json={"command": ["true"]}, headers=api.h(api.team_a)), 409)
    assert refused["code"] == "limit_reached"
    assert "budget" in refused["message"]
    assert "the budget resets 1970-02-01 00:00 UTC" in refused["message"]
    record = api.store.get(running["id"])
    assert record is not None
    assert record.state is JobState.RUNNING
    submit(api, api.team_b)  # other queues are not
    # raising the budget lifts the block at once
    budget(api, "team-a", amount=1000.0, action="block")
    submit(api, api.team_a)


def test_budget_warn_never_refuses(api: Api) -> None:
    set_price(api, "A100-80GB", 10.0)
    loop = Loop(api)
    budget(api, "team-a", amount=5.0, action="warn")
    run_for(api, loop, 1.0, gpus=1, gpu_models=["A100-80GB"])
    assert check(api)["team-a"]["level"] == "exceeded"
    submit(api, api.team_a)


def test_budget_in_gpu_hours_counts_unpriced_models_too(api: Api) -> None:
    loop = Loop(api)
    budget(api, "team-a", amount=2.0, unit="gpu-hours", action="block")
    run_for(api, loop, 1.0, gpus=2, gpu_models=["H100"])
    assert check(api)["team-a"]["level"] == "exceeded"
    assert_error(api.client.post("/v1/jobs", json={"command": ["true"]}, headers=api.h(api.team_a)), 409)
    answer = api.client.delete("/v1/queues/team-a/budget", headers=api.as_admin())
    assert answer.status_code == 204
    submit(api, api.team_a)


def test_deprioritised_queue_reaches_the_scheduler_as_data(api: Api) -> None:
    set_price(api, "A100-80GB", 10.0)
    loop = Loop(api)
    budget(api, "team-a", amount=5.0, action="deprioritise")
    assert not {q.name: q for q in api.store.queues()}["team-a"].deprioritised
    run_for(api, loop, 1.0, gpus=1, gpu_models=["A100-80GB"])
    assert check(api)["team-a"]["level"] == "exceeded"
    queues = {q.name: q for q in api.store.queues()}
    assert queues["team-a"].deprioritised
    assert not queues["team-b"].deprioritised
    submit(api, api.team_a)  # deprioritise does not refuse submissions
    api.client.delete("/v1/queues/team-a/budget", headers=api.as_admin())
    assert not {q.name: q for q in api.store.queues()}["team-a"].deprioritised


def test_budget_input_errors_are_clear(api: Api) -> None:
    assert_error(api.client.put("/v1/queues/team-a/budget", json={"amount": -1}, headers=api.as_admin()), 422)
    assert_error(
        api.client.put("/v1/queues/team-a/budget", json={"amount": 1, "action": "shout"}, headers=api.as_admin()), 422
    )
    assert_error(api.client.put("/v1/queues/nope/budget", json={"amount": 1}, headers=api.as_admin()), 404)
    assert_error(api.client.put("/v1/queues/team-a/budget", json={"amount": 1}, headers=api.h(api.team_a)), 403)
    assert_error(api.client.delete("/v1/queues/team-b/budget", headers=api.as_admin()), 404)


def test_a_spot_node_bills_at_the_spot_price_and_the_nodes_list_says_its_pool(api: Api) -> None:
    nodes = [dataclasses.replace(n, pool="spot") if n.name == "node-h" else n for n in api.store.nodes()]
    api.store.set_nodes(nodes)
    set_price(api, "H100", 5.0)
    set_price(api, "H100", 2.0, pool="spot")
    loop = Loop(api)
    run_for(api, loop, 1.0, gpus=2, gpu_models=["H100"], spot="allowed")
    by_pool = api.client.get("/v1/reports/cost", params={"since": 0, "by": "pool"}, headers=api.as_admin()).json()
    assert [(g["key"], g["usd"]) for g in by_pool["groups"]] == [("spot", pytest.approx(4.0))]
    listed = {n["name"]: n["pool"] for n in api.client.get("/v1/nodes", headers=api.as_admin()).json()["nodes"]}
    assert listed == {"node-a": "on-demand", "node-h": "spot"}
