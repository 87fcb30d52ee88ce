"""`gpufleet bench resize` prints one JSON object: each resize of a real job on the local executor, timed."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from gpufleet.cli.main import app


def test_bench_resize_times_each_resize_of_a_running_job() -> None:
    result = CliRunner().invoke(app, ["bench", "resize", "--sizes", "1,3", "--rounds", "1"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures["sizes"] == [1, 3]
    assert figures["resizes"] == 2 == len(figures["samples_s"])  # 1 -> 3, then back to 1
    assert 0 < figures["resize_min_s"] <= figures["resize_p50_s"] <= figures["resize_max_s"]
    assert figures["load_avg_1m"] >= 0


def test_bench_resize_refuses_sizes_it_cannot_resize_between() -> None:
    result = CliRunner().invoke(app, ["bench", "resize", "--sizes", "4"])
    assert result.exit_code == 2
    assert "give 2 or more sizes of 1 to 8 workers" in result.output
    result = CliRunner().invoke(app, ["bench", "resize", "--sizes", "two"])
    assert result.exit_code == 2
    assert "give e.g. --sizes 2,4,1" in result.output
