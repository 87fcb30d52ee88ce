"""The spot circuit breaker's state machine on injected interruptions (`domain/spot.py`)."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.domain import GiB, make_node
from gpufleet.domain.errors import SpecError
from gpufleet.domain.spot import BreakerSettings, BreakerState, SpotBreakers

MIN = 60.0


def spot(name: str, zone: str = "us-east-1a", healthy: bool = True):  # type: ignore[no-untyped-def]
    node = make_node(name, "V100", 1, 16 * GiB, zone=zone)
    return dataclasses.replace(node, pool="spot", healthy=healthy)


POOL = [spot(f"s{i}") for i in range(4)]
OTHER = [spot("t0", zone="us-east-1c"), make_node("od", "V100", 8, 16 * GiB)]


def nodes(down: set[str] = frozenset()):  # type: ignore[no-untyped-def,assignment]
    return [dataclasses.replace(n, healthy=n.name not in down) for n in POOL + OTHER]


def test_opens_past_the_threshold_and_gates_only_that_pools_nodes() -> None:
    breakers = SpotBreakers()
    gates, events = breakers.step(0.0, nodes(), {})
    assert events == []
    assert set(gates) == {"s0", "s1", "s2", "s3", "t0"}  # the on-demand node is no spot node
    assert set(gates.values()) == {"all"}
    # 4 nodes up for an hour: 4 node-hours; one loss = 0.25/node-h, under 0.3
    gates, events = breakers.step(3600.0, nodes({"s0"}), {})
    assert events == []
    assert breakers.pools["us-east-1a"].state is BreakerState.CLOSED
    # a second loss 10 minutes later: 2 in the hour over ~3.9 node-hours = 0.51/node-h
    gates, events = breakers.step(3600.0 + 10 * MIN, nodes({"s0", "s1"}), {})
    assert [(e.pool, e.state) for e in events] == [("us-east-1a", BreakerState.OPEN)]
    assert "2 interruptions in 1 h" in events[0].reason
    assert "threshold 0.3/node-h" in events[0].reason
    assert {n: g for n, g in gates.items() if n.startswith("s")} == dict.fromkeys(
        ("s0", "s1", "s2", "s3"), "checkpointing"
    )
    assert gates["t0"] == "all"
    assert breakers.describe("us-east-1a", 0.0).startswith(
        "spot pool us-east-1a open since 1970-01-01 01:10 UTC: 2 interruptions"
    )


def test_half_open_after_cool_down_one_probe_then_closed_when_it_survives() -> None:
    breakers = SpotBreakers(BreakerSettings(threshold=0.3, cooldown_s=30 * MIN, probe_s=20 * MIN, blocks="none"))
    breakers.step(0.0, nodes(), {})
    _, events = breakers.step(60.0, nodes({"s0"}), {})  # 1 loss over the 1 node-hour floor: 1.0/node-h
    assert [e.state for e in events] == [BreakerState.OPEN]
    gates, _ = breakers.step(60.0 + 10 * MIN, nodes({"s0"}), {"old": frozenset({"s2"})})
    assert gates["s1"] == "none"
    gates, events = breakers.step(60.0 + 30 * MIN, nodes({"s0"}), {"old": frozenset({"s2"})})
    assert [e.state for e in events] == [BreakerState.HALF_OPEN]
    assert gates["s1"] == "probe"  # one probe job may come in
    t = 60.0 + 31 * MIN
    gates, events = breakers.step(t, nodes({"s0"}), {"old": frozenset({"s2"}), "probe": frozenset({"s1"})})
    assert breakers.pools["us-east-1a"].probe == "probe"  # the new job, not the one that was there
    assert gates["s1"] == "none"  # one probe at a time
    gates, events = breakers.step(t + 20 * MIN, nodes({"s0"}), {"probe": frozenset({"s1"})})
    assert [e.state for e in events] == [BreakerState.CLOSED]
    assert "probe job survived 1200 s" in events[0].reason
    assert set(gates.values()) == {"all"}


def test_an_interruption_while_half_open_opens_it_again_and_one_while_open_restarts_the_cool_down() -> None:
    breakers = SpotBreakers(BreakerSettings(cooldown_s=30 * MIN))
    breakers.step(0.0, nodes(), {})
    breakers.step(60.0, nodes({"s0"}), {})
    breakers.step(60.0 + 20 * MIN, nodes({"s0", "s1"}), {})  # open: the cool-down starts again here
    _, events = breakers.step(60.0 + 40 * MIN, nodes({"s0", "s1"}), {})
    assert events == []
    _, events = breakers.step(60.0 + 50 * MIN, nodes({"s0", "s1"}), {})
    assert [e.state for e in events] == [BreakerState.HALF_OPEN]
    breakers.step(60.0 + 51 * MIN, nodes({"s0", "s1"}), {"probe": frozenset({"s2"})})
    _, events = breakers.step(60.0 + 52 * MIN, nodes({"s0", "s1", "s2"}), {})
    assert [e.state for e in events] == [BreakerState.OPEN]
    assert events[0].reason.startswith("interrupted while probing")
    assert breakers.pools["us-east-1a"].interruptions_total == 3


def test_a_node_coming_back_is_not_an_interruption_and_settings_are_checked() -> None:
    breakers = SpotBreakers()
    breakers.step(0.0, nodes({"s0"}), {})
    _, events = breakers.step(60.0, nodes(), {})
    assert events == []
    assert breakers.pools["us-east-1a"].interruptions_total == 0
    with pytest.raises(SpecError, match="threshold"):
        BreakerSettings(threshold=0.0)
    with pytest.raises(SpecError, match="blocks"):
        BreakerSettings(blocks="some")
