"""FGD: the fragmentation measure (hand-computed cases), its gradient, the `fgd` score and select plugins."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpufleet.domain import (
    ClusterSnapshot,
    Gpu,
    GpufleetError,
    GpuShare,
    Job,
    Node,
    RunningJob,
    SpecError,
    WorkerPlacement,
    WorkerRequest,
    make_node,
)
from gpufleet.policies.catalog import PolicyData, build_profile, profile
from gpufleet.policies.score.fgd import FgdScore, GradientMemo, growth_score, truncated_score
from gpufleet.policies.select.fgd import FgdSelect
from gpufleet.policies.select.pack import PackGpus
from gpufleet.scheduling.cycle import run_cycle
from gpufleet.scheduling.fragmentation import (
    GENERIC_TARGET,
    TargetWorkload,
    TaskClass,
    cluster_fragmentation,
    node_fragmentation,
    placement_delta,
)
from gpufleet.scheduling.placer import evaluate
from gpufleet.scheduling.plugin_api import ClusterView, EvaluationView, GangContext, JobView
from gpufleet.scheduling.state import CycleState, Evaluation
from gpufleet.scheduling.table import FloatArray, IntArray, NodeTable

GIB = 1024**3
ANY: frozenset[str] = frozenset()


def table(*rows: tuple[str, list[int]], model: str = "T4", cpu: int = 96_000, cpu_used: int = 0) -> NodeTable:
    """Nodes of `len(free)` GPUs of `model`, with GPU g holding 1000 - free[g] milli-GPU taken."""
    nodes = [make_node(name, model, len(free), 16 * GIB, cpu_milli=cpu) for name, free in rows]
    result = NodeTable(nodes)
    for name, free in rows:
        shares = tuple(GpuShare(g, 1000 - f) for g, f in enumerate(free) if f < 1000)
        result.apply(WorkerPlacement(name, shares, cpu_used), -1)
    return result


def target(*classes: tuple[int, int, str, float] | TaskClass) -> TargetWorkload:
    return TargetWorkload.of(classes)


HALF_AND_WHOLE = target((500, 1, "", 1.0), (1000, 1, "", 1.0))


# ---- the measure, hand-computed ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workload", "free", "expected"),
    [
        pytest.param(target((500, 1, "", 1.0)), [1000, 300], 300.0, id="share-too-small-is-fragment"),
        pytest.param(HALF_AND_WHOLE, [500, 1000], 250.0, id="half-of-classes-see-the-half-gpu"),
        pytest.param(target((0, 0, "", 1.0)), [1000, 300], 1300.0, id="cpu-only-class-sees-all-as-fragment"),
        pytest.param(target((1000, 2, "", 1.0)), [1000, 1000, 500], 500.0, id="two-gpu-class-fits"),
        pytest.param(target((1000, 2, "", 1.0)), [1000, 500, 500], 2000.0, id="two-gpu-class-does-not-fit"),
        pytest.param(target((500, 1, "A100", 1.0)), [1000, 1000], 2000.0, id="wrong-model-is-all-fragment"),
        pytest.param(target((500, 1, "T4|A100", 1.0)), [1000, 1000], 0.0, id="allowed-model"),
        pytest.param(target((250, 1, "", 3.0), (0, 0, "", 1.0)), [200, 1000], 450.0, id="popularity-weighted"),
        pytest.param(target((250, 1, "", 1.0)), [0, 0], 0.0, id="nothing-free-nothing-fragmented"),
    ],
)
def test_fragmentation_of_one_node(workload: TargetWorkload, free: list[int], expected: float) -> None:
    assert node_fragmentation(table(("n", free)), workload).tolist() == [expected]


@pytest.mark.parametrize(
    ("cpu_used", "expected"),
    [
        pytest.param(0, 0.0, id="cpu-fits"),
        pytest.param(90_000, 1000.0, id="too-little-cpu-left-all-fragment"),
    ],
)
def test_a_class_whose_cpu_does_not_fit_sees_everything_as_fragment(cpu_used: int, expected: float) -> None:
    workload = target(TaskClass(500, 1, ANY, 1.0, cpu_milli=8_000))
    assert node_fragmentation(table(("n", [1000]), cpu_used=cpu_used), workload).tolist() == [expected]


def test_memory_is_checked_when_a_class_gives_it() -> None:
    workload = target(TaskClass(500, 1, ANY, 1.0, memory=2 * 1024**4))  # more than make_node's 1 TiB
    assert node_fragmentation(table(("n", [1000])), workload).tolist() == [1000.0]


def test_models_are_checked_per_gpu_on_a_mixed_node() -> None:
    mixed = Node("mixed", (Gpu(0, "a", "A100", 80 * GIB), Gpu(1, "b", "T4", 16 * GIB)), cpu_milli=8_000)
    assert node_fragmentation(NodeTable([mixed]), target((500, 1, "T4", 1.0))).tolist() == [1000.0]
    assert node_fragmentation(NodeTable([mixed]), target((1000, 2, "T4", 1.0))).tolist() == [2000.0]


def test_cluster_totals_and_ratios() -> None:
    nodes = table(("a", [500, 1000]), ("b", [0, 0]), ("c", [1000, 1000]))
    summary = cluster_fragmentation(nodes, HALF_AND_WHOLE)
    assert (summary.fragmented_milli, summary.idle_milli, summary.capacity_milli) == (250.0, 3500, 6000)
    assert summary.ratio == pytest.approx(250 / 3500)
    assert summary.share_of_capacity == pytest.approx(250 / 6000)
    empty = cluster_fragmentation(NodeTable([]), HALF_AND_WHOLE)
    assert (empty.fragmented_milli, empty.ratio, empty.share_of_capacity) == (0.0, 0.0, 0.0)


def reference(free: list[int], model: str, cpu: int, workload: TargetWorkload) -> float:
    """F_n written out one class at a time, as upstream's `NodeGpuShareFragAmount`."""
    total = sum(free)
    value = 0.0
    for c, p in zip(workload.classes, workload.popularity, strict=True):
        if c.gpus == 0:
            value += p * total
            continue
        usable = [f for f in free if f >= c.gpu_milli] if not c.models or model in c.models else []
        fits = len(usable) >= c.gpus and cpu >= c.cpu_milli
        value += p * (total - sum(usable) if fits else total)
    return value


