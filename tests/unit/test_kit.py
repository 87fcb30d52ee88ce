"""The test kit itself: builders convert units as documented, and every invariant check can fail."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import pytest

from gpufleet.domain import GiB, Placement, Preemption, Quota
from gpufleet.policies.catalog import profile
from gpufleet.scheduling.cycle import CycleResult, run_cycle
from gpufleet.scheduling.status import Code, Status
from tests.kit import advance, cluster, make_job, queue, running_on, worker_on
from tests.kit.invariants import (
    check_capacity,
    check_partition,
    check_quotas,
    check_targets,
    check_victims,
    check_worker_shapes,
)


def test_job_builder_converts_to_base_units() -> None:
    job = make_job("j").fraction(0.25).gpu_memory(10).cpu(1.5).memory(2).queue("q").priority(3).build()
    request = job.request
    assert (request.gpus, request.gpu_milli, request.gpu_memory) == (1, 250, 10 * GiB)
    assert (request.cpu_milli, request.memory) == (1500, 2 * GiB)
    assert (job.queue, job.priority, job.preemptible) == ("q", 3, True)
    elastic = make_job("e").gpus(2).elastic(1, 4).models("H100").non_preemptible().build()
    assert (elastic.workers, elastic.min_workers, elastic.request.models, elastic.preemptible) == (
        4,
        1,
        frozenset({"H100"}),
        False,
    )


def test_cluster_builder_names_nodes_in_order() -> None:
    builder = cluster().nodes(2, "H100", gpus=4, nvlink_groups=2, rack="r1").nodes(1, "T4", cordoned=True)
    nodes = builder.build()
    assert [n.name for n in nodes] == ["node-00", "node-01", "node-02"]
    assert [g.nvlink_group for g in nodes[0].gpus] == [0, 0, 1, 1]
    assert nodes[0].gpus[0].memory == 80 * GiB
    assert nodes[2].gpus[0].memory == 16 * GiB
    assert (nodes[0].rack, nodes[2].schedulable) == ("r1", False)


def test_queue_builder_converts_to_milli() -> None:
    spec = queue("q").gpus(4, borrowing_limit=2, lending_limit=1).model_gpus("H100", 0.5).cohort("c").build()
    assert spec.quotas == {"gpu": Quota(4000, 2000, 1000), "gpu:H100": Quota(500, None, None)}
    assert (spec.cohort, spec.weight) == ("c", 1.0)


def test_advance_starts_placements_and_marks_victims() -> None:
    builder = cluster().nodes(1, "A100-80GB")
    (node,) = builder.build()
    snap = builder.snapshot(running=[running_on(make_job("low").gpus(8).build(), [(node, range(8))])])
    high = make_job("high").gpus(8).priority(1).build()
    result = run_cycle(snap, [high], profile("priority"))
    after = advance(snap, result, [high], now=5.0)
    assert [(r.id, r.evicting_for) for r in after.running] == [("low", "high")]
    assert (after.now, after.nominated) == (5.0, ("high",))
    stopped = advance(snap, result, [high], stop_victims=True)
    assert stopped.running == ()


# ---- every invariant check catches what it is for ---------------------------------------------------

BUILDER = cluster().nodes(1, "A100-80GB", gpus=2, cpu=8).nodes(1, "T4", gpus=1, cordoned=True)
N0, N1 = BUILDER.build()
A = make_job("a").gpus(1).build()
B = make_job("b").gpus(1).build()
SNAP = BUILDER.snapshot(running=[running_on(A, [(N0, [0])])], queues=[queue("default").gpus(2)])


def result_with(*placements: Placement, waiting: dict[str, Status] | None = None) -> CycleResult:
    return CycleResult(placements, (), waiting or {})


BAD: list[tuple[str, Callable[[], None], str]] = [
    (
        "gpu-given-twice",
        lambda: check_capacity(SNAP, result_with(Placement("b", (worker_on(B, N0, [0]),)))),
        "given 2000 milli",
    ),
    (
        "cpu-over",
        lambda: check_capacity(
            SNAP, result_with(Placement("c", (worker_on(make_job("c").gpus(1).cpu(9).build(), N0, [1]),)))
        ),
        "CPU over",
    ),
    (
        "missing-job",
        lambda: check_partition([A, B], result_with(waiting={"a": Status(Code.WAIT, ("x",))})),
        "missing: ['b']",
    ),
    (
        "waiting-without-reason",
        lambda: check_partition([B], result_with(waiting={"b": Status(Code.UNSCHEDULABLE)})),
        "without a reason",
    ),
    (
        "partial-gang",
        lambda: check_worker_shapes(
            [make_job("g").gpus(1).workers(2).build()],
            result_with(Placement("g", (worker_on(make_job("g").gpus(1).workers(2).build(), N0, [1]),))),
        ),
        "1 workers, asks 2..2",
    ),
    (
        "cordoned-node",
        lambda: check_targets(SNAP, [B], result_with(Placement("b", (worker_on(B, N1, [0]),)))),
        "cordoned or unhealthy",
    ),
    (
        "wrong-model",
        lambda: check_targets(
            SNAP,
            [make_job("h").models("H100").build()],
            result_with(Placement("h", (worker_on(make_job("h").models("H100").build(), N0, [1]),))),
        ),
        "allows ['H100']",
    ),
    (
        "over-quota",
        lambda: check_quotas(
            SNAP,
            [make_job("big").gpus(2).build()],
            result_with(Placement("big", (worker_on(make_job("big").gpus(2).build(), N0, [1, 1]),))),
        ),
        "queue default gpu over its limit",
    ),
    (
        "equal-priority-victim",
        lambda: check_victims(
            SNAP,
            [B],
            dataclasses.replace(
                result_with(waiting={"b": Status(Code.WAIT, ("x",))}), preemptions=(Preemption("a", "b", "why"),)
            ),
        ),
        "neither lower priority nor reclaim",
    ),
    (
        "las-victim-with-less-service",
        # Under a LAS profile, `a` (1 GPU since t=0, now 1,000 s: band 0) may not be stopped for `b` (band 0).
        lambda: check_victims(
            SNAP,
            [B],
            dataclasses.replace(
                result_with(waiting={"b": Status(Code.WAIT, ("x",))}), preemptions=(Preemption("a", "b", "why"),)
            ),
            profile("tiresias"),
        ),
        "neither lower priority nor reclaim nor more attained service",
    ),
]


@pytest.mark.parametrize(("check", "message"), [pytest.param(c, m, id=i) for i, c, m in BAD])
def test_invariant_checks_fail_on_violations(check: Callable[[], None], message: str) -> None:
    with pytest.raises(AssertionError, match=re.escape(message)):
        check()
