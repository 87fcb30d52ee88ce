"""`gpufleet bench store` and `gpufleet bench api` print one JSON object with their figures (small runs)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app


def test_bench_store_reports_its_figures_on_sqlite_and_postgresql(postgres_url: str) -> None:
    runner = CliRunner()
    for extra in ([], ["--db", postgres_url]):
        result = runner.invoke(app, ["bench", "store", "--jobs", "30", *extra])
        assert result.exit_code == 0, result.output
        figures = json.loads(result.stdout)
        assert figures["jobs"] == 30
        assert figures["active_jobs"] == 30
        assert figures["store"] == ("postgresql" if extra else "sqlite")
        assert all(figures[k] > 0 for k in ("submits_per_s", "single_writes_per_s", "batch_records_per_s"))


@pytest.mark.slow
def test_bench_api_runs_a_real_control_plane_and_reports_throughput_and_latency() -> None:
    result = CliRunner().invoke(app, ["bench", "api", "--jobs", "40", "--clients", "4", "--samples", "3"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures["submit_accepted"] == 40
    assert figures["submit_errors"] == 0
    assert figures["start_samples"] == 3
    assert 0 < figures["start_p50_ms"] <= figures["start_max_ms"]
    assert figures["submits_per_s"] > 0
