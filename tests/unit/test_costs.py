"""Prices, price files, a placement's charges, and budget windows and levels (`domain/costs.py`)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from gpufleet.domain.cluster import GpuShare, WorkerPlacement, make_node
from gpufleet.domain.costs import (
    Budget,
    BudgetAction,
    BudgetLevel,
    BudgetPeriod,
    BudgetUnit,
    Pool,
    Price,
    PriceTable,
    attempt_cost,
    budget_status,
    budget_window,
    charges_for,
    read_price_csv,
)
from gpufleet.domain.errors import SpecError, WorkloadError
from gpufleet.domain.resources import GiB


def ts(*parts: int) -> float:
    return datetime(*parts, tzinfo=UTC).timestamp()  # type: ignore[misc]


def test_price_table_compares_models_like_the_throughput_table_and_refuses_repeats() -> None:
    table = PriceTable((Price("A100-80GB", Pool.SPOT, 1.5),))
    assert table.usd_per_gpu_hour("a100-80gb", Pool.SPOT) == 1.5
    assert table.usd_per_gpu_hour("A100-80GB", Pool.ON_DEMAND) is None
    assert table.with_prices([Price("a100-80gb", Pool.SPOT, 2.0)]).usd_per_gpu_hour("A100-80GB", Pool.SPOT) == 2.0
    with pytest.raises(SpecError):
        PriceTable((Price("A100", Pool.SPOT, 1.0), Price("a100", Pool.SPOT, 2.0)))
    with pytest.raises(SpecError, match="usd_per_gpu_hour"):
        Price("A100", Pool.SPOT, -1.0)


def test_own_price_csv_and_its_errors_name_the_line_and_column() -> None:
    prices = read_price_csv("model,pool,usd_per_gpu_hour\nH100,reserved,2.1\n", source="p.csv")
    assert prices == (Price("H100", Pool.RESERVED, 2.1, "p.csv"),)
    with pytest.raises(WorkloadError, match=r"p.csv, line 3, column 'pool'"):
        read_price_csv("model,pool,usd_per_gpu_hour\nH100,spot,1\nH100,preemptible,1\n", source="p.csv")
    with pytest.raises(WorkloadError, match="neither a price table nor a GCP price catalog"):
        read_price_csv("gpu,price\nH100,1\n", source="p.csv")


def test_gcp_catalog_rows_per_gpu_with_and_without_host_vm() -> None:
    text = (
        "cloud,kind,name,count,gpu_mem_gib,region,zone,price_usd_per_hour,spot_price_usd_per_hour\n"
        "gcp,gpu,H200,8,141,us-central1,us-central1-a,74.49392,29.7976\n"
        "gcp,gpu,B200,8,180,us-central1,us-central1-b,90.216,\n"
        "gcp,gpu,T4,1,16,us-west1,us-west1-b,0.35,0.14\n"
        "gcp,host_vm,a3-ultragpu-8g,8,,us-central1,,12.266,2.82111\n"
        "lambda,gpu_instance,gpu.1x.a100,1,40,us-tx-1,,1.10,\n"
    )
    found = {(p.model, p.pool): p.usd_per_gpu_hour for p in read_price_csv(text, source="gcp.csv")}
    assert found[("H200", Pool.ON_DEMAND)] == pytest.approx((74.49392 + 12.266) / 8)
    assert found[("H200", Pool.SPOT)] == pytest.approx((29.7976 + 2.82111) / 8)
    assert ("B200", Pool.SPOT) not in found  # no spot offer
    assert found[("B200", Pool.ON_DEMAND)] == pytest.approx(90.216 / 8)
    gpu_only = {(p.model, p.pool): p.usd_per_gpu_hour for p in read_price_csv(text, source="g", host_vm=False)}
    assert gpu_only[("H200", Pool.ON_DEMAND)] == pytest.approx(74.49392 / 8)
    with pytest.raises(WorkloadError, match="choose a region the file has: us-central1, us-west1"):
        read_price_csv(text, source="gcp.csv", region="europe-west4")


def test_charges_group_a_placement_by_model_and_pool_and_price_fractions() -> None:
    nodes = {
        "a": make_node("a", "A100-80GB", 4, 80 * GiB),
        "s": dataclasses.replace(make_node("s", "A100-80GB", 4, 80 * GiB), pool="spot"),
    }
    table = PriceTable((Price("A100-80GB", Pool.ON_DEMAND, 4.0),))
    workers = (
        WorkerPlacement("a", (GpuShare(0), GpuShare(1, milli=500))),
        WorkerPlacement("s", (GpuShare(0),)),
        WorkerPlacement("gone", (GpuShare(0),)),
    )
    charges = charges_for(workers, nodes, table)
    assert [(c.model, c.pool, c.gpus, c.usd_per_gpu_hour) for c in charges] == [
        ("A100-80GB", Pool.ON_DEMAND, 1.5, 4.0),
        ("A100-80GB", Pool.SPOT, 1.0, None),
    ]
    lines = attempt_cost(charges, 7200.0, queue="q", user="u", idle_fraction=0.25)
    assert [(line.gpu_hours, line.usd, line.idle_usd) for line in lines] == [(3.0, 12.0, 3.0), (2.0, None, None)]


def test_monthly_window_starts_on_the_first_and_resets_on_the_next_first_across_a_year_end() -> None:
    start, resets = budget_window(BudgetPeriod.MONTH, ts(2026, 12, 31, 23, 0))
    assert (start, resets) == (ts(2026, 12, 1), ts(2027, 1, 1))
    start, resets = budget_window(BudgetPeriod.ROLLING_30D, ts(2026, 3, 31))
    assert (start, resets) == (ts(2026, 3, 1), None)


@pytest.mark.parametrize(
    ("spent", "level"),
    [(0.0, BudgetLevel.OK), (79.9, BudgetLevel.OK), (80.0, BudgetLevel.NOTICE), (100.0, BudgetLevel.EXCEEDED)],
)
def test_budget_levels_at_80_and_100_percent(spent: float, level: BudgetLevel) -> None:
    budget = Budget("q", 100.0, BudgetUnit.USD, BudgetPeriod.MONTH, BudgetAction.BLOCK)
    status = budget_status(budget, spent, 1e9, ts(2026, 5, 10))
    assert status.level is level
    assert status.blocks_submissions is (level is BudgetLevel.EXCEEDED)
    assert not status.deprioritises


def test_a_gpu_hour_budget_counts_gpu_hours_and_says_when_it_resets() -> None:
    budget = Budget("q", 10.0, BudgetUnit.GPU_HOURS, BudgetPeriod.MONTH, BudgetAction.DEPRIORITISE)
    status = budget_status(budget, 1e9, 12.0, ts(2026, 5, 10))
    assert status.deprioritises
    assert status.summary() == "queue q has spent 12.0 GPU-hours of its 10.0 GPU-hours monthly budget (120 %)"
    assert status.reset_text() == "the budget resets 2026-06-01 00:00 UTC"
    with pytest.raises(SpecError, match="amount"):
        Budget("q", 0.0)


def test_a_file_that_is_not_csv_is_refused_with_the_reason() -> None:
    with pytest.raises(WorkloadError, match="not a CSV file"):
        read_price_csv('model,pool,usd_per_gpu_hour\n"' + "x" * 200_000 + '",spot,1\n', source="p.csv")
