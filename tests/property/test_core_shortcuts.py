"""The core's speed shortcuts decide exactly what the plain path decides, on random worlds.

Shortcuts checked: jobs whose outcome is already known in the cycle settled without a turn
(`settle_known`), single-node victim searches skipped when they cannot beat the best set found
(`_lower_bound`), what-ifs over many running jobs applied as arrays (`SHIFT_ARRAYS_FROM`), node-local
scores kept per request class and recomputed for changed nodes only (`Profile.local_scores`), and the
node table, capacity memo and running-job facts reused from an earlier cycle of the same inventory.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from unittest.mock import patch

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.policies.catalog import profile
from gpufleet.policies.preempt import priority as priority_preemption
from gpufleet.scheduling import cycle as cycle_module
from gpufleet.scheduling import state as state_module
from gpufleet.scheduling.cycle import run_cycle
from gpufleet.scheduling.plugin_api import Profile
from gpufleet.scheduling.state import InventoryCache
from tests.kit import without
from tests.property.strategies import World, worlds


def _never_prune(*_: object) -> tuple[float, float, float, float]:
    return (-math.inf, -math.inf, -math.inf, -math.inf)


@contextmanager
def _plain() -> Iterator[None]:
    """Every shortcut off: each job takes its turn, every node is searched, what-ifs go job by job,
    every candidate is scored afresh (and nothing is reused from earlier cycles: no inventory cache)."""
    with (
        patch.object(cycle_module._Cycle, "settle_known", lambda self, stack: None),
        patch.object(priority_preemption, "_lower_bound", _never_prune),
        patch.object(state_module, "SHIFT_ARRAYS_FROM", 10**9),
        patch.object(Profile, "local_scores", property(lambda self: False)),
    ):
        yield


@given(worlds(max_pending=12), st.data())
def test_shortcuts_decide_as_the_plain_path(world: World, data: st.DataObject) -> None:
    policy = profile(world.profile_name)
    with _plain():
        plain = run_cycle(world.snapshot, world.pending, policy).to_json()
    # Arrays from two jobs on, so that the small worlds exercise the vectorised what-if too.
    with patch.object(state_module, "SHIFT_ARRAYS_FROM", 2):
        inventory = InventoryCache()
        cold = run_cycle(world.snapshot, world.pending, policy, inventory=inventory).to_json()
        again = run_cycle(world.snapshot, world.pending, policy, inventory=inventory).to_json()
        # Warm from a different cycle of the same inventory: some running jobs gone, the rest the same objects.
        running = sorted(r.id for r in world.snapshot.running)
        gone = data.draw(st.lists(st.sampled_from(running), unique=True) if running else st.just([]))
        run_cycle(without(world.snapshot, gone), world.pending, policy, inventory=inventory)
        warm = run_cycle(world.snapshot, world.pending, policy, inventory=inventory).to_json()
    assert cold == plain
    assert again == plain
    assert warm == plain
