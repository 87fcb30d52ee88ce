"""Spot capacity in the core: `spot: never|allowed|preferred` (the `spot` filter and `spot_preference` score),
and what an open spot circuit breaker still admits (`Node.admits`, data in the snapshot)."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.domain import ClusterSnapshot, GiB, make_node
from gpufleet.policies.catalog import profile
from gpufleet.policies.filter.spot import REASON_CHECKPOINTS_ONLY, REASON_CLOSED, REASON_NOT_ALLOWED
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
