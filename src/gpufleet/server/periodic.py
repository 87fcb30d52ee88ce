"""A daemon thread that calls one function every `interval_s` until stopped; a failure is logged and the next
call comes on time (the budget and spot watches run on it)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("gpufleet.server")


class Periodic:
    def __init__(self, name: str, interval_s: float, step: Callable[[], object], what: str) -> None:
        self.name, self.interval_s, self.step, self.what = name, interval_s, step, what
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:
                log.exception("%s failed; retrying in %.0f s", self.what, self.interval_s)
            self._stop.wait(self.interval_s)
