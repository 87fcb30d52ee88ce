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

**Batch-aware model** (`batch_goodput_by_size`), used instead of the above for a job whose reports count
steps and say its placement and batch (`domain/progress.py`): a job that picks its batch per size (as Pollux's
adaptive jobs do) gains from more GPUs far more than a fixed per-GPU batch suggests (cifar10 from 1 to 2 GPUs:
x1.72 measured; x1.16 by the model above, x1.82 by this one). Step time of total batch B on g GPUs over n
nodes = fixed + per_sample x B / g + sync(g, n) (`StepModel`, Pollux's shape without its overlap exponent),
fitted by non-negative least squares to the mean step time and batch of each (GPUs, nodes, batch) entry,
with prior rows (each of fixed, sync on one node and across nodes a share of the compute at the job's mean
batch; their growth with g none) weighing `PRIOR_WEIGHT_S` seconds. At each candidate size, on the nodes it
would span (`nodes_for`), goodput = max over B in [min_batch, min(max_batch, max_local_batch x g)] of
B / step_time x 1 / (noise + B) (statistical efficiency per sample up to a constant, noise = grad_var x batch /
grad_sqr: the noise scale in samples); without a batch range or gradient statistics the job keeps its batch
per GPU. PRIOR_NETWORK_SYNC was chosen on Pollux workloads 1-4 (gpufleet.sim.tuned).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.optimize import nnls

from gpufleet.domain.progress import JobProgress, SizeThroughput

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
    progress: JobProgress | None,
    current: int,
    sizes: Iterable[int],
    gpus_per_node: int | None = None,
    node_gpus: int | None = None,
) -> Mapping[int, float]:
    """The job's goodput at each of `sizes` GPUs (samples/s at the current batch's worth), running at
    `current` GPUs now, a size spanning nodes when it exceeds `gpus_per_node` (nodes of `node_gpus` beyond).
    The batch-aware model when the job's reports allow it (`batch_goodput_by_size`), else the model above."""
    sizes = list(sizes)
    if progress is not None:
        by_batch = batch_goodput_by_size(progress, current, sizes, gpus_per_node, node_gpus)
        if by_batch is not None:
            return by_batch
    model = throughput_model(progress, gpus_per_node)
    learning = still_learning(progress)
    return {g: throughput(model, g) * efficiency(progress, g / current) * learning for g in sizes}


# --- Batch-aware model: for jobs whose reports count steps and say their placement and batch ---------------

# Before reports tell them apart, the prior's shares of a step's compute at the job's mean batch: the fixed
# cost of a step whatever its batch, synchronisation inside one node, and across nodes.
PRIOR_STEP_FIXED = 0.1
# Tuned on Pollux workloads 1-4 (gpufleet.sim.tuned): 0, 0.25, 0.5, 1, 2 tried.
PRIOR_NETWORK_SYNC = 0.25
# How much the prior weighs against measurements: as many seconds of measured steps.
PRIOR_WEIGHT_S = 300.0
BATCH_CANDIDATES = 24  # total batches tried between min_batch and max_batch (geometric), per size


@dataclass(frozen=True, slots=True)
class StepModel:
    """Seconds per step of total batch B on g GPUs over n nodes: fixed + per_sample x B / g + sync(g, n),
    sync = 0 on one GPU; node + node_per_gpu (g - 2) on one node; network + network_per_gpu (g - 2) across
    nodes (Pollux's throughput model, Qiao et al., OSDI'21, §3.2, without its overlap exponent)."""

    fixed: float
    per_sample: float
    node: float
    node_per_gpu: float
    network: float
    network_per_gpu: float

    def step_s(self, gpus: int, nodes: int, batch: float | np.ndarray) -> float | np.ndarray:
        return self.fixed + self.per_sample * batch / gpus + self._sync(gpus, nodes)

    def _sync(self, gpus: int, nodes: int) -> float:
        if gpus <= 1:
            return 0.0
        if nodes <= 1:
            return self.node + self.node_per_gpu * (gpus - 2)
        return self.network + self.network_per_gpu * (gpus - 2)


def _features(gpus: int, nodes: int, batch: float) -> list[float]:
    one = 1.0 if gpus > 1 and nodes <= 1 else 0.0
    many = 1.0 if gpus > 1 and nodes > 1 else 0.0
    return [1.0, batch / gpus, one, one * (gpus - 2), many, many * (gpus - 2)]


def step_model(progress: JobProgress) -> StepModel | None:
    """The step-time model fitted to the job's reported steps per placement and batch, the prior (shares of
    the compute at its mean batch, weighing `PRIOR_WEIGHT_S` seconds) filling what they cannot tell; None when
    no report counted steps at a known placement."""
    return _fit_steps(progress.throughput)


