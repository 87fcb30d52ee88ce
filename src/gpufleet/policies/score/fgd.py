"""Score: fragmentation gradient descent (FGD; Weng et al., USENIX ATC 2023).

A node scores by how much the cluster's fragmentation (`gpufleet.scheduling.fragmentation`, measured for the
target workload) would grow if the worker went there: the smaller the growth, the higher the score. A
fractional worker counts with the GPU of the node that grows it least, which the `fgd` select plugin then
picks. Scores are `100 * sigmoid(-growth / 1000)`, growth in milli-GPU, as upstream's `FGDScorePlugin`
(hkust-adsl/kubernetes-scheduler-simulator, `pkg/simulator/plugin/fgd_score.go`): no growth scores 50, each
whole GPU less fragmented moves it towards 100.

`truncate=True` keeps what the authors' simulator does with that number: a Kubernetes score is an integer,
so it is truncated to a whole point (0..100), and nodes whose growth differs by less than about 40 milli-GPU
tie and go to the first node (the lowest index here). That coarse tie is part of the published FGD: the
`fgd` profile (FGD as published) truncates, and reproduces the published allocation on both openb pod lists
(`docs/results/`); exact scores and the same first-node ties allocate about a point less on `default`.
`fgd-plus` and `default` build on that published FGD; `fgd-bf` keeps exact scores and breaks near-ties with
best fit on purpose.

The target workload is a constructor parameter (`TargetWorkload`, or (gpu_milli, gpus, models, weight)
tuples); the registry's factory uses `GENERIC_TARGET`. The paper builds it from the trace being scheduled:
`FgdScore(TargetWorkload.from_requests(job.request for job in jobs))`.

Speed: growth per node depends only on the node's free resources, its usable GPUs and the request, so it is
memoised per request class and recomputed only for the nodes that changed since, a few per placement
(`GradientMemo`). Within a cycle the table's change clock says which; a new table (the next cycle) is
compared by content, so the memo carries over between cycles. Either way the result is exactly what a fresh
computation gives. The few nodes recomputed per placement go through `FewNodes` (plain Python loops,
the same floats bit for bit), where numpy's per-call overhead would cost more than the arithmetic.
It is not thread-safe: give each thread its own profile.
The `fgd` select plugin may share the score's memo (`FgdSelect(target, memo=score.memo)`), to reuse the GPU
the score found for the chosen node instead of computing it again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import numpy as np

from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.resources import WorkerRequest
from gpufleet.scheduling.plugin_api import (
    GENERIC_TARGET,
    BoolArray,
    ClusterView,
    EvaluationView,
    FewNodes,
    FloatArray,
    GangContext,
    IntArray,
    JobView,
    NodeInfo,
    TargetWorkload,
    TaskLike,
)

NAME = "fgd"
MAX_CLASSES = 512  # request classes memoised before the memo starts over (~40 kB each on 1,213 nodes)


def growth_score(growth: FloatArray) -> FloatArray:
    """100 * sigmoid(-growth / 1000): 50 for no growth, towards 100 as fragmentation shrinks."""
    exponent = np.minimum(np.maximum(growth / 1000.0, -60.0), 60.0)  # np.clip without its Python wrapper
    return np.asarray(100.0 / (1.0 + np.exp(exponent)), dtype=np.float64)


def truncated_score(growth: FloatArray) -> FloatArray:
    """`growth_score` truncated to a whole point, as the FGD authors' simulator scores (`int64(100 * sigmoid)`)."""
    exponent = np.minimum(np.maximum(growth / 1000.0, -60.0), 60.0)
    return np.asarray(np.floor(100.0 * (1.0 / (1.0 + np.exp(exponent)))), dtype=np.float64)


class _Entry:
    """Growth of one request class per node, and when (and with which usable GPUs) each row was computed."""

    __slots__ = ("computed", "epoch", "evaluation", "gpu", "growth", "usable")

    def __init__(self, nodes: int, width: int) -> None:
        self.computed = np.zeros(nodes, dtype=np.int64)  # the memo's clock when the row was computed; 0: never
        self.usable = np.zeros((nodes, width), dtype=np.bool_)
        self.growth = np.zeros(nodes, dtype=np.float64)
        self.gpu = np.full(nodes, -1, dtype=np.int64)
        self.epoch = -1  # the memo's table epoch and the evaluation the rows were last checked against
        self.evaluation = 0


