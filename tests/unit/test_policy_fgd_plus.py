"""Model scarcity (`model_scarcity` score) and the `fgd-plus` profile: FGD that keeps scarce GPU models for the
jobs bound to them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain import ClusterSnapshot, Gpu, Job, Node, WorkerRequest, make_node
from gpufleet.policies.catalog import PROFILES, SCORE, PolicyData, build_profile, profile
from gpufleet.policies.score.model_scarcity import ModelScarcity, model_pressure, node_scores
from gpufleet.scheduling.cycle import run_cycle
from gpufleet.scheduling.fragmentation import GENERIC_TARGET, TargetWorkload, TaskClass
from gpufleet.scheduling.placer import evaluate
from gpufleet.scheduling.plugin_api import GangContext, JobView
from gpufleet.scheduling.state import CycleState
from gpufleet.scheduling.table import FloatArray, NodeTable

GIB = 1024**3
ANY: frozenset[str] = frozenset()

# One scarce model (T4, 4 GPUs) that half the demand is bound to, and a plentiful one (G2, 16 GPUs).
FLEET = (
    make_node("a-t4", "T4", 2, 16 * GIB),
    make_node("b-t4", "T4", 2, 16 * GIB),
    make_node("c-g2", "G2", 8, 32 * GIB),
    make_node("d-g2", "G2", 8, 32 * GIB),
)
T4_BOUND = TargetWorkload.of(((1000, 1, "", 1.0), (1000, 1, "T4", 1.0), (0, 0, "", 1.0)))


def job(job_id: str, gpus: int = 1, milli: int = 1000, models: frozenset[str] = ANY) -> Job:
    return Job(id=job_id, queue="q", request=WorkerRequest(gpus=gpus, gpu_milli=milli, models=models))


def scores_of(plugin: ModelScarcity, snapshot: ClusterSnapshot, j: Job) -> dict[str, float]:
    state = CycleState(snapshot)
    view = JobView(j, state.table.model_lut(j.request.models))
    evaluation = evaluate(build_profile("t", "fifo", ((plugin, 1.0),)), view, state)
    candidates = np.flatnonzero(evaluation.passed)
    scores = plugin.score(view, state.view, evaluation, candidates, GangContext())
    return {state.table.names[int(c)]: float(s) for c, s in zip(candidates, scores, strict=True)}


def pressure_by_model(table: NodeTable, target: TargetWorkload) -> dict[str, float]:
    pressure = model_pressure(table, target)
    return {m: float(pressure[i]) for i, m in enumerate(table.models)}


def test_pressure_is_bound_demand_over_the_capacity_it_may_use_relative_to_the_fleet() -> None:
    table = NodeTable(FLEET)
    # demand: 1000 (any) + 1000 (T4-bound) over 20 GPUs; T4: 1000 / 4 GPUs, times 20 GPUs / 2000 demand = 2.5
    assert pressure_by_model(table, T4_BOUND) == {"G2": 0.0, "T4": pytest.approx(2.5)}
    scores = node_scores(table, model_pressure(table, T4_BOUND))
    assert scores.tolist() == pytest.approx([100 / 3.5, 100 / 3.5, 100.0, 100.0])


def test_a_class_allowed_on_several_models_spreads_its_demand_by_capacity() -> None:
    table = NodeTable(FLEET)
    either = TargetWorkload.of(((1000, 1, "T4|G2", 1.0),))
    # spread over all 20 GPUs: every model gets the fleet's average, 1
    assert pressure_by_model(table, either) == {"G2": pytest.approx(1.0), "T4": pytest.approx(1.0)}
    mixed = TargetWorkload.of(((1000, 1, "T4|G2", 1.0), (1000, 1, "T4", 1.0)))
    pressure = pressure_by_model(table, mixed)
    assert pressure["T4"] == pytest.approx(0.5 + 2.5)  # (1000/20 + 1000/4) * 20 / 2000
    assert pressure["G2"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "target",
    [
        GENERIC_TARGET,  # no class is bound to a model
        TargetWorkload.of(((0, 0, "", 5.0), (500, 1, "", 1.0))),  # CPU-only and free classes only
        TargetWorkload.of(((1000, 1, "", 1.0), (500, 1, "H100", 3.0))),  # a model the fleet does not have
    ],
)
def test_no_gpu_demand_bound_to_a_model_of_the_fleet_means_no_pressure(target: TargetWorkload) -> None:
    table = NodeTable(FLEET)
    assert not model_pressure(table, target).any()
    assert node_scores(table, model_pressure(table, target)).tolist() == [100.0] * 4


def test_a_node_of_several_models_scores_by_the_mean_of_its_gpus_and_a_cpu_node_scores_100() -> None:
    mixed = Node(
        "m", (Gpu(0, "u0", "T4", GIB), Gpu(1, "u1", "G2", GIB), Gpu(2, "u2", "G2", GIB)), cpu_milli=8000, memory=GIB
    )
    table = NodeTable((*FLEET, mixed, Node("cpu", (), cpu_milli=8000, memory=GIB)))
    target = TargetWorkload.of(((1000, 1, "", 1.0), (1000, 1, "T4", 1.0)))
    # T4 capacity now 5 of 23 GPUs: pressure 1000/5 * 23/2000 = 2.3
    by_name = dict(zip(table.names, node_scores(table, model_pressure(table, target)).tolist(), strict=True))
    assert by_name["m"] == pytest.approx(100 / (1 + 2.3 / 3))
    assert by_name["cpu"] == 100.0
    assert by_name["a-t4"] == pytest.approx(100 / 3.3)


def test_a_job_free_to_run_anywhere_is_steered_to_the_model_nobody_is_bound_to() -> None:
    scores = scores_of(ModelScarcity(T4_BOUND), ClusterSnapshot(FLEET), job("free"))
    assert scores["c-g2"] == scores["d-g2"] == 100.0
    assert scores["a-t4"] == scores["b-t4"] < 50.0


def test_a_bound_job_sees_equal_scores_and_a_cpu_only_job_is_not_steered() -> None:
    plugin = ModelScarcity(T4_BOUND)
    bound = scores_of(plugin, ClusterSnapshot(FLEET), job("bound", models=frozenset({"T4"})))
    assert set(bound) == {"a-t4", "b-t4"}
    assert len(set(bound.values())) == 1
    cpu_only = scores_of(plugin, ClusterSnapshot(FLEET), job("cpu", gpus=0))
    assert cpu_only == dict.fromkeys(("a-t4", "b-t4", "c-g2", "d-g2"), 100.0)


def test_scores_are_computed_once_per_layout_and_again_for_a_new_fleet() -> None:
    plugin = ModelScarcity(T4_BOUND)
    state = CycleState(ClusterSnapshot(FLEET))
    first = plugin.scores_for(state.table)
    assert plugin.scores_for(state.table.copy()) is first  # copies share the capacity arrays
    bigger = CycleState(ClusterSnapshot((*FLEET, make_node("e-t4", "T4", 4, 16 * GIB))))
    again = plugin.scores_for(bigger.table)
    assert again is not first
    assert len(again) == 5
    assert again[0] > first[0]  # more T4 capacity: less pressure on it


def test_fgd_plus_keeps_the_scarce_model_for_the_jobs_bound_to_it() -> None:
    """Four one-GPU jobs free to go anywhere, then four bound to T4. With some 8-GPU jobs in the target, FGD
    keeps the 8-GPU G2 nodes whole and fills the small T4 nodes, so the bound jobs find no room; fgd-plus sends
    the free jobs to G2 and places all eight."""
    pending = [job(f"free-{k}") for k in range(4)] + [job(f"t4-{k}", models=frozenset({"T4"})) for k in range(4)]
    data = PolicyData(target=TargetWorkload.of(((1000, 1, "", 1.0), (1000, 1, "T4", 1.0), (1000, 8, "", 0.25))))
    fgd = run_cycle(ClusterSnapshot(FLEET), pending, profile("fgd", data))
    plus = run_cycle(ClusterSnapshot(FLEET), pending, profile("fgd-plus", data))
    assert len(fgd.placements) < 8
    assert len(plus.placements) == 8
    nodes = {p.job: p.workers[0].node for p in plus.placements}
    assert all(nodes[f"free-{k}"].endswith("g2") for k in range(4))
    assert all(nodes[f"t4-{k}"].endswith("t4") for k in range(4))


def test_fgd_plus_without_bound_classes_places_as_fgd() -> None:
    """No job bound to a model: scarcity is the same everywhere, so fgd-plus decides exactly as the published
    FGD (and so never allocates less than it on such pod lists)."""
    fleet = tuple(make_node(f"n{k}", "T4", 2 + 2 * (k % 3), 16 * GIB, cpu_milli=8000 * (1 + k % 4)) for k in range(9))
    pending = [job(f"j{k}", milli=(230, 470, 650, 810, 1000)[k % 5]) for k in range(30)]
    pending += [Job(id=f"c{k}", queue="q", request=WorkerRequest(gpus=0, cpu_milli=3000)) for k in range(5)]
    first = run_cycle(ClusterSnapshot(fleet), pending, profile("fgd-plus"))
    assert first.to_json() == run_cycle(ClusterSnapshot(fleet), pending, profile("fgd")).to_json()
    assert first.to_json() == run_cycle(ClusterSnapshot(fleet), pending, profile("fgd-plus")).to_json()
    assert first.to_json() != run_cycle(ClusterSnapshot(fleet), pending, profile("fgd-bf")).to_json()


def test_registered_by_name_and_as_a_profile() -> None:
    assert "fgd-plus" in PROFILES
    plugin = SCORE.create("model_scarcity")
    assert isinstance(plugin, ModelScarcity)
    assert plugin.target is GENERIC_TARGET
    prof = profile("fgd-plus", PolicyData(target=T4_BOUND))
    assert [(type(s).__name__, w) for s, w in prof.scores] == [
        ("FgdScore", 1.0),
        ("ModelScarcity", 0.3),
        ("SpotPreference", 10.0),
    ]
    assert prof.scores[0][0].truncate  # type: ignore[attr-defined]  # the published FGD's whole points
    assert prof.scores[1][0].target is T4_BOUND  # type: ignore[attr-defined]


MODELS = ("A", "B", "C")
classes = st.lists(
    st.builds(
        lambda gpus, milli, models, weight: TaskClass(
            milli if gpus == 1 else 1000, gpus, models if gpus else frozenset(), weight
        ),
        st.sampled_from((0, 1, 2, 8)),
        st.sampled_from((250, 500, 1000)),
        st.frozensets(st.sampled_from((*MODELS, "Z")), max_size=3),
        st.integers(1, 50).map(float),
    ),
    min_size=1,
    max_size=8,
)
fleets = st.lists(st.tuples(st.sampled_from(MODELS), st.sampled_from((1, 2, 4, 8))), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(classes, fleets, st.randoms(use_true_random=False))
def test_pressure_properties(target_classes: list[TaskClass], shape: list[tuple[str, int]], rnd: object) -> None:
    """Pressure is non-negative and does not depend on the order of the classes; scores lie in (0, 100]; nodes
    of one model score alike; a model no GPU class is bound to (or every model, when none is) has no pressure;
    the capacity-weighted mean pressure is at most 1 (the bound share of the demand)."""
    table = NodeTable(tuple(make_node(f"n{k}", m, g, GIB) for k, (m, g) in enumerate(shape)))
    target = TargetWorkload(tuple(target_classes))
    pressure = model_pressure(table, target)
    shuffled = list(target_classes)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert np.allclose(pressure, model_pressure(table, TargetWorkload(tuple(shuffled))))
    assert (pressure >= 0).all()
    bound = {m for c in target.classes if c.gpus and c.models for m in c.models}
    for i, m in enumerate(table.models):
        if m not in bound:
            assert pressure[i] == 0.0
    capacity = np.bincount(table.gpu_model[table.gpu_exists], minlength=len(table.models) + 1)
    assert float(capacity @ pressure) / float(capacity.sum()) <= 1.0 + 1e-9
    scores: FloatArray = node_scores(table, pressure)
    assert ((scores > 0) & (scores <= 100)).all()
    by_model: dict[str, set[float]] = {}
    for k, (m, _) in enumerate(shape):
        by_model.setdefault(m, set()).add(float(scores[table.index[f"n{k}"]]))
    assert all(len(v) == 1 for v in by_model.values())
