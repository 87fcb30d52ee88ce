"""The `recorded` probe: replays a recording of GPU samples, looping, with times shifted to the caller's clock.

A recording is JSON:

    {"format": "gpufleet-gpu-recording/1",
     "source": "what made it (e.g. 'nvml, driver 550.54.15, 8x NVIDIA H100 80GB HBM3'), and if emulated, so",
     "emulated": false, "hostname": "...", "interval_s": 5.0,
     "frames": [{"t": 0.0, "samples": [{GpuSample fields}, ...]}, ...]}

`gpufleet.adapters.nvml.record` makes one on a machine with GPUs. Replay picks the frame for
`(now - first now) // interval_s`, modulo the number of frames; each sample is re-stamped `at=now`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpufleet.domain.errors import WorkloadError
from gpufleet.ports.gpu_probe import GpuSample

FORMAT = "gpufleet-gpu-recording/1"
_FIELDS = {f.name for f in dataclasses.fields(GpuSample)}


def sample_to_json(sample: GpuSample) -> dict[str, Any]:
    data = dataclasses.asdict(sample)
    data["processes"] = [list(p) for p in sample.processes]
    return data


def sample_from_json(data: Mapping[str, Any]) -> GpuSample:
    unknown = set(data) - _FIELDS
    if unknown:
        raise ValueError(f"unknown sample fields {sorted(unknown)}")
    fields = dict(data)
    fields["processes"] = tuple((int(pid), int(used)) for pid, used in fields.get("processes", ()))
    return GpuSample(**fields)


@dataclasses.dataclass(frozen=True, slots=True)
class Recording:
    source: str
    emulated: bool
    hostname: str
    interval_s: float
    frames: tuple[tuple[GpuSample, ...], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "source": self.source,
            "emulated": self.emulated,
            "hostname": self.hostname,
            "interval_s": self.interval_s,
            "frames": [
                {"t": round(i * self.interval_s, 6), "samples": [sample_to_json(s) for s in frame]}
                for i, frame in enumerate(self.frames)
            ],
        }


def load_recording(path: str | Path) -> Recording:
    """Read a recording; a missing or malformed file is a `WorkloadError` naming the file and the fix."""
    fix = "give a recording made by gpufleet.adapters.nvml.record (JSON, format " + FORMAT + ")"
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise WorkloadError("no such recording", fix, path=path) from None
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"cannot read the recording ({exc})", fix, path=path) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise WorkloadError(f"not a GPU recording (format {found!r})", fix, path=path)
    try:
        frames = tuple(tuple(sample_from_json(s) for s in frame["samples"]) for frame in data["frames"])
        interval = float(data["interval_s"])
        recording = Recording(
            source=str(data["source"]),
            emulated=bool(data["emulated"]),
            hostname=str(data.get("hostname", "")),
            interval_s=interval,
            frames=frames,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkloadError(f"malformed recording ({exc!s})", fix, path=path) from None
    if not frames or interval <= 0:
        raise WorkloadError("the recording has no frames or a non-positive interval_s", fix, path=path)
    return recording


class RecordedProbe:
    """Replays `recording` (a path or a loaded `Recording`). With `nodes`, the recorded GPUs are replayed once
    per node name given (the recorded host's GPUs under each name), to stand for a larger fleet."""

    kind = "recorded"

    def __init__(self, recording: Recording | str | Path, *, nodes: Sequence[str] | None = None) -> None:
        self.recording = recording if isinstance(recording, Recording) else load_recording(recording)
        self._start: float | None = None
        names = list(nodes) if nodes else None
        # Pre-build the renamed frames once: replay is then a list look-up and a re-stamp.
        self._frames = [
            [dataclasses.replace(s, node=name, probe=self.kind) for name in names for s in frame]
            if names
            else [dataclasses.replace(s, probe=self.kind) for s in frame]
            for frame in self.recording.frames
        ]

    def sample(self, now: float) -> Sequence[GpuSample]:
        if self._start is None:
            self._start = now
        # The epsilon keeps 0.3 / 0.1 (2.999...) on frame 3, where a person reading the clock would put it.
        step = math.floor(max(0.0, now - self._start) / self.recording.interval_s + 1e-9)
        frame = self._frames[step % len(self._frames)]
        return [dataclasses.replace(s, at=now) for s in frame]