MIXED = target(
    TaskClass(500, 1, ANY, 2.0),
    TaskClass(250, 1, frozenset({"T4"}), 1.0),
    TaskClass(1000, 1, ANY, 3.0, cpu_milli=20_000),
    TaskClass(1000, 2, ANY, 1.0),
    TaskClass(0, 0, ANY, 1.0),
)


def random_table(seed: int, nodes: int = 40) -> NodeTable:
    rng = np.random.default_rng(seed)
    result = NodeTable(
        [make_node(f"n{i:02d}", "T4" if i % 2 else "A100", 4, 16 * GIB, cpu_milli=32_000) for i in range(nodes)]
    )
    for i in range(nodes):
        taken = [int(rng.choice([0, 0, 100, 250, 500, 750, 1000])) for _ in range(4)]
        shares = tuple(GpuShare(g, t) for g, t in enumerate(taken) if t)
        result.apply(WorkerPlacement(f"n{i:02d}", shares, int(rng.integers(0, 30_000))), -1)
    return result


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_measure_matches_the_definition_class_by_class(seed: int) -> None:
    nodes = random_table(seed)
    expected = [
        reference(nodes.gpu_milli_free[i].tolist(), nodes.gpu_model_names[i][0], int(nodes.cpu_free[i]), MIXED)
        for i in range(len(nodes))
    ]
    # Popularity is quantised to 2**-20, so the two agree to a millionth of a GPU.
    assert node_fragmentation(nodes, MIXED) == pytest.approx(expected, abs=1e-2)


# ---- the gradient ---------------------------------------------------------------------------------------


