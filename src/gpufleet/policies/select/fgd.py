"""GPU selection by fragmentation gradient (FGD; Weng et al., USENIX ATC 2023).

A fractional worker takes the usable GPU after which the node is least fragmented for the target workload
(`gpufleet.scheduling.fragmentation`), the first such GPU on ties, as upstream's `allocateGpuIdBasedOnFGDScore`.
For example, with half-GPU tasks in the target, a 0.5 share goes to a GPU that already has 0.5 taken rather
than splitting a whole GPU. Whole GPUs are all alike for fragmentation on a node of one model, so they are
chosen as the `pack` plugin does, keeping NVLink groups intact. Use it with the `fgd` score and the same target;
given the score's memo (`FgdSelect(target, memo=score.memo)`) it reuses the GPU the score found.

`truncate=True` chooses as the authors' simulator does (`allocateGpuIdBasedOnFGDScore`): each usable GPU gets
the score's whole-point value (`truncated_score`), and the first GPU with the highest one is taken, which
need not be the GPU of the least growth when two GPUs' growths fall in the same point.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import numpy as np

from gpufleet.domain.errors import GpufleetError
from gpufleet.policies.score.fgd import GradientMemo, shared_memo, truncated_score
from gpufleet.policies.select.pack import PackGpus
from gpufleet.scheduling.plugin_api import (
    GENERIC_TARGET,
    BoolArray,
    IntArray,
    JobView,
    NodeInfo,
    TargetWorkload,
    TaskLike,
)

NAME = "fgd"


class FgdSelect:
    name: ClassVar[str] = NAME

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
        self._whole = PackGpus()

    def select(self, view: JobView, table: NodeInfo, node: int, usable: BoolArray) -> tuple[int, ...]:
        request = view.job.request
        if not request.fractional:
            return self._whole.select(view, table, node, usable)
        if self.truncate:
            gpu = self._first_best_point(table, view, node, usable)
        else:
            gpu = self.memo.best_gpu(table, request, view.model_lut, node, usable)
        if gpu < 0:
            raise GpufleetError(
                f"node {table.names[node]} passed the filters without a usable GPU for job {view.job.id}",
                "this is a bug in a filter plugin; report it with the snapshot",
            )
        return (gpu,)

    def _first_best_point(self, table: NodeInfo, view: JobView, node: int, usable: BoolArray) -> int:
        """The first usable GPU whose growth scores the highest whole point (-1: none has room)."""
        gpus: IntArray = usable.nonzero()[0]
        if not len(gpus):
            return -1
        one_each = np.zeros((len(gpus), len(usable)), dtype=np.bool_)
        one_each[np.arange(len(gpus)), gpus] = True
        rows = np.full(len(gpus), node, dtype=np.int64)
        growth, chosen = self.memo.few.placement_delta(table, view.job.request, rows, one_each)
        room = chosen >= 0
        if not room.any():
            return -1
        points = np.where(room, truncated_score(growth), -1.0)
        return int(gpus[int(points.argmax())])  # argmax: the first GPU on ties
