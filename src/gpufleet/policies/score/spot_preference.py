"""Score: jobs that say `spot: preferred` go to spot nodes first (100 there, 0 elsewhere); every other job
scores every node alike, so its placement is the other scores' alone. Every profile carries it, with a weight
that outweighs the others (`SPOT_PREFERRED_WEIGHT`): preferred means first where there is room."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpufleet.scheduling.plugin_api import ClusterView, EvaluationView, FloatArray, GangContext, IntArray, JobView

NAME = "spot_preference"


class SpotPreference:
    name: ClassVar[str] = NAME
    node_local: ClassVar[bool] = True

    def score(
        self, view: JobView, cluster: ClusterView, evaluation: EvaluationView, candidates: IntArray, gang: GangContext
    ) -> FloatArray:
        if view.job.request.spot != "preferred":
            return np.zeros(len(candidates), dtype=np.float64)
        return np.where(cluster.nodes.spot[candidates], 100.0, 0.0)
