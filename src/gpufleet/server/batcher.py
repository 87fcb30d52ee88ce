"""Group commit of API submits: concurrent submits are written together in one transaction.

One writer thread takes whatever submits have queued up (up to `max_batch`) and stores them with
`AdminStore.submit_many`; each caller gets its own record or error back. A lone submit is written at once
(nothing waits for a batch to fill), so latency on an idle control plane is unchanged; under load, one
commit serves many submits instead of each waiting its turn for SQLite's single writer."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from gpufleet.domain.jobs import Job
from gpufleet.domain.records import JobRecord
from gpufleet.ports.admin import IDEMPOTENCY_TTL_S, AdminStore, SubmitKey

Item = tuple[Job, float, SubmitKey | None, "Future[JobRecord]"]
PRUNE_EVERY_S = 600.0  # how often expired idempotency keys are deleted (they are ignored once expired anyway)
log = logging.getLogger("gpufleet.api")


class SubmitBatcher:
    def __init__(
        self,
        store: AdminStore,
        wake: Callable[[], None],
        max_batch: int = 64,
        key_ttl_s: float = IDEMPOTENCY_TTL_S,
    ) -> None:
        self.store = store
        self.wake = wake
        self.max_batch = max_batch
        self.key_ttl_s = key_ttl_s
        self._pruned_at = time.monotonic()
        self._queue: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, job: Job, at: float, key: SubmitKey | None = None) -> Future[JobRecord]:
        """The job's record once stored: a record of another job when `key` was used before (that job)."""
        future: Future[JobRecord] = Future()
        self._queue.put((job, at, key, future))
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
            if time.monotonic() - self._pruned_at > PRUNE_EVERY_S:
                self._prune(batch[-1][1])

    def _write(self, batch: list[Item]) -> None:
        # One commit time for the batch: jobs submitted together are ordered by their submit numbers.
        at = max(item[1] for item in batch)
        keys = [item[2] for item in batch]
        try:
            results = self.store.submit_many(
                [item[0] for item in batch], at, keys if any(keys) else None, self.key_ttl_s
            )
        except BaseException as error:  # the store is down: every caller gets the error
            for *_, future in batch:
                future.set_exception(error)
            return
        # Woken before any caller is answered, so a submit that has returned has always woken the loop.
        self.wake()
        for (*_, future), result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    def _prune(self, now: float) -> None:
        self._pruned_at = time.monotonic()
        try:
            self.store.forget_idempotency_keys(now - self.key_ttl_s)
        except Exception:  # the store is down: the next batch tries again
            log.warning("could not delete expired idempotency keys; will retry", exc_info=True)
