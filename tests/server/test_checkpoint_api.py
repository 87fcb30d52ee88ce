"""The checkpoint cost model over the HTTP API, on the real SQL store with the real control loop: a checkpoint a
job reports with its job token decides which job is preempted, the next start gets a Young/Daly interval that
the job view shows, and `/v1/reports/lost-work` prices the work preemptions and failures lost."""

from __future__ import annotations

import math

import pytest

from gpufleet.domain.checkpoints import DEFAULT_GPU_FAILURES_PER_HOUR
from gpufleet.domain.lifecycle import JobState
from tests.server.conftest import Api
from tests.server.test_api import assert_error, submit
from tests.server.test_cost_api import Loop, set_price
from tests.server.test_progress_api import job_token, post

HOUR = 3600.0


def state(api: Api, job_id: str) -> JobState:
    record = api.store.get(job_id)
    assert record is not None
    return record.state


def two_running(api: Api, loop: Loop) -> tuple[str, str]:
    first = submit(api, api.team_a, gpus=2, gpu_models=["A100-80GB"])["id"]
    second = submit(api, api.team_a, gpus=2, gpu_models=["A100-80GB"])["id"]
    loop.reconciler.step()
    for job_id in (first, second):
        loop.backend.started(job_id, api.clock.t)
    loop.reconciler.step()
    assert state(api, first) is JobState.RUNNING
    assert state(api, second) is JobState.RUNNING
    return first, second


@pytest.mark.parametrize("saver", [0, 1])
def test_the_job_that_reported_a_checkpoint_is_the_victim_and_the_rest_of_its_work_is_priced_as_lost(
    api: Api, saver: int
) -> None:
    set_price(api, "A100-80GB", 4.0)
    loop = Loop(api)
    jobs = two_running(api, loop)
    saved, other = jobs[saver], jobs[1 - saver]
    api.clock.t += 2 * HOUR
    at = api.clock.t - 0.5 * HOUR
    answer = post(api, saved, [{"kind": "checkpoint", "at": at, "duration_s": 40.0}], job_token(api, saved))
    assert answer.status_code == 202, answer.text
    loop.reconciler.step()
    shown = api.client.get(f"/v1/jobs/{saved}", headers=api.h(api.team_a)).json()
    assert shown["last_checkpoint_at"] == at
    submit(api, api.team_a, gpus=2, gpu_models=["A100-80GB"], priority=5)
    loop.reconciler.step()
    assert state(api, saved) is JobState.EVICTING
    assert state(api, other) is JobState.RUNNING
    loop.backend.stopped(saved, api.clock.t)
    loop.reconciler.step()
    report = api.client.get("/v1/reports/lost-work", params={"since": 0}, headers=api.as_admin()).json()
    [group] = report["groups"]
    assert group["key"] == "team-a"
    assert group["attempts"] == 1
    assert group["lost_hours"] == pytest.approx(0.5)
    assert group["gpu_hours"] == pytest.approx(1.0)  # half an hour of 2 GPUs
    assert group["usd"] == pytest.approx(4.0)
    assert group["gpu_hours_by_cause"] == {"preempted": pytest.approx(1.0)}
    by_user = api.client.get("/v1/reports/lost-work", params={"since": 0, "by": "user"}, headers=api.as_admin())
    assert [g["key"] for g in by_user.json()["groups"]] == ["alice"]
    # Team b sees none of team a's losses.
    theirs = api.client.get("/v1/reports/lost-work", params={"since": 0}, headers=api.h(api.team_b)).json()
    assert theirs["groups"] == []
    assert theirs["total"]["attempts"] == 0


def test_the_next_start_gets_the_young_daly_interval_and_the_job_view_says_from_what(api: Api) -> None:
    loop = Loop(api)
    job_id = submit(api, api.team_a, gpus=2, gpu_models=["A100-80GB"], retries=1)["id"]
    loop.start(job_id)
    shown = api.client.get(f"/v1/jobs/{job_id}", headers=api.h(api.team_a)).json()
    assert shown["checkpoint_plan"] is None  # no checkpoint reported yet
    post(api, job_id, [{"kind": "checkpoint", "duration_s": 25.0}], job_token(api, job_id))
    api.clock.t += 60.0
    loop.backend.exited(job_id, api.clock.t, code=1)  # a failure; retried
    loop.reconciler.step()
    loop.reconciler.step()
    assert state(api, job_id) is JobState.LAUNCHING  # its retry
    plan = api.client.get(f"/v1/jobs/{job_id}", headers=api.h(api.team_a)).json()["checkpoint_plan"]
    mtbf = HOUR / (4 * DEFAULT_GPU_FAILURES_PER_HOUR)  # node-a has 4 GPUs
    assert plan["cost_s"] == 25.0
    assert plan["mtbf_s"] == pytest.approx(mtbf)
    assert plan["interval_s"] == pytest.approx(math.sqrt(2 * 25.0 * mtbf))
    assert "Llama 3" in plan["mtbf_source"]
    assert loop.backend.launches[-1].checkpoint_interval_s == pytest.approx(plan["interval_s"])
    failed = api.client.get("/v1/reports/lost-work", params={"since": 0}, headers=api.as_admin()).json()
    assert failed["total"]["gpu_hours_by_cause"] == {"failed": pytest.approx(2 * 60.0 / HOUR)}
    assert failed["total"]["unpriced_gpu_hours"] == pytest.approx(2 * 60.0 / HOUR)


def test_a_lost_work_window_that_ends_before_it_starts_is_refused(api: Api) -> None:
    answer = api.client.get("/v1/reports/lost-work", params={"since": 100, "until": 50}, headers=api.as_admin())
    assert_error(answer, 422)
    assert_error(
        api.client.get("/v1/reports/lost-work", params={"since": 0, "by": "model"}, headers=api.as_admin()), 422
    )
