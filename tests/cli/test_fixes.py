"""Small defects of the everyday verbs, each through the API on the real SQL store (and the real control loop
where jobs must be placed) or through the CLI against a real uvicorn server."""

from __future__ import annotations

import json

import httpx
import pytest

from gpufleet.cli.main import app
from tests.server.conftest import Api, api
from tests.server.test_api import finish, submit
from tests.server.test_cli_live import Live, live, run_on_live
from tests.server.test_cost_api import HOUR, Loop

__all__ = ["api", "live"]  # the fixtures, for pytest


def test_usage_and_cost_reports_count_the_same_gpu_hours_of_an_elastic_job(api: Api) -> None:
    loop = Loop(api)
    # At most 4 workers of 2 A100s; node-a has 4 of them, so it runs with 2 workers (4 GPUs).
    job = submit(api, api.team_a, gpus=2, workers=4, min_workers=2, gpu_models=["A100-80GB"])
    loop.start(job["id"])
    held = api.client.get(f"/v1/jobs/{job['id']}", headers=api.as_admin()).json()
    assert len(held["placement"]) == 2
    api.clock.t += 1.0 * HOUR
    loop.finish(job["id"])
    window = {"since": 0}
    usage = api.client.get("/v1/usage", params=window, headers=api.as_admin()).json()
    cost = api.client.get("/v1/reports/cost", params=window, headers=api.as_admin()).json()
    [used] = [q for q in usage["queues"] if q["queue"] == "team-a"]
    [costed] = [g for g in cost["groups"] if g["key"] == "team-a"]
    assert costed["gpu_hours"] == pytest.approx(4.0)
    assert used["allocated_gpu_hours"] == pytest.approx(costed["gpu_hours"])


def test_an_ended_jobs_summary_does_not_say_its_state_twice(api: Api) -> None:
    job = submit(api, api.team_a)
    assert api.client.post(f"/v1/jobs/{job['id']}/cancel", headers=api.as_admin()).status_code == 202
    Loop(api).reconciler.step()
    why = api.client.get(f"/v1/jobs/{job['id']}/explain", headers=api.as_admin()).json()
    assert why["state"] == "cancelled"
    assert why["reason"].startswith("cancelled: by ")
    assert why["summary"] == "cancelled: " + why["reason"].removeprefix("cancelled: ")
    assert "cancelled: cancelled" not in why["summary"]


def _submit_stdin(live: Live, body: dict[str, object]) -> dict[str, object]:
    """`gpufleet submit -` with the spec (JSON is YAML) on stdin."""
    result = live.runner.invoke(
        app, ["submit", "-", "--json", "--url", live.url, "--token", live.admin], input=json.dumps(body)
    )
    assert result.exit_code == 0, result.output
    created: dict[str, object] = json.loads(result.output)
    return created


def test_jobs_shows_the_workers_an_elastic_job_holds_of_its_most(live: Live) -> None:
    created = _submit_stdin(live, {"command": ["sleep", "1"], "gpus": 1, "workers": 4, "min_workers": 1})
    job_id = str(created["id"])
    run_on_live(live, job_id)  # one worker placed
    row = next(line for line in live.cli("jobs").splitlines() if job_id in line)
    assert " 1/4 " in f" {row} "
    assert live.cli("jobs", "--format", "id,workers", "--no-header").split() == [job_id, "1/4"]


def test_nodes_remove_forgets_a_node_and_is_refused_while_it_holds_jobs(live: Live) -> None:
    job_id = str(_submit_stdin(live, {"command": ["sleep", "1"], "gpus": 1})["id"])
    run_on_live(live, job_id)  # on node-a
    refused = live.cli("nodes", "remove", "node-a", code=2)
    assert f"error: node 'node-a' holds 1 job(s): {job_id}" in refused
    assert "to fix: drain it first (`gpufleet drain node-a`)" in refused
    assert "admin" in live.cli("nodes", "remove", "node-h", token=live.team, code=2)
    assert live.cli("nodes", "remove", "node-h") == "node node-h removed\n"
    assert [n["name"] for n in json.loads(live.cli("nodes", "--json"))] == ["node-a"]
    assert "node-h" not in live.cli("nodes")
    info = httpx.get(f"{live.url}/v1/info", headers={"Authorization": f"Bearer {live.admin}"}).json()
    assert (info["nodes"], info["gpus"], info["gpus_by_model"]) == (1, 4, {"A100-80GB": 4})
    assert "no node named 'node-h'" in live.cli("nodes", "remove", "node-h", code=2)
    finish(live, job_id)  # type: ignore[arg-type]
    assert live.cli("nodes", "remove", "node-a") == "node node-a removed\n"
    assert json.loads(live.cli("nodes", "--json")) == []


def test_explain_says_why_an_elastic_job_has_not_grown(live: Live) -> None:
    job_id = str(_submit_stdin(live, {"command": ["sleep", "1"], "gpus": 1, "workers": 4, "min_workers": 1})["id"])
    run_on_live(live, job_id)  # one worker of at most 4
    live.ctx.policy = "fifo"
    words = json.loads(live.cli("explain", job_id, "--json"))["elastic"]
    assert words.startswith("elastic: holds 1 of at most 4 workers, and stays so: the 'fifo' scheduling profile")
    live.ctx.policy = "default"
    shown = live.cli("explain", job_id)
    assert "elastic: holds 1 of at most 4 workers; the 'default' profile's resize policy (goodput)" in shown
    rigid = str(_submit_stdin(live, {"command": ["sleep", "1"], "gpus": 1})["id"])
    run_on_live(live, rigid)
    assert json.loads(live.cli("explain", rigid, "--json"))["elastic"] is None