class GradientMemo:
    """`placement_delta` per request class, recomputed only for the nodes that changed.

    What changed is read from the table's own change clock while the same table is in use (the core changes
    free resources only through `NodeTable.apply`/`apply_many`, which keep it), and by comparing contents
    when a new table comes (a new cycle): then the usable GPUs are compared too, as node health or quota may
    have changed them. Growth depends only on those, so the result equals a fresh `placement_delta`.
    The memo holds the last table it saw until another comes, to copy the rows that changed in it then
    (once per table, not once per change).
    """

    def __init__(self, target: TargetWorkload, max_classes: int = MAX_CLASSES) -> None:
        self.target = target
        self.few = FewNodes(target)  # the gradient of the few rows that changed, per placement
        self.max_classes = max_classes
        # The table last seen (held: its contents are read once more when another one comes).
        self._table: NodeInfo | None = None
        self._table_clock = 0
        self._epoch = 0  # bumped whenever another table object comes
        self._names: tuple[str, ...] | None = None
        self._models: tuple[str, ...] | None = None
        # The contents of the tables seen, as of the memo's clock `_synced`: rows changed since are copied
        # only when another table comes, not on every change.
        self._arrays: tuple[IntArray, ...] = ()
        self._synced = 0
        self._changed_at = np.zeros(0, dtype=np.int64)
        self._clock = 0
        self._entries: dict[tuple[object, ...], _Entry] = {}
        self._memory_matters = bool(target.class_memory.any())

    @staticmethod
    def _contents(table: NodeInfo) -> tuple[IntArray, ...]:
        return (table.gpu_milli_free, table.gpu_model, table.cpu_free, table.mem_free)

    def _observe(self, table: NodeInfo) -> None:
        """Note which nodes changed since the last call, and when. Other nodes or GPU models: start over
        (model ids are indices into `table.models`)."""
        old = self._table
        if old is table:
            if table.clock != self._table_clock:
                self._mark(np.flatnonzero(table.version > self._table_clock))
                self._table_clock = table.clock
            return
        arrays = self._contents(table)
        if old is not None and self._arrays and old.gpu_milli_free.shape == self._arrays[0].shape:
            self._observe(old)  # its last changes, then what it holds now
            rows = np.flatnonzero(self._changed_at > self._synced)
            for now, seen in zip(self._contents(old), self._arrays, strict=True):
                seen[rows] = now[rows]
            self._synced = self._clock
        self._table = table
        self._table_clock = table.clock
        self._epoch += 1
        if self._names != table.names or self._models != table.models or self._arrays[0].shape != arrays[0].shape:
            self._names = table.names
            self._models = table.models
            self._arrays = tuple(a.copy() for a in arrays)
            self._clock = self._synced = 1
            self._changed_at = np.ones(len(table), dtype=np.int64)
            self._entries.clear()
            return
        changed = np.zeros(len(table), dtype=np.bool_)
        for now, seen in zip(arrays, self._arrays, strict=True):
            differs = now != seen
            changed |= differs.any(axis=1) if differs.ndim == 2 else differs
        self._mark(np.flatnonzero(changed))

    def _mark(self, rows: IntArray) -> None:
        if len(rows):
            self._clock += 1
            self._changed_at[rows] = self._clock

    def _key(self, request: WorkerRequest, lut: BoolArray) -> tuple[object, ...]:
        """What growth depends on besides the node: GPUs, share, and CPU and memory where the target has
        thresholds for them (GPU models and GPU memory act through the usable GPUs, compared separately)."""
        target = self.target
        return (
            request.gpus,
            request.gpu_milli if request.gpus else 0,
            request.cpu_milli if target.needs_node_check else 0,
            request.memory if self._memory_matters else 0,
            lut.tobytes(),
        )

    def _entry(self, table: NodeInfo, request: WorkerRequest, lut: BoolArray) -> _Entry:
        key = self._key(request, lut)
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= self.max_classes:
                self._entries.clear()
            entry = self._entries[key] = _Entry(len(table), table.width)
        return entry

    def growth(
        self, table: NodeInfo, request: WorkerRequest, lut: BoolArray, evaluation: EvaluationView, rows: IntArray
    ) -> tuple[FloatArray, IntArray]:
        """(growth, best GPU) for `rows`: `placement_delta(table, target, request, rows, usable[rows])`."""
        self._observe(table)
        entry = self._entry(table, request, lut)
        stale = entry.computed[rows] < self._changed_at[rows]
        if entry.epoch != self._epoch or entry.evaluation != id(evaluation):
            stale |= (entry.usable[rows] != evaluation.usable[rows]).any(axis=1)
            entry.epoch = self._epoch
            entry.evaluation = id(evaluation)
        redo = rows[stale]
        if len(redo):
            wanted = evaluation.usable[redo]
            growth, gpu = self.few.placement_delta(table, request, redo, wanted)
            entry.growth[redo] = growth
            entry.gpu[redo] = gpu
            entry.usable[redo] = wanted
            entry.computed[redo] = self._clock
        return entry.growth[rows], entry.gpu[rows]

    def best_gpu(self, table: NodeInfo, request: WorkerRequest, lut: BoolArray, node: int, usable: BoolArray) -> int:
        """The GPU a fractional worker should take on `node` (-1: none), from the memo when it is current."""
        entry = self._entries.get(self._key(request, lut))
        current = (
            entry is not None
            and self._table is table
            and table.clock == self._table_clock
            and entry.computed[node] >= self._changed_at[node]
            and bool(np.array_equal(entry.usable[node], usable))
        )
        if entry is not None and current:
            return int(entry.gpu[node])
        _, gpu = self.few.placement_delta(table, request, np.array([node], dtype=np.int64), usable[None, :])
        return int(gpu[0])


def shared_memo(memo: GradientMemo | None, target: TargetWorkload) -> GradientMemo:
    """`memo` if given (it must be for the same target), else a new one."""
    if memo is None:
        return GradientMemo(target)
    if memo.target != target:
        raise GpufleetError(
            "the FGD memo given was built for another target workload",
            "give the fgd score and select plugins the same target, and the score's memo to the select plugin",
        )
    return memo


class FgdScore:
    name: ClassVar[str] = NAME
    node_local: ClassVar[bool] = True

    def __init__(
        self,
        target: TargetWorkload | Iterable[TaskLike] = GENERIC_TARGET,
        *,
        memo: GradientMemo | None = None,
        truncate: bool = False,
    ) -> None:
        self.target = TargetWorkload.of(target)
        self.memo = shared_memo(memo, self.target)
        self.truncate = truncate
        self._score = truncated_score if truncate else growth_score

    def score(
        self, view: JobView, cluster: ClusterView, evaluation: EvaluationView, candidates: IntArray, gang: GangContext
    ) -> FloatArray:
        growth, _ = self.memo.growth(cluster.nodes, view.job.request, view.model_lut, evaluation, candidates)
        return self._score(growth)
