"""The USD counter behind `gpufleet_cost_usd_total`: what holding jobs hold x time x price, per tick."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.domain.cluster import GpuShare, WorkerPlacement
from gpufleet.domain.costs import Pool, Price
from gpufleet.scheduling.plugin_api import Holding
from gpufleet.server.cost_meter import MAX_STEP_S, CostMeter
from tests.kit import make_job
from tests.server.conftest import make_store


def test_cost_meter_adds_price_times_gpus_times_time_and_skips_unpriced(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.set_prices([Price("A100-80GB", Pool.ON_DEMAND, 3.6)], at=0.0)
    nodes = {n.name: n for n in store.nodes()}
    on_a100 = Holding(
        make_job("a").queue("team-a").gpus(2).build(),
        (WorkerPlacement("node-a", (GpuShare(0), GpuShare(1))),),
        (),
        None,
    )
    on_h100 = Holding(
        make_job("h").queue("team-b").gpus(1).build(), (WorkerPlacement("node-h", (GpuShare(0),)),), (), None
    )
    meter = CostMeter(store)
    meter.add(0.0, [on_a100, on_h100], nodes)  # the first tick only sets the clock
    assert meter.totals() == {}
    meter.add(180.0, [on_a100, on_h100], nodes)
    assert meter.totals() == {("team-a", "A100-80GB", "on-demand"): pytest.approx(0.36)}  # 2 GPUs x 0.05 h x 3.6
    meter.add(180.0 + 10 * MAX_STEP_S, [on_a100], nodes)  # a long gap counts MAX_STEP_S only
    assert meter.totals()[("team-a", "A100-80GB", "on-demand")] == pytest.approx(0.36 + 2 * MAX_STEP_S / 3600 * 3.6)
    store.close()
