"""The CLI against a real uvicorn server: user strings with terminal escapes and markup are shown escaped,
submit retries with one idempotency key, cancel --force, quota limits, backup and audit."""

from __future__ import annotations

import dataclasses
import json
import socket
import sqlite3
import threading
import time
from pathlib import Path

from gpufleet.domain.lifecycle import JobState
from gpufleet.ports import RequestKind
from tests.server.test_cli_live import Live, _spec_file, run_on_live
from tests.server.test_cli_live import live as live  # noqa: PLC0414 - the fixture, by its name

ESC = "\x1b"
EVIL = f"{ESC}]0;owned{ESC}\\{ESC}[2J{ESC}[31mred[/] [link=http://x]click[/link] \u202eevil\r"


def plant_strings(live: Live, tmp_path: Path) -> str:
    """A job whose name, reason and command hold escapes and markup (stored before names were checked)."""
    job = json.loads(live.cli("submit", _spec_file(tmp_path), "--json", token=live.team))
    record = live.store.get(job["id"])
    assert record is not None
    run = record.job.run
    assert run is not None
    planted = dataclasses.replace(record.job, name=EVIL, run=dataclasses.replace(run, command=("python", EVIL)))
    changed = record.evolve(job=planted, waiting_reason=EVIL, reason=EVIL)
    live.store.write([(record.version, changed)], [])
    return str(job["id"])


def test_user_strings_never_reach_the_terminal_raw(live: Live, tmp_path: Path) -> None:
    job_id = plant_strings(live, tmp_path)
    outputs = {
        "jobs": live.cli("jobs", token=live.team),
        "show": live.cli("show", job_id),
        "explain": live.cli("explain", job_id),
    }
    for command, out in outputs.items():
        assert ESC not in out, command
        assert "\r" not in out, command
        assert "\u202e" not in out, command
        assert "\\x1b]0;owned" in out, command  # shown, escaped
    assert "[/]" in outputs["show"]  # markup in a name is shown, not applied
    assert "[link=http://x]" in outputs["show"]
    assert "\\u202eevil" in outputs["show"]
    # Scripts that ask for JSON get the data as stored.
    assert json.loads(live.cli("show", job_id, "--json"))["name"] == EVIL


def test_logs_to_a_pipe_are_the_output_as_written_unless_asked_to_escape(live: Live, tmp_path: Path) -> None:
    job = json.loads(live.cli("submit", _spec_file(tmp_path), "--json"))
    log = tmp_path / "attempt-1" / "worker-0.log"
    log.parent.mkdir()
    log.write_text(f"{ESC}[32mgreen{ESC}[0m\tok\n")
    live.ctx.log_paths = lambda job_id: [log] if job_id == job["id"] else []
    run_on_live(live, job["id"])
    # Not a terminal (the runner's output is a pipe): as written, colours included, as `> file` keeps them.
    assert live.cli("logs", job["id"]) == f"{ESC}[32mgreen{ESC}[0m\tok\n"
    assert live.cli("logs", job["id"], "--raw") == f"{ESC}[32mgreen{ESC}[0m\tok\n"
    assert live.cli("logs", job["id"], "--escape-control") == "\\x1b[32mgreen\\x1b[0m\tok\n"
    live.cli("logs", job["id"], "--raw", "--escape-control", code=1)  # one or the other


