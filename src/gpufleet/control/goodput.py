"""What a job's progress reports say about its goodput at each size it could run at: the data a resize
policy (`policies/resize/goodput.py`) weighs. Pure functions of a `JobProgress`, outside the cycle, as the
learner's run-time estimates are.

goodput(g) = throughput(g) x statistical efficiency(g) x how much it still learns, each as follows:

- **Throughput** (samples/s) is fitted to what the job measured at each size it ran at (`throughput`, each
  size weighted by the seconds measured there) with the model 1 / throughput(g) = a / g + b (g - 1) / g: the
  per-sample compute time a is shared by g GPUs, and gradient synchronisation adds b per extra GPU (the shape
  of Pollux's model, Qiao et al., OSDI'21, without its network terms). With one size measured, b is the prior
  `PRIOR_SYNC` x a; with none, a = 1 (relative units).
- **Statistical efficiency.** Growing from the size the job runs at to g multiplies its total batch by
  s = g / now (per-GPU batch fixed). From the gradient statistics the job reported (`grad_sqr`, `grad_var`,
  measured at its current batch), one step is worth gain(s) = (var + sqr) / (var / s + sqr) steps at the
  current batch, so a sample is worth gain(s) / s; without them, 1.
- **Still learning.** The loss's fall per sample over the latest quarter of its curve against the first
  quarter (0..1): a job whose loss has flattened is worth little more wherever it runs, so it gets no more
  GPUs and is the first to give them back. Too short a curve (< 8 points): 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from gpufleet.domain.progress import JobProgress

PRIOR_SYNC = 0.05  # synchronisation cost of each extra GPU, as a share of the per-sample compute time
MIN_POINTS = 8


def throughput_model(progress: JobProgress | None) -> tuple[float, float]:
    """(a, b) of 1 / throughput(g) = a / g + b (g - 1) / g, from the sizes the job ran at."""
    measured = [
        (e.gpus, e.samples_per_s, e.seconds)
        for e in (progress.throughput if progress else ())
        if e.samples_per_s and e.gpus > 0
    ]
    if not measured:
        return 1.0, PRIOR_SYNC
    if len({g for g, _, _ in measured}) == 1:
        g, rate, _ = measured[0]
        a = 1.0 / (rate * (1.0 / g + PRIOR_SYNC * (g - 1) / g))
        return a, PRIOR_SYNC * a
    gpus = np.array([m[0] for m in measured], dtype=float)
    inverse = np.array([1.0 / m[1] for m in measured])
    weight = np.sqrt(np.array([m[2] for m in measured]))
    design = np.stack([1.0 / gpus, (gpus - 1.0) / gpus], axis=1) * weight[:, None]
    (a, b), *_ = np.linalg.lstsq(design, inverse * weight, rcond=None)
    return max(float(a), 1e-12), max(float(b), 0.0)


def throughput(model: tuple[float, float], gpus: int) -> float:
    a, b = model
    return gpus / (a + b * (gpus - 1))


def efficiency(progress: JobProgress | None, scale: float) -> float:
    """What a sample is worth at `scale` times the current batch, against one at the current batch."""
    if progress is None or progress.grad_sqr is None or progress.grad_var is None or progress.grad_sqr <= 0:
        return 1.0
    sqr, var = progress.grad_sqr, progress.grad_var
    gain = (var + sqr) / (var / scale + sqr)
    return gain / scale


def still_learning(progress: JobProgress | None) -> float:
    """The loss's recent fall per sample relative to its early fall, in 0..1 (1 when it cannot tell)."""
    curve = progress.loss_curve if progress else ()
    if len(curve) < MIN_POINTS:
        return 1.0
    quarter = len(curve) // 4
    early = _slope(curve[: quarter + 1])
    late = _slope(curve[-quarter - 1 :])
    if early >= 0:  # the loss never fell: nothing to compare with
        return 1.0
    return float(min(1.0, max(0.0, late / early)))


def _slope(points: Iterable[tuple[float, float]]) -> float:
    xs, ys = np.array(list(points), dtype=float).T
    span = float(np.ptp(xs))
    if span <= 0:
        return 0.0
    slope = float(np.polyfit(xs, ys, 1)[0])
    # A change over the whole span below rounding error is no change (a flat curve fits a slope of ~1e-17).
    return 0.0 if abs(slope) * span <= 1e-9 * (float(np.abs(ys).max()) + 1.0) else slope


def goodput_by_size(progress: JobProgress | None, current: int, sizes: Iterable[int]) -> Mapping[int, float]:
    """The job's goodput at each of `sizes` GPUs (samples/s at the current batch's worth), running at
    `current` GPUs now."""
    model = throughput_model(progress)
    learning = still_learning(progress)
    return {g: throughput(model, g) * efficiency(progress, g / current) * learning for g in sizes}
