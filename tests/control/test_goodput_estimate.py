"""Goodput estimated from progress reports: the throughput fit, the efficiency from gradient statistics, the
loss-descent factor, and what the resize policy does with them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.control.goodput import (
    PRIOR_NETWORK,
    PRIOR_SYNC,
    ThroughputModel,
    efficiency,
    goodput_by_size,
    still_learning,
    throughput,
    throughput_model,
)
from gpufleet.domain.progress import JobProgress, SizeThroughput
from gpufleet.policies.resize.goodput import GoodputResize
from gpufleet.scheduling.plugin_api import ElasticJob, ResizeInput


def measured(a: float, b: float, sizes: tuple[int, ...]) -> JobProgress:
    """A job that ran at `sizes` with throughput exactly g / (a + b (g - 1)), 100 s at each."""
    return JobProgress(throughput=tuple(SizeThroughput(g, 100.0 * g / (a + b * (g - 1)), 100.0, 10) for g in sizes))


@settings(max_examples=50, deadline=None)
@given(a=st.floats(1e-4, 1.0), share=st.floats(0.0, 0.5))
def test_the_fit_recovers_the_model_from_two_or_more_sizes(a: float, share: float) -> None:
    fitted = throughput_model(measured(a, a * share, (1, 2, 4, 8)))
    assert fitted.compute == pytest.approx(a, rel=1e-6)
    assert fitted.sync_node == pytest.approx(a * share, rel=1e-6, abs=1e-9 * a)


def test_one_size_measured_is_matched_there_and_scaled_by_the_prior_elsewhere() -> None:
    progress = JobProgress(throughput=(SizeThroughput(4, 400.0, 10.0, 5),))
    model = throughput_model(progress)
    assert throughput(model, 4) == pytest.approx(40.0)
    assert model.sync_node == pytest.approx(PRIOR_SYNC * model.compute)
    assert 40.0 < throughput(model, 8) < 80.0  # more, but less than linear


def test_without_reports_the_prior_is_sublinear_and_increasing() -> None:
    model = throughput_model(None)
    rates = [throughput(model, g) for g in (1, 2, 4, 8, 16)]
    assert rates == sorted(rates)
    assert rates[-1] < 16 * rates[0]


def test_noisy_gradients_make_large_batches_efficient_and_clean_ones_do_not() -> None:
    noisy = JobProgress(grad_sqr=1.0, grad_var=1000.0)
    clean = JobProgress(grad_sqr=1.0, grad_var=0.001)
    assert efficiency(noisy, 4.0) > 0.99
    assert efficiency(clean, 4.0) == pytest.approx(0.25, rel=1e-2)
    assert efficiency(None, 4.0) == 1.0
    assert efficiency(clean, 1.0) == pytest.approx(1.0)


def curve(losses: list[float]) -> JobProgress:
    return JobProgress(loss_curve=tuple((float(i * 100), loss) for i, loss in enumerate(losses)))


def test_a_flattened_loss_counts_for_nothing_and_a_falling_one_for_all() -> None:
    assert still_learning(curve([10.0 - i for i in range(16)])) == pytest.approx(1.0)
    assert still_learning(curve([10.0 * math.exp(-i) for i in range(16)])) < 0.01
    assert still_learning(curve([5.0] * 16)) == 1.0  # never fell: it cannot tell
    assert still_learning(curve([3.0, 2.0])) == 1.0  # too short to tell


def test_the_policy_gives_idle_gpus_to_the_job_still_learning() -> None:
    learning = curve([10.0 - 0.5 * i for i in range(16)])
    flattened = curve([10.0 * math.exp(-i) for i in range(16)])
    jobs = tuple(
        ElasticJob(name, "a", 2, 1, 8, 1, goodput_by_size(progress, 2, range(1, 9)))
        for name, progress in (("learning", learning), ("flattened", flattened))
    )
    new = GoodputResize().resize(ResizeInput(0.0, 4, jobs, {}))
    assert new == {"learning": 6}
    # And to admit a waiting job, the flattened one gives back first.
    new = GoodputResize().resize(ResizeInput(0.0, 0, jobs, {}, waiting=(("b", 1),)))
    assert new == {"flattened": 1}


def placed(model: ThroughputModel, sizes: tuple[int, ...]) -> JobProgress:
    """A job that ran at `sizes` with exactly `model`'s throughput, 100 s at each."""
    return JobProgress(throughput=tuple(SizeThroughput(g, 100.0 * throughput(model, g), 100.0, 10) for g in sizes))


