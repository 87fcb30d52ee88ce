"""The CLI against a real uvicorn server on loopback: every client command end to end, errors without tracebacks."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from typer.testing import CliRunner

from gpufleet.adapters.local.isolation import IsolationReport
from gpufleet.cli.main import app
from gpufleet.domain.errors import GpufleetError
from gpufleet.ports import RequestKind
from gpufleet.ports.admin import Role
from gpufleet.server.auth import bootstrap_admin, create_token
from gpufleet.server.context import ApiContext
from gpufleet.server.http_app import create_app
from tests.server.conftest import StepClock, make_store
from tests.server.test_api import run_on


@dataclass
class Live:
    url: str
    admin: str
    team: str
    ctx: ApiContext
    runner: CliRunner

    @property
    def store(self):  # the helpers of test_api read `.store`
        return self.ctx.store

    def cli(self, *args: str, token: str | None = None, code: int = 0) -> str:
        result = self.runner.invoke(app, [*args, "--url", self.url, "--token", token or self.admin])
        assert result.exit_code == code, (result.output, result.exception)
        assert "Traceback" not in result.output
        return result.output


@pytest.fixture
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Live]:
    monkeypatch.setenv("GPUFLEET_CLIENT_CONFIG", str(tmp_path / "client.toml"))
    monkeypatch.delenv("GPUFLEET_URL", raising=False)
    monkeypatch.delenv("GPUFLEET_TOKEN", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    store = make_store(tmp_path)
    clock = StepClock()
    admin = bootstrap_admin(store, clock)
    assert admin is not None
    _, team = create_token(store, clock, "alice", Role.TEAM, "team-a")
    ctx = ApiContext(store=store, clock=clock, emulated=True, inventory_source="emulated: test")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(ctx), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield Live(f"http://127.0.0.1:{port}", admin, team, ctx, CliRunner())
    server.should_exit = True
    thread.join(10)
    sock.close()
    store.close()


def test_submit_jobs_show_explain_cancel(live: Live, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: train\ncommand: [python, train.py]\ngpus: 1\ngpu_models: A100-80GB\nmemory: 8GiB\n")
    out = live.cli("submit", str(spec), token=live.team)
    job_id = out.split()[1]
    assert out.strip() == f"submitted {job_id} to queue team-a"
    listed = json.loads(live.cli("jobs", "--json", token=live.team))
    assert [(j["id"], j["name"], j["state"]) for j in listed] == [(job_id, "train", "pending")]
    table = live.cli("jobs", token=live.team)
    assert job_id in table
    assert "pending" in table
    assert json.loads(live.cli("show", job_id, "--json"))["request"]["memory"] == 8 * 1024**3
    assert "A100-80GB" in live.cli("show", job_id)
    explained = live.cli("explain", job_id, token=live.team)
    assert "position 1 in queue team-a" in explained
    assert "quota gpu: 0 used of 4 nominal (GPUs)" in explained
    assert "cancel requested" in live.cli("cancel", job_id, token=live.team)
    taken, _ = live.ctx.store.take_requests(0)
    assert [(r.job_id, r.kind) for r in taken] == [(job_id, RequestKind.CANCEL)]
    # --queue overrides the spec's queue; a team token may not leave its queue.
    out = live.runner.invoke(app, ["submit", str(spec), "--queue", "team-b", "--url", live.url, "--token", live.team])
    assert out.exit_code == 2
    assert "error: token 'alice' may submit only to queue 'team-a'" in out.output
    assert "to fix" in out.output
    assert "submitted" in live.cli("submit", str(spec), "--queue", "team-b")


def test_cli_errors_are_one_line_with_a_fix(live: Live, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("command: [x]\ngpus: 1.5\nenv: {CUDA_VISIBLE_DEVICES: '0'}\n")
    out = live.cli("submit", str(bad), code=2)
    assert out.startswith("error: invalid job spec")
    assert "gpus: is 1.5" in out
    assert "CUDA_VISIBLE_DEVICES" in out
    assert "error: " in live.cli("submit", str(tmp_path / "missing.yaml"), code=2)
    assert "no job 'j-00000000'" in live.cli("show", "j-00000000", code=2)
    assert "not valid (unknown or revoked)" in live.cli("jobs", token="gf_wrong", code=2)
    result = live.runner.invoke(app, ["jobs", "--url", "http://127.0.0.1:9", "--token", "x"])
    assert result.exit_code == 2
    assert "cannot reach the control plane at http://127.0.0.1:9; to fix: start it with `gpufleet up`" in result.output


def test_login_then_env_free_commands(live: Live, tmp_path: Path) -> None:
    out = live.runner.invoke(app, ["login", live.url, live.admin])
    assert out.exit_code == 0, out.output
    config = tmp_path / "client.toml"
    assert config.stat().st_mode & 0o777 == 0o600
    # No --url/--token: from the file.
    result = live.runner.invoke(app, ["queues", "--json"])
    assert result.exit_code == 0, result.output
    assert {q["name"] for q in json.loads(result.output)} == {"default", "team-a", "team-b"}
    # Environment beats the file.
    result = live.runner.invoke(app, ["queues"], env={"GPUFLEET_TOKEN": live.team})
    assert result.exit_code == 0
    assert "team-b" not in result.output


def test_admin_commands_quota_nodes_tokens(live: Live, tmp_path: Path) -> None:
    assert "queue team-c created" in live.cli(
        "quota", "set", "team-c", "--gpu", "8", "--gpu-model", "A100-80GB=4", "--cpu", "64", "--memory", "512GiB",
        "--borrowing-limit", "2", "--cohort", "lab", "--weight", "2",
    )  # fmt: skip
    live.cli("quota", "set", "team-c", "--gpu", "6")  # changes only the GPU nominal
    queue = next(q for q in json.loads(live.cli("queues", "--json")) if q["name"] == "team-c")
    assert queue["quotas"]["gpu"] == {"nominal": 6.0, "borrowing_limit": 2.0, "lending_limit": None}
    assert queue["quotas"]["gpu:A100-80GB"]["nominal"] == 4.0
    assert queue["quotas"]["memory"]["nominal"] == 512 * 1024**3
    assert (queue["cohort"], queue["weight"]) == ("lab", 2.0)
    assert "team-c" in live.cli("queues")
    assert "is not MODEL=N" in live.cli("quota", "set", "team-c", "--gpu-model", "A100", code=2)

    created = json.loads(live.cli("token", "create", "ci", "--role", "team", "--queue", "team-c", "--json"))
    assert created["secret"].startswith("gf_")
    assert "ci" in live.cli("token", "list")
    assert "revoked" in live.cli("token", "revoke", created["id"])
    assert "unknown or revoked" in live.cli("jobs", token=created["secret"], code=2)
    assert "needs an admin token" in live.cli("token", "list", token=live.team, code=2)

    job = json.loads(live.cli("submit", _spec_file(tmp_path), "--json", token=live.team))
    run_on_live(live, job["id"])
    nodes = live.cli("nodes")
    assert "node-a (emulated)" in nodes
    assert job["id"] in nodes
    assert "node-h cordoned" in live.cli("cordon", "node-h")
    assert "node-h uncordoned" in live.cli("uncordon", "node-h")
    assert f"1 job(s) asked to requeue: {job['id']}" in live.cli("drain", "node-a")
    assert "node-a (emulated) (cordoned)" in live.cli("nodes")
    assert "no node named 'node-z'" in live.cli("cordon", "node-z", code=2)


def test_logs_follow_until_the_job_ends(live: Live, tmp_path: Path) -> None:
    job = json.loads(live.cli("submit", _spec_file(tmp_path), "--json"))
    log = tmp_path / "attempt-1" / "worker-0.log"
    log.parent.mkdir()
    log.write_text("step 1\n")
    live.ctx.log_paths = lambda job_id: [log] if job_id == job["id"] else []
    run_on_live(live, job["id"])
    assert live.cli("logs", job["id"]) == "step 1\n"

    def finish_later() -> None:
        time.sleep(0.4)
        with log.open("a") as handle:
            handle.write("step 2\n")
        time.sleep(0.4)
        from tests.server.test_api import finish

        finish(live, job["id"])  # type: ignore[arg-type]

    writer = threading.Thread(target=finish_later)
    writer.start()
    assert live.cli("logs", job["id"], "-f") == "step 1\nstep 2\n"
    writer.join()


def _spec_file(folder: Path) -> str:
    path = folder / "sleep.yaml"
    path.write_text("command: [sleep, '1']\ngpus: 1\n")
    return str(path)


def run_on_live(live: Live, job_id: str) -> None:
    run_on(live, job_id)  # type: ignore[arg-type]


def test_login_keeps_the_token_in_a_private_file_in_a_private_folder(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "fresh" / "gpufleet" / "client.toml"
    monkeypatch.setenv("GPUFLEET_CLIENT_CONFIG", str(config))
    assert live.runner.invoke(app, ["login", live.url, live.admin]).exit_code == 0
    assert config.stat().st_mode & 0o777 == 0o600
    assert config.parent.stat().st_mode & 0o777 == 0o700  # the admin token's folder: not even listable by others


def test_quota_run_as_and_nodes_say_how_jobs_are_isolated(live: Live) -> None:
    def check(user: str) -> None:
        if user == "root":
            raise GpufleetError("user 'root' has root's uid 0", "map the queue to an unprivileged user")

    live.ctx.check_run_as = check
    live.ctx.isolation = IsolationReport("jobs run as their queue's own user", "cgroups v1: memory limits", False)
    assert "queue team-r created" in live.cli("quota", "set", "team-r", "--gpu", "2", "--run-as", "research")
    live.cli("quota", "set", "team-r", "--gpu", "3")  # keeps the mapping
    queue = next(q for q in json.loads(live.cli("queues", "--json")) if q["name"] == "team-r")
    assert queue["run_as"] == "research"
    assert "research" in live.cli("queues")
    out = live.cli("quota", "set", "team-r", "--run-as", "root", code=2)
    assert "run_as: user 'root' has root's uid 0; to fix: map the queue to an unprivileged user" in out
    assert "is not a user name" in live.cli("quota", "set", "team-r", "--run-as", "Bad Name", code=2)
    live.cli("quota", "set", "team-r", "--run-as", "")  # back to the queue's own user
    assert next(q for q in json.loads(live.cli("queues", "--json")) if q["name"] == "team-r")["run_as"] is None
    # Who mapped the queue to which OS user is in the audit log (the refused mappings changed nothing).
    mapped = [e for e in json.loads(live.cli("audit", "--json")) if e["target"] == "team-r"]
    assert [e["action"] for e in mapped] == ["queue.set"] * 3
    assert sum('"run_as": "research"' in e["detail"] for e in mapped) == 2
    nodes = live.cli("nodes")
    assert "jobs: jobs run as their queue's own user" in nodes
    assert "limits: cgroups v1: memory limits" in nodes
