"""Score: spread (least allocated), the Kubernetes default, kept as a baseline."""

from __future__ import annotations

from typing import ClassVar

from gpufleet.policies.score.bin_pack import free_fraction_after
from gpufleet.scheduling.plugins import GangContext, JobView
from gpufleet.scheduling.state import CycleState, Evaluation
from gpufleet.scheduling.table import FloatArray, IntArray

NAME = "spread"


class Spread:
    name: ClassVar[str] = NAME
    node_local: ClassVar[bool] = True

    def score(
        self, view: JobView, state: CycleState, evaluation: Evaluation, candidates: IntArray, gang: GangContext
    ) -> FloatArray:
        return 100.0 * free_fraction_after(view, state, candidates)
