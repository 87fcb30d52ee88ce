"""An admin's windows on nodes: maintenance (no job may still run there at its start) and GPUs held for a queue
(others may use them only if they end before the window starts)."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.domain import Job, SpecError
from gpufleet.domain.windows import Window
from gpufleet.policies.catalog import profile
from gpufleet.scheduling.cycle import CycleResult, run_cycle
from tests.kit import cluster, make_job, queue

NOW = 1_000.0
FLEET = cluster().nodes(2, "A100-80GB", gpus=4)
FIRST, SECOND = FLEET.names()


def cycle(pending: list[Job], *windows: Window, policy: str = "fifo-backfill") -> CycleResult:
    snapshot = FLEET.snapshot((), [queue("a"), queue("b")], now=NOW)
    return run_cycle(dataclasses.replace(snapshot, windows=windows), pending, profile(policy))


def job(job_id: str, seconds: float | None, team: str = "a", gpus: int = 1, seq: int = 0) -> Job:
    return make_job(job_id).gpus(gpus).queue(team).duration(seconds).seq(seq).build()


def nodes_used(result: CycleResult) -> dict[str, set[str]]:
    return {p.job: {w.node for w in p.workers} for p in result.placements}


def test_a_job_that_would_run_into_maintenance_starts_elsewhere_or_waits() -> None:
    maintenance = Window("fw-upgrade", (FIRST,), start=NOW + 3_600, end=NOW + 7_200)
    pending = [job(f"long{i}", 10_000.0, seq=i) for i in range(6)]
    result = cycle(pending, maintenance)
    assert all(nodes == {SECOND} for nodes in nodes_used(result).values())
    assert len(result.placements) == 4  # the 4 GPUs of the other node; 2 wait
    assert set(result.waiting) == {"long4", "long5"}


def test_a_job_that_ends_before_maintenance_may_use_the_nodes_meanwhile() -> None:
    maintenance = Window("fw-upgrade", (FIRST,), start=NOW + 3_600, end=NOW + 7_200)
    result = cycle([job(f"short{i}", 600.0, seq=i) for i in range(8)], maintenance)
    assert len(result.placements) == 8


def test_a_job_without_a_limit_never_starts_on_nodes_with_maintenance_ahead() -> None:
    maintenance = Window("fw-upgrade", (FIRST, SECOND), start=NOW + 86_400, end=NOW + 90_000)
    result = cycle([job("unlimited", None)], maintenance)
    assert result.placements == ()
    assert "unlimited" in result.waiting


def test_during_maintenance_nothing_starts_there_and_after_it_everything_may() -> None:
    during = Window("now", (FIRST,), start=NOW - 10, end=NOW + 600)
    result = cycle([job(f"s{i}", 1.0, seq=i) for i in range(6)], during)
    assert all(nodes == {SECOND} for nodes in nodes_used(result).values())
    over = Window("past", (FIRST, SECOND), start=NOW - 600, end=NOW)
    assert len(cycle([job(f"s{i}", None, seq=i) for i in range(8)], over).placements) == 8


def test_a_queues_window_lets_its_queue_in_at_any_time_and_others_only_before_it_and_briefly() -> None:
    held = Window("team-b-demo", (FIRST,), start=NOW + 3_600, end=NOW + 7_200, queue="b")
    pending = [
        *(job(f"a-long{i}", 10_000.0, "a", seq=i) for i in range(5)),
        *(job(f"b-long{i}", 10_000.0, "b", seq=10 + i) for i in range(3)),
    ]
    result = cycle(pending, held)
    used = nodes_used(result)
    assert [used[f"a-long{i}"] for i in range(4)] == [{SECOND}] * 4
    assert "a-long4" in result.waiting  # the held node is free, but not for it
    assert [used[f"b-long{i}"] for i in range(3)] == [{FIRST}] * 3
    during = dataclasses.replace(held, start=NOW - 1)
    result = cycle([job("a-short", 1.0, "a"), *(job(f"b{i}", None, "b", seq=i + 1) for i in range(4))], during)
    used = nodes_used(result)
    assert used["a-short"] == {SECOND}  # during the window, however short
    assert all(f"b{i}" in used for i in range(4))


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"name": "Bad Name"}, "is not a name"),
        ({"nodes": ()}, "names no node"),
        ({"nodes": ("n", "n")}, "names a node twice"),
        ({"end": 0.0}, "is not after the start"),
        ({"queue": ""}, "is empty"),
    ],
)
def test_a_malformed_window_is_refused_with_the_field_and_a_fix(fields: dict[str, object], problem: str) -> None:
    good: dict[str, object] = {"name": "w", "nodes": ("n",), "start": 10.0, "end": 20.0, "queue": None}
    with pytest.raises(SpecError) as caught:
        Window(**{**good, **fields})  # type: ignore[arg-type]
    assert problem in str(caught.value)
    assert all(field.fix for field in caught.value.fields)


def test_a_job_kept_out_is_told_which_reservation_holds_the_room() -> None:
    maintenance = Window("fw-upgrade", (FIRST, SECOND), start=NOW + 3_600, end=NOW + 7_200)
    result = cycle([job("long", 10_000.0)], maintenance)
    message = result.waiting["long"].message()
    assert "reservation fw-upgrade (maintenance" in message
    assert f"ends them by t={NOW + 3_600:.0f}" in message