def all_usable(nodes: NodeTable, request: WorkerRequest) -> np.ndarray:
    return nodes.gpu_exists & (nodes.gpu_milli_free >= (request.gpu_milli if request.fractional else 1000))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(WorkerRequest(gpus=1, gpu_milli=300, cpu_milli=5_000), id="fraction"),
        pytest.param(WorkerRequest(gpus=1, cpu_milli=12_000), id="one-gpu"),
        pytest.param(WorkerRequest(gpus=2), id="two-gpus"),
        pytest.param(WorkerRequest(cpu_milli=8_000), id="cpu-only"),
    ],
)
def test_the_gradient_is_the_difference_of_the_measure(seed: int, request_: WorkerRequest) -> None:
    nodes = random_table(seed)
    rows = np.arange(len(nodes))
    usable = all_usable(nodes, request_) if request_.gpus else np.zeros_like(nodes.gpu_exists)
    growth, best = placement_delta(nodes, MIXED, request_, rows, usable)
    before = node_fragmentation(nodes, MIXED)
    for i in range(len(nodes)):
        free_gpus = [int(g) for g in np.flatnonzero(usable[i])]
        if len(free_gpus) < request_.gpus:
            assert (growth[i], best[i]) == (np.inf, -1)
            continue
        # A fraction is tried on every usable GPU; whole GPUs are the first usable ones (GPU -1: none chosen).
        options = free_gpus if request_.fractional else [-1]
        results = []
        for g in options:
            gpus = [g] if request_.fractional else free_gpus[: request_.gpus]
            share = request_.gpu_milli if request_.fractional else 1000
            nodes.apply(
                WorkerPlacement(nodes.names[i], tuple(GpuShare(x, share) for x in gpus), request_.cpu_milli), -1
            )
            results.append((float(node_fragmentation(nodes, MIXED, np.array([i]))[0] - before[i]), g))
            nodes.apply(
                WorkerPlacement(nodes.names[i], tuple(GpuShare(x, share) for x in gpus), request_.cpu_milli), +1
            )
        smallest = min(r for r, _ in results)
        assert growth[i] == pytest.approx(smallest, abs=1e-6)
        assert best[i] == next(g for r, g in results if r == pytest.approx(smallest, abs=1e-6))


def test_equal_nodes_get_bit_equal_growth() -> None:
    nodes = table(*((f"n{i}", [500, 1000, 250, 1000]) for i in range(6)))
    growth, _ = placement_delta(nodes, MIXED, WorkerRequest(gpus=1, gpu_milli=250), np.arange(6), nodes.gpu_exists)
    assert len(set(growth.tolist())) == 1


# ---- the score ------------------------------------------------------------------------------------------


def score_of(plugin: FgdScore, snapshot: ClusterSnapshot, job: Job) -> tuple[FloatArray, IntArray]:
    state = CycleState(snapshot)
    prof = build_profile("t", "fifo", ((plugin, 1.0),))
    view = JobView(job, state.table.model_lut(job.request.models))
    evaluation = evaluate(prof, view, state)
    candidates = np.flatnonzero(evaluation.passed)
    return plugin.score(view, state.view, evaluation, candidates, GangContext()), candidates


def snapshot_with(*layout: tuple[str, list[int]], cpu: int = 96_000) -> ClusterSnapshot:
    """Nodes named as given, each GPU g holding 1000 - free[g] milli-GPU of one running job."""
    nodes = tuple(make_node(name, "T4", len(free), 16 * GIB, cpu_milli=cpu) for name, free in layout)
    running = []
    for name, free in layout:
        for g, f in enumerate(free):
            if f < 1000:
                taken = 1000 - f
                request = WorkerRequest(gpus=1, gpu_milli=taken) if taken < 1000 else WorkerRequest(gpus=1)
                job = Job(id=f"{name}-{g}", queue="q", request=request)
                running.append(RunningJob(job, (WorkerPlacement(name, (GpuShare(g, taken),)),)))
    return ClusterSnapshot(nodes, tuple(running))


def half_job(job_id: str = "j", share: int = 500) -> Job:
    return Job(id=job_id, queue="q", request=WorkerRequest(gpus=1, gpu_milli=share))


@pytest.mark.parametrize(
    ("growth", "expected"),
    [(0.0, 50.0), (-250.0, 100 / (1 + np.exp(-0.25))), (1000.0, 100 / (1 + np.exp(1.0))), (np.inf, 0.0)],
)
def test_growth_maps_to_a_sigmoid_score(growth: float, expected: float) -> None:
    assert growth_score(np.array([growth]))[0] == pytest.approx(expected)


@pytest.mark.parametrize("growth", [0.0, -250.0, -39.0, -41.0, 1000.0, 123.4, np.inf])
def test_the_published_fgd_scores_in_whole_points(growth: float) -> None:
    """The authors' simulator keeps `int64(100 * sigmoid(-growth / 1000))`: the exact score, truncated."""
    assert truncated_score(np.array([growth]))[0] == np.floor(growth_score(np.array([growth]))[0])


