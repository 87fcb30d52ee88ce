"""`gpufleet up --db postgresql+psycopg://…` on a private PostgreSQL server: jobs run, state survives a
restart of the control plane, and the restart adopts the job that kept running."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.server.live import alive, start

pytestmark = pytest.mark.slow


def test_the_control_plane_runs_on_postgresql_and_a_restart_adopts_its_jobs(tmp_path: Path, postgres_url: str) -> None:
    live = start(tmp_path, "--db", postgres_url)
    gate = live.shared / "go"  # where the job (its queue's own user) can see it
    try:
        with live.http() as client:
            quick = live.submit(client, "sleep", "0.1", name="quick", gpus=1)
            long = live.submit(client, "wait-file", str(gate), name="long", gpus=2)
            assert live.wait_state(client, quick, "succeeded")["exit_code"] == 0
            live.wait_state(client, long, "running")
        pid = live.wait_events("start", long)[0]["pid"]
        assert live.server.stop() == 0
        assert alive(pid)
        live.restart("--db", postgres_url, "--stop-jobs")
        with live.http() as client:
            assert live.job(client, quick)["state"] == "succeeded"
            assert live.job(client, long)["state"] == "running"
            gate.touch()
            assert live.wait_state(client, long, "succeeded")["attempt"] == 1
            events = [e["target"] for e in client.get(f"/v1/jobs/{long}/events").json()["events"]]
            assert events == ["admitted", "launching", "running", "succeeded"]
    finally:
        gate.touch()
        live.server.stop()
    assert not (tmp_path / "data" / "state.db").exists()  # nothing went to the default SQLite file
