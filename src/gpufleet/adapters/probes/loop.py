"""`Sampler`: runs a probe at a fixed interval (default 5 s) into a `SampleRing`, on a daemon thread.

`tick(now)` is one round (sample, store), so the control plane can also drive it from its own loop and
tests need no thread. A probe that raises (a bug, or a GPU lost mid-call) costs that round only: the
error is logged once per kind and the loop carries on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from gpufleet.adapters.probes.ring import SampleRing
from gpufleet.ports.gpu_probe import GpuProbe, GpuSample

log = logging.getLogger("gpufleet.telemetry")
DEFAULT_INTERVAL_S = 5.0


class Sampler:
    def __init__(
        self,
        probe: GpuProbe,
        ring: SampleRing | None = None,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"sampling interval is {interval_s} s; give a positive number of seconds")
        self.probe = probe
        self.ring = ring or SampleRing()
        self.interval_s = interval_s
        self.clock = clock
        self.errors = 0
        self._logged: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self, now: float | None = None) -> Sequence[GpuSample]:
        """Sample once into the ring; returns the samples (empty if the probe failed)."""
        try:
            samples = self.probe.sample(self.clock() if now is None else now)
        except Exception as exc:  # the collector must outlive a failing probe; it is counted and logged
            self.errors += 1
            kind = type(exc).__name__
            if kind not in self._logged:
                self._logged.add(kind)
                log.warning(
                    "GPU probe %s failed (%s: %s); retrying every %.3g s", self.probe.kind, kind, exc, self.interval_s
                )
            return ()
        self.ring.add(samples)
        return samples

    def latest_samples(self) -> list[GpuSample]:
        return self.ring.latest()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpufleet-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.tick()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