def test_truncated_scores_tie_nodes_whose_growth_differs_by_less_than_a_point() -> None:
    # growth -30 and 0: exact scores differ, both are 50 in whole points, so the first node wins the tie.
    snapshot = snapshot_with(("a-no-change", [1000, 1000]), ("b-slightly-better", [1000, 1000]))
    assert truncated_score(np.array([-30.0, 0.0])).tolist() == [50.0, 50.0]
    assert growth_score(np.array([-30.0]))[0] > growth_score(np.array([0.0]))[0]
    exact, _ = score_of(FgdScore(HALF_AND_WHOLE), snapshot, half_job())
    whole, _ = score_of(FgdScore(HALF_AND_WHOLE, truncate=True), snapshot, half_job())
    assert whole.tolist() == np.floor(exact).tolist()


def test_a_half_gpu_job_prefers_the_node_where_it_completes_a_half_used_gpu() -> None:
    snapshot = snapshot_with(("a-half-used", [500, 1000]), ("b-empty", [1000, 1000]))
    scores, candidates = score_of(FgdScore(HALF_AND_WHOLE), snapshot, half_job())
    assert candidates.tolist() == [0, 1]
    # a: 250 -> 0 fragmented (growth -250); b: 0 -> 250 (growth +250).
    assert scores.tolist() == pytest.approx([100 / (1 + np.exp(-0.25)), 100 / (1 + np.exp(0.25))])


def test_a_one_gpu_job_keeps_two_gpu_holes_whole() -> None:
    snapshot = snapshot_with(("a-four-free", [1000] * 4), ("b-two-free", [1000, 1000, 0, 0]))
    job = Job(id="j", queue="q", request=WorkerRequest(gpus=1))
    scores, _ = score_of(FgdScore(target((1000, 2, "", 1.0))), snapshot, job)
    assert scores.tolist() == pytest.approx([50.0, 100 / (1 + np.exp(1.0))])  # growth 0 vs +1000


def test_a_cpu_only_job_avoids_taking_the_cpu_a_gpu_class_needs() -> None:
    workload = target(TaskClass(500, 1, ANY, 1.0, cpu_milli=8_000))
    nodes = (
        make_node("a-tight", "T4", 1, 16 * GIB, cpu_milli=10_000),
        make_node("b-roomy", "T4", 1, 16 * GIB, cpu_milli=20_000),
    )
    job = Job(id="c", queue="q", request=WorkerRequest(cpu_milli=4_000))
    scores, _ = score_of(FgdScore(workload), ClusterSnapshot(nodes), job)
    assert scores.tolist() == pytest.approx([100 / (1 + np.exp(1.0)), 50.0])


def test_a_memo_is_shared_only_for_the_same_target() -> None:
    score = FgdScore(HALF_AND_WHOLE)
    assert FgdSelect(HALF_AND_WHOLE, memo=score.memo).memo is score.memo
    with pytest.raises(GpufleetError, match="another target workload"):
        FgdSelect(MIXED, memo=score.memo)


def test_the_registry_factory_uses_the_generic_target() -> None:
    assert FgdScore().target is GENERIC_TARGET
    assert FgdSelect().target is GENERIC_TARGET
    assert FgdScore([(500, 1, "", 1.0)]).target == target((500, 1, "", 1.0))


# ---- the select plugin ---------------------------------------------------------------------------------


def select_on(plugin: FgdSelect | PackGpus, free: list[int], job: Job, nvlink_groups: int = 1) -> tuple[int, ...]:
    nodes = NodeTable([make_node("n", "T4", len(free), 16 * GIB, nvlink_groups=nvlink_groups)])
    nodes.apply(WorkerPlacement("n", tuple(GpuShare(g, 1000 - f) for g, f in enumerate(free) if f < 1000)), -1)
    usable = all_usable(nodes, job.request)[0]
    return plugin.select(JobView(job, nodes.model_lut(job.request.models)), nodes, 0, usable)


def test_select_leaves_a_half_share_the_target_can_use_where_pack_would_not() -> None:
    # 0.1 GPU on [0.6 free, 0.5 free]: on GPU 0 both keep 0.5 (usable by 0.5-GPU tasks); pack takes the
    # tightest GPU, GPU 1, leaving 0.4 that no task of the target can use.
    job = half_job(share=100)
    assert select_on(FgdSelect(target((500, 1, "", 1.0))), [600, 500], job) == (0,)
    assert select_on(PackGpus(), [600, 500], job) == (1,)


def test_select_completes_a_half_used_gpu_rather_than_split_a_whole_one() -> None:
    assert select_on(FgdSelect(HALF_AND_WHOLE), [1000, 500, 1000], half_job()) == (1,)


