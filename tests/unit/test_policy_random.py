"""`random`: a uniformly random node, the same for the same snapshot seed and job, another for another seed."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.domain import ClusterSnapshot, Job, WorkerRequest, make_node
from gpufleet.policies.catalog import build_profile, profile
from gpufleet.policies.score.random import RandomScore, draw, stable_hash
from gpufleet.scheduling.cycle import run_cycle
from gpufleet.scheduling.placer import evaluate
from gpufleet.scheduling.plugin_api import GangContext, JobView
from gpufleet.scheduling.state import CycleState
from gpufleet.scheduling.table import FloatArray, IntArray

GIB = 1024**3
NODES = tuple(make_node(f"n{i:02d}", "A100", 8, 80 * GIB) for i in range(16))


def one_gpu(job_id: str, seq: int = 0) -> Job:
    return Job(id=job_id, queue="q", request=WorkerRequest(gpus=1), submit_seq=seq)


def scores(seed: int, job: Job, candidates: IntArray | None = None, gang: GangContext | None = None) -> FloatArray:
    state = CycleState(ClusterSnapshot(NODES, seed=seed))
    view = JobView(job, state.table.model_lut(job.request.models))
    evaluation = evaluate(build_profile("r", "fifo", (("random", 1.0),)), view, state)
    rows = np.arange(len(NODES)) if candidates is None else candidates
    return RandomScore().score(view, state.view, evaluation, rows, gang or GangContext())


def test_the_hash_and_the_draw_are_pinned() -> None:
    # BLAKE2b-64 of the id and numpy's default_rng: pinned, so neither hash salting nor a Python upgrade can
    # change a simulation's placements.
    assert stable_hash("job-1") == 7761117588695213569
    assert stable_hash("job-1") != stable_hash("job-2")
    assert draw(7, "a", 0, 3).round(6).tolist() == [0.236712, 0.110942, 0.617315]


def test_scores_are_uniform_in_0_100_and_deterministic() -> None:
    first = scores(7, one_gpu("a"))
    assert first.tolist() == scores(7, one_gpu("a")).tolist()
    assert ((first >= 0) & (first < 100)).all()
    assert first.tolist() == (100 * draw(7, "a", 0, len(NODES))).tolist()


@pytest.mark.parametrize(
    ("seed", "job_id", "worker"),
    [
        pytest.param(8, "a", 0, id="another-seed"),
        pytest.param(7, "b", 0, id="another-job"),
        pytest.param(7, "a", 1, id="next-worker"),
    ],
)
def test_another_seed_job_or_worker_draws_again(seed: int, job_id: str, worker: int) -> None:
    gang = GangContext([0] * worker)
    assert scores(seed, one_gpu(job_id), gang=gang).tolist() != scores(7, one_gpu("a")).tolist()


def test_a_nodes_score_does_not_depend_on_the_other_candidates() -> None:
    every = scores(7, one_gpu("a"))
    some = np.array([2, 5, 11])
    assert scores(7, one_gpu("a"), some).tolist() == every[some].tolist()


def test_negative_and_huge_seeds_are_accepted() -> None:
    assert len(scores(-1, one_gpu("a"))) == len(scores(2**70, one_gpu("a"))) == len(NODES)


def test_the_random_profile_spreads_jobs_and_repeats_itself() -> None:
    jobs = [one_gpu(f"j{i}", i) for i in range(12)]
    placed = run_cycle(ClusterSnapshot(NODES, seed=1), jobs, profile("random"))
    nodes = {p.workers[0].node for p in placed.placements}
    assert len(placed.placements) == 12
    assert len(nodes) > 6
    again = run_cycle(ClusterSnapshot(NODES, seed=1), list(reversed(jobs)), profile("random"))
    assert again.to_json() == placed.to_json()
    other = run_cycle(ClusterSnapshot(NODES, seed=2), jobs, profile("random"))
    assert other.to_json() != placed.to_json()
