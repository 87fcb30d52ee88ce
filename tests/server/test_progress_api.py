"""The progress-report endpoint on the real SQL store: job tokens (scoped to one job and attempt, useless
elsewhere, dead when the attempt ends), bad input refused whole, and the history users read back."""

from __future__ import annotations

from typing import Any

from gpufleet.server.job_tokens import JobTokens
from tests.server.conftest import Api
from tests.server.test_api import assert_error, finish, run_on, submit


def job_token(api: Api, job_id: str, attempt: int = 1) -> dict[str, str]:
    return api.h(JobTokens(api.store).token(job_id, attempt))


def post(api: Api, job_id: str, reports: Any, headers: dict[str, str]) -> Any:
    return api.client.post(f"/v1/jobs/{job_id}/reports", json={"reports": reports}, headers=headers)


def running_job(api: Api) -> tuple[Any, dict[str, str]]:
    """A two-GPU job of team A, running, and the headers that carry its report token."""
    job = submit(api, api.team_a, gpus=2)
    run_on(api, job["id"], gpus=(0, 1))
    return job, job_token(api, job["id"])


def test_a_running_job_reports_and_its_team_reads_throughput_loss_and_checkpoint(api: Api) -> None:
    job, token = running_job(api)
    first = [
        {"kind": "progress", "at": 900.0, "step": 0, "samples": 0, "loss": 4.0},
        {"kind": "progress", "at": 910.0, "step": 10, "samples": 640, "loss": 3.0, "grad_sqr": 2.0, "lr": 0.1},
    ]
    assert post(api, job["id"], first, token).status_code == 202
    second = [
        {"kind": "progress", "at": 920.0, "step": 20, "samples": 1280, "loss": 2.5, "grad_var": 0.5},
        {"kind": "checkpoint", "at": 925.0, "duration_s": 4.5},
    ]
    assert post(api, job["id"], second, token).json() == {"accepted": 2, "reports": 4}
    got = api.client.get(f"/v1/jobs/{job['id']}/progress", headers=api.h(api.team_a))
    assert got.status_code == 200, got.text
    body = got.json()
    # Measured on the model its GPUs are.
    measured = {"gpus": 2, "model": "A100-80GB", "samples": 1280.0, "seconds": 20.0, "reports": 2}
    unplaced = {"nodes": None, "steps": None, "batch": None}  # its reports did not say where it ran
    assert body["throughput"] == [{**measured, "samples_per_s": 64.0, **unplaced}]
    assert body["loss_curve"] == [[0.0, 4.0], [640.0, 3.0], [1280.0, 2.5]]
    assert (body["step"], body["samples"], body["loss"]) == (20, 1280.0, 2.5)
    assert (body["grad_sqr"], body["grad_var"], body["metrics"]) == (2.0, 0.5, {"lr": 0.1})
    assert (body["last_checkpoint_at"], body["checkpoint_duration_s"], body["checkpoints"]) == (925.0, 4.5, 1)
    assert body["sizes"] == [[900.0, 2]]
    # Another team does not learn the job exists; the admin sees it.
    assert_error(api.client.get(f"/v1/jobs/{job['id']}/progress", headers=api.h(api.team_b)), 404)
    assert api.client.get(f"/v1/jobs/{job['id']}/progress", headers=api.as_admin()).status_code == 200


def test_only_the_jobs_own_token_of_its_current_attempt_is_accepted(api: Api) -> None:
    job = submit(api, api.team_a)
    other = submit(api, api.team_a)
    run_on(api, job["id"])
    run_on(api, other["id"], gpus=(1,))
    report = [{"kind": "progress", "samples": 1, "loss": 1.0}]
    assert_error(post(api, job["id"], report, {}), 401, "unauthorized")
    # The API's own tokens are not job tokens, and a job token opens nothing but its job's reports.
    assert_error(post(api, job["id"], report, api.as_admin()), 401)
    assert_error(post(api, job["id"], report, api.h(api.team_a)), 401)
    assert_error(post(api, job["id"], report, job_token(api, other["id"])), 401)
    assert_error(post(api, job["id"], report, job_token(api, job["id"], attempt=2)), 401)
    forged = JobTokens(api.store).token(job["id"], 1)[:-4] + "0000"
    assert_error(post(api, job["id"], report, api.h(forged)), 401)
    assert_error(api.client.get("/v1/jobs", headers=job_token(api, job["id"])), 401)
    assert_error(api.client.get(f"/v1/jobs/{job['id']}", headers=job_token(api, job["id"])), 401)
    assert_error(api.client.get(f"/v1/jobs/{job['id']}/progress", headers=job_token(api, job["id"])), 401)
    assert post(api, job["id"], report, job_token(api, job["id"])).status_code == 202
    # The attempt ends: its token dies with it.
    finish(api, job["id"])
    body = assert_error(post(api, job["id"], report, job_token(api, job["id"])), 401)
    assert "has ended" in body["message"]