def test_select_takes_the_first_gpu_on_ties() -> None:
    assert select_on(FgdSelect(HALF_AND_WHOLE), [1000, 1000, 1000], half_job()) == (0,)


def test_truncated_select_takes_the_first_gpu_of_the_best_whole_point() -> None:
    """0.1 GPU on [0.3 free, 0.9 free]: GPU 1 grows fragmentation least (-33 milli-GPU), GPU 0 not at all; both
    score 50 in whole points, and the authors' simulator takes the first GPU with the highest point."""
    workload = target((500, 1, "", 1.0), (1000, 1, "", 1.0), (300, 1, "", 1.0))
    job = half_job(share=100)
    assert select_on(FgdSelect(workload), [300, 900], job) == (1,)
    assert select_on(FgdSelect(workload, truncate=True), [300, 900], job) == (0,)
    # A clear difference in points still decides: the half-used GPU completes a 0.5 class.
    assert select_on(FgdSelect(HALF_AND_WHOLE, truncate=True), [1000, 500, 1000], half_job()) == (1,)


def test_select_places_whole_gpus_as_pack_does() -> None:
    job = Job(id="w", queue="q", request=WorkerRequest(gpus=2))
    free = [1000, 0, 1000, 1000, 1000, 1000, 0, 0]
    assert select_on(FgdSelect(), free, job, nvlink_groups=2) == select_on(PackGpus(), free, job, nvlink_groups=2)


# ---- the memo ------------------------------------------------------------------------------------------


class FreshFgd:
    """The `fgd` score without the memo: `placement_delta` on every call."""

    name = "fgd"

    def __init__(self, workload: TargetWorkload) -> None:
        self.target = workload

    def score(
        self, view: JobView, cluster: ClusterView, evaluation: EvaluationView, candidates: IntArray, gang: GangContext
    ) -> FloatArray:
        usable = evaluation.usable[candidates]
        growth, _ = placement_delta(cluster.nodes, self.target, view.job.request, candidates, usable)
        return growth_score(growth)


def mixed_jobs(seed: int, count: int) -> list[Job]:
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(count):
        kind = int(rng.integers(0, 4))
        request = (
            WorkerRequest(gpus=1, gpu_milli=int(rng.choice([100, 250, 300, 500, 750])), cpu_milli=2_000),
            WorkerRequest(gpus=1, cpu_milli=6_000),
            WorkerRequest(gpus=2, cpu_milli=4_000),
            WorkerRequest(cpu_milli=3_000),
        )[kind]
        jobs.append(Job(id=f"j{i:03d}", queue="q", request=request, submit_seq=i))
    return jobs


def fleet() -> tuple[Node, ...]:
    return tuple(
        make_node(f"n{i}", "T4" if i % 3 else "A100", 4, 16 * GIB, cpu_milli=24_000, nvlink_groups=2) for i in range(8)
    )


def test_the_memo_gives_what_a_fresh_computation_gives_within_and_across_cycles() -> None:
    score = FgdScore(MIXED)
    memoised = build_profile("m", "fifo", ((score, 1.0),), select=FgdSelect(MIXED, memo=score.memo))
    fresh = build_profile("f", "fifo", ((FreshFgd(MIXED), 1.0),), select=FgdSelect(MIXED))
    snapshot = ClusterSnapshot(fleet())
    jobs = mixed_jobs(3, 120)
    for wave in range(4):  # four cycles; the memo carries over, the fresh score starts over
        pending = jobs[wave * 30 : (wave + 1) * 30]
        first = run_cycle(snapshot, pending, memoised)
        assert first.to_json() == run_cycle(snapshot, pending, fresh).to_json()
        placed = {p.job: p.workers for p in first.placements}
        running = tuple(RunningJob(j, placed[j.id]) for j in pending if j.id in placed)
        # Every third job ends before the next cycle: the next table differs from the memo's last view.
        kept = tuple(r for k, r in enumerate(snapshot.running) if k % 3)
        snapshot = dataclasses.replace(snapshot, running=kept + running)
    assert len(snapshot.running) > 30


