"""Spot capacity in the core: `spot: never|allowed|preferred` (the `spot` filter and `spot_preference` score),
and what an open spot circuit breaker still admits (`Node.admits`, data in the snapshot)."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.domain import ClusterSnapshot, GiB, make_node
from gpufleet.policies.catalog import profile
from gpufleet.policies.filter.spot import REASON_CHECKPOINTS_ONLY, REASON_CLOSED, REASON_NOT_ALLOWED, REASON_PROBED
from gpufleet.scheduling.plugin_api import Code
from tests.kit import make_job, run

ON_DEMAND = make_node("a-od", "A100-80GB", 8, 80 * GiB)
SPOT = dataclasses.replace(make_node("b-spot", "A100-80GB", 8, 80 * GiB), pool="spot")


def place(*jobs, nodes=(ON_DEMAND, SPOT), name: str = "default"):  # type: ignore[no-untyped-def]
    return run(ClusterSnapshot(tuple(nodes), now=100.0), list(jobs), profile(name))


def where(result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {p.job: p.workers[0].node for p in result.placements}


@pytest.mark.parametrize("name", ["default", "first-fit", "fifo"])
def test_spot_never_keeps_off_spot_nodes_and_says_why(name: str) -> None:
    full = make_job("big").gpus(8).build()
    result = place(full, make_job("never").gpus(8).build(), name=name)
    assert where(result) == {"big": "a-od"}
    assert any(REASON_NOT_ALLOWED in r for r in result.waiting["never"].reasons)
    allowed = place(full, make_job("ok").gpus(8).spot("allowed").build(), name=name)
    assert where(allowed) == {"big": "a-od", "ok": "b-spot"}


@pytest.mark.parametrize("name", ["default", "first-fit", "best-fit", "gavel"])
def test_spot_preferred_goes_to_spot_first(name: str) -> None:
    result = place(make_job("p").gpus(2).spot("preferred").build(), name=name)
    assert where(result) == {"p": "b-spot"}
    assert where(place(make_job("a").gpus(2).spot("allowed").build(), name="first-fit")) == {"a": "a-od"}


def test_an_open_breaker_admits_only_jobs_that_checkpoint_or_none() -> None:
    gated = dataclasses.replace(SPOT, admits="checkpointing")
    plain = make_job("plain").gpus(1).spot("preferred").build()
    saving = make_job("saving").gpus(1).spot("preferred").checkpoint_every(600).build()
    result = place(plain, saving, nodes=(gated,))
    assert where(result) == {"saving": "b-spot"}
    assert any(REASON_CHECKPOINTS_ONLY in r for r in result.waiting["plain"].reasons)
    closed = place(saving, nodes=(dataclasses.replace(SPOT, admits="none"),))
    assert closed.placements == ()
    assert any(REASON_CLOSED in r for r in closed.waiting["saving"].reasons)


@pytest.mark.parametrize("name", ["default", "first-fit", "fifo", "gavel"])
def test_a_half_open_pool_takes_one_probe_job_per_cycle_per_pool(name: str) -> None:
    def probe_node(node_name: str, zone: str):  # type: ignore[no-untyped-def]
        node = make_node(node_name, "A100-80GB", 8, 80 * GiB, zone=zone)
        return dataclasses.replace(node, pool="spot", admits="probe")

    pools = [probe_node(f"p{i}", "us-a") for i in range(3)] + [probe_node("q0", "us-b")]
    jobs = [make_job(f"j{i}").gpus(1).spot("preferred").build() for i in range(5)]
    result = place(*jobs, nodes=tuple(pools), name=name)
    placed = where(result)
    assert sorted(node[0] for node in placed.values()) == ["p", "q"], placed  # one job per pool
    waiting = [j for j in ("j0", "j1", "j2", "j3", "j4") if j not in placed]
    assert any(REASON_PROBED in r for job in waiting for r in result.waiting[job].reasons)
    # Without the gate, the pools take every job.
    open_pools = [dataclasses.replace(n, admits="all") for n in pools]
    assert len(place(*jobs, nodes=tuple(open_pools), name=name).placements) == 5


def test_a_gang_that_fits_only_with_spot_nodes_is_told_so_when_it_says_never() -> None:
    """The gang check counts only the nodes the `spot` filter lets the job use: a `spot: never` gang of two whole
    nodes with one on-demand node can never run, and says why; the same gang allowed on spot runs."""
    never = place(make_job("never").gpus(8).workers(2).build())
    status = never.waiting["never"]
    assert status.code is Code.UNRESOLVABLE, status
    assert any("outside spot capacity, which the job does not allow (spot: never)" in r for r in status.reasons), (
        status.reasons
    )
    allowed = place(make_job("ok").gpus(8).workers(2).spot("allowed").build())
    assert sorted(w.node for w in allowed.placements[0].workers) == ["a-od", "b-spot"]


def test_a_gang_waiting_for_on_demand_room_is_not_counted_on_free_spot_nodes() -> None:
    """Half the on-demand node is taken and the spot node is free: two 4-GPU workers of a `spot: never` gang fit
    in what is free only by counting the spot node, so the gang check says it waits (all or nothing)."""
    result = place(make_job("busy").gpus(4).build(), make_job("gang").gpus(4).workers(2).build(), name="fifo")
    status = result.waiting["gang"]
    assert status.code is Code.UNSCHEDULABLE, status
    assert status.plugin == "gang", status
    assert any("only 1 fit in what is free now" in r for r in status.reasons), status.reasons
