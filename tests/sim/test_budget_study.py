"""Budgets in the simulator: a queue's spend is metered with the live price code, its budget's status comes
from the same domain code as live, and its action acts as live does (warn changes nothing, block refuses the
queue's arrivals from the moment the budget is spent, deprioritise reaches the scheduling core as data)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.domain.costs import Budget, BudgetAction, BudgetPeriod, BudgetUnit, Pool, Price, PriceTable
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.lifecycle import JobState
from gpufleet.policies.catalog import profile
from gpufleet.sim.budget_study import BudgetMeter, parse_budget, run_budget_study
from gpufleet.sim.engine import SimSettings, Simulation
from gpufleet.sim.experiment import policy_data
from gpufleet.sim.workload import WorkloadError
from gpufleet.sim.workloads.synthetic import generate_synthetic

PRICES = PriceTable((Price("A100-80GB", Pool.ON_DEMAND, 4.0), Price("H100-80GB", Pool.ON_DEMAND, 6.0)))
WORKLOAD = generate_synthetic(seed=3, jobs=120, nodes=6, arrival_rate_per_hour=40.0)


def test_parse_budget_reads_unit_action_and_period_in_any_order() -> None:
    assert parse_budget("team-a=500") == Budget("team-a", 500.0)
    assert parse_budget("team-b=20.5:block:gpu-hours:rolling-30d") == Budget(
        "team-b", 20.5, BudgetUnit.GPU_HOURS, BudgetPeriod.ROLLING_30D, BudgetAction.BLOCK
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("team-a", "is not QUEUE=AMOUNT"),
        ("=5", "is not QUEUE=AMOUNT"),
        ("team-a=lots", "the amount 'lots' is not a number"),
        ("team-a=5:usd:gpu-hours", "gives its unit twice"),
        ("team-a=5:sometimes", "'sometimes' is no unit, action or period"),
        ("team-a=0", "give an amount > 0"),
    ],
)
def test_a_bad_budget_says_what_is_wrong_and_how_to_fix_it(text: str, says: str) -> None:
    with pytest.raises(GpufleetError) as raised:
        parse_budget(text)
    assert says in str(raised.value)
    assert "to fix:" in str(raised.value)


def test_a_budget_for_a_queue_the_workload_lacks_is_refused() -> None:
    with pytest.raises(WorkloadError, match=r"'nope', not a queue of .*; to fix: budget one of its queues: team-a"):
        run_budget_study(WORKLOAD, [Budget("nope", 5.0)], PRICES, "fifo")


def _run(budgets: list[Budget], policy: str = "fifo") -> tuple[Simulation, BudgetMeter]:
    sim = Simulation(WORKLOAD, profile(policy, policy_data(WORKLOAD)), SimSettings())
    meter = BudgetMeter(sim, budgets, PRICES)
    sim.observer = meter
    sim.admission = meter.admits
    sim.run()
    return sim, meter


@pytest.fixture(scope="module")
def unbudgeted() -> tuple[Simulation, BudgetMeter]:
    return _run([])


def test_metered_gpu_hours_are_the_gpu_time_each_queue_held(unbudgeted: tuple[Simulation, BudgetMeter]) -> None:
    sim, meter = unbudgeted
    for queue, spend in meter.spend.items():
        held = sum(r.attained_gpu_seconds for r in sim.store.all() if r.job.queue == queue) / 3600.0
        assert spend.gpu_hours[-1] == pytest.approx(held, rel=1e-6)
        assert spend.usd[-1] >= 4.0 * held - 1e-6  # every model is priced at $4 or $6 per GPU-hour


def test_warn_only_reports_and_schedules_exactly_as_without_a_budget(
    unbudgeted: tuple[Simulation, BudgetMeter],
) -> None:
    base, _ = unbudgeted
    sim, meter = _run([Budget("team-a", 30.0, BudgetUnit.GPU_HOURS)])
    assert [e.level.value for e in meter.events if e.queue == "team-a"] == ["notice", "exceeded"]
    assert meter.refused == {}
    finished = {r.job.id: r.finished_at for r in sim.store.all()}
    assert finished == {r.job.id: r.finished_at for r in base.store.all()}


def test_block_refuses_the_queues_arrivals_from_when_its_budget_is_spent(
    unbudgeted: tuple[Simulation, BudgetMeter],
) -> None:
    sim, meter = _run([Budget("team-a", 20.0, action=BudgetAction.BLOCK)])
    [spent_at] = [e.at for e in meter.events if e.level.value == "exceeded"]
    arrivals = [t for t in WORKLOAD.jobs if t.job.queue == "team-a"]
    taken = {r.job.id for r in sim.store.all() if r.job.queue == "team-a"}
    assert taken == {t.job.id for t in arrivals if t.arrival <= spent_at}
    assert meter.refused == {"team-a": len(arrivals) - len(taken)}
    assert meter.refused["team-a"] > 0
    # Running jobs go on: everything it took finishes, and other queues lose nothing.
    assert all(r.state is JobState.SUCCEEDED for r in sim.store.all())
    others = {r.job.id for r in unbudgeted[0].store.all() if r.job.queue != "team-a"}
    assert others <= {r.job.id for r in sim.store.all()}


def test_deprioritise_marks_the_queue_for_the_core_and_its_jobs_give_way() -> None:
    report: dict[str, Any] = run_budget_study(
        WORKLOAD, [Budget("team-a", 100.0, action=BudgetAction.DEPRIORITISE)], PRICES, "default"
    )
    before, after = report["variants"]["no budgets"], report["variants"]["budgets"]
    assert after["queues"]["team-a"]["exceeded_at_h"] is not None
    assert after["jobs_refused"] == 0
    assert after["jobs_finished"] == before["jobs_finished"]
    assert after["queues"]["team-a"]["jct_mean_h"] > before["queues"]["team-a"]["jct_mean_h"]
    assert after["jct_mean_h_other_queues"] < before["jct_mean_h_other_queues"]
    sim, _ = _run([Budget("team-a", 100.0, action=BudgetAction.DEPRIORITISE)], "default")
    assert {q.name: q.deprioritised for q in sim.store.queues()}["team-a"] is True
    assert not any(q.deprioritised for q in sim.store.queues() if q.name != "team-a")
