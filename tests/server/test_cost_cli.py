"""`gpufleet price`, `budget`, `report cost`, and cost in `show` and `queues`, against a real uvicorn server."""

from __future__ import annotations

import json
from pathlib import Path

from tests.kit.traces import price_tables
from tests.server.test_cli_live import Live, live  # noqa: F401 - the fixture
from tests.server.test_cost_api import HOUR, Loop


def test_price_budget_and_cost_report_commands(live: Live, tmp_path: Path) -> None:  # noqa: F811
    assert "no prices set" in live.cli("price", "list")
    assert "A100-80GB (on-demand): $3.6700 per GPU-hour" in live.cli("price", "set", "A100-80GB", "3.67")
    live.cli("price", "set", "A100-80GB", "1.2", "--pool", "spot")
    listed = json.loads(live.cli("price", "list", "--json", token=live.team))
    assert {(p["model"], p["pool"]) for p in listed} == {("A100-80GB", "on-demand"), ("A100-80GB", "spot")}
    bad = live.cli("price", "set", "A100-80GB", "2", "--pool", "cheap", code=2)
    assert "pool" in bad
    catalog = price_tables() / "gcp_gpu_prices_us.csv"
    out = live.cli("price", "import", str(catalog), "--gpu-only", "--region", "us-west1")
    assert "prices set" in out
    assert "V100" in live.cli("price", "list")
    missing = live.cli("price", "import", str(tmp_path / "nope.csv"), code=2)
    assert "cannot read" in missing
    assert "to fix" in missing

    loop = Loop(live)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: train\ncommand: [python, train.py]\ngpus: 2\ngpu_models: A100-80GB\n")
    job_id = live.cli("submit", str(spec), token=live.team).split()[1]
    loop.start(job_id)
    live.ctx.clock.t += 2 * HOUR  # type: ignore[attr-defined]
    loop.finish(job_id)
    shown = live.cli("show", job_id, token=live.team)
    assert "cost: $14.68 for 4.00 GPU-hours" in shown
    assert json.loads(live.cli("show", job_id, "--json"))["cost"]["usd"] == 4 * 3.67

    report = live.cli("report", "cost", "--since", "1970-01-01", "--by", "model")
    assert "A100-80GB" in report
    assert "$14.68" in report
    data = json.loads(live.cli("report", "cost", "--since", "1970-01-01", "--json"))
    assert [(g["key"], round(g["usd"], 2)) for g in data["groups"]] == [("team-a", 14.68)]
    png = tmp_path / "cost.png"
    live.cli("report", "cost", "--since", "1970-01-01", "--png", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "is not a grouping" in live.cli("report", "cost", "--by", "colour", code=2)

    out = live.cli("budget", "set", "team-a", "10", "--action", "block")
    assert "$14.68/$10.00 month 147% EXCEEDED (block)" in out
    assert "EXCEEDED" in live.cli("queues")
    assert "resets" in live.cli("budget", "list", token=live.team)
    refused = live.cli("submit", str(spec), token=live.team, code=2)
    assert "its action is block" in refused
    assert "the budget resets" in refused
    live.cli("budget", "delete", "team-a")
    assert "no budgets" in live.cli("budget", "list")