def test_the_memo_compares_usable_gpus_of_another_evaluation() -> None:
    nodes = table(("x", [500, 1000]), ("y", [1000, 1000]))
    memo = GradientMemo(HALF_AND_WHOLE)
    request = WorkerRequest(gpus=1, gpu_milli=500)
    lut = nodes.model_lut(ANY)
    rows = np.arange(2)
    for usable in (all_usable(nodes, request), np.array([[False, True], [False, True]])):  # e.g. GPU memory
        evaluation = Evaluation(usable, usable.any(axis=1), usable.sum(axis=1), nodes.clock)
        got = memo.growth(nodes, request, lut, evaluation, rows)
        want = placement_delta(nodes, HALF_AND_WHOLE, request, rows, usable)
        assert (got[0].tolist(), got[1].tolist()) == (want[0].tolist(), want[1].tolist())
    assert got[1].tolist() == [1, 1]


def test_the_memo_sees_a_node_cordoned_between_cycles() -> None:
    score = FgdScore(HALF_AND_WHOLE)
    prof = build_profile("m", "fifo", ((score, 1.0),), select=FgdSelect(HALF_AND_WHOLE, memo=score.memo))
    snapshot = snapshot_with(("a", [500, 1000]), ("b", [1000, 1000]))
    assert run_cycle(snapshot, [half_job()], prof).placements[0].workers[0].node == "a"
    cordoned = dataclasses.replace(
        snapshot, nodes=(dataclasses.replace(snapshot.nodes[0], cordoned=True), snapshot.nodes[1])
    )
    assert run_cycle(cordoned, [half_job()], prof).placements[0].workers[0].node == "b"


def test_best_gpu_comes_from_the_memo_only_while_it_is_current() -> None:
    nodes = table(("n", [600, 500]))
    memo = GradientMemo(target((500, 1, "", 1.0)))
    request = WorkerRequest(gpus=1, gpu_milli=100)
    lut = nodes.model_lut(ANY)
    usable = all_usable(nodes, request)
    evaluation = Evaluation(usable, usable.any(axis=1), usable.sum(axis=1), nodes.clock)
    growth, gpu = memo.growth(nodes, request, lut, evaluation, np.array([0]))
    assert (growth.tolist(), gpu.tolist()) == ([0.0], [0])
    assert memo.best_gpu(nodes, request, lut, 0, usable[0]) == 0
    nodes.apply(WorkerPlacement("n", (GpuShare(0, 100),)), -1)  # now [500, 500]: any GPU leaves 400
    assert memo.best_gpu(nodes, request, lut, 0, all_usable(nodes, request)[0]) == 0
    nodes.apply(WorkerPlacement("n", (GpuShare(0, 200),)), -1)  # now [300, 500]: GPU 0 is too small to matter
    assert memo.best_gpu(nodes, request, lut, 0, all_usable(nodes, request)[0]) == 0


def test_the_memo_starts_over_for_another_cluster() -> None:
    memo = GradientMemo(HALF_AND_WHOLE)
    request = WorkerRequest(gpus=1, gpu_milli=500)
    for layout in ([("a", [500, 1000])], [("a", [500, 1000]), ("b", [1000])], [("a", [1000, 1000])]):
        nodes = table(*layout)
        usable = all_usable(nodes, request)
        evaluation = Evaluation(usable, usable.any(axis=1), usable.sum(axis=1), nodes.clock)
        rows = np.arange(len(nodes))
        got = memo.growth(nodes, request, nodes.model_lut(ANY), evaluation, rows)
        want = placement_delta(nodes, HALF_AND_WHOLE, request, rows, usable)
        assert got[0].tolist() == want[0].tolist()
        assert got[1].tolist() == want[1].tolist()


def test_the_memo_compares_a_new_table_by_content() -> None:
    workload = target(TaskClass(500, 1, ANY, 1.0, cpu_milli=8_000))
    memo = GradientMemo(workload)
    request = WorkerRequest(cpu_milli=4_000)
    growths = []
    for cpu_used in (0, 4_000):  # same GPUs, so the same usable GPUs; only free CPU differs
        nodes = table(("a", [1000]), cpu=10_000, cpu_used=cpu_used)
        usable = np.zeros_like(nodes.gpu_exists)
        evaluation = Evaluation(usable, np.ones(1, dtype=np.bool_), np.zeros(1, dtype=np.int64), nodes.clock)
        growths.append(memo.growth(nodes, request, nodes.model_lut(ANY), evaluation, np.arange(1))[0].tolist())
    assert growths == [[1000.0], [0.0]]  # 10 -> 6 CPUs breaks the class; from 6 CPUs it was broken already


