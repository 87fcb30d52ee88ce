"""Score: uniformly random, the baseline every placement policy should beat (FGD's `01-Random`).

Deterministic: the scores come from numpy's `default_rng` seeded with the snapshot's seed, a stable hash of
the job id (BLAKE2b, never Python's salted `hash()`) and the worker's position in its gang, and are drawn for
every node of the table, so a node's score does not depend on which other nodes are candidates. Same
snapshot, same job, same scores; another seed, another draw.
"""

from __future__ import annotations

import hashlib
from typing import ClassVar

import numpy as np

from gpufleet.scheduling.plugin_api import ClusterView, EvaluationView, FloatArray, GangContext, IntArray, JobView

NAME = "random"
_UINT64 = (1 << 64) - 1


def stable_hash(text: str) -> int:
    """A 64-bit hash of `text` that is the same in every process and Python version."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def draw(seed: int, job_id: str, worker: int, nodes: int) -> FloatArray:
    """Uniform [0, 1) numbers, one per node, for this seed, job and worker."""
    rng = np.random.default_rng([seed & _UINT64, stable_hash(job_id), worker])
    return rng.random(nodes)


class RandomScore:
    name: ClassVar[str] = NAME
    node_local: ClassVar[bool] = False

    def score(
        self, view: JobView, cluster: ClusterView, evaluation: EvaluationView, candidates: IntArray, gang: GangContext
    ) -> FloatArray:
        values = draw(cluster.seed, view.job.id, len(gang.nodes), len(cluster.nodes))
        return np.asarray(100.0 * values[candidates], dtype=np.float64)
