"""Bad input at every boundary of the API, tried one by one against the real app and SQL store: each must get
a clear 4xx (a message with its fix, naming the field when there is one), never a 5xx, and never be accepted.

The catalogue is also the measurement the hardening is reported with: the test prints one JSON line with
how many inputs were tried, answered with a clear 4xx, answered 5xx, or wrongly accepted (run with -s)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tests.server.conftest import Api

JOB: dict[str, Any] = {"name": "train", "command": ["python", "train.py"], "gpus": 1}
HUGE = int("9" * 400)  # 400 digits


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    body: Any = None  # JSON
    raw: bytes | None = None  # a body sent as is
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    who: str = "team"  # team, admin
    names: str | None = None  # the field the answer must name
    status: int | None = None  # when one status is required (413, 429, …)


def job(**changes: Any) -> dict[str, Any]:
    return {**JOB, **changes}


CASES = [
    # --- numbers in a job spec
    Case("gpus 1e30", "POST", "/v1/jobs", job(gpus=1e30), names="gpus"),
    Case("gpus -1", "POST", "/v1/jobs", job(gpus=-1), names="gpus"),
    Case("gpus true", "POST", "/v1/jobs", job(gpus=True), names="gpus"),
    Case("gpus NaN", "POST", "/v1/jobs", raw=b'{"command": ["x"], "gpus": NaN}', names="gpus"),
    Case("gpus Infinity", "POST", "/v1/jobs", raw=b'{"command": ["x"], "gpus": Infinity}', names="gpus"),
    Case("gpus 1.5", "POST", "/v1/jobs", job(gpus=1.5), names="gpus"),
    Case("gpus 0.0001", "POST", "/v1/jobs", job(gpus=0.0001), names="gpus"),
    Case("gpus 400 digits", "POST", "/v1/jobs", job(gpus=HUGE), names="gpus"),
    Case("cpu 1e30", "POST", "/v1/jobs", job(cpu=1e30), names="cpu"),
    Case("cpu -1", "POST", "/v1/jobs", job(cpu=-1), names="cpu"),
    Case("cpu true", "POST", "/v1/jobs", job(cpu=True), names="cpu"),
    Case("memory 10**30", "POST", "/v1/jobs", job(memory=10**30), names="memory"),
    Case("memory 400 digits", "POST", "/v1/jobs", job(memory=HUGE), names="memory"),
    Case("gpu_memory 400 digits", "POST", "/v1/jobs", job(gpu_memory=HUGE), names="gpu_memory"),
    Case("memory 400-digit string", "POST", "/v1/jobs", job(memory="9" * 400 + "GiB"), names="memory"),
    Case("memory 1e400GiB", "POST", "/v1/jobs", job(memory="1e400GiB"), names="memory"),
    Case("memory true", "POST", "/v1/jobs", job(memory=True), names="memory"),
    Case("memory -5", "POST", "/v1/jobs", job(memory=-5), names="memory"),
    Case("memory 5 parsecs", "POST", "/v1/jobs", job(memory="5 parsecs"), names="memory"),
    Case("workers 0", "POST", "/v1/jobs", job(workers=0), names="workers"),
    Case("workers 10**6", "POST", "/v1/jobs", job(workers=10**6), names="workers"),
    Case("workers true", "POST", "/v1/jobs", job(workers=True), names="workers"),
    Case("min_workers > workers", "POST", "/v1/jobs", job(workers=2, min_workers=3), names="min_workers"),
    Case("priority 10**30", "POST", "/v1/jobs", job(priority=10**30), names="priority"),
    Case("priority 1.5", "POST", "/v1/jobs", job(priority=1.5), names="priority"),
    Case("retries -1", "POST", "/v1/jobs", job(retries=-1), names="retries"),
    Case("retries 10**9", "POST", "/v1/jobs", job(retries=10**9), names="retries"),
    # --- durations
    Case("grace_period 1000000d", "POST", "/v1/jobs", job(grace_period="1000000d"), names="grace_period"),
    Case("grace_period 1e300", "POST", "/v1/jobs", job(grace_period=1e300), names="grace_period"),
    Case("grace_period 400 digits", "POST", "/v1/jobs", job(grace_period=HUGE), names="grace_period"),
    Case("grace_period 2h (cap 1h)", "POST", "/v1/jobs", job(grace_period="2h"), names="grace_period"),
    Case("grace_period -5", "POST", "/v1/jobs", job(grace_period=-5), names="grace_period"),
    Case("grace_period true", "POST", "/v1/jobs", job(grace_period=True), names="grace_period"),
    Case("grace_period soon", "POST", "/v1/jobs", job(grace_period="soon"), names="grace_period"),
    Case("max_runtime 100000d", "POST", "/v1/jobs", job(max_runtime="100000d"), names="max_runtime"),
    Case("checkpoint_interval 1e300", "POST", "/v1/jobs", job(checkpoint_interval=1e300), names="checkpoint_interval"),
    Case("expected_duration 1e999", "POST", "/v1/jobs", job(expected_duration="1e999"), names="expected_duration"),
    # --- strings and collections
    Case("gpu_models empty string", "POST", "/v1/jobs", job(gpu_models=""), names="gpu_models"),
    Case('gpu_models [""]', "POST", "/v1/jobs", job(gpu_models=[""]), names="gpu_models"),
    Case(
        "gpu_models 1000 names", "POST", "/v1/jobs", job(gpu_models=[f"M{i}" for i in range(1000)]), names="gpu_models"
    ),
    Case("command of 10 MB", "POST", "/v1/jobs", job(command=["echo", "x" * 10_000_000]), status=413),
    Case("command argument of 300 KB", "POST", "/v1/jobs", job(command=["echo", "x" * 300_000]), names="command"),
    Case("command of 5000 arguments", "POST", "/v1/jobs", job(command=["x"] * 5000), names="command"),
    Case("command empty", "POST", "/v1/jobs", job(command=[]), names="command"),
    Case("command blank string", "POST", "/v1/jobs", job(command="   "), names="command"),
    Case("100,000 env vars", "POST", "/v1/jobs", job(env={f"V{i}": "1" for i in range(100_000)}), status=413),
    Case("2000 env vars", "POST", "/v1/jobs", job(env={f"V{i}": "1" for i in range(2000)}), names="env"),
    Case("env value of 100 KB", "POST", "/v1/jobs", job(env={"BIG": "x" * 100_000}), names="env"),
    Case("env name 1BAD", "POST", "/v1/jobs", job(env={"1BAD": "x"}), names="env"),
    Case("env sets CUDA_VISIBLE_DEVICES", "POST", "/v1/jobs", job(env={"CUDA_VISIBLE_DEVICES": "0"}), names="env"),
    Case("env value a list", "POST", "/v1/jobs", job(env={"A": [1, 2]}), names="env"),
    Case("name of 10,000 characters", "POST", "/v1/jobs", job(name="n" * 10_000), names="name"),
    Case("name with a terminal escape", "POST", "/v1/jobs", job(name="\x1b[2Jx"), names="name"),
    Case("name with a NUL", "POST", "/v1/jobs", job(name="a\x00b")),
    Case("workdir of 10,000 characters", "POST", "/v1/jobs", job(workdir="w" * 10_000), names="workdir"),
    Case("checkpoint_signal SIGFOO", "POST", "/v1/jobs", job(checkpoint_signal="SIGFOO"), names="checkpoint_signal"),
    Case("unknown field gpu", "POST", "/v1/jobs", job(gpu=1), names="gpu"),
    Case("queue of another team", "POST", "/v1/jobs", job(queue="team-b")),
    Case("queue that does not exist", "POST", "/v1/jobs", job(queue="nope"), who="admin"),
    # --- bodies
    Case("body not JSON", "POST", "/v1/jobs", raw=b"{not json"),
    Case("body a JSON list", "POST", "/v1/jobs", body=[1, 2]),
    Case(
        "body of 2 MB", "POST", "/v1/jobs", raw=b'{"command": ["x"], "name": "' + b"y" * 2_000_000 + b'"}', status=413
    ),
    Case("body nested 100,000 deep", "POST", "/v1/jobs", raw=b"[" * 100_000 + b"]" * 100_000),
    # --- query, path and headers
    Case("before_seq of 25 digits", "GET", "/v1/jobs", params={"before_seq": "9" * 25}, names="before_seq"),
    Case("before_seq -1", "GET", "/v1/jobs", params={"before_seq": -1}, names="before_seq"),
    Case("limit 0", "GET", "/v1/jobs", params={"limit": 0}, names="limit"),
    Case("limit 10**6", "GET", "/v1/jobs", params={"limit": 10**6}, names="limit"),
    Case("state bogus", "GET", "/v1/jobs", params={"state": "bogus"}, names="state"),
    Case("logs offset 10**30", "GET", "/v1/jobs/j-1/logs", params={"offset": 10**30}, names="offset"),
    Case("logs worker -1", "GET", "/v1/jobs/j-1/logs", params={"worker": -1}, names="worker"),
    Case("usage since 1e400", "GET", "/v1/usage", params={"since": "1e400"}, names="since"),
    Case("usage since nan", "GET", "/v1/usage", params={"since": "nan"}, names="since"),
    Case("snapshot since_s 1e400", "GET", "/v1/snapshot", params={"since_s": "1e400"}, who="admin", names="since_s"),
    Case("audit limit 0", "GET", "/v1/audit", params={"limit": 0}, who="admin", names="limit"),
    Case("job id of 300 characters", "GET", "/v1/jobs/" + "j" * 300, names="job_id"),
    Case("job id with %00", "GET", "/v1/jobs/j-%00x", names="job_id"),
    Case(
        "Idempotency-Key of 300 characters",
        "POST",
        "/v1/jobs",
        JOB,
        headers={"Idempotency-Key": "k" * 300},
        names="Idempotency-Key",
    ),
    Case(
        "Idempotency-Key with a space",
        "POST",
        "/v1/jobs",
        JOB,
        headers={"Idempotency-Key": "a b"},
        names="Idempotency-Key",
    ),
    Case("Authorization of 10 KB", "GET", "/v1/info", headers={"Authorization": "Bearer " + "x" * 10_000}, who=""),
    Case("Authorization Basic", "GET", "/v1/info", headers={"Authorization": "Basic dXNlcjpwdw=="}, who=""),
    # --- admin input
    Case("quota gpu 1e30", "PUT", "/v1/queues/q1", {"quotas": {"gpu": 1e30}}, who="admin", names="quotas.gpu"),
    Case("quota gpu 400 digits", "PUT", "/v1/queues/q1", {"quotas": {"gpu": HUGE}}, who="admin", names="quotas.gpu"),
    Case("quota memory 10**30", "PUT", "/v1/queues/q1", {"quotas": {"memory": 10**30}}, who="admin", names="memory"),
    Case("quota memory '1e30'", "PUT", "/v1/queues/q1", {"quotas": {"memory": "1e30"}}, who="admin", names="memory"),
    Case("quota cpu -5", "PUT", "/v1/queues/q1", {"quotas": {"cpu": -5}}, who="admin", names="quotas.cpu"),
    Case("quota cpu 'lots'", "PUT", "/v1/queues/q1", {"quotas": {"cpu": "lots"}}, who="admin", names="quotas.cpu"),
    Case("quota key bogus", "PUT", "/v1/queues/q1", {"quotas": {"bogus": 1}}, who="admin", names="bogus"),
    Case(
        "quota of 1000 keys",
        "PUT",
        "/v1/queues/q1",
        {"quotas": {f"gpu:M{i}": 1 for i in range(1000)}},
        who="admin",
        names="quotas",
    ),
    Case(
        "lending above nominal",
        "PUT",
        "/v1/queues/q1",
        {"quotas": {"gpu": {"nominal": 1, "lending_limit": 5}}},
        who="admin",
        names="lending_limit",
    ),
    Case("weight 1e308", "PUT", "/v1/queues/q1", {"weight": 1e308}, who="admin", names="weight"),
    Case("weight 0", "PUT", "/v1/queues/q1", {"weight": 0}, who="admin", names="weight"),
    Case("weight true", "PUT", "/v1/queues/q1", {"weight": True}, who="admin", names="weight"),
    Case("quota gpu true", "PUT", "/v1/queues/q1", {"quotas": {"gpu": True}}, who="admin", names="quotas"),
    Case("cohort 'bad name!'", "PUT", "/v1/queues/q1", {"cohort": "bad name!"}, who="admin", names="cohort"),
    Case("max_pending -1", "PUT", "/v1/queues/q1", {"max_pending": -1}, who="admin", names="max_pending"),
    Case("max_pending 10**20", "PUT", "/v1/queues/q1", {"max_pending": 10**20}, who="admin", names="max_pending"),
    Case("max_grace 30d", "PUT", "/v1/queues/q1", {"max_grace": "30d"}, who="admin", names="max_grace"),
    Case("queue name of 100 characters", "PUT", "/v1/queues/" + "q" * 100, {}, who="admin", names="name"),
    Case("queue change by a team", "PUT", "/v1/queues/team-a", {"quotas": {"gpu": 99}}),
    Case("token name of 10 KB", "POST", "/v1/tokens", {"name": "t" * 10_000}, who="admin", names="name"),
    Case("token role root", "POST", "/v1/tokens", {"name": "x", "role": "root"}, who="admin", names="role"),
    Case(
        "token name with an escape",
        "POST",
        "/v1/tokens",
        {"name": "\x1b[2J", "role": "team", "queue": "team-a"},
        who="admin",
        names="name",
    ),
    Case(
        "admin token with a queue",
        "POST",
        "/v1/tokens",
        {"name": "x", "role": "admin", "queue": "team-a"},
        who="admin",
        names="queue",
    ),
    Case("idle policy bogus", "PUT", "/v1/queues/team-a/idle-policy", {"policy": "bogus"}, who="admin", names="policy"),
    Case("cancel force=maybe", "POST", "/v1/jobs/j-1/cancel", params={"force": "maybe"}, names="force"),
]


def clear(answer: Any, case: Case) -> str | None:
    """Why a 4xx answer is not clear enough (None: it is)."""
    try:
        body = answer.json()
    except ValueError:
        return "not JSON"
    if set(body) != {"code", "message", "fields"}:
        return f"not the error shape: {sorted(body)}"
    fixed = "to fix" in body["message"] or any(f.get("fix") for f in body["fields"])
    if not fixed:
        return f"no fix: {body['message'][:200]}"
    if case.names is not None:
        named = [f["field"] for f in body["fields"]]
        if not any(case.names in f for f in named) and case.names not in body["message"]:
            return f"does not name {case.names!r}: fields {named}, message {body['message'][:200]}"
    if case.status is not None and answer.status_code != case.status:
        return f"status {answer.status_code}, wanted {case.status}"
    return None


def test_every_bad_input_gets_a_clear_4xx_and_nothing_is_stored(api: Api) -> None:
    tokens = {"team": api.team_a, "admin": api.admin}
    outcome: dict[str, list[str]] = {"clear_4xx": [], "unclear_4xx": [], "5xx": [], "accepted": []}
    problems: list[str] = []
    for case in CASES:
        headers = {**({"Authorization": f"Bearer {tokens[case.who]}"} if case.who else {}), **case.headers}
        if case.raw is not None:
            headers["Content-Type"] = "application/json"
        answer = api.client.request(
            case.method,
            case.path,
            json=case.body if case.raw is None and case.body is not None else None,
            content=case.raw,
            params=case.params,
            headers=headers,
        )
        if answer.status_code >= 500:
            outcome["5xx"].append(case.name)
            problems.append(f"{case.name}: {answer.status_code} {answer.text[:200]}")
        elif answer.status_code < 400:
            outcome["accepted"].append(case.name)
            problems.append(f"{case.name}: accepted ({answer.status_code})")
        elif (why := clear(answer, case)) is not None:
            outcome["unclear_4xx"].append(case.name)
            problems.append(f"{case.name}: {answer.status_code} {why}")
        else:
            outcome["clear_4xx"].append(case.name)
    print("bad-inputs:", json.dumps({"tried": len(CASES), **{k: len(v) for k, v in outcome.items()}}))
    assert problems == []
    # Nothing any of them asked for was stored.
    assert api.store.active() == []
    assert [q.name for q in api.store.queues()] == ["default", "team-a", "team-b"]
    assert {t.name for t in api.store.tokens()} == {"admin", "alice", "bob"}
