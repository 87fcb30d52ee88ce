from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.adapters.probes import Sampler, SampleRing, mean_util, util_by_job, util_by_queue
from gpufleet.ports.gpu_probe import GpuOwner, GpuSample


def _s(node: str, index: int, at: float, util: float | None) -> GpuSample:
    return GpuSample(node=node, index=index, uuid=f"GPU-{node}-{index}", model="A100-80GB", at=at, gpu_util=util)


readings = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 3), st.one_of(st.none(), st.floats(0, 100))),
    max_size=200,
)


@given(length=st.integers(1, 20), stream=readings)
def test_ring_keeps_the_last_n_samples_of_each_gpu(length: int, stream: list) -> None:
    ring = SampleRing(length)
    for t, (node, index, util) in enumerate(stream):
        ring.add([_s(node, index, float(t), util)])
    for key in ring.gpus():
        expected = [float(t) for t, (n, i, _) in enumerate(stream) if (n, i) == key][-length:]
        assert [s.at for s in ring.history(key)] == expected
    assert [s.key for s in ring.latest()] == sorted({(n, i) for n, i, _ in stream})


@given(stream=readings)
def test_mean_util_lies_between_the_gpus_min_and_max_and_skips_unknown(stream: list) -> None:
    ring = SampleRing(1000)
    for t, (node, index, util) in enumerate(stream):
        ring.add([_s(node, index, float(t), util)])
    means = mean_util(ring)
    for key in ring.gpus():
        known = [s.gpu_util for s in ring.history(key) if s.gpu_util is not None]
        if not known:
            assert key not in means  # unknown is not idle
        else:
            assert min(known) - 1e-9 <= means[key] <= max(known) + 1e-9


def test_mean_util_over_a_window() -> None:
    ring = SampleRing()
    ring.add(_s("a", 0, t, u) for t, u in [(0, 90.0), (5, 90.0), (10, 0.0), (15, 2.0), (20, None)])
    assert mean_util(ring, since=10) == {("a", 0): 1.0}
    assert mean_util(ring, since=0, until=5) == {("a", 0): 90.0}
    assert mean_util(ring, since=100) == {}


def test_rollups_per_job_and_queue() -> None:
    util = {("a", 0): 100.0, ("a", 1): 50.0, ("b", 0): 0.0, ("b", 1): 20.0}
    owners = {
        ("a", 0): GpuOwner("j1", "research"),
        ("a", 1): GpuOwner("j1", "research"),
        ("b", 0): GpuOwner("j2", "research"),
        ("b", 2): GpuOwner("j3", "prod"),  # no reading: left out rather than counted as idle
    }
    jobs = util_by_job(util, owners)
    assert set(jobs) == {"j1", "j2"}
    assert (jobs["j1"].gpus, jobs["j1"].used_gpus, jobs["j1"].mean_util) == (2, 1.5, 75.0)
    assert (jobs["j2"].gpus, jobs["j2"].used_gpus, jobs["j2"].mean_util) == (1, 0.0, 0.0)
    queues = util_by_queue(util, owners)
    assert set(queues) == {"research"}
    assert queues["research"].gpus == 3
    assert queues["research"].used_gpus == pytest.approx(1.5)
    assert queues["research"].mean_util == pytest.approx(50.0)


def test_ring_refuses_a_zero_length() -> None:
    with pytest.raises(ValueError, match="give 1 or more"):
        SampleRing(0)


class _Flaky:
    kind = "emulated"

    def __init__(self) -> None:
        self.calls = 0

    def sample(self, now: float) -> list[GpuSample]:
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("GPU fell off the bus")
        return [_s("a", 0, now, 10.0)]


def test_sampler_outlives_a_failing_probe() -> None:
    sampler = Sampler(_Flaky(), SampleRing(10), interval_s=5.0)
    assert len(sampler.tick(0.0)) == 1
    assert sampler.tick(5.0) == ()
    assert len(sampler.tick(10.0)) == 1
    assert sampler.errors == 1
    assert [s.at for s in sampler.ring.history(("a", 0))] == [0.0, 10.0]
    assert sampler.latest_samples()[0].at == 10.0


def test_sampler_thread_samples_at_its_interval() -> None:
    probe = _Flaky()
    probe.calls = 2  # never fail
    sampler = Sampler(probe, interval_s=0.01)
    sampler.start()
    try:
        import time

        deadline = time.monotonic() + 5
        while probe.calls < 7 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        sampler.stop()
    assert probe.calls >= 7
    assert len(sampler.ring.history(("a", 0))) >= 5
