"""A team's job against everything that is not its own, on a real `gpufleet up`: as root (each queue's jobs run
as their own user, in cgroups) and as an unprivileged user (one trust domain: team tokens refused unless
--single-user). The jobs are real processes and write what they found to files outside the data folder."""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.bench.api import LocalServer
from tests.kit.jobusers import (
    JOB_PYTHON,
    python_for_anyone,
    reachable_by_jobs,
    share,
    unprivileged_user,
    users_created_here,
)
from tests.server.live import alive

pytestmark = pytest.mark.slow

PROBE = r"""
import json, os, sys, time
out, mode, args = sys.argv[1], sys.argv[2], sys.argv[3:]

def write(data):
    with open(out + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(out + ".tmp", out)

if mode == "steal":  # read each path; report what the environment holds
    found = {}
    for path in args:
        try:
            with open(path, "rb") as f:
                data = f.read()
            found[path] = "read: " + data[:200].decode(errors="replace")
        except IsADirectoryError:
            found[path] = "read: " + ",".join(os.listdir(path))
        except PermissionError:
            found[path] = "denied"
        except FileNotFoundError:
            found[path] = "absent"
    write({"uid": os.getuid(), "env": dict(os.environ), "reads": found})
elif mode == "secret":  # hold a secret in its environment and its log, until told to end
    print("team-b log line: " + os.environ.get("B_SECRET", ""), flush=True)
    write({"pid": os.getpid(), "uid": os.getuid()})
    while not os.path.exists(args[0]):
        time.sleep(0.02)
elif mode == "escape":  # leave the session (double fork + setsid) holding the job's GPU, then wait
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            write({"escapee": os.getpid(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")})
            while True:
                time.sleep(0.05)
        os._exit(0)
    while True:
        time.sleep(0.05)
elif mode == "whoami":
    write({"uid": os.getuid(), "env": dict(os.environ)})
"""


def read_out(path: Path, timeout_s: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"the job wrote no {path.name} in {timeout_s} s")
        time.sleep(0.02)
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def wait_state(client: httpx.Client, job_id: str, *states: str, timeout_s: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in states:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job['state']}: {job['reason']}")
        time.sleep(0.05)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def team_token(admin: httpx.Client, queue: str) -> str:
    assert admin.put(f"/v1/queues/{queue}", json={"quotas": {"gpu": 4}}).status_code == 200
    made = admin.post("/v1/tokens", json={"name": f"{queue}-ci", "role": "team", "queue": queue})
    assert made.status_code == 201, made.text
    return str(made.json()["secret"])


def submit(client: httpx.Client, command: list[str], **spec: Any) -> str:
    response = client.post("/v1/jobs", json={"command": command, "gpus": 1, **spec})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    return reachable_by_jobs(tmp_path / "shared")


