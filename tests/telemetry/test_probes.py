from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.adapters.probes import EmulatedProbe, RecordedProbe, load_recording
from gpufleet.domain.cluster import make_node
from gpufleet.domain.errors import WorkloadError
from gpufleet.ports.gpu_probe import ActivityLevel, GpuActivity
from tests.telemetry.fixture_machine import FIXTURE

GiB = 1024**3


def _nodes():
    return [make_node("n1", "A100-80GB", 4, 80 * GiB), make_node("n2", "T4", 2, 16 * GiB)]


def _activity():
    return {
        ("n1", 0): GpuActivity("busy-job", ActivityLevel.BUSY, pids=(10, 11)),
        ("n1", 1): GpuActivity("idle-job", ActivityLevel.IDLE, memory=30 * GiB),
        ("n1", 2): GpuActivity("light-job", ActivityLevel.LIGHT),
        ("n2", 0): GpuActivity("half-job", ActivityLevel.BUSY, milli=500),
    }


def test_emulated_values_follow_what_jobs_declare() -> None:
    probe = EmulatedProbe(_nodes(), _activity, seed=7)
    by_key: dict[tuple[str, int], list] = {}
    for step in range(50):
        for s in probe.sample(float(step)):
            by_key.setdefault(s.key, []).append(s)
    busy, idle, light, free = by_key[("n1", 0)], by_key[("n1", 1)], by_key[("n1", 2)], by_key[("n1", 3)]
    half = by_key[("n2", 0)]
    assert all(85 <= s.gpu_util <= 99 for s in busy)
    assert all(0 <= s.gpu_util <= 2 for s in idle)
    assert all(20 <= s.gpu_util <= 50 for s in light)
    assert all(s.gpu_util == 0 and s.memory_used == 0 for s in free)
    assert all(42.5 <= s.gpu_util <= 49.5 for s in half)  # a half share of a busy GPU
    # Memory: what the job declared, else about its share of the GPU; free + used = total.
    assert all(abs(s.memory_used - 30 * GiB) <= 0.011 * 30 * GiB for s in idle)
    assert all(0.88 * 80 * GiB <= s.memory_used <= 80 * GiB for s in busy)
    assert all(0.88 * 8 * GiB <= s.memory_used <= 0.92 * 8 * GiB for s in half)
    for samples in by_key.values():
        assert all(s.memory_used + s.memory_free == s.memory_total for s in samples)
        assert all(s.probe == "emulated" and s.model_name.startswith("emulated") for s in samples)
    # Busy boards draw more power and run hotter than idle ones.
    assert min(s.power_w for s in busy) > max(s.power_w for s in idle)
    assert min(s.temperature_c for s in busy) > max(s.temperature_c for s in free)
    assert all(s.power_w <= s.power_limit_w for samples in by_key.values() for s in samples)
    # Processes: the declared pids share the memory.
    assert busy[0].processes == ((10, busy[0].memory_used // 2), (11, busy[0].memory_used // 2))


def test_emulated_probe_is_deterministic_for_a_seed() -> None:
    a = EmulatedProbe(_nodes(), _activity, seed=3)
    b = EmulatedProbe(_nodes(), _activity, seed=3)
    c = EmulatedProbe(_nodes(), _activity, seed=4)
    runs_a = [a.sample(float(t)) for t in range(5)]
    assert runs_a == [b.sample(float(t)) for t in range(5)]
    assert runs_a != [c.sample(float(t)) for t in range(5)]


def test_emulated_probe_sees_activity_change_between_samples() -> None:
    current = {("n1", 0): GpuActivity("j", ActivityLevel.BUSY)}
    probe = EmulatedProbe(_nodes(), lambda: current, seed=0)
    assert probe.sample(0.0)[0].gpu_util >= 85
    current[("n1", 0)] = GpuActivity("j", ActivityLevel.IDLE)
    assert probe.sample(5.0)[0].gpu_util <= 2


def test_the_committed_fixture_is_labelled_emulated() -> None:
    data = json.loads(FIXTURE.read_text())
    assert data["emulated"] is True
    assert "EMULATED" in data["source"]
    assert "not from a real GPU" in data["source"]
    recording = load_recording(FIXTURE)
    assert len(recording.frames) == 6
    assert all(len(f) == 8 for f in recording.frames)


def test_recorded_probe_loops_and_shifts_times() -> None:
    probe = RecordedProbe(FIXTURE)
    frames = load_recording(FIXTURE).frames
    interval = 0.1
    got = [probe.sample(1000.0 + step * interval + 0.01) for step in range(8)]
    for step, samples in enumerate(got):
        assert all(s.at == pytest.approx(1000.0 + step * interval + 0.01) for s in samples)
        assert all(s.probe == "recorded" for s in samples)
        assert [s.gpu_util for s in samples] == [s.gpu_util for s in frames[step % 6]]
    # GPU 4 of the fixture is the reserved-but-idle one: memory held, no kernels.
    idle = [samples[4] for samples in got]
    assert all(s.gpu_util <= 1 and s.memory_used > 30 * GiB for s in idle)


def test_recorded_probe_can_stand_for_several_nodes() -> None:
    probe = RecordedProbe(FIXTURE, nodes=["a", "b", "c"])
    samples = probe.sample(0.0)
    assert len(samples) == 24
    assert sorted({s.node for s in samples}) == ["a", "b", "c"]
    assert len({s.key for s in samples}) == 24


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "no such recording"),
        ("{not json", "cannot read the recording"),
        ('{"format": "other"}', "not a GPU recording"),
        ('{"format": "gpufleet-gpu-recording/1", "source": "x", "emulated": true, "interval_s": 1}', "malformed"),
        (
            '{"format": "gpufleet-gpu-recording/1", "source": "x", "emulated": true, "interval_s": 1, '
            '"frames": [{"samples": [{"node": "n", "index": 0, "uuid": "u", "model": "m", "colour": 1}]}]}',
            "malformed",
        ),
        (
            '{"format": "gpufleet-gpu-recording/1", "source": "x", "emulated": true, "interval_s": 1, "frames": []}',
            "no frames",
        ),
    ],
)
def test_a_bad_recording_is_a_clear_error(tmp_path: Path, content: str | None, problem: str) -> None:
    path = tmp_path / "rec.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(WorkloadError) as caught:
        RecordedProbe(path)
    assert problem in str(caught.value)
    assert str(path) in str(caught.value)
    assert "to fix:" in str(caught.value)