@settings(max_examples=50, deadline=None)
@given(
    a=st.floats(1e-4, 1.0),
    node=st.floats(0.0, 0.5),
    network=st.floats(0.0, 8.0),
    network_per_gpu=st.floats(0.0, 0.5),
)
def test_the_fit_recovers_the_node_and_network_terms(
    a: float, node: float, network: float, network_per_gpu: float
) -> None:
    truth = ThroughputModel(a, a * node, a * network, a * network_per_gpu, gpus_per_node=4)
    fitted = throughput_model(placed(truth, (1, 2, 4, 8, 16)), gpus_per_node=4)
    assert fitted.compute == pytest.approx(truth.compute, rel=1e-6)
    assert fitted.sync_node == pytest.approx(truth.sync_node, rel=1e-6, abs=1e-9 * a)
    assert fitted.network == pytest.approx(truth.network, rel=1e-6, abs=1e-7 * a)
    assert fitted.sync_network == pytest.approx(truth.sync_network, rel=1e-6, abs=1e-7 * a)


def test_one_node_and_one_size_across_nodes_fit_the_fixed_network_cost() -> None:
    truth = ThroughputModel(1.0, 0.1, 3.0, 0.1, gpus_per_node=4)
    fitted = throughput_model(placed(truth, (1, 4, 8)), gpus_per_node=4)
    for g in (1, 4, 8):
        assert throughput(fitted, g) == pytest.approx(throughput(truth, g), rel=1e-9)
    # The network cost is measured, not the prior: 8 GPUs over two nodes are slower than 4 on one.
    assert fitted.network == pytest.approx(3.0)
    assert throughput(fitted, 8) < throughput(fitted, 4)


def test_sizes_across_nodes_are_not_fitted_as_one_node() -> None:
    """The old one-node model smooths a jump at the node boundary away; the placement-aware one keeps it."""
    # One size across nodes: its per-GPU network term is the prior's (the node's), as here.
    truth = ThroughputModel(1.0, 0.05, 4.0, 0.05, gpus_per_node=4)
    reports = placed(truth, (1, 2, 4, 8))
    aware = throughput_model(reports, gpus_per_node=4)
    blind = throughput_model(reports)
    assert throughput(aware, 4) == pytest.approx(throughput(truth, 4), rel=1e-9)
    assert throughput(aware, 6) == pytest.approx(throughput(truth, 6), rel=1e-9)
    assert abs(throughput(blind, 4) / throughput(truth, 4) - 1) > 0.1


def test_before_running_across_nodes_the_prior_charges_the_network() -> None:
    progress = JobProgress(throughput=(SizeThroughput(2, 200.0, 10.0, 5), SizeThroughput(4, 380.0, 10.0, 5)))
    model = throughput_model(progress, gpus_per_node=4)
    assert model.network == pytest.approx(PRIOR_NETWORK * model.compute)
    assert model.sync_network == pytest.approx(model.sync_node)
    # Unknown node size: every size is one node, as before.
    assert throughput_model(progress).spans_nodes(64) is False


def test_a_job_only_seen_across_nodes_matches_what_it_measured() -> None:
    progress = JobProgress(throughput=(SizeThroughput(8, 400.0, 10.0, 5),))
    model = throughput_model(progress, gpus_per_node=4)
    assert throughput(model, 8) == pytest.approx(40.0)
    assert model.network == pytest.approx(PRIOR_NETWORK * model.compute)
    assert throughput(model, 4) > throughput(model, 8) / 2  # on one node it loses no network time


def test_the_policy_keeps_a_comm_heavy_job_inside_one_node() -> None:
    """Four idle GPUs and a job on 4 of a node's 4: with the network cost it measured, it stays; a job that
    scales across nodes gets them."""
    heavy = ThroughputModel(1.0, 0.05, 4.0, 0.05, gpus_per_node=4)
    light = ThroughputModel(1.0, 0.05, 0.1, 0.05, gpus_per_node=4)
    jobs = tuple(
        ElasticJob(name, "a", 4, 1, 8, 1, goodput_by_size(placed(model, (1, 2, 4, 8)), 4, range(1, 9), 4))
        for name, model in (("heavy", heavy), ("light", light))
    )
    new = GoodputResize().resize(ResizeInput(0.0, 4, jobs[:1], {}))
    assert new == {}
    new = GoodputResize().resize(ResizeInput(0.0, 4, jobs, {}))
    assert new == {"light": 8}
    # Without the node size the same reports read as one node: the heavy job would grow across nodes.
    blind = ElasticJob("heavy", "a", 4, 1, 8, 1, goodput_by_size(placed(heavy, (1, 2, 4, 8)), 4, range(1, 9)))
    assert GoodputResize().resize(ResizeInput(0.0, 4, (blind,), {})).get("heavy", 4) > 4
