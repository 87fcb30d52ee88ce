"""The Grafana dashboard only queries metrics we export."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.adapters.metrics import QueueMetrics, SchedulerState, make_registry, render, wait_histogram
from gpufleet.adapters.probes import RecordedProbe
from gpufleet.ports.gpu_probe import GpuOwner
from tests.telemetry.fixture_machine import FIXTURE

DASHBOARD = Path(__file__).parents[2] / "dashboards" / "gpufleet-scheduler.json"
METRIC = re.compile(r"\b(gpufleet_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+)\b")


def _exported_series_names() -> set[str]:
    samples = RecordedProbe(FIXTURE).sample(0.0)
    state = SchedulerState(
        queues=(QueueMetrics("q", 1, 1, wait_histogram([3.0]), 1.0, 0.5, 1.0, 60.0, 1),),
        owners={("emulated-dgx", 0): GpuOwner("j", "q")},
        fragmentation_ratio=0.1,
        fragmented_gpus=0.5,
        cycles=1,
        cycle_seconds_sum=0.01,
        last_cycle_seconds=0.01,
    )
    text = render(make_registry(lambda: samples, lambda: state)).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def _exprs(node: object) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for value in node.values() for e in _exprs(value)]
    if isinstance(node, list):
        return [e for item in node for e in _exprs(item)]
    return []


def test_dashboard_is_valid_json_and_every_expr_queries_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "gpufleet-scheduler"
    exprs = _exprs(dashboard["panels"])
    assert len(exprs) >= 10
    exported = _exported_series_names()
    for expr in exprs:
        names = METRIC.findall(expr)
        assert names, f"expression queries none of our metrics: {expr}"
        for name in names:
            assert name in exported, f"{name} (in {expr!r}) is not exported"
    # Every panel has a unique id and sits on the grid.
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all({"x", "y", "w", "h"} <= set(p["gridPos"]) for p in dashboard["panels"])
    # The queue variable reads a metric we export.
    (queue_var,) = [v for v in dashboard["templating"]["list"] if v["name"] == "queue"]
    assert METRIC.findall(queue_var["definition"])[0] in exported
