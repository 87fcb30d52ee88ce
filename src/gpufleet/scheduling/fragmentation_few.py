"""FGD's fragmentation gradient for a few nodes at a time, in plain Python.

`fragmentation.placement_delta` is vectorised over nodes: right for a whole table, but on the one or two
nodes a placement changed it is mostly numpy's per-call overhead (~40 array operations, ~110 µs). The control
loop asks exactly that after every placement, so here is the same computation per node, over Python lists.

It gives the same floats bit for bit: every term is a whole number of popularity units times a whole
milli-GPU share (see `TargetWorkload`), so sums are exact in any order, and the final steps (one division by
a power of two, two subtractions) are the same operations. `tests/property/test_fragmentation_few.py` checks
it against `placement_delta` on random tables, targets and requests.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from gpufleet.domain.resources import MILLI_PER_GPU, WorkerRequest
from gpufleet.scheduling.fragmentation import WEIGHT_UNITS, TargetWorkload, hosting_table, placement_delta
from gpufleet.scheduling.table import BoolArray, FloatArray, IntArray, NodeInfo

FEW_ROWS = 8  # up to this many rows the loops are cheaper than the vectorised kernel (measured crossover ~8)
MEMO_LIMIT = 1 << 16  # node states memoised before the memo starts over


class _Shape:
    """A node's GPU models seen through the target, for one row of class weights (CPU reached).

    `contrib[g][s]`: what GPU g adds to the one-GPU classes' usable sum with `s` milli free (s times the
    popularity of the classes it could host, over the sets allowing its model). `thresholds[k][g]`: the free
    share GPU g needs to count for multi-GPU group k (above 1000 where its model is not allowed)."""

    __slots__ = ("contrib", "multi", "thresholds")

    def __init__(self, contrib: list[list[float]], thresholds: list[list[int]], multi: list[float]) -> None:
        self.contrib = contrib
        self.thresholds = thresholds
        self.multi = multi


class FewNodes:
    """`placement_delta` over a few rows: the target's tables as Python lists, per-node loops."""

    def __init__(self, target: TargetWorkload) -> None:
        self.target = target
        # Memory thresholds need a matrix product per node: those targets keep the vectorised kernel.
        self.supported = not bool(target.class_memory.any())
        self._steps: list[int] = target.cpu_steps.tolist()
        self._groups = [
            (int(target.set_milli[e][position]), e, members) for (e, position), members in target.multi_groups
        ]
        self._per_model: dict[tuple[tuple[str, ...], int, int], list[float]] = {}
        self._shapes: dict[tuple[tuple[str, ...], int, tuple[int, ...]], _Shape] = {}
        # Growth depends on the node's state only through these lists: nodes in equal states (idle nodes of
        # one model, above all) share one computation.
        self._deltas: dict[tuple[object, ...], tuple[float, int]] = {}

    def placement_delta(
        self, table: NodeInfo, request: WorkerRequest, rows: IntArray, usable: BoolArray
    ) -> tuple[FloatArray, IntArray]:
        """`fragmentation.placement_delta(table, target, request, rows, usable)`, the same values."""
        if len(rows) > FEW_ROWS or not self.supported:
            return placement_delta(table, self.target, request, rows, usable)
        growth: list[float] = []
        best: list[int] = []
        for free, models, cpu, usable_row in zip(
            table.gpu_milli_free[rows].tolist(),
            table.gpu_model[rows].tolist(),
            table.cpu_free[rows].tolist(),
            usable.tolist(),
            strict=True,
        ):
            before, after = self._reached(cpu), self._reached(cpu - request.cpu_milli)
            key = (table.models, *free, *models, *usable_row, before, after, request.gpus, request.gpu_milli)
            memo = self._deltas.get(key)
            if memo is None:
                if len(self._deltas) >= MEMO_LIMIT:
                    self._deltas.clear()
                kinds = tuple(models)
                shapes = self._shape(table, before, kinds), self._shape(table, after, kinds)
                memo = self._deltas[key] = self._node_delta(shapes, free, request, usable_row)
            g, gpu = memo
            growth.append(g)
            best.append(gpu)
        return np.array(growth, dtype=np.float64), np.array(best, dtype=np.int64)

    def _reached(self, cpu: int) -> int:
        """The row of the class-weight tables for a node with `cpu` free (as `fragmentation._weights`)."""
        return bisect_right(self._steps, cpu) if self.target.needs_node_check else -1

    def _shape(self, table: NodeInfo, reached: int, models: tuple[int, ...]) -> _Shape:
        key = (table.models, reached, models)
        shape = self._shapes.get(key)
        if shape is None:
            target = self.target
            lut = table.spec_lut_stack(target.model_sets).tolist() if target.model_sets else None
            allowed = [[e for e, ok in enumerate(lut[m]) if ok] if lut else [] for m in models]
            contrib = [self._contrib(table, reached, m, sets) for m, sets in zip(models, allowed, strict=True)]
            thresholds = [[need if e in sets else MILLI_PER_GPU + 1 for sets in allowed] for need, e, _ in self._groups]
            shape = self._shapes[key] = _Shape(contrib, thresholds, target.multi_by_cpu[reached].tolist())
        return shape

    def _contrib(self, table: NodeInfo, reached: int, model: int, sets: list[int]) -> list[float]:
        key = (table.models, reached, model)
        cached = self._per_model.get(key)
        if cached is None:
            target = self.target
            hosting = hosting_table(target.single_by_cpu[reached][None, :], target)[0]
            shares = np.arange(MILLI_PER_GPU + 1)
            columns = target.level_lut[shares] + target.level_offset
            hosted = np.zeros(len(shares), dtype=np.float64)
            for e in sets:
                hosted += hosting[columns[:, e]]
            cached = self._per_model[key] = (shares * hosted).tolist()
        return cached

    def _used(self, shape: _Shape, free: list[int]) -> float:
        """sum over the target's GPU classes of p_m [m fits] U_m(n), in weight units (the measure's core)."""
        total = 0.0
        for table, share in zip(shape.contrib, free, strict=True):
            total += table[share]
        for (_, _, members), thresholds in zip(self._groups, shape.thresholds, strict=True):
            count = held = 0
            for share, need in zip(free, thresholds, strict=True):
                if share >= need:
                    count += 1
                    held += share
            for h, gpus in members:
                total += shape.multi[h] * (held if count >= gpus else 0)
        return total

    def _node_delta(
        self, shapes: tuple[_Shape, _Shape], free: list[int], request: WorkerRequest, usable: list[bool]
    ) -> tuple[float, int]:
        """Growth on one node, and the GPU a fraction takes there; `shapes`: the node before and after the
        worker's CPU is taken."""
        before = sum(free) - self._used(shapes[0], free) / WEIGHT_UNITS
        shape = shapes[1]
        if request.gpus == 0:
            return sum(free) - self._used(shape, free) / WEIGHT_UNITS - before, -1
        if not request.fractional:
            taken = [g for g, ok in enumerate(usable) if ok][: request.gpus]
            if len(taken) < request.gpus:
                return float("inf"), -1
            after = list(free)
            for g in taken:
                after[g] = 0
            return sum(after) - self._used(shape, after) / WEIGHT_UNITS - before, -1
        return self._fractional(shape, free, request.gpu_milli, usable, before)

    def _fractional(
        self, shape: _Shape, free: list[int], share: int, usable: list[bool], before: float
    ) -> tuple[float, int]:
        """The smallest growth over the usable GPUs with room for `share`, and that GPU (first on ties).
        Only GPU g changes, so its terms are swapped in the sums of the unchanged node."""
        contrib = shape.contrib
        multi = shape.multi
        base = [table[s] for table, s in zip(contrib, free, strict=True)]
        single_total = sum(base)
        groups = []
        for (_, _, members), thresholds in zip(self._groups, shape.thresholds, strict=True):
            share_in = [s if s >= need else -1 for s, need in zip(free, thresholds, strict=True)]
            inside = [s for s in share_in if s >= 0]
            groups.append((members, share_in, len(inside), sum(inside)))
        total_after = sum(free) - share
        best_growth = float("inf")
        best_gpu = -1
        for g, ok in enumerate(usable):
            left = free[g] - share
            if not ok or left < 0:
                continue
            used = single_total - base[g] + contrib[g][left]
            for members, share_in, count_all, held_all in groups:
                # Multi-GPU classes take whole GPUs (`TaskClass`), so a GPU partly taken leaves their groups.
                count, held = (count_all - 1, held_all - free[g]) if share_in[g] >= 0 else (count_all, held_all)
                for h, gpus in members:
                    used += multi[h] * (held if count >= gpus else 0)
            growth = total_after - used / WEIGHT_UNITS - before
            if growth < best_growth:
                best_growth, best_gpu = growth, g
        return best_growth, best_gpu
