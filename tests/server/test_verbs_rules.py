"""Who may depend on, cancel, hold and update which jobs: the CLI against a real API server on loopback (no loop),
with a team token of queue team-a beside the admin's. Another team's job is not there for a team token; the
requests that are allowed are stored for the loop as it will read them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from gpufleet.cli.main import app
from gpufleet.domain.quotas import QueueSpec
from gpufleet.ports import RequestKind
from tests.server.test_cli_live import Live, live

__all__ = ["live"]

CMD = ("--workdir", "-", "--", "true")


def _run(live: Live, *args: str, token: str | None = None, code: int = 0) -> str:
    """`gpufleet run`: its options before the command, the connection's too."""
    where = ["--url", live.url, "--token", token or live.admin]
    result = live.runner.invoke(app, ["run", "--no-wait", *where, *args, *CMD])
    assert result.exit_code == code, (result.output, result.exception)
    assert "Traceback" not in result.output
    return result.output


def _submit(live: Live, queue: str, *more: str, token: str | None = None) -> dict[str, Any]:
    return dict(json.loads(_run(live, "--json", "--queue", queue, *more, token=token)))


def test_a_team_token_cannot_depend_on_cancel_or_hold_another_teams_jobs(live: Live, tmp_path: Path) -> None:
    theirs = _submit(live, "team-b")["id"]
    refused = _run(live, "--dependency", f"afterok:{theirs}", token=live.team, code=2)
    assert theirs in refused, refused
    assert "not yours to see" in refused, refused
    assert "no job or array" in live.cli("cancel", theirs, token=live.team, code=2)
    assert "team-a" in live.cli("hold", "--queue", "team-b", token=live.team, code=2)
    mine = _submit(live, "team-a", token=live.team)["id"]
    moved = live.cli("update", mine, "--queue", "team-b", token=live.team, code=2)
    assert "may not move jobs to queue 'team-b'" in moved, moved
    ok = _submit(live, "team-a", "--dependency", f"afterok:{mine},singleton", token=live.team)
    assert ok["depends_on"] == [f"afterok:{mine}", "singleton"]


def test_requests_reach_the_loop_as_it_reads_them(live: Live) -> None:
    job = _submit(live, "team-a")["id"]
    live.cli("update", job, "--priority", "9", "--max-runtime", "1h")
    live.cli("hold", job)
    live.cli("cancel", job, "--force")
    requests, _ = live.store.take_requests(0)
    kinds = [(r.job_id, r.kind) for r in requests]
    assert kinds == [(job, RequestKind.UPDATE), (job, RequestKind.HOLD), (job, RequestKind.FORCE_CANCEL)]
    assert json.loads(requests[0].reason) == {"priority": 9, "max_runtime_s": 3600.0, "by": "admin"}
    nothing = live.cli("cancel", code=2)
    assert "--name" in nothing, nothing


def test_a_dependency_on_an_array_means_every_task(live: Live) -> None:
    array = _submit(live, "default", "--array", "1-3")
    assert array["array_tasks"] == 3
    child = _submit(live, "default", "--dependency", f"afterany:{array['array_id']}")
    assert child["depends_on"] == [f"afterany:{array['array_id']}_{n}" for n in (1, 2, 3)]
    one = _submit(live, "default", "--dependency", f"afterok:{array['array_id']}_2")
    assert one["depends_on"] == [f"afterok:{array['array_id']}_2"]
    folded = live.cli("jobs")
    assert f"{array['array_id']} [3 tasks]" in folded, folded
    assert "pending:3" in folded, folded


def test_an_array_its_queue_cannot_hold_is_refused_whole(live: Live) -> None:
    live.store.set_queue(QueueSpec("small", max_pending=5))
    out = _run(live, "--queue", "small", "--array", "0-7", code=2)
    assert "small" in out, out
    stored = [r for r in live.store.active() if r.job.queue == "small"]
    assert len(stored) == 5
    requests, _ = live.store.take_requests(0)
    assert sorted(r.job_id for r in requests if r.kind is RequestKind.CANCEL) == sorted(r.id for r in stored)


def test_the_single_cancel_route_takes_an_arrays_id(live: Live) -> None:
    array = _submit(live, "team-a", "--array", "0-2", token=live.team)
    with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {live.team}"}) as client:
        answer = client.post(f"/v1/jobs/{array['array_id']}/cancel").json()
        assert answer["message"] == "cancel requested for 3 job(s)", answer
        theirs = _submit(live, "team-b", "--array", "0-1")
        assert client.post(f"/v1/jobs/{theirs['array_id']}/cancel").status_code == 404
    requests, _ = live.store.take_requests(0)
    assert sorted(r.job_id for r in requests) == [f"{array['array_id']}_{n}" for n in range(3)]