def test_a_team_job_reads_no_token_store_log_or_secret_that_is_not_its_own(tmp_path: Path, shared: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("per-queue users need a control plane running as root")
    program = share(shared / "probe.py", PROBE)
    # Where the operator's CLI keeps the admin token: a folder jobs could enter, so the file's own mode counts.
    config_dir = reachable_by_jobs(shared / "operator")
    config_dir.chmod(0o755)
    config = config_dir / "client.toml"
    data = tmp_path / "data"
    with users_created_here():
        server = LocalServer(
            data,
            env={"GPUFLEET_CLIENT_CONFIG": str(config), "OPERATOR_SECRET": "operator-only-secret"},
            log_path=tmp_path / "server.log",
        )
        try:
            with server.client() as admin:
                token_a, token_b = team_token(admin, "team-a"), team_token(admin, "team-b")
                health = admin.get("/healthz").json()
                nodes = admin.get("/v1/nodes").json()
            with httpx.Client(base_url=server.url, headers=bearer(token_b), timeout=30) as team_b:
                b_out, b_done = shared / "b.json", shared / "b.done"
                secret = [JOB_PYTHON, str(program), str(b_out), "secret", str(b_done)]
                b_job = submit(team_b, secret, env={"B_SECRET": "team-b-secret"}, queue="team-b")
                b_pid = read_out(b_out)["pid"]
                wait_state(team_b, b_job, "running")
            b_log = data / "jobs" / "logs" / b_job / "attempt-1" / "worker-0.log"
            targets = [
                str(config),  # the admin token
                str(data / "state.db"),  # every job's spec and environment, token hashes
                str(b_log),  # another team's log
                f"/proc/{b_pid}/environ",  # another team's environment
                str(data / "jobs" / "run" / b_job / "attempt-1" / "worker-0" / "spec.json"),
                str(data / "jobs" / "jobs" / b_job),  # where a job's working folder was before per-queue users
                str(Path("/var/lib/gpufleet-jobs/gpufleet-team-b/gpufleet-jobs") / b_job),  # where it is now
            ]
            with httpx.Client(base_url=server.url, headers=bearer(token_a), timeout=30) as team_a:
                a_out = shared / "a.json"
                a_job = submit(team_a, [JOB_PYTHON, str(program), str(a_out), "steal", *targets], queue="team-a")
                found = read_out(a_out)
                assert wait_state(team_a, a_job, "succeeded", "failed")["state"] == "succeeded"
            (b_done).touch()
            output = server.output()
        finally:
            server.stop()
        # Refused, or not there at all for the job: its /tmp is its own, other users' processes are hidden.
        assert set(found["reads"]) == set(targets), found["reads"]
        assert set(found["reads"].values()) <= {"denied", "absent"}, found["reads"]
        assert found["reads"][f"/proc/{b_pid}/environ"] == "absent", found["reads"]
        assert "OPERATOR_SECRET" not in found["env"]
        assert "operator-only-secret" not in json.dumps(found)
        assert "team-b-secret" not in json.dumps(found)
        assert found["uid"] == pwd.getpwnam("gpufleet-team-a").pw_uid != 0
    # The files themselves are private too (they would still be if a folder above opened up).
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE((data / "state.db").stat().st_mode) == 0o600
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert "team-b-secret" in b_log.read_text()  # what team-b's job printed is there, for team-b to read
    # Said at start, and to anyone who asks.
    assert "jobs: jobs run as their queue's own unprivileged user" in output
    assert "limits: cgroups v1" in output or "limits: cgroups v2" in output
    assert health["isolation"]["single_trust_domain"] is False
    assert health["isolation"]["team_tokens"] is True
    assert nodes["isolation"] == health["isolation"]


def test_cancel_kills_a_process_that_left_the_jobs_session_and_frees_its_gpu(tmp_path: Path, shared: Path) -> None:
    program = share(shared / "probe.py", PROBE)
    with users_created_here():
        server = LocalServer(tmp_path / "data", extra=("--emulate", "1xA100-80GB"), emulate=None)
        try:
            with server.client() as client:
                out = shared / "escape.json"
                job = submit(client, [JOB_PYTHON, str(program), str(out), "escape"], queue="default")
                escapee = read_out(out)["escapee"]
                wait_state(client, job, "running")
                assert client.post(f"/v1/jobs/{job}/cancel").status_code == 202
                wait_state(client, job, "cancelled")
                # The GPU is shown free at once; nothing of the job may still hold it.
                gpu = client.get("/v1/nodes").json()["nodes"][0]["gpus"][0]
                assert gpu["jobs"] == []
                deadline = time.monotonic() + 2.0
                while alive(escapee) and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert not alive(escapee), "a process of the cancelled job survived, holding its GPU"
        finally:
            server.stop()


def test_a_queue_mapped_to_a_user_runs_as_it_and_root_cannot_be_mapped(tmp_path: Path, shared: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mapping queues to users needs a control plane running as root")
    program = share(shared / "probe.py", PROBE)
    with unprivileged_user("gft-research", shared / "research-home") as user, users_created_here():
        server = LocalServer(tmp_path / "data", log_path=tmp_path / "server.log")
        try:
            with server.client() as admin:
                put = admin.put("/v1/queues/research", json={"run_as": user.pw_name})
                assert put.status_code == 200, put.text
                assert put.json()["run_as"] == user.pw_name
                refused = admin.put("/v1/queues/ops", json={"run_as": "root"})
                assert refused.status_code == 422
                assert refused.json()["fields"][0]["field"] == "run_as"
                assert "root's uid 0" in refused.json()["fields"][0]["problem"]
                bad = admin.put("/v1/queues/ops", json={"run_as": "Not A User"})
                assert bad.status_code == 422
                assert bad.json()["fields"][0]["field"] == "run_as"
                out = shared / "who.json"
                job = submit(admin, [JOB_PYTHON, str(program), str(out), "whoami"], queue="research")
                assert read_out(out)["uid"] == user.pw_uid
                assert wait_state(admin, job, "succeeded", "failed")["state"] == "succeeded"
        finally:
            server.stop()


def test_root_refuses_single_user(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("this checks what `up` does as root")
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet", "up", "--data-dir", str(tmp_path), "--emulate", "1xT4", "--single-user"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "error: --single-user would run every job as root; to fix:" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_control_plane_that_is_not_root_is_one_trust_domain_and_refuses_team_tokens(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the test runs `up` as an unprivileged user it creates, which needs root")
    shared = reachable_by_jobs(tmp_path / "shared")
    program = share(shared / "probe.py", PROBE)
    python, env = python_for_anyone()
    with unprivileged_user("gft-operator", shared / "operator-home") as operator:
        data = Path(operator.pw_dir) / "data"
        data.mkdir()
        os.chown(data, operator.pw_uid, operator.pw_gid)
        prefix = ("runuser", "-u", operator.pw_name, "--")
        server_env = {**env, "HOME": operator.pw_dir, "GPUFLEET_CLIENT_CONFIG": str(data / "client.toml")}
        start = {"python": python, "prefix": prefix, "log_path": tmp_path / "server.log"}
        server = LocalServer(data, env={**server_env, "OPERATOR_SECRET": "x"}, **start)  # type: ignore[arg-type]
        try:
            output = server.output()
            with server.client() as admin:
                token = team_token(admin, "team-a")
                health = admin.get("/healthz").json()["isolation"]
                mapped = admin.put("/v1/queues/team-a", json={"run_as": "nobody"})
                out = shared / "who.json"
                job = submit(admin, [python, str(program), str(out), "whoami"], queue="team-a")
                who = read_out(out)
                wait_state(admin, job, "succeeded", "failed")
            refused = httpx.get(f"{server.url}/v1/jobs", headers=bearer(token))
        finally:
            server.stop()
        assert "every job runs as gft-operator" in output
        assert "one trust domain" in output
        assert "team tokens are refused" in output
        assert health["single_trust_domain"] is True
        assert health["team_tokens"] is False
        assert refused.status_code == 403
        message = refused.json()["message"]
        assert "team token 'team-a-ci' is refused" in message
        assert "--single-user" in message
        assert "to fix" in message
        assert mapped.status_code == 422
        assert "not root" in mapped.json()["fields"][0]["problem"]
        assert who["uid"] == operator.pw_uid
        assert "OPERATOR_SECRET" not in who["env"]  # a clean environment, even in one trust domain
        # With --single-user the operator says all teams trust each other: team tokens work.
        again = LocalServer(data, env=server_env, extra=("--single-user",), token=server.token, **start)  # type: ignore[arg-type]
        try:
            accepted = httpx.get(f"{again.url}/v1/jobs", headers=bearer(token))
            health = httpx.get(f"{again.url}/healthz", headers=bearer(server.token)).json()["isolation"]
        finally:
            again.stop()
        assert accepted.status_code == 200
        assert health["team_tokens"] is True
