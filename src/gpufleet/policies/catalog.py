"""Every built-in plugin registered by extension point, and the named profiles built from them.

Named profiles (kebab-case; every one has the standard admission `gang`+`quota` and filters
`node_health`+`gpu_model`+`fits`):

    default        fair share between queues (DRF); inside a queue priority, then least predicted service
                   (`fair_qssf`: run times learned online, with aging); priority preemption and quota reclaim,
                   and inside a queue LAS preemption (`las`: a job may suspend one of its queue, priority at
                   most its own, that has had more GPU time by Tiresias' bands, 1 and 10 GPU-hours, once that
                   one has run 15 minutes since it started); placement by `fgd-plus`'s scores (FGD as
                   published + model scarcity 0.3) + topology, FGD GPU selection; elastic jobs resized by
                   goodput (`goodput`: grow, shrink to admit, shed, rebalance; less GPU time first)
    fair-binpack   fair share between queues, priority then FIFO inside a queue, priority preemption and
                   quota reclaim, bin_pack + topology (the default before QSSF ordering and FGD placement)
    fifo           strict FIFO (a head that does not fit holds its queue), bin_pack
    fifo-backfill  FIFO, jobs behind a blocked head may go first, bin_pack
    priority       priority then FIFO, priority preemption, bin_pack + topology
    spread         FIFO, least-allocated nodes first (the Kubernetes default)
    best-fit       FIFO, best fit by absolute CPU and GPU left (`best_fit`, FGD's `BestFit` baseline)
    las            Tiresias' discretised least attained service, bin_pack + topology
    first-fit      FIFO, no score: the first node (by name) that fits; pack GPU selection
    random         FIFO, uniformly random node, seeded by the snapshot seed and job id (FGD's `01-Random`)
    fgd            FIFO, fragmentation gradient descent score + FGD GPU selection (FGD's `06-FGD`), for a
                   target workload (`PolicyData.target`; default: `GENERIC_TARGET`); scores in whole points,
                   as the authors' simulator computes them, so that it is the published FGD
    fgd-bf         FGD with exact scores and best fit (weight 0.02) to break its near-ties toward the node
                   with the least absolute room left (an alternative to the whole-point ties of `fgd`)
    fgd-plus       `fgd` plus `model_scarcity` (weight 0.3): jobs that may run on any GPU model stay off the
                   models that model-bound jobs need; where no job is bound to a model it places as `fgd`
    fgd-fair       `default` with FGD for placement: fair share, fgd + topology, FGD GPU selection, priority
                   preemption; for shared clusters with fractional GPUs
    sjf            shortest job first with known durations (`expected_duration`), bin_pack + topology
    srtf           shortest remaining time first (duration minus attained service), bin_pack + topology;
                   ordering only: no plugin preempts a running job for a shorter one
    gavel          the round allocator (`policies/rounds`): each round (360 s) an LP gives every active job
                   max-min fair shares of each GPU model over throughput-normalised allocations, weighted by
                   service received inside a queue (bands 0.5, 2 and 10 h: weights 64, 16, 4, 1) and queue
                   weight; a running job keeps its GPUs unless another lags by more than 360 s; keeps every
                   GPU busy; jobs that lag their share run next round, others are preempted with the
                   checkpoint signal at the round's end; with one queue, a running job the plan puts on
                   another GPU model moves there at the round's start (at most once a round); for a
                   throughput table (`PolicyData.throughput`; without one every model counts the same)
    gavel-mmf      Gavel's own `max_min_fairness_perf`: the round allocator with equal weights and one LP
    max-min        Gavel's heterogeneity-agnostic `max_min_fairness`: the round allocator with every GPU model
                   counted the same (preemptive time-sharing)
    gavel-greedy   the event-driven approximation that `gavel` was before: max-min on normalised throughput
                   by a greedy order (`throughput_fair`), heterogeneity-aware placement (`throughput`, weight
                   2) + bin_pack + topology; no rounds, no preemption
    tiresias       least attained service (2D-LAS bands) with consolidation first (topology weight 2, then
                   bin_pack), and LAS preemption: a job may stop jobs of its queue in a higher band (`las`)
    qssf           quasi-shortest service first (Helios): least predicted GPU-seconds first, run times learned
                   online (the 0.3-quantile of the last 20 of the same queue and GPU count, running jobs at
                   their run time so far; aging 0.1 GPU-second per second waited); no oracle durations, no
                   preemption; bin_pack + topology
    default-qssf   `default`'s order (`fair_qssf`), priority preemption and reclaim only (no LAS preemption),
                   bin_pack + topology placement

Any profile takes modifiers after its name: `+reserve=DURATION` (e.g. `fifo-backfill+reserve=2h`) gives the job
that has waited that long a reserved start (EASY backfill, `scheduling/reservation.py`): jobs that would delay it
keep off the room it will start in. No named profile reserves by default: on Philly December x8 it bought nothing
(its large jobs wait for their teams' quota, not for room; docs/results, `starvation`).

Profiles that order by QSSF (`default`, `qssf`, `default-qssf`) carry its learner (`RunTimeLearner`,
registered as `qssf` in `LEARNER`), which the control loop feeds and whose estimates every cycle reads.

Data-driven plugins (FGD's target workload, Gavel's throughput table) cannot be built from a name alone.
Two ways to give them their data:

- `profile(name, PolicyData(target=..., throughput=...))` builds a named profile with that data (the
  simulator builds `fgd` with the trace's own distribution, `TargetWorkload.from_requests`, as the paper
  does); `profile(name)` and `PROFILES[name]()` use the defaults.
- `build_profile` takes plugin instances wherever it takes names, for custom combinations:
  `build_profile("mine", "fifo", ((FgdScore(target), 1.0), ("bin_pack", 0.5)), select=FgdSelect(target))`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from gpufleet.domain.errors import UnknownNameError
from gpufleet.domain.throughput_table import ThroughputTable
from gpufleet.policies.admit.gang import GangAdmission
from gpufleet.policies.admit.quota import QuotaAdmission
from gpufleet.policies.filter.fits import Fits
from gpufleet.policies.filter.gpu_model import GpuModel
from gpufleet.policies.filter.health import NodeHealth
from gpufleet.policies.filter.spot import SpotFilter
from gpufleet.policies.order.fair_share import FairShare
from gpufleet.policies.order.fifo import Fifo
from gpufleet.policies.order.las import LeastAttainedService
from gpufleet.policies.order.priority import Priority
from gpufleet.policies.order.qssf import FairShareQssf, QuasiShortestServiceFirst, RunTimeLearner
from gpufleet.policies.order.sjf import ShortestJobFirst
from gpufleet.policies.order.srtf import ShortestRemainingTime
from gpufleet.policies.order.throughput_fair import ThroughputFairShare
from gpufleet.policies.preempt.las import LasPreemption
from gpufleet.policies.preempt.priority import PriorityPreemption
from gpufleet.policies.resize.goodput import GoodputResize
from gpufleet.policies.resize.shrink_first import ShrinkFirstLas
from gpufleet.policies.rounds.plan import Planner, WeightBands
from gpufleet.policies.rounds.plugins import RoundAdmit, RoundMigrate, RoundOrder, RoundPreempt, ServiceLearner
from gpufleet.policies.score.best_fit import BestFit
from gpufleet.policies.score.bin_pack import BinPack
from gpufleet.policies.score.fgd import FgdScore
from gpufleet.policies.score.model_scarcity import ModelScarcity
from gpufleet.policies.score.random import RandomScore
from gpufleet.policies.score.spot_preference import SpotPreference
from gpufleet.policies.score.spread import Spread
from gpufleet.policies.score.throughput import ThroughputScore
from gpufleet.policies.score.topology import Topology
from gpufleet.policies.select.fgd import FgdSelect
from gpufleet.policies.select.pack import PackGpus
from gpufleet.scheduling.plugin_api import (
    GENERIC_TARGET,
    AdmitPlugin,
    FilterPlugin,
    Learner,
    OrderPlugin,
    PreemptPlugin,
    Profile,
    Registry,
    ScorePlugin,
    SelectPlugin,
    TargetWorkload,
)

ORDER: Registry[OrderPlugin] = Registry("order")
ADMIT: Registry[AdmitPlugin] = Registry("admit")
FILTER: Registry[FilterPlugin] = Registry("filter")
SCORE: Registry[ScorePlugin] = Registry("score")
SELECT: Registry[SelectPlugin] = Registry("select")
PREEMPT: Registry[PreemptPlugin] = Registry("preempt")
LEARNER: Registry[Learner] = Registry("learner")

for _cls in (
    Fifo,
    Priority,
    FairShare,
    LeastAttainedService,
    ShortestJobFirst,
    ShortestRemainingTime,
    ThroughputFairShare,
    QuasiShortestServiceFirst,
    FairShareQssf,
):
    ORDER.register(_cls.name, _cls)
for _admit in (QuotaAdmission, GangAdmission):
    ADMIT.register(_admit.name, _admit)
for _filter in (NodeHealth, GpuModel, Fits, SpotFilter):
    FILTER.register(_filter.name, _filter)
for _score in (
    BinPack,
    BestFit,
    Spread,
    Topology,
    FgdScore,
    RandomScore,
    ThroughputScore,
    ModelScarcity,
    SpotPreference,
):
    SCORE.register(_score.name, _score)
for _select in (PackGpus, FgdSelect):
    SELECT.register(_select.name, _select)
for _preempt in (PriorityPreemption, LasPreemption, ShrinkFirstLas):
    PREEMPT.register(_preempt.name, _preempt)
LEARNER.register(RunTimeLearner.name, RunTimeLearner)

STANDARD_FILTERS = ("node_health", "gpu_model", "fits", "spot")
# Every profile ends its scores with the spot preference (0 everywhere for jobs that do not prefer spot), with a
# weight above the others' together, so that `spot: preferred` places on spot capacity first.
SPOT_PREFERRED_WEIGHT = 10.0
STANDARD_ADMIT = ("gang", "quota")


def build_profile(
    name: str,
    order: str | OrderPlugin,
    scores: tuple[tuple[str | ScorePlugin, float], ...],
    *,
    select: str | SelectPlugin = "pack",
    preempt: str | PreemptPlugin | None = None,
    strict_fifo: bool = False,
    learner: str | Learner | None = None,
) -> Profile:
    """A profile with the standard admission and filters. Each plugin is a registered name (built fresh) or
    an instance (used as is: plugins that need data, such as `FgdScore(target)`)."""
    return Profile(
        name=name,
        order=ORDER.create(order) if isinstance(order, str) else order,
        admit=tuple(ADMIT.create(a) for a in STANDARD_ADMIT),
        filters=tuple(FILTER.create(f) for f in STANDARD_FILTERS),
        scores=(
            *((SCORE.create(s) if isinstance(s, str) else s, w) for s, w in scores),
            (SpotPreference(), SPOT_PREFERRED_WEIGHT),
        ),
        select=SELECT.create(select) if isinstance(select, str) else select,
        preempt=PREEMPT.create(preempt) if isinstance(preempt, str) else preempt,
        strict_fifo=strict_fifo,
        learner=LEARNER.create(learner) if isinstance(learner, str) else learner,
    )


@dataclass(frozen=True, slots=True)
class PolicyData:
    """Data that some plugins are built with; a profile uses what it needs and ignores the rest.

    `target`: FGD's target workload (the paper uses the trace's own: `TargetWorkload.from_requests`).
    `throughput`: Gavel's throughput table (`gpufleet.sim.workloads.gavel.load_throughput_table`).
    """

    target: TargetWorkload = GENERIC_TARGET
    throughput: ThroughputTable | None = None


# The model-scarcity weight of fgd-plus and default (tuned: gpufleet.sim.tuned says on what).
FGD_PLUS_SCARCITY_WEIGHT = 0.3


def _fgd(data: PolicyData) -> Profile:
    # FGD as published: whole-point scores and GPU choice, as the authors' simulator computes them.
    score = FgdScore(data.target, truncate=True)
    select = FgdSelect(data.target, memo=score.memo, truncate=True)
    return build_profile("fgd", "fifo", ((score, 1.0),), select=select)


# fgd-bf's best-fit weight: breaks exact FGD's near-ties (tuned: gpufleet.sim.tuned says on what).
FGD_BF_BEST_FIT_WEIGHT = 0.02


def _fgd_best_fit(data: PolicyData) -> Profile:
    score = FgdScore(data.target)
    return build_profile(
        "fgd-bf",
        "fifo",
        ((score, 1.0), ("best_fit", FGD_BF_BEST_FIT_WEIGHT)),
        select=FgdSelect(data.target, memo=score.memo),
    )


def _fgd_plus(data: PolicyData) -> Profile:
    # FGD as published (whole-point scores, first node on ties) plus model scarcity (weight 0.3, measured on
    # openb gpuspec33 seeds 42-46: see gpufleet.sim.tuned). Scarcity is the same on every node when no job is
    # bound to a model, so there fgd-plus places exactly as fgd; where jobs are bound, 0.3 outweighs FGD's
    # choice between models without deciding within one.
    score = FgdScore(data.target, truncate=True)
    return build_profile(
        "fgd-plus",
        "fifo",
        ((score, 1.0), (ModelScarcity(data.target), FGD_PLUS_SCARCITY_WEIGHT)),
        select=FgdSelect(data.target, memo=score.memo, truncate=True),
    )


# A job runs this long per start before it can be stopped for a job with less attained service (`default`).
# Tuned, with the data it was tuned on in gpufleet.sim.tuned.
DEFAULT_LAS_MIN_RUN_S = 900.0
# `default`: the least time between two resizes of one elastic job (tuned on Pollux workloads 1-4; see
# gpufleet.sim.tuned).
DEFAULT_RESIZE_MIN_INTERVAL_S = 60.0
# `default`: by how much more than it costs a move of GPUs between running elastic jobs must pay (the rebalance
# of `GoodputResize`; tuned on Pollux workloads 1-4, see gpufleet.sim.tuned).
DEFAULT_REBALANCE_MARGIN = 3.0
# `default`: an elastic job better off at a smaller size gives the surplus back (`GoodputResize.shed`).
DEFAULT_SHED = True
# `default`: a job's goodput gains weigh (1 + attained GPU-s / scale) ^ -exponent in resizing (less service
# first; `GoodputResize.service_scale_s`). Tuned on Pollux workloads 1-4 (see gpufleet.sim.tuned).
DEFAULT_SERVICE_SCALE_S = 7200.0
DEFAULT_SERVICE_EXPONENT = 0.5


def _default(data: PolicyData) -> Profile:
    # Order: fair share between teams, then Helios' QSSF inside a team. Preemption: priority and reclaim, and
    # inside a team Tiresias' LAS bands (a job that has had hours of GPU time may be suspended for a new one,
    # after DEFAULT_LAS_MIN_RUN_S of its current run). Placement: `fgd-plus`'s (fractional GPUs packed without
    # stranding, scarce models kept for the jobs bound to them) and topology for multi-GPU workers and gangs;
    # on openb it allocates as `fgd-plus` does. Measured figures: docs/results/.
    # Resize: running elastic jobs grow into idle GPUs, shrink to admit waiting jobs and move GPUs to where they
    # add the most goodput, by a margin over the restarts, the jobs that have had less GPU time first (the only
    # profile that resizes; the baselines keep every job at the size it started at). An elastic job shrinks
    # instead of being stopped for service.
    score = FgdScore(data.target, truncate=True)
    profile = build_profile(
        "default",
        "fair_qssf",
        ((score, 1.0), (ModelScarcity(data.target), FGD_PLUS_SCARCITY_WEIGHT), ("topology", 1.0)),
        select=FgdSelect(data.target, memo=score.memo, truncate=True),
        preempt=ShrinkFirstLas(min_run_s=DEFAULT_LAS_MIN_RUN_S),
        learner="qssf",
    )
    resize = GoodputResize(
        min_interval_s=DEFAULT_RESIZE_MIN_INTERVAL_S,
        rebalance=True,
        rebalance_margin=DEFAULT_REBALANCE_MARGIN,
        shed=DEFAULT_SHED,
        service_scale_s=DEFAULT_SERVICE_SCALE_S,
        service_exponent=DEFAULT_SERVICE_EXPONENT,
    )
    return dataclasses.replace(profile, resize=resize)


def _fgd_fair(data: PolicyData) -> Profile:
    score = FgdScore(data.target)
    return build_profile(
        "fgd-fair",
        "fair_share",
        ((score, 1.0), ("topology", 1.0)),
        select=FgdSelect(data.target, memo=score.memo),
        preempt="priority",
    )


# The round allocator's settings (see `gpufleet.policies.rounds` and docs/results/gavel.md for the measurements).
ROUND_S = 360.0  # Gavel's round; see ROUND_S_MEASURED in gpufleet.sim.tuned
ROUND_MIN_RUN_S = 0.0  # a job started in a round keeps its GPUs to the round's end; no further minimum
# `gavel`'s weights by hours of service received: less service, more weight (tuned; see gpufleet.sim.tuned).
GAVEL_BANDS = WeightBands(thresholds_h=(0.5, 2.0, 10.0), weights=(64.0, 16.0, 4.0, 1.0))
# `gavel`: a running job keeps its GPUs unless another job lags its share by more than this much service (the
# restart a stop costs, and the churn it saves; tuned, see gpufleet.sim.tuned).
GAVEL_KEEP_S = 360.0
# `gavel`: a job whose service falls below this fraction of what Gavel's isolated share (1/n of the cluster)
# would have given it goes first (finish-time fairness; tuned, see gpufleet.sim.tuned).
GAVEL_ISOLATED_FLOOR = 1.0


def round_profile(
    name: str,
    data: PolicyData,
    *,
    agnostic: bool = False,
    bands: WeightBands | None = None,
    efficient: bool = True,
    fill: bool = True,
    round_s: float = ROUND_S,
    min_run_s: float = ROUND_MIN_RUN_S,
    restart_s: float = 0.0,
    migrate: bool = False,
    isolated_floor: float = 0.0,
) -> Profile:
    """A round allocator profile: max-min fair shares of GPU models by LP each round, realised by preemption
    at round ends; placement inside the planned model packs, with topology for multi-GPU jobs; GPUs filled
    mid-round (`fill`) go to the models a job runs fastest on."""
    planner = Planner(
        data.throughput,
        round_s=round_s,
        agnostic=agnostic,
        bands=bands,
        efficient=efficient,
        fill=fill,
        restart_s=restart_s,
        migrate=migrate,
        isolated_floor=isolated_floor,
    )
    scores: tuple[tuple[str | ScorePlugin, float], ...] = (("bin_pack", 1.0), ("topology", 1.0))
    if fill and not agnostic:
        scores = ((ThroughputScore(data.throughput), 2.0), *scores)
    profile = build_profile(
        name,
        RoundOrder(planner),
        scores,
        preempt=RoundPreempt(planner, min_run_s=min_run_s),
        learner=ServiceLearner(),
    )
    return dataclasses.replace(
        profile,
        admit=(*profile.admit, RoundAdmit(planner)),
        round_s=round_s,
        migrate=RoundMigrate(planner, min_run_s=min_run_s) if migrate else None,
        job_specific=True,
        preemption_searches_per_queue=1 << 30,
    )


def _gavel_greedy(data: PolicyData) -> Profile:
    return build_profile(
        "gavel-greedy",
        ThroughputFairShare(data.throughput),
        ((ThroughputScore(data.throughput), 2.0), ("bin_pack", 1.0), ("topology", 1.0)),
    )


# name -> builder from PolicyData; every builder makes fresh plugins.
PROFILE_BUILDERS: dict[str, Callable[[PolicyData], Profile]] = {
    # gpufleet's default: fair share between teams, QSSF inside one, priority and LAS preemption and reclaim,
    # FGD placement with model scarcity.
    "default": _default,
    "fair-binpack": lambda _: build_profile(
        "fair-binpack", "fair_share", (("bin_pack", 1.0), ("topology", 1.0)), preempt="priority"
    ),
    "fifo": lambda _: build_profile("fifo", "fifo", (("bin_pack", 1.0),), strict_fifo=True),
    "fifo-backfill": lambda _: build_profile("fifo-backfill", "fifo", (("bin_pack", 1.0),)),
    "priority": lambda _: build_profile(
        "priority", "priority", (("bin_pack", 1.0), ("topology", 1.0)), preempt="priority"
    ),
    "spread": lambda _: build_profile("spread", "fifo", (("spread", 1.0),)),
    "best-fit": lambda _: build_profile("best-fit", "fifo", (("best_fit", 1.0),)),
    "las": lambda _: build_profile("las", "las", (("bin_pack", 1.0), ("topology", 1.0))),
    "first-fit": lambda _: build_profile("first-fit", "fifo", ()),
    "random": lambda _: build_profile("random", "fifo", (("random", 1.0),)),
    "fgd": _fgd,
    "fgd-bf": _fgd_best_fit,
    "fgd-plus": _fgd_plus,
    "fgd-fair": _fgd_fair,
    "sjf": lambda _: build_profile("sjf", "sjf", (("bin_pack", 1.0), ("topology", 1.0))),
    "srtf": lambda _: build_profile("srtf", "srtf", (("bin_pack", 1.0), ("topology", 1.0))),
    # Round allocators: Gavel's max-min fairness over normalised throughput (LP each round). `gavel` is ours
    # (service-weighted bands, every GPU kept busy); `gavel-mmf` Gavel's max_min_fairness_perf as published
    # (equal weights, one LP); `max-min` Gavel's heterogeneity-agnostic max_min_fairness (every GPU the same).
    "gavel": lambda data: round_profile(
        "gavel",
        data,
        bands=GAVEL_BANDS,
        restart_s=GAVEL_KEEP_S,
        migrate=True,
        isolated_floor=GAVEL_ISOLATED_FLOOR,
    ),
    "gavel-mmf": lambda data: round_profile("gavel-mmf", data, efficient=False, fill=False),
    "max-min": lambda data: round_profile("max-min", data, agnostic=True, efficient=False, fill=False),
    "gavel-greedy": _gavel_greedy,
    "tiresias": lambda _: build_profile("tiresias", "las", (("topology", 2.0), ("bin_pack", 1.0)), preempt="las"),
    # Quasi-shortest service first with run times learned online from finished jobs (no oracle durations).
    "qssf": lambda _: build_profile("qssf", "qssf", (("bin_pack", 1.0), ("topology", 1.0)), learner="qssf"),
    # `default` with QSSF inside each queue: fair share between queues, least predicted service within one.
    "default-qssf": lambda _: build_profile(
        "default-qssf", "fair_qssf", (("bin_pack", 1.0), ("topology", 1.0)), preempt="priority", learner="qssf"
    ),
}

# name -> zero-argument factory with the default PolicyData.
PROFILES: dict[str, Callable[[], Profile]] = {
    name: partial(builder, PolicyData()) for name, builder in PROFILE_BUILDERS.items()
}


def profile(name: str, data: PolicyData | None = None) -> Profile:
    """The named profile, with fresh plugins; data-driven plugins get `data` (default: `PolicyData()`).

    A name may end with modifiers: `+reserve=DURATION` (`fifo-backfill+reserve=1h`) gives a job that waited that
    long a reserved start (`Profile.reserve_after_s`; DURATION in seconds, or with s, m, h or d)."""
    base, *modifiers = name.split("+")
    builder = PROFILE_BUILDERS.get(base)
    if builder is None:
        raise UnknownNameError(f"no scheduling profile named {base!r}", f"use one of: {', '.join(sorted(PROFILES))}")
    built = builder(data if data is not None else PolicyData())
    for modifier in modifiers:
        key, _, value = modifier.partition("=")
        if key != "reserve":
            raise UnknownNameError(
                f"profile {name!r}: no modifier {key!r}", "use +reserve=DURATION, e.g. fifo-backfill+reserve=1h"
            )
        built = dataclasses.replace(built, name=name, reserve_after_s=_duration(value, name))
    return built


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _duration(text: str, name: str) -> float:
    number, unit = (text[:-1], text[-1]) if text[-1:] in _UNITS else (text, "s")
    try:
        seconds = float(number) * _UNITS[unit]
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise UnknownNameError(
            f"profile {name!r}: {text!r} is not a duration", "give seconds, or a number with s, m, h or d: +reserve=30m"
        )
    return seconds
