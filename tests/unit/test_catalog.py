"""The plugin registries and the named profiles built from them."""

from __future__ import annotations

import pytest

from gpufleet.domain import GpufleetError, UnknownNameError
from gpufleet.policies.catalog import (
    ADMIT,
    DEFAULT_LAS_MIN_RUN_S,
    FILTER,
    ORDER,
    PREEMPT,
    PROFILES,
    SCORE,
    SELECT,
    build_profile,
    profile,
)
from gpufleet.policies.preempt.las import LasPreemption
from gpufleet.scheduling.plugin_api import Registry

EXPECTED = {
    "default": "order=fair_qssf, admit=gang+quota, filter=node_health+gpu_model+fits+spot, "
    "score=fgd*1+model_scarcity*0.3+topology*1+spot_preference*10, select=fgd, preempt=las-shrink-first, learner=qssf, "
    "resize=goodput",
    "fair-binpack": "order=fair_share, admit=gang+quota, filter=node_health+gpu_model+fits+spot, "
    "score=bin_pack*1+topology*1+spot_preference*10, select=pack, preempt=priority",
    "fifo": "order=fifo, admit=gang+quota, filter=node_health+gpu_model+fits+spot, "
    "score=bin_pack*1+spot_preference*10, select=pack, preempt=none",
    "fifo-backfill": "order=fifo, admit=gang+quota, filter=node_health+gpu_model+fits+spot, "
    "score=bin_pack*1+spot_preference*10, select=pack, preempt=none",
    "priority": "order=priority, admit=gang+quota, filter=node_health+gpu_model+fits+spot, "
    "score=bin_pack*1+topology*1+spot_preference*10, select=pack, preempt=priority",
    "spread": "order=fifo, admit=gang+quota, filter=node_health+gpu_model+fits+spot, "
    "score=spread*1+spot_preference*10, select=pack, preempt=none",
    "best-fit": "order=fifo, admit=gang+quota, filter=node_health+gpu_model+fits+spot, "
    "score=best_fit*1+spot_preference*10, select=pack, preempt=none",
    "las": "order=las, admit=gang+quota, filter=node_health+gpu_model+fits+spot, "
    "score=bin_pack*1+topology*1+spot_preference*10, select=pack, preempt=none",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_named_profiles(name: str) -> None:
    built = profile(name)
    assert built.name == name
    assert built.describe() == EXPECTED[name]
    assert built.strict_fifo is (name == "fifo")


def test_the_core_profiles_are_all_there() -> None:
    assert set(EXPECTED) <= set(PROFILES)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_builds_and_describes_itself(name: str) -> None:
    built = profile(name)
    assert built.name == name
    assert built.describe().startswith("order=")


def test_an_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as caught:
        profile("fastest")
    assert caught.value.fix == "use one of: " + ", ".join(sorted(PROFILES))


@pytest.mark.parametrize(
    ("registry", "names"),
    [
        pytest.param(ORDER, ["fair_share", "fifo", "las", "priority"], id="order"),
        pytest.param(ADMIT, ["gang", "quota"], id="admit"),
        pytest.param(FILTER, ["fits", "gpu_model", "node_health"], id="filter"),
        pytest.param(SCORE, ["bin_pack", "spread", "topology"], id="score"),
        pytest.param(SELECT, ["pack"], id="select"),
        pytest.param(PREEMPT, ["priority"], id="preempt"),
    ],
)
def test_registries_hold_every_core_plugin_under_its_name(registry: Registry[object], names: list[str]) -> None:
    assert set(names) <= set(registry.names())
    assert registry.names() == sorted(registry.names())
    for name in registry.names():
        assert registry.create(name).name == name  # type: ignore[attr-defined]


def test_a_registry_refuses_a_duplicate_name() -> None:
    registry: Registry[object] = Registry("test")
    registry.register("x", object)
    with pytest.raises(GpufleetError, match="a test plugin named 'x' is registered already"):
        registry.register("x", object)


def test_an_unknown_plugin_names_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match="no score plugin named 'magic'") as caught:
        build_profile("p", "fifo", (("magic", 1.0),))
    assert caught.value.fix == "use one of: " + ", ".join(SCORE.names())


def test_default_suspends_for_service_only_after_its_minimum_run() -> None:
    preempt = profile("default").preempt
    assert isinstance(preempt, LasPreemption)
    assert preempt.min_run_s == DEFAULT_LAS_MIN_RUN_S == 900.0
    assert preempt.bands.thresholds == (3_600.0, 36_000.0)


def test_each_call_builds_fresh_plugins() -> None:
    assert profile("default").order is not profile("default").order
