"""Score: spread (least allocated), the Kubernetes default, kept as a baseline."""

from __future__ import annotations

from typing import ClassVar

from gpufleet.policies.score.bin_pack import free_fraction_after
from gpufleet.scheduling.plugin_api import ClusterView, EvaluationView, FloatArray, GangContext, IntArray, JobView

NAME = "spread"


class Spread:
    name: ClassVar[str] = NAME
    node_local: ClassVar[bool] = True

    def score(
        self, view: JobView, cluster: ClusterView, evaluation: EvaluationView, candidates: IntArray, gang: GangContext
    ) -> FloatArray:
        return 100.0 * free_fraction_after(view, cluster, candidates)
