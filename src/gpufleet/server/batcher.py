"""Group commit of API submits: concurrent submits are written together in one transaction.

One writer thread takes whatever submits have queued up (up to `max_batch`) and stores them with
`AdminStore.submit_many`; each caller gets its own record or error back. A lone submit is written at once
(nothing waits for a batch to fill), so latency on an idle control plane is unchanged; under load, one
commit serves many submits instead of each waiting its turn for SQLite's single writer."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

from gpufleet.domain.jobs import Job
from gpufleet.domain.records import JobRecord
from gpufleet.ports.admin import AdminStore

Item = tuple[Job, float, "Future[JobRecord]"]


class SubmitBatcher:
    def __init__(self, store: AdminStore, wake: Callable[[], None], max_batch: int = 64) -> None:
        self.store = store
        self.wake = wake
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, job: Job, at: float) -> Future[JobRecord]:
        future: Future[JobRecord] = Future()
        self._queue.put((job, at, future))
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="gpufleet-submit", daemon=True)
                    self._thread.start()
        return future

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._write(batch)

    def _write(self, batch: list[Item]) -> None:
        # One commit time for the batch: jobs submitted together are ordered by their submit numbers.
        at = max(item[1] for item in batch)
        try:
            results = self.store.submit_many([item[0] for item in batch], at)
        except BaseException as error:  # the store is down: every caller gets the error
            for _, _, future in batch:
                future.set_exception(error)
            return
        for (_, _, future), result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
        self.wake()