def test_the_memo_sees_changes_the_last_table_had_after_it_looked() -> None:
    """The memo copies a table's contents only when another table comes: a change the old table had after
    the memo's last look must count, also when the new table has it already."""
    memo = GradientMemo(target(TaskClass(500, 1, ANY, 1.0, cpu_milli=8_000)))
    request = WorkerRequest(cpu_milli=4_000)

    def growth(nodes: NodeTable) -> list[float]:
        usable = np.zeros_like(nodes.gpu_exists)
        evaluation = Evaluation(usable, np.ones(1, dtype=np.bool_), np.zeros(1, dtype=np.int64), nodes.clock)
        got: list[float] = memo.growth(nodes, request, nodes.model_lut(ANY), evaluation, np.arange(1))[0].tolist()
        return got

    first = table(("a", [1000]), cpu=10_000)
    assert growth(first) == [1000.0]  # 10 -> 6 CPUs breaks the class
    first.apply(WorkerPlacement("a", (), 1_000), -1)
    assert growth(first) == [1000.0]  # 9 -> 5 CPUs too, computed again for the changed node
    first.apply(WorkerPlacement("a", (), 3_000), -1)  # 6 CPUs free, after the memo's last look
    assert growth(first.copy()) == [0.0]  # the next cycle's table has it already; the class was broken


# ---- the target workload -------------------------------------------------------------------------------


def test_target_workload_validates_every_class() -> None:
    with pytest.raises(SpecError) as caught:
        target((1500, 1, "", 1.0), (500, 2, "", 1.0), (0, 0, "T4", 1.0), (500, 1, "", 0.0), (500, -1, "", 1.0))
    fields = [p.field for p in caught.value.fields]
    assert fields == [
        "classes[0].gpu_milli",
        "classes[1].gpu_milli",
        "classes[2].models",
        "classes[3].weight",
        "classes[4].gpus",
    ]
    with pytest.raises(SpecError, match="is empty"):
        TargetWorkload(())


def test_target_workload_normalises_popularity_and_parses_models() -> None:
    workload = target((500, 1, "T4|A100", 3.0), (0, 0, frozenset(), 1.0))
    assert workload.classes[0].models == frozenset({"T4", "A100"})
    assert workload.popularity.tolist() == [0.75, 0.25]
    assert TargetWorkload.of(workload) is workload
    assert abs(sum(GENERIC_TARGET.popularity) - 1.0) < 1e-12


def test_from_requests_keeps_the_most_popular_classes_as_upstream() -> None:
    half = WorkerRequest(gpus=1, gpu_milli=500, cpu_milli=4_000, memory=GIB)
    whole = WorkerRequest(gpus=1, cpu_milli=8_000)
    cpu = WorkerRequest(cpu_milli=2_000)
    eight = WorkerRequest(gpus=8, cpu_milli=64_000, models=frozenset({"G2"}))
    requests = [half] * 6 + [whole] * 2 + [cpu] + [eight]
    assert TargetWorkload.from_requests(requests, popularity=0.95).classes == (
        TaskClass(500, 1, ANY, 6.0, cpu_milli=4_000),  # memory is not part of the class, as upstream
        TaskClass(1000, 1, ANY, 2.0, cpu_milli=8_000),
        TaskClass(1000, 8, frozenset({"G2"}), 1.0, cpu_milli=64_000),  # ties: larger key first, as upstream
        TaskClass(0, 0, ANY, 1.0, cpu_milli=2_000),
    )
    assert len(TargetWorkload.from_requests(requests, popularity=0.6).classes) == 1
    assert len(TargetWorkload.from_requests(requests, popularity=0.8).classes) == 2
    with pytest.raises(ValueError, match="no requests"):
        TargetWorkload.from_requests([])


# ---- profiles ------------------------------------------------------------------------------------------


def test_fgd_profile_places_with_the_given_target() -> None:
    snapshot = snapshot_with(("a", [600, 500]), ("b", [0, 0]))
    job = half_job(share=100)
    by_target = profile("fgd", PolicyData(target=target((500, 1, "", 1.0))))
    assert by_target.describe() == (
        "order=fifo, admit=gang+quota, filter=node_health+gpu_model+fits+spot, score=fgd*1+spot_preference*10, "
        "select=fgd, preempt=none"
    )
    worker = run_cycle(snapshot, [job], by_target).placements[0].workers[0]
    assert (worker.node, worker.gpu_indices) == ("a", (0,))
    assert profile("fgd").scores[0][0].target is GENERIC_TARGET  # type: ignore[attr-defined]
