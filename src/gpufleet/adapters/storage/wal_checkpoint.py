"""SQLite's WAL checkpoints, moved off the writers' commits onto a thread of their own.

By default SQLite checkpoints inside the commit that takes the write-ahead log past 1,000 pages: that commit
copies the log's pages into the database file and syncs both before it returns. The control loop writes a few
thousand rows a step, so at 5,000 nodes its large commits carried checkpoints (33-52 ms each instead of 8-13 ms).
The store's connections turn that off (`PRAGMA wal_autocheckpoint=0`) and this thread checkpoints instead
(`PRAGMA wal_checkpoint(PASSIVE)`, which never waits for readers or writers), on its own connection, whenever it
finds the log at SQLite's own threshold (1,000 pages) or beyond, looking a few times a second. Python's sqlite3
driver lets go of the interpreter while SQLite works, so the copying and syncing run beside the loop, on another
core. A log that never reaches the threshold is never checkpointed before the store closes, as before.

What a crash may lose is unchanged: a commit is durable once it is in the log (`synchronous=NORMAL`), and a
checkpoint only moves what the log already holds. When the last connection closes, SQLite checkpoints what is
left and removes the log, as before.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger(__name__)

# How often the log's size is looked at.
INTERVAL_S = 0.2
# The log is checkpointed from this many pages (SQLite's automatic checkpoint's default). The log's file keeps its
# size when SQLite starts writing it from the beginning again, so past this size it is checkpointed at every look:
# a PASSIVE checkpoint of what is already copied costs microseconds.
CHECKPOINT_PAGES = 1_000


class WalCheckpointer:
    """Looks at one SQLite database's write-ahead log every `interval_s` from a daemon thread until `stop`, and
    checkpoints it when it has `pages` pages or more."""

    def __init__(self, path: Path, interval_s: float = INTERVAL_S, pages: int = CHECKPOINT_PAGES) -> None:
        self.path = path
        self.log_path = path.with_name(path.name + "-wal")
        self.interval_s = interval_s
        self.pages = pages
        self.checkpoints = 0  # completed checkpoint calls (tests read it)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufleet-wal-checkpoint", daemon=True)

    def start(self) -> WalCheckpointer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and wait for it (a checkpoint under way finishes first)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        try:
            connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
        except sqlite3.Error as error:
            log.warning("WAL checkpoints off for %s: cannot connect (%s)", self.path, error)
            return
        try:
            page_size = int(connection.execute("PRAGMA page_size").fetchone()[0])
            while not self._stopping.wait(self.interval_s):
                try:
                    if self._log_size() < self.pages * page_size:
                        continue
                    connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.checkpoints += 1
                except sqlite3.Error as error:
                    # Another checkpoint under way, or the disk is full: the next round tries again, and the
                    # writers' own commits report a store that cannot be written.
                    log.debug("WAL checkpoint of %s skipped: %s", self.path, error)
        except sqlite3.Error as error:
            log.warning("WAL checkpoints off for %s: %s", self.path, error)
        finally:
            with contextlib.suppress(sqlite3.Error):
                connection.close()

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:  # no log (yet, or no longer): nothing to checkpoint
            return 0