def test_a_retried_job_gets_a_new_token_and_the_old_one_is_refused(api: Api) -> None:
    job = submit(api, api.team_a)
    run_on(api, job["id"])
    record = api.store.get(job["id"])
    assert record is not None
    again = record.evolve(attempt=2, reason="retried")
    api.store.write([(record.version, again)], [])
    report = [{"kind": "progress", "samples": 1, "loss": 1.0}]
    assert_error(post(api, job["id"], report, job_token(api, job["id"], attempt=1)), 401)
    assert post(api, job["id"], report, job_token(api, job["id"], attempt=2)).status_code == 202


def test_bad_reports_name_every_field_and_keep_nothing(api: Api) -> None:
    job = submit(api, api.team_a)
    run_on(api, job["id"])
    token = job_token(api, job["id"])
    bad = [
        {"kind": "progress", "samples": -1, "loss": "low", "step": 1.5},
        {"kind": "checkpoint"},
        {"kind": "teleport"},
        {"kind": "progress", "samples": 10, "not a name": 1},
        "text",
    ]
    body = assert_error(post(api, job["id"], bad, token), 422, "invalid")
    fields = {f["field"] for f in body["fields"]}
    assert {"reports[0].samples", "reports[0].loss", "reports[0].step", "reports[1].duration_s"} <= fields
    assert {"reports[2].kind", "reports[3].not a name", "reports[4]"} <= fields
    assert all(f["fix"] for f in body["fields"])
    for payload in (b"{not json", b"[1, 2]", b'{"reports": []}'):
        response = api.client.post(f"/v1/jobs/{job['id']}/reports", content=payload, headers=token)
        assert_error(response, 422)
    assert_error(api.client.get(f"/v1/jobs/{job['id']}/progress", headers=api.h(api.team_a)), 404)
    # A bad body without a token is refused for the token first: nothing about the job is parsed.
    assert_error(api.client.post(f"/v1/jobs/{job['id']}/reports", content=b"{", headers={}), 401)


def test_a_job_that_says_its_batch_and_placement_is_measured_per_placement_and_batch(api: Api) -> None:
    job, token = running_job(api)
    how = {"batch": 64, "min_batch": 32, "max_batch": 512, "max_local_batch": 128, "gpus": 2, "nodes": 1}
    reports = [
        {"kind": "progress", "at": 900.0, "step": 0, "samples": 0, **how},
        {"kind": "progress", "at": 910.0, "step": 50, "samples": 3200, **how},
    ]
    assert post(api, job["id"], reports, token).status_code == 202
    body = api.client.get(f"/v1/jobs/{job['id']}/progress", headers=api.h(api.team_a)).json()
    assert (body["batch"], body["min_batch"], body["max_batch"], body["nodes"]) == (64.0, 32.0, 512.0, 1)
    [entry] = body["throughput"]
    assert (entry["gpus"], entry["nodes"], entry["steps"], entry["batch"]) == (2, 1, 50.0, 64.0)
    assert entry["samples_per_s"] == 320.0


def test_bad_batch_or_placement_is_refused_with_the_field_and_a_fix(api: Api) -> None:
    job, token = running_job(api)
    bad = [
        {"kind": "progress", "samples": 10, "batch": 0, "nodes": 0, "gpus": 1.5},
        {"kind": "progress", "samples": 10, "gpus": 2, "nodes": 3},
        {"kind": "progress", "samples": 10, "min_batch": 64, "max_batch": 32},
        {"kind": "progress", "samples": 10, "batch": 16, "min_batch": 32, "max_batch": 64},
    ]
    body = assert_error(post(api, job["id"], bad, token), 422, "invalid")
    fields = {f["field"]: f for f in body["fields"]}
    assert {"reports[0].batch", "reports[0].nodes", "reports[0].gpus", "reports[1].nodes"} <= set(fields)
    assert {"reports[2].min_batch", "reports[3].batch"} <= set(fields)
    assert "one node per GPU" in fields["reports[1].nodes"]["fix"]
    assert all(f["fix"] for f in body["fields"])
    assert_error(api.client.get(f"/v1/jobs/{job['id']}/progress", headers=api.h(api.team_a)), 404)


def test_a_job_that_floods_reports_gets_429_and_other_jobs_carry_on(api: Api) -> None:
    import warnings

    from gpufleet.server.http_app import create_app
    from gpufleet.server.ratelimit import Rate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    flood, calm = submit(api, api.team_a), submit(api, api.team_a)
    run_on(api, flood["id"])
    run_on(api, calm["id"], gpus=(1,))
    api.ctx.team_rate = Rate(2.0, 3.0)
    report = {"reports": [{"kind": "progress", "samples": 1}]}
    with TestClient(create_app(api.ctx), raise_server_exceptions=False) as client:
        url = f"/v1/jobs/{flood['id']}/reports"
        answers = [client.post(url, json=report, headers=job_token(api, flood["id"])).status_code for _ in range(4)]
        assert answers == [202, 202, 202, 429]
        other = client.post(f"/v1/jobs/{calm['id']}/reports", json=report, headers=job_token(api, calm["id"]))
        assert other.status_code == 202
