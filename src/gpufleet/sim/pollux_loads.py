"""Pollux's eight workloads at several loads (`gpufleet sim --reproduce pollux-loads`): each load runs
`reproduce_pollux` with arrivals scaled (0.5: the same 160 jobs over twice the time; 2: over half), and the
table keeps its means (all eight, 1-4 on which the resize constants were tuned, 5-8 held out) beside Pollux's
published mean at the same job load. Pollux's job loads add jobs instead (80 to 320 sampled over the same 8
hours): the same arrival rate, not the same jobs, so only load 1.0 compares like for like."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from gpufleet.sim.experiment import Comparison, Progress
from gpufleet.sim.prices import PriceTable
from gpufleet.sim.workload import WorkloadError

POLLUX_LOADS = (0.5, 1.0, 1.5, 2.0)
LOADS_POLICIES = ("tiresias", "default")
MEANS = ("mean", "mean 1-4 (tuned)", "mean 5-8 (held out)")


def reproduce_pollux_loads(
    traces_root: Path,
    *,
    reproduce_pollux: Callable[..., Comparison],
    policies: Sequence[str] | None = None,
    loads: Sequence[float] = POLLUX_LOADS,
    prices: PriceTable | None = None,
    progress: Progress | None = None,
) -> Comparison:
    """Means of average JCT over the eight workloads at each load, ours beside Pollux's published ones
    (`reproduce_pollux`: the one-load reproduction, `gpufleet.sim.reproduce_pollux.reproduce_pollux`)."""
    if not loads:
        raise WorkloadError("no load given", "give loads, e.g. --set loads=0.5,1,1.5,2")
    rows = []
    notes: tuple[str, ...] = ()
    for load in loads:
        one = reproduce_pollux(
            traces_root, policies=tuple(policies or LOADS_POLICIES), prices=prices, progress=progress, load=load
        )
        for policy, part, ours, pollux, tiresias, optimus, _ in one.rows:
            if part in MEANS:
                rows.append((load, policy, part, ours, pollux, tiresias, optimus, _ratio(ours, pollux)))
        notes = notes or tuple(n for n in one.notes if not n.startswith("Load ") and not n.startswith("Published"))
    notes = (
        "Load scales arrival times: 0.5 spreads each workload's 160 jobs over twice the time, 2.0 packs them into "
        "half. Pollux's published job loads sample more or fewer jobs over the same 8 hours instead (80 at 0.5, 320 "
        "at 2.0): the same arrival rate, not the same jobs; only load 1.0 is like for like.",
        "Published: mean of the 8 workloads' average JCT at each job load (and of 1-4, 5-8), 60 s scheduling "
        "interval, no interference.",
        *notes,
    )
    return Comparison(
        "pollux-loads",
        "Pollux workloads 1-8 on 64 T4 at loads "
        + ", ".join(f"{load:g}" for load in loads)
        + ": mean avg JCT (s), ours vs Pollux (OSDI'21)",
        (
            "load",
            "policy",
            "workloads",
            "avg_jct_s",
            "pollux_avg_jct_s",
            "tiresias_avg_jct_s",
            "optimus_avg_jct_s",
            "ratio_to_pollux",
        ),
        tuple(rows),
        (),
        one.source,
        notes,
    )


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return None if ours is None or not theirs else round(ours / theirs, 3)
