from __future__ import annotations

from gpufleet.bench.telemetry import GOALS, run_telemetry_bench


def test_telemetry_bench_reports_costs_and_meets_its_render_goal() -> None:
    result = run_telemetry_bench(repeats=20)
    assert result["benchmark"] == "telemetry"
    assert result["sample_8_gpus_us"]["emulated"] > 0
    assert result["sample_8_gpus_us"]["recorded"] > 0
    render = result["render"]
    assert (render["nodes"], render["gpus"], render["jobs"]) == (8, 64, 1000)
    # 64 GPUs x 19 GPU metrics (XID is 0 on emulated GPUs, so present) plus the scheduler families.
    assert render["series"] > 64 * 19
    assert 0 < render["ms"] < GOALS["render_ms"]
    assert render["met"] is True
    assert 0 < result["cpu"]["share_of_one_core_pct"] < GOALS["cpu_share_pct"]
