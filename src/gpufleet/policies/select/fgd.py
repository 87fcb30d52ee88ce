"""GPU selection by fragmentation gradient (FGD; Weng et al., USENIX ATC 2023).

A fractional worker takes the usable GPU after which the node is least fragmented for the target workload
(`gpufleet.scheduling.fragmentation`), the first such GPU on ties, as upstream's `allocateGpuIdBasedOnFGDScore`.
For example, with half-GPU tasks in the target, a 0.5 share goes to a GPU that already has 0.5 taken rather
than splitting a whole GPU. Whole GPUs are all alike for fragmentation on a node of one model, so they are
chosen as the `pack` plugin does, keeping NVLink groups intact. Use it with the `fgd` score and the same target;
given the score's memo (`FgdSelect(target, memo=score.memo)`) it reuses the GPU the score found.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from gpufleet.domain.errors import GpufleetError
from gpufleet.policies.score.fgd import GradientMemo, shared_memo
from gpufleet.policies.select.pack import PackGpus
from gpufleet.scheduling.plugin_api import GENERIC_TARGET, BoolArray, JobView, NodeInfo, TargetWorkload, TaskLike

NAME = "fgd"


class FgdSelect:
    name: ClassVar[str] = NAME

    def __init__(
        self, target: TargetWorkload | Iterable[TaskLike] = GENERIC_TARGET, *, memo: GradientMemo | None = None
    ) -> None:
        self.target = TargetWorkload.of(target)
        self.memo = shared_memo(memo, self.target)
        self._whole = PackGpus()

    def select(self, view: JobView, table: NodeInfo, node: int, usable: BoolArray) -> tuple[int, ...]:
        request = view.job.request
        if not request.fractional:
            return self._whole.select(view, table, node, usable)
        gpu = self.memo.best_gpu(table, request, view.model_lut, node, usable)
        if gpu < 0:
            raise GpufleetError(
                f"node {table.names[node]} passed the filters without a usable GPU for job {view.job.id}",
                "this is a bug in a filter plugin; report it with the snapshot",
            )
        return (gpu,)
