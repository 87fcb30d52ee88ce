"""The batch-aware goodput model: reports that count steps and say their placement and batch, the step-time
fit per placement and batch, the batch chosen for each size, and the resize policy shedding GPUs a job is
better off without."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.control.goodput import (
    StepModel,
    best_batch,
    goodput_by_size,
    nodes_for,
    noise_scale,
    step_model,
)
from gpufleet.domain.errors import SpecError
from gpufleet.domain.progress import (
    MAX_THROUGHPUT_ENTRIES,
    JobProgress,
    Report,
    ReportContext,
    SizeThroughput,
    fold,
    parse_report,
)
from gpufleet.policies.resize.goodput import GoodputResize
from gpufleet.scheduling.plugin_api import ElasticJob, ResizeInput

PLACEMENTS = ((1, 1), (2, 1), (3, 1), (4, 1), (8, 2), (12, 3), (16, 4))
BATCHES = (32.0, 128.0, 512.0)


def measured(model: StepModel, seconds: float = 1e7, **how: float) -> JobProgress:
    """A job that ran `seconds` at every placement of PLACEMENTS and total batch of BATCHES, at exactly the
    step time `model` gives."""
    entries = []
    for gpus, nodes in PLACEMENTS:
        for batch in BATCHES:
            steps = seconds / float(model.step_s(gpus, nodes, batch))
            entries.append(SizeThroughput(gpus, steps * batch, seconds, 10, nodes=nodes, steps=steps, batch=batch))
    return JobProgress(throughput=tuple(entries), batch=how.pop("batch", 128.0), nodes=1, **how)  # type: ignore[arg-type]


positive = st.floats(1e-3, 1.0)


@settings(max_examples=40, deadline=None)
@given(
    fixed=positive,
    per_sample=st.floats(1e-5, 1e-2),
    node=positive,
    node_per_gpu=st.floats(0.0, 0.1),
    network=positive,
    network_per_gpu=st.floats(0.0, 0.1),
)
def test_the_fit_recovers_known_step_times_per_placement_and_batch(
    fixed: float, per_sample: float, node: float, node_per_gpu: float, network: float, network_per_gpu: float
) -> None:
    truth = StepModel(fixed, per_sample, node, node_per_gpu, network, network_per_gpu)
    fitted = step_model(measured(truth, seconds=1e10))  # the prior (minutes of weight) negligible
    assert fitted is not None
    for gpus, nodes in PLACEMENTS:
        for batch in (16.0, 100.0, 1000.0):
            assert fitted.step_s(gpus, nodes, batch) == pytest.approx(truth.step_s(gpus, nodes, batch), rel=1e-3)


def test_before_a_size_is_measured_the_prior_fills_in_and_without_steps_there_is_no_model() -> None:
    one = SizeThroughput(1, 1000.0, 10.0, 3, nodes=1, steps=100.0, batch=10.0)
    fitted = step_model(JobProgress(throughput=(one,), batch=10.0))
    assert fitted is not None
    assert float(fitted.step_s(1, 1, 10.0)) == pytest.approx(0.1, rel=0.05)
    # Two GPUs on one node: faster than one, slower than twice; across nodes: slower than on one.
    assert 0.05 < float(fitted.step_s(2, 1, 20.0)) < 0.1 * 2
    assert fitted.step_s(8, 2, 80.0) > fitted.step_s(8, 1, 80.0)
    assert step_model(JobProgress(throughput=(SizeThroughput(1, 1000.0, 10.0, 3),))) is None


@settings(max_examples=50, deadline=None)
@given(noise=st.one_of(st.none(), st.floats(0.0, 1e5)), gpus=st.integers(1, 16))
def test_the_chosen_batch_makes_the_most_goodput_of_the_candidates(noise: float | None, gpus: int) -> None:
    model = StepModel(0.05, 1e-3, 0.02, 0.0, 0.1, 0.0)
    candidates = np.geomspace(32, 4096, 24)
    batch, goodput = best_batch(model, gpus, nodes_for(gpus, 4, 4), candidates, noise)
    worth = candidates / model.step_s(gpus, nodes_for(gpus, 4, 4), candidates)
    if noise is not None:
        worth = worth / (noise + candidates)
    assert goodput == pytest.approx(worth.max())
    assert batch in candidates


def test_noisy_gradients_choose_large_batches_and_clean_ones_small() -> None:
    model = StepModel(0.05, 1e-3, 0.0, 0.0, 0.0, 0.0)
    candidates = np.geomspace(32, 4096, 24)
    assert best_batch(model, 1, 1, candidates, 1e6)[0] == pytest.approx(4096)
    assert best_batch(model, 1, 1, candidates, 0.0)[0] == pytest.approx(32)


def test_choosing_the_batch_per_size_shows_what_more_gpus_are_worth() -> None:
    # Most of a step is per-sample compute: two GPUs take the same batch in about half the time.
    truth = StepModel(0.01, 1e-3, 0.005, 0.0, 0.05, 0.0)
    how = {"grad_sqr": 1.0, "grad_var": 2.0, "batch": 128.0}
    adaptive = goodput_by_size(measured(truth, min_batch=32.0, max_batch=2048.0, **how), 1, (1, 2), 4, 4)
    fixed = goodput_by_size(measured(truth, **how), 1, (1, 2), 4, 4)
    assert adaptive[2] / adaptive[1] > 1.55
    assert adaptive[2] / adaptive[1] > fixed[2] / fixed[1]


def test_a_size_that_spans_nodes_pays_the_network_it_would_cross() -> None:
    slow_network = StepModel(0.01, 1e-3, 0.005, 0.0, 2.0, 0.0)
    goodput = goodput_by_size(measured(slow_network, batch=128.0), 4, (4, 5, 8), 4, 4)
    assert goodput[5] < goodput[4]
    assert goodput[8] < goodput[4]
    # The same job able to grow on its own node gains.
    assert goodput_by_size(measured(slow_network, batch=128.0), 4, (4, 8), 8, 8)[8] > goodput[4]


def test_the_noise_scale_is_in_samples_at_the_reported_batch() -> None:
    assert noise_scale(JobProgress(grad_sqr=2.0, grad_var=1.0, batch=64.0)) == pytest.approx(32.0)
    assert noise_scale(JobProgress(grad_sqr=2.0, grad_var=1.0)) is None


def report(at: float, step: int, samples: float, **how: float) -> Report:
    return Report("progress", at, {"step": float(step), "samples": samples, **how})


def test_reports_that_count_steps_at_a_placement_give_the_mean_step_time_and_batch() -> None:
    ctx = ReportContext(attempt=1, gpus=4, now=0.0)
    progress = fold(JobProgress(), [report(100.0, 0, 0.0, nodes=1), report(110.0, 40, 2560.0, nodes=1)], ctx)
    [entry] = progress.throughput
    assert (entry.nodes, entry.steps, entry.batch) == (1, 40.0, 64.0)
    assert entry.step_s == pytest.approx(0.25)
    assert entry.mean_batch == pytest.approx(64.0)
    # Without `nodes` (or without steps), it is counted as before: samples over seconds at the size.
    plain = fold(JobProgress(), [report(100.0, 0, 0.0), report(110.0, 40, 2560.0)], ctx)
    assert [(e.nodes, e.steps, e.batch, e.samples_per_s) for e in plain.throughput] == [(0, 0.0, 0.0, 256.0)]


@settings(max_examples=30, deadline=None)
@given(batches=st.lists(st.floats(1.0, 1e6), min_size=2, max_size=400))
def test_the_throughput_table_stays_bounded_whatever_batches_a_job_reports(batches: list[float]) -> None:
    progress, samples = JobProgress(), 0.0
    for i, batch in enumerate(batches):
        samples += 10 * batch
        progress = fold(progress, [report(100.0 + i, 10 * i, samples, nodes=1 + i % 3)], ReportContext(1, 4, 0.0))
    assert len(progress.throughput) <= MAX_THROUGHPUT_ENTRIES
    assert all(e.steps > 0 and e.nodes > 0 for e in progress.throughput)


@pytest.mark.parametrize(
    ("fields", "bad"),
    [
        ({"batch": 0.5}, "batch"),
        ({"nodes": 0}, "nodes"),
        ({"gpus": 2.5}, "gpus"),
        ({"gpus": 2, "nodes": 3}, "nodes"),
        ({"min_batch": 64, "max_batch": 32}, "min_batch"),
        ({"batch": 16, "min_batch": 32}, "batch"),
        ({"batch": 128, "max_batch": 64}, "batch"),
        ({"max_local_batch": 0}, "max_local_batch"),
    ],
)
def test_bad_batch_or_placement_values_are_refused_with_a_fix(fields: dict[str, float], bad: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_report({"kind": "progress", "samples": 1.0, **fields}, "r", 1000.0)
    [problem] = raised.value.fields
    assert problem.field == f"r.{bad}"
    assert problem.fix


def test_good_batch_and_placement_values_are_kept() -> None:
    fields = {"batch": 64, "min_batch": 32, "max_batch": 512, "max_local_batch": 128, "gpus": 4, "nodes": 2}
    parsed = parse_report({"kind": "progress", "samples": 1.0, **fields}, "r", 1000.0)
    assert parsed.values == {"samples": 1.0, **{k: float(v) for k, v in fields.items()}}
    assert not parsed.metrics


def elastic(goodput: dict[int, float], gpus: int, min_gpus: int = 1) -> ElasticJob:
    return ElasticJob("j", "a", gpus, min_gpus, 8, 1, goodput)


def test_a_job_better_off_smaller_sheds_to_its_best_size_but_never_below_min() -> None:
    worse_when_bigger = {1: 1.0, 2: 1.6, 3: 1.4, 4: 1.2, 5: 0.8, 6: 0.7, 7: 0.6, 8: 0.5}
    shed = GoodputResize(shed=True)
    assert shed.resize(ResizeInput(0.0, 0, (elastic(worse_when_bigger, 6),), {})) == {"j": 2}
    assert shed.resize(ResizeInput(0.0, 0, (elastic(worse_when_bigger, 6, min_gpus=3),), {})) == {"j": 3}
    assert GoodputResize(shed=False).resize(ResizeInput(0.0, 0, (elastic(worse_when_bigger, 6),), {})) == {}
    # A gain too small to pay the restart within the horizon: kept.
    almost_flat = {g: 1.0 + 0.001 * (g == 2) for g in range(1, 9)}
    assert shed.resize(ResizeInput(0.0, 0, (elastic(almost_flat, 3),), {})) == {}


def test_what_a_placed_job_reported_survives_the_store_round_trip() -> None:
    from gpufleet.domain.progress import progress_from_dict, progress_to_dict

    how = {"batch": 64.0, "min_batch": 32.0, "max_batch": 512.0, "max_local_batch": 128.0, "nodes": 1.0}
    progress = fold(
        JobProgress(), [report(100.0, 0, 0.0, **how), report(110.0, 40, 2560.0, **how)], ReportContext(1, 4, 0.0)
    )
    assert progress_from_dict(progress_to_dict(progress)) == progress
    # A history stored before entries had placements reads as unplaced.
    old = {"throughput": [{"gpus": 2, "model": "", "samples": 10.0, "seconds": 1.0, "reports": 1}]}
    assert progress_from_dict(old).throughput == (SizeThroughput(2, 10.0, 1.0, 1),)
