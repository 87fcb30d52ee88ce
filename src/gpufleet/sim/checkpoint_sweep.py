"""How much time a job loses to failures and checkpoints at each checkpoint interval, and where the least lies
against the interval the control plane gives (`gpufleet sim --checkpoint-sweep`).

One job needs `work_s` seconds of work. It saves a checkpoint every `interval` seconds of work, each save taking
`cost_s` (C) seconds; the nodes it runs on fail as the simulator's failure model draws them (exponential times
between failures with mean M: `FailureModel`, seeded). A failure loses the work since the last completed save
(and a save in progress); the job restarts at once from that save (restart time 0, as Young's model assumes).
Its **lost time** is its wall time minus `work_s`: re-done work plus time spent saving. Every interval of the
sweep meets the same failure times (common random numbers), so the curve's shape is the model's, not the
noise's. The interval the control plane gives for (C, M) is `domain.checkpoints.optimal_interval`, the very
function the live control plane calls at each start.

The default settings are published figures (`../shared/costs/published-constants`, each cited there):
- Llama 3 (Meta 2024): a 16,384-GPU job fails every 3.09 h; a 60 s checkpoint;
- a spot node interrupted 0.3 times per hour (NSDI'24 V100 traces: M = 3.33 h) with a 120 s checkpoint;
- one 8-GPU node at the Llama 3 per-GPU rate (M = 50,700 / 8 h = 6,338 h) with a 300 s checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpufleet.domain.checkpoints import DEFAULT_GPU_FAILURES_PER_HOUR, DEFAULT_SPOT_INTERRUPTIONS_PER_NODE_HOUR
from gpufleet.domain.checkpoints import optimal_interval as control_plane_interval
from gpufleet.sim.events import FailureModel
from gpufleet.sim.workload import WorkloadError

HOUR = 3600.0
# Failures drawn per interval: the curve's minimum moves by less than the grid step with this many.
DEFAULT_FAILURES = 20_000
GRID_POINTS = 61
GRID_SPAN = 4.0  # from prediction / span to prediction * span, log-spaced
TOLERANCE = 0.20


@dataclass(frozen=True, slots=True)
class SweepSetting:
    name: str
    cost_s: float
    mtbf_s: float
    source: str


DEFAULT_SETTINGS = (
    SweepSetting("llama3-job", 60.0, 3.09 * HOUR, "Llama 3 Herd of Models (Meta 2024): 419 interruptions in 54 d"),
    SweepSetting(
        "spot-node",
        120.0,
        HOUR / DEFAULT_SPOT_INTERRUPTIONS_PER_NODE_HOUR,
        "NSDI'24 spot traces (Wu et al.): 0.3 interruptions per node-hour",
    ),
    SweepSetting(
        "8-gpu-node",
        300.0,
        HOUR / (8 * DEFAULT_GPU_FAILURES_PER_HOUR),
        "Llama 3 per-GPU rate (1 per 50,700 GPU-h) x 8 GPUs",
    ),
)


@dataclass(frozen=True, slots=True)
class SweepResult:
    setting: SweepSetting
    predicted_s: float  # the control plane's interval for (C, M)
    intervals_s: tuple[float, ...]
    lost_fraction: tuple[float, ...]  # lost time / work, per interval
    best_s: float  # the interval of least lost time
    failures: int
    seed: int

    @property
    def ratio(self) -> float:
        """best / predicted."""
        return self.best_s / self.predicted_s

    @property
    def within_tolerance(self) -> bool:
        return abs(self.ratio - 1.0) <= TOLERANCE

    def to_dict(self) -> dict[str, object]:
        return {
            "setting": self.setting.name,
            "cost_s": self.setting.cost_s,
            "mtbf_s": self.setting.mtbf_s,
            "source": self.setting.source,
            "predicted_interval_s": self.predicted_s,
            "best_interval_s": self.best_s,
            "best_over_predicted": self.ratio,
            "within_20_percent": self.within_tolerance,
            "lost_fraction_at_best": min(self.lost_fraction),
            "lost_fraction_at_predicted": float(np.interp(self.predicted_s, self.intervals_s, self.lost_fraction)),
            "failures_drawn": self.failures,
            "seed": self.seed,
            "intervals_s": list(self.intervals_s),
            "lost_fraction": list(self.lost_fraction),
        }


def parse_setting(text: str) -> SweepSetting:
    """`C_S:MTBF_H`, e.g. `60:3.09` (a 60 s checkpoint on hardware failing every 3.09 h)."""
    parts = text.split(":")
    try:
        cost_s, mtbf_h = (float(p) for p in parts) if len(parts) == 2 else (math.nan, math.nan)
    except ValueError:
        cost_s = mtbf_h = math.nan
    if not (math.isfinite(cost_s) and math.isfinite(mtbf_h) and cost_s > 0 and mtbf_h > 0):
        raise WorkloadError(f"checkpoint setting {text!r} is not C_S:MTBF_H", "give e.g. 60:3.09 (seconds:hours)")
    if cost_s >= mtbf_h * HOUR / 10:
        raise WorkloadError(
            f"checkpoint setting {text!r}: a checkpoint of {cost_s:g} s is not small against an MTBF of {mtbf_h:g} h",
            "Young/Daly's first order holds for C much smaller than M; give C below M / 10",
        )
    return SweepSetting(f"C={cost_s:g}s,M={mtbf_h:g}h", cost_s, mtbf_h * HOUR, "given on the command line")


def lost_time(interval_s: float, cost_s: float, gaps: np.ndarray, work_s: float) -> float:
    """Wall time minus `work_s` for a job saving every `interval_s` of work, failing after each of `gaps`
    (seconds of wall time between failures, in order)."""
    cycle = interval_s + cost_s
    # Work saved before each stretch between failures: whole cycles completed in the earlier stretches.
    saved_before = np.concatenate(([0.0], np.cumsum(np.floor(gaps / cycle) * interval_s)[:-1]))
    left = np.maximum(0.0, work_s - saved_before)
    # What finishing the rest takes without a failure: whole cycles, then the rest (no save at the very end).
    full, rest = np.divmod(left, interval_s)
    needed = np.where(rest > 0, full * cycle + rest, np.maximum(0.0, full * cycle - cost_s))
    done = np.flatnonzero(needed <= gaps)
    if done.size == 0:
        raise WorkloadError("the sweep drew too few failures for its work", "report this: the work is sized to them")
    last = int(done[0])
    return float(gaps[:last].sum() + needed[last] - work_s)


def sweep(setting: SweepSetting, *, failures: int = DEFAULT_FAILURES, seed: int = 0) -> SweepResult:
    """Lost time over a log grid of intervals around the control plane's interval, on one seeded draw of
    failure times (the simulator's `FailureModel`) shared by every interval."""
    predicted = control_plane_interval(setting.cost_s, setting.mtbf_s)
    clock = FailureModel(mtbf_hours=setting.mtbf_s / HOUR, repair_hours=1.0, seed=seed).clock(setting.name)
    gaps = np.array([clock.next_failure(0.0) for _ in range(failures + failures // 2)])
    # Work sized so the job meets about `failures` failures at the predicted interval.
    overhead = setting.cost_s / predicted + predicted / (2 * setting.mtbf_s)
    work_s = failures * setting.mtbf_s / (1.0 + overhead)
    intervals = np.geomspace(predicted / GRID_SPAN, predicted * GRID_SPAN, GRID_POINTS)
    lost = tuple(lost_time(float(t), setting.cost_s, gaps, work_s) / work_s for t in intervals)
    best = float(intervals[int(np.argmin(lost))])
    return SweepResult(setting, predicted, tuple(float(t) for t in intervals), lost, best, failures, seed)


def plot(results: list[SweepResult], path: str) -> None:
    """Lost time against the interval (relative to the prediction), one line per setting; needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for result in results:
        x = np.array(result.intervals_s) / result.predicted_s
        label = f"{result.setting.name}: best {result.best_s:,.0f} s / Young-Daly {result.predicted_s:,.0f} s"
        ax.plot(x, 100 * np.array(result.lost_fraction), label=label)
        ax.plot([result.ratio], [100 * min(result.lost_fraction)], "o", color=ax.lines[-1].get_color())
    ax.axvline(1.0, color="black", lw=0.8, ls="--")
    ax.axvspan(1 - TOLERANCE, 1 + TOLERANCE, color="grey", alpha=0.15, label="within 20 % of sqrt(2CM)")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval / Young-Daly interval sqrt(2 C M)")
    ax.set_ylabel("time lost (rework + checkpoints), % of work")
    ax.set_title("Checkpoint interval sweep (seeded exponential failures)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