def test_submit_retries_through_a_refusing_port_with_one_key_and_makes_one_job(live: Live, tmp_path: Path) -> None:
    """The control plane is down when the CLI submits and comes up a moment later: one job, not zero or two."""
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]
    proxy_ready = threading.Event()
    keys: list[str] = []

    def relay() -> None:
        # Nothing listens on `port` for 0.7 s (connections are refused), then a relay to the real server that
        # notes each request's Idempotency-Key.
        time.sleep(0.7)
        import http.server
        import urllib.request

        class Relay(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                keys.append(self.headers["Idempotency-Key"])
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                request = urllib.request.Request(live.url + self.path, body, headers, method="POST")
                if len(keys) == 1:  # the first delivery is lost on the way back (a crash after the commit)
                    urllib.request.urlopen(request).read()
                    self.close_connection = True
                    return
                with urllib.request.urlopen(request) as answer:
                    data = answer.read()
                    self.send_response(answer.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def log_message(self, *_args: object) -> None:
                pass

        server = http.server.HTTPServer(("127.0.0.1", port), Relay)
        proxy_ready.set()
        server.handle_request()
        server.handle_request()
        server.server_close()

    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    result = live.runner.invoke(
        app_main(), ["submit", _spec_file(tmp_path), "--url", f"http://127.0.0.1:{port}", "--token", live.team]
    )
    thread.join(10)
    assert result.exit_code == 0, result.output
    assert "retrying" in result.output
    assert len(keys) == 2
    assert keys[0] == keys[1]
    jobs = json.loads(live.cli("jobs", "--json", "--all"))
    assert len(jobs) == 1
    assert f"submitted {jobs[0]['id']}" in result.output


def app_main():  # the Typer app, imported late so that the fixture module's import stays the only one
    from gpufleet.cli.main import app

    return app


def test_cancel_force_quota_limits_backup_and_audit(live: Live, tmp_path: Path) -> None:
    job = json.loads(live.cli("submit", _spec_file(tmp_path), "--json", token=live.team))
    run_on_live(live, job["id"])
    assert "SIGKILL" in live.cli("cancel", job["id"], "--force", token=live.team)
    taken, _ = live.store.take_requests(0)
    assert [(r.job_id, r.kind) for r in taken] == [(job["id"], RequestKind.FORCE_CANCEL)]

    live.cli("quota", "set", "team-a", "--max-pending", "5", "--max-grace", "2h")
    live.cli("quota", "set", "team-a", "--gpu", "3")  # keeps the limits
    queue = next(q for q in json.loads(live.cli("queues", "--json")) if q["name"] == "team-a")
    assert (queue["max_pending"], queue["max_grace"], queue["quotas"]["gpu"]["nominal"]) == (5, 7200.0, 3.0)
    assert "pending<=5 grace<=7200s" in live.cli("queues")
    live.cli("quota", "set", "team-a", "--max-pending", "-1")
    queue = next(q for q in json.loads(live.cli("queues", "--json")) if q["name"] == "team-a")
    assert queue["max_pending"] is None

    copy = tmp_path / "backup.db"
    out = live.cli("backup", str(copy))
    assert "1 jobs" in out
    assert "checked whole" in out
    assert copy.stat().st_mode & 0o777 == 0o600
    connection = sqlite3.connect(copy)
    try:
        assert connection.execute("SELECT id FROM jobs").fetchall() == [(job["id"],)]
    finally:
        connection.close()
    assert "needs an admin token" in live.cli("backup", str(tmp_path / "no.db"), token=live.team, code=2)
    assert not (tmp_path / "no.db").exists()

    table = live.cli("audit")
    for action in ("job.force_cancel", "queue.set", "store.backup"):
        assert action in table
    assert "denied" in table
    entries = json.loads(live.cli("audit", "--json", "--since", "1h"))
    assert entries == []  # the test's clock stands at 1,000 s after the epoch: nothing in the last hour
    entries = json.loads(live.cli("audit", "--json"))
    assert [e["action"] for e in entries][:2] == ["job.force_cancel", "queue.set"]
    assert entries[0]["actor"] == "alice"
    assert "needs an admin token" in live.cli("audit", token=live.team, code=2)


def test_backup_directly_from_a_data_dir_and_pg_dump_for_postgres(live: Live, tmp_path: Path) -> None:
    data = tmp_path  # the fixture's store lives in tmp_path/state.db
    json.loads(live.cli("submit", _spec_file(tmp_path), "--json"))
    result = live.runner.invoke(app_main(), ["backup", str(tmp_path / "direct.db"), "--data-dir", str(data)])
    assert result.exit_code == 0, result.output
    assert "backed up the store directly: 1 jobs" in result.output
    result = live.runner.invoke(
        app_main(), ["backup", str(tmp_path / "pg.db"), "--db", "postgresql://u@127.0.0.1:1/gpufleet"]
    )
    assert result.exit_code == 2
    assert "pg_dump --format=custom" in result.output
    assert "Traceback" not in result.output
    assert live.store.get(json.loads(live.cli("jobs", "--json"))[0]["id"]).state is JobState.PENDING  # type: ignore[union-attr]
