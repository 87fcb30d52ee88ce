"""What a job's progress reports say about its goodput at each size it could run at: the data a resize
policy (`policies/resize/goodput.py`) weighs. Pure functions of a `JobProgress`, outside the cycle, as the
learner's run-time estimates are.

goodput(g) = throughput(g) x statistical efficiency(g) x how much it still learns, each as follows:

- **Throughput** (samples/s) is fitted to what the job measured at each size it ran at (`throughput`, each
  size weighted by the seconds measured there) with the model 1 / throughput(g) = (a + sync(g)) / g: the
  per-sample compute time a is shared by g GPUs, and gradient synchronisation adds sync(g), with distinct
  terms inside one node and across nodes (the shape of Pollux's model, Qiao et al., OSDI'21, §3.2, without
  its overlap exponent): on one node sync(g) = b (g - 1); once the GPUs span nodes (more than
  `gpus_per_node`: the most the job can hold on one node as it is placed, which the caller knows)
  sync(g) = c + d (g - 1), c the fixed cost of going over the network. Sizes on one node fit a and b;
  sizes across nodes fit c and d from what is left once a is known (a report says its size, not its
  placement: each size measured is taken as on one node or not by today's boundary). What the reports
  cannot tell comes from the prior: b = `PRIOR_SYNC` x a (one size measured on
  one node), d = b and c = `PRIOR_NETWORK` x a (no size measured across nodes); with no report at all,
  a = 1 (relative units). Without `gpus_per_node` every size counts as one node (the model without c, d).
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
from dataclasses import dataclass

import numpy as np

from gpufleet.domain.progress import JobProgress

PRIOR_SYNC = 0.05  # synchronisation cost of each extra GPU, as a share of the per-sample compute time
# The fixed cost of synchronising over the network once a job spans nodes, as a share of the per-sample compute
# time, until the job has run across nodes (see gpufleet.sim.tuned: none until measured did best).
PRIOR_NETWORK = 0.0
MIN_POINTS = 8


@dataclass(frozen=True, slots=True)
class ThroughputModel:
    """1 / throughput(g) = (compute + sync(g)) / g, sync(g) = sync_node (g - 1) on one node and
    network + sync_network (g - 1) across nodes (`gpus_per_node` None: one node whatever the size)."""

    compute: float
    sync_node: float
    network: float = 0.0
    sync_network: float = 0.0
    gpus_per_node: int | None = None

    def spans_nodes(self, gpus: int) -> bool:
        return self.gpus_per_node is not None and gpus > self.gpus_per_node

    def seconds_per_sample(self, gpus: int) -> float:
        across = self.spans_nodes(gpus)
        sync = self.network + self.sync_network * (gpus - 1) if across else self.sync_node * (gpus - 1)
        return (self.compute + sync) / gpus


def throughput_model(progress: JobProgress | None, gpus_per_node: int | None = None) -> ThroughputModel:
    """The model fitted to the sizes the job ran at, the prior filling what they cannot tell (module doc)."""
    measured = [
        (e.gpus, e.samples_per_s, e.seconds)
        for e in (progress.throughput if progress else ())
        if e.samples_per_s and e.gpus > 0
    ]
    across = [m for m in measured if gpus_per_node is not None and m[0] > gpus_per_node]
    within = [m for m in measured if m not in across]
    if within:
        a, b = _fit_node(within)
    elif across:  # only ever ran across nodes: its compute from the priors at the size it ran longest
        g, rate, _ = max(across, key=lambda m: (m[2], -m[0]))
        a = g / rate / (1.0 + PRIOR_NETWORK + PRIOR_SYNC * (g - 1))
        b = PRIOR_SYNC * a
    else:
        a, b = 1.0, PRIOR_SYNC
    c, d = _fit_network(across, a, b)
    return ThroughputModel(a, b, c, d, gpus_per_node)


def _fit_node(measured: list[tuple[int, float, float]]) -> tuple[float, float]:
    """(a, b) from sizes on one node: least squares with two or more sizes, b from the prior with one."""
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


def _fit_network(measured: list[tuple[int, float, float]], a: float, b: float) -> tuple[float, float]:
    """(c, d) from sizes across nodes, given a: each size's sync(g) = g / rate - a is c + d (g - 1)."""
    if not measured:
        return PRIOR_NETWORK * a, b
    gpus = np.array([m[0] for m in measured], dtype=float)
    sync = gpus / np.array([m[1] for m in measured]) - a
    weight = np.array([m[2] for m in measured])
    if len(set(gpus.tolist())) == 1:
        return max(0.0, float(np.average(sync - b * (gpus - 1.0), weights=weight))), b
    root = np.sqrt(weight)
    design = np.stack([np.ones_like(gpus), gpus - 1.0], axis=1) * root[:, None]
    (c, d), *_ = np.linalg.lstsq(design, sync * root, rcond=None)
    if d < 0:  # sync does not grow with the size: all of it is the fixed network cost
        return max(0.0, float(np.average(sync, weights=weight))), 0.0
    if c < 0:  # no fixed cost: all of it grows with the size
        return 0.0, max(0.0, float(np.sum(weight * sync * (gpus - 1.0)) / np.sum(weight * (gpus - 1.0) ** 2)))
    return float(c), float(d)


def throughput(model: ThroughputModel, gpus: int) -> float:
    return 1.0 / model.seconds_per_sample(gpus)


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


def goodput_by_size(
    progress: JobProgress | None, current: int, sizes: Iterable[int], gpus_per_node: int | None = None
) -> Mapping[int, float]:
    """The job's goodput at each of `sizes` GPUs (samples/s at the current batch's worth), running at
    `current` GPUs now, a size spanning nodes when it exceeds `gpus_per_node`."""
    model = throughput_model(progress, gpus_per_node)
    learning = still_learning(progress)
    return {g: throughput(model, g) * efficiency(progress, g / current) * learning for g in sizes}
