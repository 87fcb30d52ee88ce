"""What guards the API beyond tokens: grace-period caps, pending caps, rate limits, the body cap, idempotent
submits, force-cancel, the audit log, backups and the metrics token. The real SQL store behind the app."""

from __future__ import annotations

import re
import sqlite3
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from gpufleet.ports import RequestKind
from gpufleet.ports.admin import Role
from gpufleet.server.auth import create_token
from gpufleet.server.http_app import create_app
from gpufleet.server.ratelimit import Rate
from tests.server.conftest import Api
from tests.server.test_api import JOB, assert_error, requests, run_on, submit


def audit(api: Api) -> list[tuple[str, str, str, str]]:
    return [(e.actor, e.action, e.target, e.outcome) for e in api.store.audit_log()]


# --------------------------------------------------------------------------------------- grace period


def test_grace_period_is_capped_at_one_hour_unless_the_queue_allows_more(api: Api) -> None:
    body = assert_error(
        api.client.post("/v1/jobs", json={**JOB, "grace_period": "2h"}, headers=api.h(api.team_a)), 422, "invalid"
    )
    assert body["fields"][0]["field"] == "grace_period"
    assert "above the maximum of 1h" in body["fields"][0]["problem"]
    assert "quota set team-a --max-grace" in body["fields"][0]["fix"]
    for absurd in ("1000000d", 1e300, "1e300"):
        refused = api.client.post("/v1/jobs", json={**JOB, "grace_period": absurd}, headers=api.h(api.team_a))
        assert assert_error(refused, 422)["fields"][0]["field"] == "grace_period"
    # An admin raises team-a's maximum; the same job is accepted there, and only there.
    queue = api.client.put("/v1/queues/team-a", json={"quotas": {"gpu": 4}, "max_grace": "3h"}, headers=api.as_admin())
    assert queue.status_code == 200, queue.text
    assert queue.json()["max_grace"] == 10800
    assert submit(api, api.team_a, grace_period="2h")["run"]["grace_period"] == 7200
    assert api.client.post("/v1/jobs", json={**JOB, "grace_period": "2h"}, headers=api.h(api.team_b)).status_code == 422
    too_long = api.client.put("/v1/queues/team-a", json={"max_grace": "30d"}, headers=api.as_admin())
    assert assert_error(too_long, 422)["fields"][0]["field"] == "max_grace"


# --------------------------------------------------------------------------------------- pending cap


def test_a_queue_capped_at_n_pending_jobs_refuses_the_next_with_409(api: Api) -> None:
    api.client.put("/v1/queues/team-a", json={"quotas": {"gpu": 4}, "max_pending": 2}, headers=api.as_admin())
    first, second = submit(api, api.team_a), submit(api, api.team_a)
    body = assert_error(api.client.post("/v1/jobs", json=JOB, headers=api.h(api.team_a)), 409, "limit_reached")
    assert "already has 2 pending jobs" in body["message"]
    assert "quota set team-a --max-pending" in body["message"]
    submit(api, api.team_b)  # other queues are not affected
    run_on(api, first["id"])  # one starts: room for one more
    submit(api, api.team_a)
    assert second["id"] != first["id"]
    listed = api.client.get("/v1/queues", headers=api.as_admin()).json()["queues"]
    assert next(q for q in listed if q["name"] == "team-a")["max_pending"] == 2


# --------------------------------------------------------------------------------------- rate limits


@pytest.fixture
def strict(api: Api) -> Iterator[tuple[Api, TestClient]]:
    """The same store and tokens behind an app whose team tokens get 2 requests a second, 3 at once."""
    api.ctx.team_rate = Rate(2.0, 3.0)
    with TestClient(create_app(api.ctx), raise_server_exceptions=False) as client:
        yield api, client


def test_a_team_token_beyond_its_rate_gets_429_with_retry_after_and_others_carry_on(
    strict: tuple[Api, TestClient],
) -> None:
    api, client = strict
    answers = [client.get("/v1/queues", headers=api.h(api.team_a)).status_code for _ in range(4)]
    assert answers == [200, 200, 200, 429]
    refused = client.get("/v1/queues", headers=api.h(api.team_a))
    body = assert_error(refused, 429, "rate_limited")
    assert refused.headers["Retry-After"] == "1"
    assert "more than 2 requests a second" in body["message"]
    assert client.get("/v1/queues", headers=api.h(api.team_b)).status_code == 200  # per token
    assert client.get("/v1/queues", headers=api.as_admin()).status_code == 200


