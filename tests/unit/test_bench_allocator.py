"""`gpufleet bench allocator` prints one JSON object: the LP, the plan and a whole round, timed (a small run)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from gpufleet.cli.main import app


def test_bench_allocator_reports_a_round_of_the_round_allocator() -> None:
    args = ["bench", "allocator", "--jobs", "120", "--gpus-per-model", "16", "--repeat", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures["active_jobs"] == 120 == figures["running"] + figures["pending"]
    assert figures["gpus"] == 48
    assert figures["gpu_models"] == ["A100", "V100", "T4"]
    assert figures["lp_classes"] > 0
    assert figures["lp_ms"] > 0
    assert figures["plan_ms"] > 0
    assert figures["round_ms"] > 0
    assert figures["round_cpu_ms"] > 0
    # Judged on CPU time: wall time on a shared machine is mostly waiting for a core.
    assert figures["meets_goal"] == (figures["round_cpu_ms"] <= figures["goal_round_ms"])
    # A loaded cluster at a round's start: the plan takes GPUs from running jobs it leaves out.
    assert figures["round_preempted"] > 0
    assert figures["load_avg_1m"] >= 0