@lru_cache(maxsize=4096)
def _fit_steps(entries: tuple[SizeThroughput, ...]) -> StepModel | None:
    """`step_model` of these entries (cached: a job's entries change only when it reports)."""
    measured = [
        (e.gpus, e.nodes, e.mean_batch, e.step_s, e.seconds)
        for e in entries
        if e.step_s is not None and e.mean_batch is not None and e.nodes > 0 and e.gpus > 0
    ]
    if not measured:
        return None
    seconds = sum(m[4] for m in measured)
    local = sum(m[2] / m[0] * m[4] for m in measured) / seconds  # the mean local batch
    rows = [_features(g, n, b) for g, n, b, _, _ in measured]
    target = [t for _, _, _, t, _ in measured]
    weight = [math.sqrt(w) for *_, w in measured]
    compute = [1.0, local, 0.0, 0.0, 0.0, 0.0]  # the compute of a step at the mean local batch

    def share(index: int, of: float) -> list[float]:
        row = [-of * c for c in compute]
        row[index] += 1.0
        return row

    prior = math.sqrt(PRIOR_WEIGHT_S)
    for row in (share(0, PRIOR_STEP_FIXED), share(2, PRIOR_SYNC), share(4, PRIOR_NETWORK_SYNC)):
        rows.append(row)
        target.append(0.0)
        weight.append(prior)
    for index in (3, 5):  # sync grows with the size only as far as measured
        rows.append([1.0 if i == index else 0.0 for i in range(6)])
        target.append(0.0)
        weight.append(prior)
    w = np.array(weight)
    design = np.array(rows) * w[:, None]
    scale = np.linalg.norm(design, axis=0)  # columns of like size, for the solver's tolerance
    scale[scale == 0] = 1.0
    theta, _ = nnls(design / scale, np.array(target) * w)
    return StepModel(*(float(v) for v in theta / scale))


def noise_scale(progress: JobProgress) -> float | None:
    """The gradient noise scale in samples (variance per sample / squared norm), from the statistics the job
    reported at its batch; None without them."""
    if progress.grad_sqr is None or progress.grad_var is None or progress.batch is None or progress.grad_sqr <= 0:
        return None
    return progress.grad_var * progress.batch / progress.grad_sqr


def best_batch(
    model: StepModel, gpus: int, nodes: int, candidates: np.ndarray, noise: float | None
) -> tuple[float, float]:
    """(total batch, goodput) at the candidate batch that makes the most progress per second on `gpus` GPUs
    over `nodes` nodes: samples per second x statistical efficiency, (noise + B0) / (noise + B) per sample
    (Pollux's), up to the constant B0 (the same for every size of one job)."""
    rate = candidates / model.step_s(gpus, nodes, candidates)
    worth = rate / (noise + candidates) if noise is not None else rate
    i = int(np.argmax(worth))
    return float(candidates[i]), float(worth[i])


def nodes_for(gpus: int, one_node: int | None, node_gpus: int | None) -> int:
    """Nodes a job of `gpus` GPUs would span: one while it fits where it is (`one_node`), else as few as nodes
    of `node_gpus` allow (at least two)."""
    if one_node is None or gpus <= one_node:
        return 1
    return max(2, math.ceil(gpus / (node_gpus or one_node)))


def batch_goodput_by_size(
    progress: JobProgress,
    current: int,
    sizes: Iterable[int],
    gpus_per_node: int | None = None,
    node_gpus: int | None = None,
) -> Mapping[int, float] | None:
    """Goodput at each size with the batch chosen for it (`best_batch`), from the batch-aware model: None when
    the job's reports do not allow it (no counted steps at a known placement, or no batch)."""
    model = step_model(progress) if progress.batch is not None else None
    if model is None or progress.batch is None:
        return None
    noise = noise_scale(progress)
    low, high = progress.min_batch, progress.max_batch
    learning = still_learning(progress)
    choice = low is not None and high is not None and high > low and noise is not None
    grid = _grid(low, high) if choice and low is not None and high is not None else None
    out = {}
    for g in sizes:
        # Without a range to choose from (or the statistics to weigh it), the job keeps its batch per GPU.
        candidates = grid if grid is not None else np.array([progress.batch * g / current])
        if grid is not None and progress.max_local_batch is not None:  # what fits in the GPUs' memory
            fits = candidates[candidates <= progress.max_local_batch * g * (1 + 1e-9)]
            candidates = fits if len(fits) else candidates[:1]
        nodes = progress.nodes if g == current and progress.nodes else nodes_for(g, gpus_per_node, node_gpus)
        out[g] = best_batch(model, g, nodes, candidates, noise)[1] * learning
    return out


@lru_cache(maxsize=256)
def _grid(low: float, high: float) -> np.ndarray:
    """`BATCH_CANDIDATES` total batches from `low` to `high`, geometrically spaced."""
    return np.geomspace(low, high, BATCH_CANDIDATES)
