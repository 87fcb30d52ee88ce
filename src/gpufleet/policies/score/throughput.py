"""Score: heterogeneity-aware placement with measured throughputs (after Gavel; Narayanan et al., OSDI 2020).

Each job type runs at a measured speed on each GPU model (`ThroughputTable`, e.g. Gavel's). A job's gain on
a model is its throughput there over its throughput on its slowest measured model, at the job's scale
(`gpus` per worker x workers; consolidated when it has one worker). The score is that gain on the node's
model, scaled by the largest gain any job type of the table has at that scale:

    score = 100 * (gain_job(model) - 1) / (max gain in the table - 1)

so every job prefers faster GPUs, and how strongly depends on how much it gains: a job that barely speeds up
scores every model about 0 and is placed by the other scores of the profile (packing, topology), while a job
that runs 4x faster on the fast model pulls hard towards it. With a greedy placer this is how "fast GPUs to
the jobs that benefit most" shows up; Gavel itself solves an allocation LP per round, which a per-placement
score does not reproduce.

Vectorised: one lookup array per (job type, scale) over the table's model ids, indexed by `table.gpu_model`
of the usable GPUs of each candidate. Unknown job types, models the table lacks, fractional and CPU-only jobs
score 0 everywhere (no preference); a measured throughput of 0 (the job cannot run there) scores 0.
Without a table (the registry's factory) the plugin scores 0 everywhere.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpufleet.domain.throughput_table import ThroughputTable, job_scale, model_key
from gpufleet.scheduling.plugin_api import ClusterView, EvaluationView, FloatArray, GangContext, IntArray, JobView

NAME = "throughput"


class ThroughputScore:
    name: ClassVar[str] = NAME
    node_local: ClassVar[bool] = False

    def __init__(self, table: ThroughputTable | None = None) -> None:
        self._use(table)

    def _use(self, table: ThroughputTable | None) -> None:
        self.table = table
        self._types = frozenset(table.job_types) if table is not None else frozenset()
        self._models = table.models if table is not None else ()
        self._luts: dict[tuple[tuple[str, ...], str, int, bool], FloatArray] = {}
        self._largest: dict[tuple[int, bool], float] = {}

    def follow(self, measured: ThroughputTable | None) -> None:
        """Read the cycle's measured table (`ClusterView.throughput`) when it has one, dropping what was derived
        from the previous table."""
        if measured is not None and measured is not self.table:
            self._use(measured)

    def gains(self, job_type: str, gpus: int, consolidated: bool) -> dict[str, float]:
        """Throughput on each measured model over that on the slowest one the job runs on (> 0)."""
        if self.table is None:
            return {}
        speeds = {m: self.table.get(job_type, m, gpus, consolidated=consolidated) for m in self._models}
        running = [s for s in speeds.values() if s]
        if not running:
            return {}
        slowest = min(running)
        return {m: s / slowest for m, s in speeds.items() if s is not None}

    def largest_gain(self, gpus: int, consolidated: bool) -> float:
        key = (gpus, consolidated)
        if key not in self._largest:
            self._largest[key] = max(
                (g for t in sorted(self._types) for g in self.gains(t, gpus, consolidated).values()), default=1.0
            )
        return self._largest[key]

    def lut(self, models: tuple[str, ...], job_type: str, gpus: int, consolidated: bool) -> FloatArray:
        """Scores over model ids of a table with these `models` (+1 slot for "no GPU")."""
        key = (models, job_type, gpus, consolidated)
        cached = self._luts.get(key)
        if cached is None:
            gains = {model_key(m): g for m, g in self.gains(job_type, gpus, consolidated).items()}
            top = self.largest_gain(gpus, consolidated)
            cached = np.zeros(len(models) + 1, dtype=np.float64)
            if top > 1.0:
                for i, model in enumerate(models):
                    gain = gains.get(model_key(model), 0.0)
                    cached[i] = 100.0 * max(0.0, gain - 1.0) / (top - 1.0)
            self._luts[key] = cached
        return cached

    def score(
        self, view: JobView, cluster: ClusterView, evaluation: EvaluationView, candidates: IntArray, gang: GangContext
    ) -> FloatArray:
        self.follow(cluster.throughput)
        job = view.job
        if job.job_type not in self._types or job.request.gpus == 0 or job.request.fractional:
            return np.zeros(len(candidates), dtype=np.float64)
        table = cluster.nodes
        gpus, consolidated = job_scale(job)
        lut = self.lut(table.models, job.job_type, gpus, consolidated)
        values = np.where(evaluation.usable[candidates], lut[table.gpu_model[candidates]], 0.0)
        return np.asarray(values.max(axis=1, initial=0.0), dtype=np.float64)
