"""Every built-in plugin registered by extension point, and the named profiles built from them."""

from __future__ import annotations

from collections.abc import Callable

from gpufleet.domain.errors import UnknownNameError
from gpufleet.policies.admit.gang import GangAdmission
from gpufleet.policies.admit.quota import QuotaAdmission
from gpufleet.policies.filter.fits import Fits
from gpufleet.policies.filter.gpu_model import GpuModel
from gpufleet.policies.filter.health import NodeHealth
from gpufleet.policies.order.fair_share import FairShare
from gpufleet.policies.order.fifo import Fifo
from gpufleet.policies.order.las import LeastAttainedService
from gpufleet.policies.order.priority import Priority
from gpufleet.policies.preempt.priority import PriorityPreemption
from gpufleet.policies.score.bin_pack import BinPack
from gpufleet.policies.score.spread import Spread
from gpufleet.policies.score.topology import Topology
from gpufleet.policies.select.pack import PackGpus
from gpufleet.scheduling.plugins import (
    AdmitPlugin,
    FilterPlugin,
    OrderPlugin,
    PreemptPlugin,
    Profile,
    ScorePlugin,
    SelectPlugin,
)
from gpufleet.scheduling.registry import Registry

ORDER: Registry[OrderPlugin] = Registry("order")
ADMIT: Registry[AdmitPlugin] = Registry("admit")
FILTER: Registry[FilterPlugin] = Registry("filter")
SCORE: Registry[ScorePlugin] = Registry("score")
SELECT: Registry[SelectPlugin] = Registry("select")
PREEMPT: Registry[PreemptPlugin] = Registry("preempt")

for _cls in (Fifo, Priority, FairShare, LeastAttainedService):
    ORDER.register(_cls.name, _cls)
for _admit in (QuotaAdmission, GangAdmission):
    ADMIT.register(_admit.name, _admit)
for _filter in (NodeHealth, GpuModel, Fits):
    FILTER.register(_filter.name, _filter)
for _score in (BinPack, Spread, Topology):
    SCORE.register(_score.name, _score)
SELECT.register(PackGpus.name, PackGpus)
PREEMPT.register(PriorityPreemption.name, PriorityPreemption)

STANDARD_FILTERS = ("node_health", "gpu_model", "fits")
STANDARD_ADMIT = ("gang", "quota")


def build_profile(
    name: str,
    order: str,
    scores: tuple[tuple[str, float], ...],
    *,
    preempt: str | None = None,
    strict_fifo: bool = False,
) -> Profile:
    return Profile(
        name=name,
        order=ORDER.create(order),
        admit=tuple(ADMIT.create(a) for a in STANDARD_ADMIT),
        filters=tuple(FILTER.create(f) for f in STANDARD_FILTERS),
        scores=tuple((SCORE.create(s), w) for s, w in scores),
        select=SELECT.create("pack"),
        preempt=PREEMPT.create(preempt) if preempt else None,
        strict_fifo=strict_fifo,
    )


PROFILES: dict[str, Callable[[], Profile]] = {
    # gpufleet's default: fair share between teams, priority preemption and reclaim, packing + topology.
    "default": lambda: build_profile(
        "default", "fair_share", (("bin_pack", 1.0), ("topology", 1.0)), preempt="priority"
    ),
    "fifo": lambda: build_profile("fifo", "fifo", (("bin_pack", 1.0),), strict_fifo=True),
    "fifo-backfill": lambda: build_profile("fifo-backfill", "fifo", (("bin_pack", 1.0),)),
    "priority": lambda: build_profile(
        "priority", "priority", (("bin_pack", 1.0), ("topology", 1.0)), preempt="priority"
    ),
    "spread": lambda: build_profile("spread", "fifo", (("spread", 1.0),)),
    "best-fit": lambda: build_profile("best-fit", "fifo", (("bin_pack", 1.0),)),
    "las": lambda: build_profile("las", "las", (("bin_pack", 1.0), ("topology", 1.0))),
}


def profile(name: str) -> Profile:
    factory = PROFILES.get(name)
    if factory is None:
        raise UnknownNameError(f"no scheduling profile named {name!r}", f"use one of: {', '.join(sorted(PROFILES))}")
    return factory()
