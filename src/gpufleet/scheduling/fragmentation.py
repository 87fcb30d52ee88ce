"""GPU fragmentation as FGD measures it, for whole node tables at once (numpy over every node and GPU).

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent",
USENIX ATC 2023, §4; the reference code is the authors' simulator, hkust-adsl/kubernetes-scheduler-simulator
(`pkg/utils/frag.go`: `NodeGpuShareFragAmount`, `GetNodePodFrag`, `GetTypicalPods`).

**Target workload.** A set of task classes m, each with a popularity p_m (normalised to sum 1): GPU milli
per GPU, GPU count (0 = CPU-only), allowed GPU models (empty = any), CPU and memory (both optional, 0 = none).

**F_n(m)**, the GPU resources (milli-GPU) of node n that task class m cannot use, from its free shares:

1. m asks for no GPU: every free GPU share on n is fragmented for it (upstream quadrants XL/XR).
2. m cannot run on n (too few GPUs of an allowed model with at least its per-GPU share free, or too little
   free CPU or memory): every free share on n is fragmented (upstream Q1, Q2, Q4, NoAccess).
3. m can run on n: the free shares of the GPUs m could not use are fragmented, i.e. those smaller than its
   per-GPU request (for whole-GPU classes: every partly used GPU), and those of a model m does not allow
   (upstream Q3 split into Q2 and Q3 by `GetGpuFragMilliByNodeResAndPodRes`).

**F_n = sum_m p_m F_n(m)** (the paper's F_n(M)); the cluster's fragmentation is the sum over nodes, and its
ratio the share of the idle GPU capacity that is fragmented (the paper's Fig. 7 metrics).

Interpretation choices, where the paper and upstream leave room:

- Models are checked per GPU, so a node with GPUs of several models is handled; on single-model nodes (all
  of the openb trace) this is exactly upstream's node-level `IsNodeAccessibleToPod`.
- Memory is checked like CPU when a class gives one; upstream ignores memory (its `PodResource` has none),
  and `TargetWorkload.from_requests` builds classes without memory, as upstream does.
- Node health is not considered: the measure is of free resources, as in the paper's simulation.
- GPU memory (bytes) is not part of the measure (upstream only compares milli-GPU shares).
- Popularity is quantised to 2**-20 so that all arithmetic is exact in float64: nodes in equal states get
  bit-equal values whatever the order of the sums, so ties between nodes are real ties (float noise had
  broken them, which cost several points of allocation in the paper's openb experiment).

Computation: F_n = T_n - sum over GPU classes m of p_m [m fits n] U_m(n), T_n the node's free milli-GPU and
U_m(n) the free milli-GPU on the GPUs m could use. A one-GPU class fits wherever U_m(n) > 0 (and its CPU and
memory fit), so its part is a sum over GPUs: each GPU adds its free share times the popularity of the
classes it can host, which, per model set, are those whose share is at most the GPU's free share (a prefix
of the sorted shares: the GPU's *level*). So the work is O(nodes x GPUs x model sets), not x classes; the
few multi-GPU classes are counted one by one. For a fractional placement only one GPU changes, so every
GPU of every node is tried in the same pass.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, cast

import numpy as np

from gpufleet.domain.errors import FieldProblem, check
from gpufleet.domain.resources import MILLI_PER_GPU, WorkerRequest, parse_models
from gpufleet.scheduling.table import ALL_ROWS, BoolArray, FloatArray, IntArray, NodeInfo, Rows

WEIGHT_UNITS = float(1 << 20)  # popularity is quantised to 2**-20 (see TargetWorkload)
DEFAULT_POPULARITY = 0.95  # the paper's runs: typical pods = the most popular classes covering 95 % of pods


class TaskClass(NamedTuple):
    """One class of the target workload. `gpu_milli` is per GPU (1000 = whole); `gpus == 0` is CPU-only."""

    gpu_milli: int
    gpus: int
    models: frozenset[str]
    weight: float
    cpu_milli: int = 0
    memory: int = 0


# What callers may pass for a class: a TaskClass, or the short tuple (gpu_milli, gpus, models, weight),
# models as a frozenset or as "A|B" text.
TaskLike = TaskClass | tuple[int, int, frozenset[str] | str, float]


def _models(models: frozenset[str] | str) -> frozenset[str]:
    return parse_models(models) if isinstance(models, str) else frozenset(models)


def _as_class(item: TaskLike) -> TaskClass:
    if isinstance(item, TaskClass):
        return item._replace(models=_models(item.models))
    milli, gpus, models, weight = item
    return TaskClass(milli, gpus, _models(models), weight)


def _problems(classes: tuple[TaskClass, ...]) -> list[FieldProblem]:
    problems: list[FieldProblem] = []
    if not classes:
        problems.append(FieldProblem("classes", "is empty", "give at least one task class"))
    for i, c in enumerate(classes):
        where = f"classes[{i}]"
        if c.gpus < 0:
            problems.append(FieldProblem(f"{where}.gpus", f"is {c.gpus}", "give 0 (CPU-only) or more GPUs"))
        elif c.gpus and not 1 <= c.gpu_milli <= MILLI_PER_GPU:
            problems.append(FieldProblem(f"{where}.gpu_milli", f"is {c.gpu_milli}", "give 1..1000 per GPU"))
        elif c.gpus > 1 and c.gpu_milli != MILLI_PER_GPU:
            problems.append(
                FieldProblem(f"{where}.gpu_milli", f"is {c.gpu_milli} with {c.gpus} GPUs", "fractions need gpus=1")
            )
        if c.gpus == 0 and c.models:
            problems.append(FieldProblem(f"{where}.models", "set on a CPU-only class", "drop the models"))
        if not (math.isfinite(c.weight) and c.weight > 0):
            problems.append(FieldProblem(f"{where}.weight", f"is {c.weight}", "give a popularity > 0"))
        if c.cpu_milli < 0 or c.memory < 0:
            problems.append(FieldProblem(f"{where}.cpu_milli/memory", "is negative", "give 0 or more"))
    return problems


def _compile(classes: tuple[TaskClass, ...]) -> dict[str, object]:
    """The arrays of `TargetWorkload` (see its docstring), by field name."""
    weights = np.array([c.weight for c in classes], dtype=np.float64)
    popularity = weights / weights.sum()
    # Weights in units of 2**-20, whole numbers: every sum is then exact in float64 (see the module docstring).
    units = np.maximum(1.0, np.round(popularity * WEIGHT_UNITS))
    gpu = [c for c in classes if c.gpus > 0]
    gpu_units = [u for c, u in zip(classes, units, strict=True) if c.gpus > 0]
    model_sets = tuple(dict.fromkeys(c.models for c in gpu))
    # Per model set, the distinct per-GPU shares asked, ascending: a GPU whose free share reaches the first
    # `level` of them can host the one-GPU classes of those shares.
    set_milli = tuple(
        np.array(sorted({c.gpu_milli for c in gpu if c.models == models}), dtype=np.int64) for models in model_sets
    )
    offsets = [0]
    for shares in set_milli:
        offsets.append(offsets[-1] + len(shares))
    multi = list(dict.fromkeys((model_sets.index(c.models), c.gpu_milli, c.gpus) for c in gpu if c.gpus > 1))
    single_weight = np.zeros((len(gpu), offsets[-1]), dtype=np.float64)
    multi_weight = np.zeros((len(gpu), len(multi)), dtype=np.float64)
    for row, (c, u) in enumerate(zip(gpu, gpu_units, strict=True)):
        e = model_sets.index(c.models)
        if c.gpus == 1:
            single_weight[row, offsets[e] + int(np.searchsorted(set_milli[e], c.gpu_milli))] = u
        else:
            multi_weight[row, multi.index((e, c.gpu_milli, c.gpus))] = u
    # Where each (set, level) sits in the per-node hosting table (`hosting_table`): set e takes the columns
    # level_offset[e] .. level_offset[e] + len(set_milli[e]); column = prefix sum hi - prefix sum lo.
    spans = [(e, j) for e in range(len(set_milli)) for j in range(len(set_milli[e]) + 1)]
    values = np.arange(MILLI_PER_GPU + 1)
    levels = [np.searchsorted(shares, values, side="right") for shares in set_milli]
    # Without memory thresholds, the classes that fit a node are those with CPU <= its free CPU: a prefix in
    # CPU order, so a node's weights are one row of a cumulative table, found by the CPU thresholds it reaches.
    cpu = np.array([c.cpu_milli for c in gpu], dtype=np.int64)
    order = np.argsort(cpu, kind="stable")
    by_cpu = {}
    for name, matrix in (("single_by_cpu", single_weight), ("multi_by_cpu", multi_weight)):
        cumulative = np.zeros((len(gpu) + 1, matrix.shape[1]), dtype=np.float64)
        np.cumsum(matrix[order], axis=0, out=cumulative[1:])
        by_cpu[name] = cumulative
    for shares in set_milli:
        shares.flags.writeable = False
    return {
        "popularity": popularity,
        "model_sets": model_sets,
        "set_milli": set_milli,
        "set_offset": tuple(offsets),
        "class_cpu": cpu,
        "class_memory": np.array([c.memory for c in gpu], dtype=np.int64),
        "single_weight": single_weight,
        "multi_set": tuple(e for e, _, _ in multi),
        "multi_level": tuple(int(np.searchsorted(set_milli[e], milli)) for e, milli, _ in multi),
        "multi_gpus": tuple(n for _, _, n in multi),
        "multi_weight": multi_weight,
        "needs_node_check": any(c.cpu_milli or c.memory for c in gpu),
        "cpu_steps": cpu[order],
        "level_lut": np.stack(levels, axis=1) if levels else np.zeros((len(values), 0), dtype=np.int64),
        "level_offset": np.array([offsets[e] + e for e in range(len(set_milli))], dtype=np.int64),
        "hosting_hi": np.array([offsets[e] + j for e, j in spans], dtype=np.int64),
        "hosting_lo": np.array([offsets[e] for e, _ in spans], dtype=np.int64),
        **by_cpu,
    }


@dataclass(frozen=True, slots=True)
class TargetWorkload:
    """The target workload, validated and compiled into the arrays the measure needs.

    Compiled, per model set e of the GPU classes: the distinct per-GPU shares they ask, ascending
    (`set_milli[e]`; a GPU's *level* is how many of them its free share reaches, so it can host the
    classes of its first `level` shares). One-GPU classes weigh in per (set, share) column of `single_weight`
    (`[GPU classes, shares of all sets]`, the class's popularity in its column); multi-GPU classes are few
    and kept apart, per (set, share, GPU count): `multi_*`. Rows of both are GPU classes, so the classes
    whose CPU or memory does not fit a node drop out by rows (`*_by_cpu`: cumulative in CPU order).
    """

    classes: tuple[TaskClass, ...]
    popularity: FloatArray = field(init=False, repr=False, compare=False)
    model_sets: tuple[frozenset[str], ...] = field(init=False, repr=False, compare=False)
    set_milli: tuple[IntArray, ...] = field(init=False, repr=False, compare=False)
    set_offset: tuple[int, ...] = field(init=False, repr=False, compare=False)
    class_cpu: IntArray = field(init=False, repr=False, compare=False)
    class_memory: IntArray = field(init=False, repr=False, compare=False)
    single_weight: FloatArray = field(init=False, repr=False, compare=False)
    multi_set: tuple[int, ...] = field(init=False, repr=False, compare=False)
    multi_level: tuple[int, ...] = field(init=False, repr=False, compare=False)
    multi_gpus: tuple[int, ...] = field(init=False, repr=False, compare=False)
    multi_weight: FloatArray = field(init=False, repr=False, compare=False)
    # multi_* grouped by (set, share): ((e, position), ((h, gpus), ...)), in order of first appearance.
    multi_groups: tuple[tuple[tuple[int, int], tuple[tuple[int, int], ...]], ...] = field(
        init=False, repr=False, compare=False
    )
    needs_node_check: bool = field(init=False, repr=False, compare=False)
    cpu_steps: IntArray = field(init=False, repr=False, compare=False)
    level_lut: IntArray = field(init=False, repr=False, compare=False)
    level_offset: IntArray = field(init=False, repr=False, compare=False)
    hosting_hi: IntArray = field(init=False, repr=False, compare=False)
    hosting_lo: IntArray = field(init=False, repr=False, compare=False)
    single_by_cpu: FloatArray = field(init=False, repr=False, compare=False)
    multi_by_cpu: FloatArray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        classes = tuple(_as_class(c) for c in self.classes)
        object.__setattr__(self, "classes", classes)
        check(_problems(classes), "target workload")
        compiled = _compile(classes)
        groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
        sets, levels, gpu_counts = (cast(tuple[int, ...], compiled[f"multi_{k}"]) for k in ("set", "level", "gpus"))
        for h, (e, position, gpus) in enumerate(zip(sets, levels, gpu_counts, strict=True)):
            groups.setdefault((e, position), []).append((h, gpus))
        compiled["multi_groups"] = tuple((key, tuple(members)) for key, members in groups.items())
        for name, value in compiled.items():
            if isinstance(value, np.ndarray):
                value.flags.writeable = False  # shared (GENERIC_TARGET, profiles): never written after this
            object.__setattr__(self, name, value)

    @classmethod
    def of(cls, distribution: TargetWorkload | Iterable[TaskLike]) -> TargetWorkload:
        """A target workload from one, or from classes and (gpu_milli, gpus, models, weight) tuples."""
        if isinstance(distribution, TargetWorkload):
            return distribution
        return cls(tuple(_as_class(item) for item in distribution))

    @classmethod
    def from_requests(
        cls, requests: Iterable[WorkerRequest], *, popularity: float = DEFAULT_POPULARITY
    ) -> TargetWorkload:
        """The typical classes of a workload, as the FGD paper builds its target from the trace itself.

        As upstream's `GetTypicalPods` with the paper's settings (CPU-only pods included, popularity threshold
        95 %, step 1): requests are grouped by (CPU, per-GPU share, GPU count, models) - memory is not part of
        the key -, sorted by count (ties: by that key, descending, as upstream), and the most popular classes
        are kept until they cover `popularity` of all requests; their counts are the weights.
        """
        if not 0 < popularity <= 1:
            raise ValueError(f"popularity is {popularity}; give a share in (0, 1]")
        counts: Counter[tuple[int, int, int, tuple[str, ...]]] = Counter()
        for r in requests:
            counts[(r.cpu_milli, r.gpu_milli if r.gpus else 0, r.gpus, tuple(sorted(r.models)))] += 1
        total = sum(counts.values())
        if not total:
            raise ValueError("no requests to build a target workload from; give at least one")
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
        kept: list[TaskClass] = []
        covered = 0
        for (cpu, milli, gpus, models), n in ranked:
            if covered >= popularity * total:
                break
            kept.append(TaskClass(milli, gpus, frozenset(models), float(n), cpu_milli=cpu))
            covered += n
        return cls(tuple(kept))


# A generic mix for clusters without a trace of their own: the openb default trace's composition, with
# fractions rounded to quarter GPUs (13 % CPU-only, 38 % fractional, 48 % one GPU, ~1 % multi-GPU).
GENERIC_TARGET = TargetWorkload(
    (
        TaskClass(0, 0, frozenset(), 13.0),
        TaskClass(250, 1, frozenset(), 9.0),
        TaskClass(500, 1, frozenset(), 13.0),
        TaskClass(750, 1, frozenset(), 16.0),
        TaskClass(1000, 1, frozenset(), 47.0),
        TaskClass(1000, 2, frozenset(), 1.0),
        TaskClass(1000, 4, frozenset(), 0.5),
        TaskClass(1000, 8, frozenset(), 0.5),
    )
)


@dataclass(frozen=True, slots=True)
class FragmentationSummary:
    """Cluster-level totals, in milli-GPU: fragmented (sum of F_n), idle (free) and capacity."""

    fragmented_milli: float
    idle_milli: int
    capacity_milli: int

    @property
    def ratio(self) -> float:
        """Fragmented share of the idle GPU capacity (0 when nothing is idle): the paper's frag ratio."""
        return self.fragmented_milli / self.idle_milli if self.idle_milli else 0.0

    @property
    def share_of_capacity(self) -> float:
        """Fragmented share of the cluster's GPU capacity: the paper's fragmentation amount over capacity."""
        return self.fragmented_milli / self.capacity_milli if self.capacity_milli else 0.0


# -- kernels over rows of the table ----------------------------------------------------------------------


def allowed_sets(table: NodeInfo, target: TargetWorkload, rows: Rows = ALL_ROWS) -> BoolArray:
    """`[R, G, E]`: whether each GPU slot is of a model each model set of the target allows."""
    if not target.model_sets:
        return np.zeros((*table.gpu_model[rows].shape, 0), dtype=np.bool_)
    # [M + 1, E], fixed for the table's models: kept beside its model look-up tables.
    luts = table.spec_lut_stack(target.model_sets)
    return np.asarray(luts[table.gpu_model[rows]], dtype=np.bool_)


def _levels(free: IntArray, allowed: BoolArray, target: TargetWorkload) -> IntArray:
    """`[R, G, E]`: per GPU and model set, how many of the set's shares its free share reaches (0: not its
    model). A GPU of level L can host the set's one-GPU classes of its L smallest shares."""
    # minimum(maximum(.)) is np.clip without its Python wrapper (this runs per placement).
    return np.where(allowed, target.level_lut[np.minimum(np.maximum(free, 0), MILLI_PER_GPU)], 0)


def _weights(cpu: IntArray, memory: IntArray, target: TargetWorkload) -> tuple[FloatArray, FloatArray]:
    """Per node (`[R, ...]`, or one row for all nodes): popularity of the one-GPU classes per (set, share)
    column, and of each multi-GPU group, counting only classes whose CPU and memory fit what is free."""
    if not target.needs_node_check:
        return target.single_by_cpu[-1:], target.multi_by_cpu[-1:]
    if not target.class_memory.any():
        reached = np.searchsorted(target.cpu_steps, cpu, side="right")
        return target.single_by_cpu[reached], target.multi_by_cpu[reached]
    fits = ((cpu[:, None] >= target.class_cpu) & (memory[:, None] >= target.class_memory)).astype(np.float64)
    return fits @ target.single_weight, fits @ target.multi_weight


def hosting_table(single: FloatArray, target: TargetWorkload) -> FloatArray:
    """`[R, levels]`: per node, (set e, level L) -> popularity of the set's one-GPU classes a GPU of level L
    can host (the sum of its first L share columns)."""
    cumulative = np.zeros((len(single), single.shape[1] + 1), dtype=np.float64)
    np.cumsum(single, axis=1, out=cumulative[:, 1:])
    hi = cumulative.take(target.hosting_hi, axis=1)
    return np.asarray(hi - cumulative.take(target.hosting_lo, axis=1), dtype=np.float64)


def _hosted(hosting: FloatArray, levels: IntArray, target: TargetWorkload) -> FloatArray:
    """`[R, G, E]`: per GPU and set, the popularity of the one-GPU classes the GPU can host."""
    columns = levels + target.level_offset
    if len(hosting) == 1:
        return np.asarray(hosting[0][columns], dtype=np.float64)
    flat = columns + (np.arange(len(hosting)) * hosting.shape[1])[:, None, None]
    return np.asarray(hosting.take(flat), dtype=np.float64)


def _usable_by_multi_gpu(free: IntArray, levels: IntArray, multi: FloatArray, target: TargetWorkload) -> FloatArray:
    """sum over multi-GPU classes m of p_m * [m fits] * U_m(n) (`[R]`). Classes of one (set, share) see the
    same GPUs: those are counted once per group (the sums are exact, see TargetWorkload: order is free)."""
    total = np.zeros(len(free), dtype=np.float64)
    for (e, position), members in target.multi_groups:
        inside = levels[:, :, e] > position
        count = np.add.reduce(inside, axis=1)
        held = np.add.reduce(np.where(inside, free, 0), axis=1)
        for h, gpus in members:
            total += multi[:, h] * np.where(count >= gpus, held, 0)
    return total


def _fragmentation_of(
    free: IntArray, allowed: BoolArray, cpu: IntArray, memory: IntArray, target: TargetWorkload
) -> FloatArray:
    """F_n for rows of free shares `[R, G]`, allowed models `[R, G, E]`, free CPU and memory `[R]`."""
    levels = _levels(free, allowed, target)
    single, multi = _weights(cpu, memory, target)
    usable = (free[:, :, None] * _hosted(hosting_table(single, target), levels, target)).sum(axis=(1, 2))
    usable += _usable_by_multi_gpu(free, levels, multi, target)
    return np.asarray(free.sum(axis=1) - usable / WEIGHT_UNITS, dtype=np.float64)


def node_fragmentation(table: NodeInfo, target: TargetWorkload, rows: Rows = ALL_ROWS) -> FloatArray:
    """F_n (milli-GPU) of each node in `rows`, for the table's free resources now."""
    return _fragmentation_of(
        table.gpu_milli_free[rows],
        allowed_sets(table, target, rows),
        table.cpu_free[rows],
        table.mem_free[rows],
        target,
    )


def cluster_fragmentation(table: NodeInfo, target: TargetWorkload) -> FragmentationSummary:
    """Sum of F_n over all nodes, with the idle and total GPU capacity it is compared with."""
    fragmented = float(node_fragmentation(table, target).sum()) if len(table) else 0.0
    return FragmentationSummary(fragmented, int(table.gpu_milli_free.sum()), int(table.gpu_milli_total.sum()))


def placement_delta(
    table: NodeInfo, target: TargetWorkload, request: WorkerRequest, rows: IntArray, usable: BoolArray
) -> tuple[FloatArray, IntArray]:
    """The fragmentation gradient: how much F_n grows if one worker of `request` goes to each node of `rows`.

    `usable[R, G]` are the GPUs the worker may take on those nodes (the filters' result). A fractional worker
    is tried on every usable GPU and the smallest growth is returned with that GPU's index (the first one on
    ties); whole GPUs are taken from the usable ones in index order (every choice is equal on a node of one
    model); a CPU-only worker changes only CPU and memory. Returns (+inf, -1) where the worker does not fit,
    and GPU -1 for whole-GPU and CPU-only workers.
    """
    free = table.gpu_milli_free[rows]
    cpu = table.cpu_free[rows]
    memory = table.mem_free[rows]
    allowed = allowed_sets(table, target, rows)
    before = _fragmentation_of(free, allowed, cpu, memory, target)
    no_gpu = np.full(len(rows), -1, dtype=np.int64)
    cpu_after = cpu - request.cpu_milli
    memory_after = memory - request.memory
    if request.gpus == 0:
        return _fragmentation_of(free, allowed, cpu_after, memory_after, target) - before, no_gpu
    if not request.fractional:
        take = usable & (np.cumsum(usable, axis=1) <= request.gpus)
        enough = take.sum(axis=1) == request.gpus
        after = _fragmentation_of(np.where(take, 0, free), allowed, cpu_after, memory_after, target)
        return np.where(enough, after - before, np.inf).astype(np.float64), no_gpu
    # A fractional worker on GPU g changes that GPU only: from `free` to `left`, so its level may drop.
    share = request.gpu_milli
    left = free - share
    levels = _levels(free, allowed, target)
    levels_left = _levels(left, allowed, target)
    single, multi = _weights(cpu_after, memory_after, target)
    hosting = hosting_table(single, target)
    hosted = free[:, :, None] * _hosted(hosting, levels, target)
    changed = left[:, :, None] * _hosted(hosting, levels_left, target) - hosted
    usable_after = hosted.sum(axis=(1, 2))[:, None] + changed.sum(axis=2)
    for (e, position), members in target.multi_groups:
        inside = levels[:, :, e] > position
        stays = levels_left[:, :, e] > position
        count = np.add.reduce(inside, axis=1)[:, None] - inside + stays
        held_in = np.where(inside, free, 0)
        held = np.add.reduce(held_in, axis=1)[:, None] - held_in + np.where(stays, left, 0)
        for h, gpus in members:
            usable_after += multi[:, h, None] * np.where(count >= gpus, held, 0)
    after = (free.sum(axis=1) - share)[:, None] - usable_after / WEIGHT_UNITS
    delta = np.where(usable & (left >= 0), after - before[:, None], np.inf)
    if not delta.shape[1]:
        return np.full(len(rows), np.inf), no_gpu
    best = np.argmin(delta, axis=1)
    growth = delta[np.arange(len(rows)), best]
    return np.asarray(growth, dtype=np.float64), np.where(np.isfinite(growth), best, -1).astype(np.int64)