def test_guessing_tokens_is_limited_per_address(api: Api) -> None:
    answers = [api.client.get("/v1/info", headers=api.h(f"gf_guess{i}")).status_code for i in range(200)]
    assert set(answers[:100]) == {401}  # a burst of 100 failures, then 10 a second
    assert answers.count(429) >= 50
    assert api.client.get("/v1/info", headers=api.as_admin()).status_code == 200  # a valid token is not held back


# --------------------------------------------------------------------------------------- body cap


def test_a_body_over_one_mib_is_refused_with_413_before_it_is_parsed(api: Api) -> None:
    big = {**JOB, "env": {"X": "y" * (2 << 20)}}
    refused = api.client.post("/v1/jobs", json=big, headers=api.h(api.team_a))
    body = assert_error(refused, 413, "body_too_large")
    assert "larger than 1024 KiB" in body["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"command": ["x"], "name": "'
        for _ in range(300):
            yield b"z" * 4096
        yield b'"}'

    streamed = api.client.post(
        "/v1/jobs", content=chunks(), headers={**api.h(api.team_a), "Content-Type": "application/json"}
    )
    assert_error(streamed, 413, "body_too_large")
    assert api.client.get("/v1/jobs", headers=api.as_admin()).json()["jobs"] == []


# --------------------------------------------------------------------------------------- idempotency


def test_a_retried_submit_with_its_key_returns_the_first_job(api: Api) -> None:
    key = {"Idempotency-Key": "9b2f3f1e-7d7e-4f53-a0f5-1b8f0c3f8f11"}
    first = api.client.post("/v1/jobs", json=JOB, headers={**api.h(api.team_a), **key})
    assert first.status_code == 201
    again = api.client.post("/v1/jobs", json={**JOB}, headers={**api.h(api.team_a), **key})
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    other = api.client.post("/v1/jobs", json={**JOB, "gpus": 2}, headers={**api.h(api.team_a), **key})
    body = assert_error(other, 422, "invalid")
    assert body["fields"][0]["field"] == "Idempotency-Key"
    # Keys are per token: the same key from another team makes its own job.
    theirs = api.client.post("/v1/jobs", json=JOB, headers={**api.h(api.team_b), **key})
    assert theirs.status_code == 201
    assert len(api.client.get("/v1/jobs", headers=api.as_admin()).json()["jobs"]) == 2
    bad = api.client.post("/v1/jobs", json=JOB, headers={**api.h(api.team_a), "Idempotency-Key": "x" * 300})
    assert "Idempotency-Key" in assert_error(bad, 422)["message"]


# --------------------------------------------------------------------------------------- force-cancel


def test_force_cancel_is_a_request_of_its_own_kind_and_is_audited(api: Api) -> None:
    job = submit(api, api.team_a, grace_period="1h")
    run_on(api, job["id"])
    answer = api.client.post(f"/v1/jobs/{job['id']}/cancel?force=true", headers=api.h(api.team_a))
    assert answer.status_code == 202
    assert "SIGKILL" in answer.json()["message"]
    assert requests(api) == [(job["id"], RequestKind.FORCE_CANCEL)]
    assert audit(api) == [("alice", "job.force_cancel", job["id"], "ok")]
    # Another team cannot even see it.
    assert_error(api.client.post(f"/v1/jobs/{job['id']}/cancel?force=true", headers=api.h(api.team_b)), 404)


# --------------------------------------------------------------------------------------- audit log


def test_admin_actions_are_audited_with_who_what_and_from_where_and_denials_too(api: Api) -> None:
    admin = api.as_admin()
    api.client.put("/v1/queues/team-c", json={"quotas": {"gpu": 2}}, headers=admin)
    made = api.client.post("/v1/tokens", json={"name": "carol", "role": "team", "queue": "team-c"}, headers=admin)
    api.client.delete(f"/v1/tokens/{made.json()['id']}", headers=admin)
    api.client.post("/v1/nodes/node-a/cordon", headers=admin)
    api.client.post("/v1/nodes/node-a/uncordon", headers=admin)
    api.client.post("/v1/nodes/node-h/drain", headers=admin)
    api.client.delete("/v1/queues/team-c", headers=admin)
    assert (
        api.client.put("/v1/queues/team-a", json={"quotas": {"gpu": 99}}, headers=api.h(api.team_a)).status_code == 403
    )
    assert [(a, t, o) for _, a, t, o in audit(api)] == [
        ("queue.set", "team-c", "ok"),
        ("token.create", made.json()["id"], "ok"),
        ("token.revoke", made.json()["id"], "ok"),
        ("node.cordon", "node-a", "ok"),
        ("node.uncordon", "node-a", "ok"),
        ("node.drain", "node-h", "ok"),
        ("queue.delete", "team-c", "ok"),
        ("queue.set", "team-a", "denied"),
    ]
    entries = api.client.get("/v1/audit", headers=admin).json()["entries"]
    assert {e["actor"] for e in entries} == {"admin", "alice"}
    assert {e["source"] for e in entries} == {"testclient"}  # the client's address
    assert '"queue": "team-c"' in entries[1]["detail"]
    assert [e["action"] for e in api.client.get("/v1/audit?since=1000&limit=2", headers=admin).json()["entries"]] == [
        "queue.delete",
        "queue.set",
    ]
    assert_error(api.client.get("/v1/audit", headers=api.h(api.team_a)), 403)


# --------------------------------------------------------------------------------------- backup


def test_an_admin_downloads_a_whole_backup_and_a_team_cannot(api: Api, tmp_path: Path) -> None:
    submit(api, api.team_a, name="kept")
    answer = api.client.post("/v1/backup", headers=api.as_admin())
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/vnd.sqlite3"
    copy = tmp_path / "copy.db"
    copy.write_bytes(answer.content)
    connection = sqlite3.connect(copy)
    try:
        assert connection.execute("PRAGMA quick_check").fetchone() == ("ok",)
        assert connection.execute("SELECT name FROM jobs").fetchall() == [("kept",)]
    finally:
        connection.close()
    assert_error(api.client.post("/v1/backup", headers=api.h(api.team_a)), 403)
    assert [(a, o) for _, a, _, o in audit(api)] == [("store.backup", "ok"), ("store.backup", "denied")]


# --------------------------------------------------------------------------------------- metrics token


def test_metrics_need_a_metrics_or_admin_token(api: Api) -> None:
    api.ctx.metrics = lambda: (b"# metrics\n", "text/plain; version=0.0.4")
    _, scraper = create_token(api.store, api.clock, "prometheus", Role.METRICS, None)
    api.ctx.metrics_need_token = False  # `up --public-metrics`
    with TestClient(create_app(api.ctx), raise_server_exceptions=False) as client:
        assert client.get("/metrics").status_code == 200
    api.ctx.metrics_need_token = True  # the default, on loopback too
    with TestClient(create_app(api.ctx), raise_server_exceptions=False) as client:
        refused = client.get("/metrics")
        body = assert_error(refused, 401, "unauthorized")
        assert "--role metrics" in body["message"]
        assert "--public-metrics" in body["message"]
        assert "credentials_file" in body["message"]
        assert_error(client.get("/metrics", headers=api.h(api.team_a)), 403)
        assert client.get("/metrics", headers=api.h(scraper)).text == "# metrics\n"
        assert client.get("/metrics", headers=api.as_admin()).status_code == 200
        # A metrics token opens nothing else.
        body = assert_error(client.get("/v1/jobs", headers=api.h(scraper)), 403)
        assert "may only scrape /metrics" in body["message"]
    made = api.client.post("/v1/tokens", json={"name": "prom2", "role": "metrics"}, headers=api.as_admin())
    assert made.json()["role"] == "metrics"
    queued = api.client.post(
        "/v1/tokens", json={"name": "prom3", "role": "metrics", "queue": "team-a"}, headers=api.as_admin()
    )
    assert assert_error(queued, 422)["fields"][0]["field"] == "queue"


def test_a_metrics_token_cannot_sign_in_to_the_dashboard(api: Api) -> None:
    """The web pages use the same service as the API: a metrics token must not see jobs through them either."""
    _, scraper = create_token(api.store, api.clock, "prometheus", Role.METRICS, None)
    form = api.client.get("/signin")
    nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
    assert nonce is not None
    answer = api.client.post(
        "/signin",
        data={"token": scraper, "nonce": nonce.group(1)},
        headers={"Origin": "http://testserver"},
        follow_redirects=False,
    )
    assert answer.status_code == 403
    assert "a metrics token only reads /metrics" in answer.text
    assert "gpufleet_session=" not in answer.headers.get("set-cookie", "")
    assert api.client.get("/jobs", follow_redirects=False).status_code == 303
