"""The HTTP API on the real SQL store: auth matrix, jobs, queues, nodes, tokens, and the error shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet.domain.cluster import GpuShare, WorkerPlacement
from gpufleet.domain.lifecycle import JobState, transition
from gpufleet.domain.resources import GiB
from gpufleet.ports import RequestKind
from tests.server.conftest import Api

JOB = {"name": "train", "command": ["python", "train.py"], "gpus": 1}


def assert_error(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"code", "message", "fields"}, body
    assert isinstance(body["message"], str)
    assert body["message"]
    assert all(set(f) == {"field", "problem", "fix"} for f in body["fields"])
    if code is not None:
        assert body["code"] == code
    return body


def submit(api: Api, secret: str, **changes: Any) -> dict[str, Any]:
    response = api.client.post("/v1/jobs", json={**JOB, **changes}, headers=api.h(secret))
    assert response.status_code == 201, response.text
    return response.json()


def run_on(api: Api, job_id: str, node: str = "node-a", gpus: tuple[int, ...] = (0,)) -> None:
    """What the loop would write when the job starts: pending -> admitted -> launching -> running."""
    record = api.store.get(job_id)
    assert record is not None
    workers = (WorkerPlacement(node, tuple(GpuShare(i) for i in gpus), 1000, GiB),)
    running = record.evolve(state=JobState.RUNNING, workers=workers, attempt=1, started_at=1.0, reason="started")
    steps = [(JobState.PENDING, JobState.ADMITTED), (JobState.ADMITTED, JobState.LAUNCHING)]
    steps.append((JobState.LAUNCHING, JobState.RUNNING))
    api.store.write([(record.version, running)], [transition(job_id, a, b, "test", 1.0) for a, b in steps])


def finish(api: Api, job_id: str, code: int = 0) -> None:
    record = api.store.get(job_id)
    assert record is not None
    target = JobState.SUCCEEDED if code == 0 else JobState.FAILED
    done = record.evolve(state=target, exit_code=code, finished_at=2.0, reason="exited")
    api.store.write([(record.version, done)], [transition(job_id, record.state, target, "exited", 2.0)])


def requests(api: Api) -> list[tuple[str, RequestKind]]:
    taken, _ = api.store.take_requests(0)
    return [(r.job_id, r.kind) for r in taken]


# ------------------------------------------------------------------------------------------- auth


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/info"),
        ("GET", "/v1/jobs"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs/j-1"),
        ("GET", "/v1/jobs/j-1/explain"),
        ("GET", "/v1/jobs/j-1/events"),
        ("GET", "/v1/jobs/j-1/logs"),
        ("POST", "/v1/jobs/j-1/cancel"),
        ("GET", "/v1/queues"),
        ("PUT", "/v1/queues/x"),
        ("DELETE", "/v1/queues/x"),
        ("GET", "/v1/nodes"),
        ("POST", "/v1/nodes/node-a/cordon"),
        ("POST", "/v1/nodes/node-a/drain"),
        ("GET", "/v1/tokens"),
        ("POST", "/v1/tokens"),
        ("DELETE", "/v1/tokens/t-1"),
    ],
)
def test_every_endpoint_but_health_needs_a_valid_token(api: Api, method: str, path: str) -> None:
    assert_error(api.client.request(method, path), 401, "unauthorized")
    bad = api.client.request(method, path, headers={"Authorization": "Bearer gf_not-a-token"})
    body = assert_error(bad, 401, "unauthorized")
    assert bad.headers["www-authenticate"] == "Bearer"
    assert "unknown or revoked" in body["message"]
    assert_error(api.client.request(method, path, headers={"Authorization": api.admin}), 401)
    assert api.client.get("/healthz").json()["status"] == "ok"


def test_team_token_sees_and_acts_on_its_queue_only(api: Api) -> None:
    mine = submit(api, api.team_a)
    assert mine["queue"] == "team-a"  # the token's queue when the spec names none
    theirs = submit(api, api.team_b)
    # Another team's job is missing, not forbidden: its existence is not leaked.
    for suffix in ("", "/explain", "/events", "/logs"):
        assert_error(api.client.get(f"/v1/jobs/{theirs['id']}{suffix}", headers=api.h(api.team_a)), 404, "not_found")
    assert_error(api.client.post(f"/v1/jobs/{theirs['id']}/cancel", headers=api.h(api.team_a)), 404)
    assert requests(api) == []
    listed = api.client.get("/v1/jobs", headers=api.h(api.team_a)).json()["jobs"]
    assert [j["id"] for j in listed] == [mine["id"]]
    body = assert_error(api.client.get("/v1/jobs?queue=team-b", headers=api.h(api.team_a)), 403, "forbidden")
    assert "team-a" in body["message"]
    wrong = api.client.post("/v1/jobs", json={**JOB, "queue": "team-b"}, headers=api.h(api.team_a))
    body = assert_error(wrong, 403, "forbidden")
    assert "only to queue 'team-a'" in body["message"]
    # Admin-only operations.
    for method, path, body_json in [
        ("PUT", "/v1/queues/team-a", {"quotas": {"gpu": 100}}),
        ("DELETE", "/v1/queues/default", None),
        ("POST", "/v1/nodes/node-a/cordon", None),
        ("POST", "/v1/nodes/node-a/drain", None),
        ("POST", "/v1/tokens", {"name": "x", "role": "admin"}),
        ("GET", "/v1/tokens", None),
        ("DELETE", "/v1/tokens/t-whatever", None),
    ]:
        answer = api.client.request(method, path, json=body_json, headers=api.h(api.team_a))
        assert "admin token" in assert_error(answer, 403, "forbidden")["message"]
    # Queues: a team sees its own; admin sees all.
    assert [q["name"] for q in api.client.get("/v1/queues", headers=api.h(api.team_a)).json()["queues"]] == ["team-a"]
    names = [q["name"] for q in api.client.get("/v1/queues", headers=api.as_admin()).json()["queues"]]
    assert names == ["default", "team-a", "team-b"]
    # Admin sees and cancels everything.
    assert api.client.get(f"/v1/jobs/{theirs['id']}", headers=api.as_admin()).status_code == 200
    assert api.client.post(f"/v1/jobs/{theirs['id']}/cancel", headers=api.as_admin()).status_code == 202


# ------------------------------------------------------------------------------------------- jobs


def test_submit_list_show_explain(api: Api) -> None:
    first = submit(api, api.team_a, gpus=0.5, gpu_memory="10GiB")
    second = submit(api, api.team_a, name="eval", priority=5)
    third = submit(api, api.team_a)
    assert len(api.wakes) == 3
    assert first["id"].startswith("j-")
    assert len(first["id"]) == 10
    assert len({first["id"], second["id"], third["id"]}) == 3
    assert first["request"]["gpus"] == 0.5
    assert first["request"]["gpu_memory"] == 10 * GiB
    assert first["state"] == "pending"
    assert first["submitted_at"] == 1000.0
    assert first["submit_seq"] < second["submit_seq"] < third["submit_seq"]

    shown = api.client.get(f"/v1/jobs/{first['id']}", headers=api.h(api.team_a)).json()
    assert shown == first

    page = api.client.get("/v1/jobs?limit=2", headers=api.as_admin()).json()
    assert [j["id"] for j in page["jobs"]] == [third["id"], second["id"]]
    rest = api.client.get(f"/v1/jobs?limit=2&before_seq={page['next_before_seq']}", headers=api.as_admin()).json()
    assert [j["id"] for j in rest["jobs"]] == [first["id"]]
    assert rest["next_before_seq"] is None
    named = api.client.get("/v1/jobs?name=eval", headers=api.as_admin()).json()["jobs"]
    assert [j["id"] for j in named] == [second["id"]]

    run_on(api, third["id"], gpus=(0, 1))
    running = api.client.get("/v1/jobs?state=running", headers=api.as_admin()).json()["jobs"]
    assert [j["id"] for j in running] == [third["id"]]
    both = api.client.get("/v1/jobs?state=running&state=pending", headers=api.as_admin()).json()["jobs"]
    assert len(both) == 3
    assert_error(api.client.get("/v1/jobs?state=sleeping", headers=api.as_admin()), 422, "invalid")
    assert_error(api.client.get("/v1/jobs?limit=0", headers=api.as_admin()), 422, "invalid")

    # Explain a waiting job: its place (priority first, then submission) and its queue's quota use.
    why = api.client.get(f"/v1/jobs/{first['id']}/explain", headers=api.h(api.team_a)).json()
    assert why["state"] == "pending"
    assert why["position"] == 2
    assert why["ahead"] == [second["id"]]
    gpu = next(q for q in why["quota"] if q["resource"] == "gpu")
    assert (gpu["used"], gpu["nominal"], gpu["unit"]) == (2.0, 4.0, "GPUs")
    assert "#2 in queue 'team-a'" in why["summary"]
    # ... and a running one: where it runs, and its history.
    why = api.client.get(f"/v1/jobs/{third['id']}/explain", headers=api.h(api.team_a)).json()
    assert why["position"] is None
    assert why["summary"].startswith("running on node-a")
    assert [w["node"] for w in why["placement"]] == ["node-a"]
    assert [g["model"] for g in why["placement"][0]["gpus"]] == ["A100-80GB", "A100-80GB"]
    events = api.client.get(f"/v1/jobs/{third['id']}/events", headers=api.h(api.team_a)).json()["events"]
    assert [(e["source"], e["target"]) for e in events] == [
        ("pending", "admitted"),
        ("admitted", "launching"),
        ("launching", "running"),
    ]
    finish(api, third["id"], code=3)
    why = api.client.get(f"/v1/jobs/{third['id']}/explain", headers=api.h(api.team_a)).json()
    assert why["summary"] == "failed with exit code 3: exited"


def test_submit_errors(api: Api) -> None:
    body = assert_error(
        api.client.post("/v1/jobs", json={**JOB, "gpuz": 2, "env": {"MASTER_PORT": "1"}}, headers=api.as_admin()),
        422,
        "invalid",
    )
    fields = {f["field"]: f for f in body["fields"]}
    assert "did you mean 'gpus'" in fields["gpuz"]["fix"]
    assert "read MASTER_PORT from the environment instead" in fields["env"]["fix"]
    body = assert_error(api.client.post("/v1/jobs", json={**JOB, "queue": "nope"}, headers=api.as_admin()), 404)
    assert "does not exist" in body["message"]
    assert "team-a" in body["message"]  # names the queues there are
    malformed = api.client.post(
        "/v1/jobs", content=b'{"command": [', headers={**api.as_admin(), "Content-Type": "application/json"}
    )
    assert "not valid JSON" in assert_error(malformed, 422, "malformed_json")["message"]
    assert_error(api.client.post("/v1/jobs", json=[1, 2], headers=api.as_admin()), 422)
    assert_error(api.client.post("/v1/jobs", json={**JOB, "gpus": 1.5}, headers=api.as_admin()), 422)
    # The domain's own checks come back per field too.
    body = assert_error(
        api.client.post("/v1/jobs", json={**JOB, "gpus": 0.5, "workers": 2}, headers=api.as_admin()), 422
    )
    assert [f["field"] for f in body["fields"]] == ["workers"]
    assert api.client.get("/v1/jobs", headers=api.as_admin()).json()["jobs"] == []  # nothing half-written
    assert_error(api.client.get("/v1/nope", headers=api.as_admin()), 404, "not_found")
    assert_error(api.client.delete("/v1/jobs", headers=api.as_admin()), 405, "method_not_allowed")


def test_cancel_records_a_request_and_refuses_finished_jobs(api: Api) -> None:
    job = submit(api, api.team_a)
    answer = api.client.post(f"/v1/jobs/{job['id']}/cancel", headers=api.h(api.team_a))
    assert answer.status_code == 202
    assert answer.json()["requested"] is True
    assert requests(api) == [(job["id"], RequestKind.CANCEL)]
    assert len(api.wakes) == 2
    # The loop does the transition; the API never writes job state.
    assert api.store.get(job["id"]).state is JobState.PENDING  # type: ignore[union-attr]
    done = submit(api, api.team_a)
    run_on(api, done["id"])
    finish(api, done["id"])
    body = assert_error(api.client.post(f"/v1/jobs/{done['id']}/cancel", headers=api.h(api.team_a)), 409, "conflict")
    assert "already succeeded" in body["message"]
    assert_error(api.client.post("/v1/jobs/j-00000000/cancel", headers=api.as_admin()), 404)


def test_logs_by_worker_and_attempt_with_offsets(api: Api, tmp_path: Path) -> None:
    job = submit(api, api.team_a, workers=2)
    assert_error(api.client.get(f"/v1/jobs/{job['id']}/logs", headers=api.as_admin()), 404, "not_found")
    files = []
    for attempt in (1, 2):
        for worker in (0, 1):
            path = tmp_path / job["id"] / f"attempt-{attempt}" / f"worker-{worker}.log"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"a{attempt} w{worker} line1\nline2\n")
            files.append(path)
    api.logs[job["id"]] = files
    run_on(api, job["id"])
    latest = api.client.get(f"/v1/jobs/{job['id']}/logs", headers=api.h(api.team_a)).json()
    assert (latest["attempt"], latest["worker"], latest["text"]) == (2, 0, "a2 w0 line1\nline2\n")
    assert latest["complete"] is False  # still running: more may come
    assert latest["available"] == [
        "attempt 1 worker 0",
        "attempt 1 worker 1",
        "attempt 2 worker 0",
        "attempt 2 worker 1",
    ]
    old = api.client.get(f"/v1/jobs/{job['id']}/logs?attempt=1&worker=1&offset=3", headers=api.h(api.team_a)).json()
    assert old["text"] == "w1 line1\nline2\n"
    assert old["complete"] is True  # an old attempt's log does not grow
    files[3].write_text("a2 w1 line1\nline2\nline3\n")
    seen = len("a2 w1 line1\nline2\n")
    follow = api.client.get(f"/v1/jobs/{job['id']}/logs?worker=1&offset={seen}", headers=api.h(api.team_a)).json()
    assert follow["text"] == "line3\n"
    assert follow["next_offset"] == len("a2 w1 line1\nline2\nline3\n")
    body = assert_error(api.client.get(f"/v1/jobs/{job['id']}/logs?worker=5", headers=api.as_admin()), 404)
    assert "attempt 2 worker 1" in body["message"]
    assert_error(api.client.get(f"/v1/jobs/{job['id']}/logs?offset=-1", headers=api.as_admin()), 422)


# ----------------------------------------------------------------------------------------- queues


def test_queue_quotas_round_trip_in_peoples_units(api: Api) -> None:
    body = {
        "quotas": {
            "gpu": 8,
            "gpu:A100-80GB": {"nominal": 4, "borrowing_limit": 2, "lending_limit": 1},
            "cpu": 64,
            "memory": "512GiB",
        },
        "cohort": "research",
        "weight": 2,
    }
    saved = api.client.put("/v1/queues/team-c", json=body, headers=api.as_admin())
    assert saved.status_code == 200, saved.text
    stored = next(q for q in api.store.queues() if q.name == "team-c")
    assert stored.quotas["gpu"].nominal == 8000
    assert stored.quotas["gpu:A100-80GB"].borrowing_limit == 2000
    assert stored.quotas["cpu"].nominal == 64_000
    assert stored.quotas["memory"].nominal == 512 * GiB
    listed = next(
        q for q in api.client.get("/v1/queues", headers=api.as_admin()).json()["queues"] if q["name"] == "team-c"
    )
    assert listed["quotas"] == {
        "cpu": {"nominal": 64.0, "borrowing_limit": None, "lending_limit": None},
        "gpu": {"nominal": 8.0, "borrowing_limit": None, "lending_limit": None},
        "gpu:A100-80GB": {"nominal": 4.0, "borrowing_limit": 2.0, "lending_limit": 1.0},
        "memory": {"nominal": float(512 * GiB), "borrowing_limit": None, "lending_limit": None},
    }
    assert (listed["cohort"], listed["weight"]) == ("research", 2.0)
    # Put back what was listed: the same queue.
    again = {"quotas": listed["quotas"], "cohort": "research", "weight": 2.0}
    assert api.client.put("/v1/queues/team-c", json=again, headers=api.as_admin()).json()["quotas"] == listed["quotas"]
    assert next(q for q in api.store.queues() if q.name == "team-c") == stored


def test_queue_usage_and_errors(api: Api) -> None:
    job = submit(api, api.team_a)
    submit(api, api.team_a)
    run_on(api, job["id"], gpus=(0, 1, 2))
    team_a = next(
        q for q in api.client.get("/v1/queues", headers=api.as_admin()).json()["queues"] if q["name"] == "team-a"
    )
    assert team_a["usage"] == {
        "running": 1,
        "pending": 1,
        "gpus": 3.0,
        "cpu": 1.0,
        "memory": GiB,
        "gpus_by_model": {"A100-80GB": 3.0},
    }
    body = assert_error(
        api.client.put(
            "/v1/queues/x",
            json={"quotas": {"gpus": 1, "memory": "lots", "cpu": {"nominal": -1}}},
            headers=api.as_admin(),
        ),
        422,
    )
    assert {f["field"] for f in body["fields"]} == {"quotas.gpus", "quotas.memory.nominal", "quotas.cpu.nominal"}
    body = assert_error(
        api.client.put(
            "/v1/queues/x", json={"quotas": {"gpu": {"nominal": 1, "lending_limit": 2}}}, headers=api.as_admin()
        ),
        422,
    )
    assert body["fields"][0]["field"] == "quotas.gpu.lending_limit"
    assert_error(api.client.put("/v1/queues/x", json={"weight": 0}, headers=api.as_admin()), 422)
    assert_error(api.client.put("/v1/queues/bad%20name", json={}, headers=api.as_admin()), 422)
    assert "x" not in {q.name for q in api.store.queues()}
    # Deleting a queue with jobs or tokens is a conflict; an empty one goes.
    body = assert_error(api.client.delete("/v1/queues/team-a", headers=api.as_admin()), 409, "conflict")
    assert "active" in body["message"]
    assert api.client.delete("/v1/queues/default", headers=api.as_admin()).status_code == 204
    assert_error(api.client.delete("/v1/queues/default", headers=api.as_admin()), 404)


# ------------------------------------------------------------------------------------------ nodes


def test_nodes_show_allocations_and_cordon_drain(api: Api) -> None:
    job = submit(api, api.team_a)
    pending = submit(api, api.team_a)
    run_on(api, job["id"], gpus=(1,))
    nodes = {n["name"]: n for n in api.client.get("/v1/nodes", headers=api.h(api.team_a)).json()["nodes"]}
    assert set(nodes) == {"node-a", "node-h"}
    a = nodes["node-a"]
    assert a["emulated"] is True
    assert [g["model"] for g in a["gpus"]] == ["A100-80GB"] * 4
    assert a["gpus"][1]["uuid"] == "GPU-node-a-1"
    assert a["gpus"][1]["jobs"] == [{"job_id": job["id"], "queue": "team-a", "fraction": 1.0, "memory": 0}]
    assert a["gpus"][1]["allocated"] == 1.0
    assert a["gpus"][0]["jobs"] == []
    assert (a["cpu_allocated"], a["memory_allocated"]) == (1.0, GiB)

    cordoned = api.client.post("/v1/nodes/node-h/cordon", headers=api.as_admin()).json()
    assert cordoned["cordoned"] is True
    assert next(n for n in api.store.nodes() if n.name == "node-h").cordoned
    assert api.client.post("/v1/nodes/node-h/uncordon", headers=api.as_admin()).json()["cordoned"] is False

    drained = api.client.post("/v1/nodes/node-a/drain", headers=api.as_admin()).json()
    assert drained["node"]["cordoned"] is True
    assert drained["requeued"] == [job["id"]]
    assert requests(api) == [(job["id"], RequestKind.REQUEUE)]
    assert pending["id"] not in drained["requeued"]
    assert_error(api.client.post("/v1/nodes/node-z/cordon", headers=api.as_admin()), 404, "not_found")


def test_info(api: Api) -> None:
    info = api.client.get("/v1/info", headers=api.h(api.team_a)).json()
    assert info["emulated"] is True
    assert info["inventory_source"] == "emulated: test"
    assert (info["nodes"], info["gpus"], info["gpus_by_model"]) == (2, 6, {"A100-80GB": 4, "H100": 2})
    assert (info["role"], info["queue"]) == ("team", "team-a")


# ----------------------------------------------------------------------------------------- tokens


def test_tokens_create_list_revoke(api: Api) -> None:
    created = api.client.post(
        "/v1/tokens", json={"name": "ci", "role": "team", "queue": "team-b"}, headers=api.as_admin()
    )
    assert created.status_code == 201
    token = created.json()
    assert token["secret"].startswith("gf_")
    assert len(token["secret"]) >= 40
    # The secret works, is shown once, and is not stored.
    assert api.client.get("/v1/info", headers=api.h(token["secret"])).json()["queue"] == "team-b"
    listed = api.client.get("/v1/tokens", headers=api.as_admin()).json()["tokens"]
    assert sorted(t["name"] for t in listed) == ["admin", "alice", "bob", "ci"]
    assert all("secret" not in t for t in listed)
    assert all(token["secret"] not in str(t) for t in api.store.tokens())
    # Revoked: refused at once.
    assert api.client.delete(f"/v1/tokens/{token['id']}", headers=api.as_admin()).json()["revoked"] is True
    assert_error(api.client.get("/v1/info", headers=api.h(token["secret"])), 401)
    assert_error(api.client.delete(f"/v1/tokens/{token['id']}", headers=api.as_admin()), 409)
    assert_error(api.client.delete("/v1/tokens/t-nothere", headers=api.as_admin()), 404)
    # Bad requests.
    assert_error(api.client.post("/v1/tokens", json={"name": "x", "role": "team"}, headers=api.as_admin()), 422)
    assert_error(api.client.post("/v1/tokens", json={"name": "x", "role": "root"}, headers=api.as_admin()), 422)
    assert_error(
        api.client.post("/v1/tokens", json={"name": "x", "role": "team", "queue": "nope"}, headers=api.as_admin()), 404
    )
    # The last admin token cannot be revoked.
    admin_id = next(t["id"] for t in listed if t["role"] == "admin")
    body = assert_error(api.client.delete(f"/v1/tokens/{admin_id}", headers=api.as_admin()), 409)
    assert "last admin token" in body["message"]


def test_bootstrap_admin_only_once(api: Api) -> None:
    from gpufleet.server.auth import bootstrap_admin

    assert bootstrap_admin(api.store, api.clock) is None
    assert [t.role.value for t in api.store.tokens()].count("admin") == 1
