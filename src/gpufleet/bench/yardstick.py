"""The host's yardstick: a fixed workload timed beside a benchmark, in none of gpufleet's code.

The machines these benchmarks run on are shared: the same code, deciding the same, has run at half the speed on
one host as on another, and by a third slower within an hour on one host. A benchmark's figure alone cannot say
whether a change or the host moved it. The yardstick is timed right before and right after a benchmark's
measured part; since gpufleet's code never runs in it, only the host can move it. Its own reading moves by a tenth
or more between runs at one moment, so it tells a host twice as fast from another, not a change of a few per cent;
a figure times its yardstick compares across hosts to first order.

It has the three kinds of work a control loop's step does: Python's own (tuples sorted, dictionaries of lists
built, small objects made), small numpy operations over arrays the size of a fleet's GPUs, and records encoded
as JSON and written to a SQLite file in WAL mode (as the store opens it), committed. Each part is the best of
`repeats` runs, in milliseconds.
"""

from __future__ import annotations

import gc
import json
import random
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

PYTHON_ROWS = 20_000
NUMPY_SIZE = 40_000
NUMPY_ROUNDS = 200
SQLITE_ROWS = 5_000
REPEATS = 5


def _python_part() -> int:
    rng = random.Random(0)
    rows = [(rng.random(), i, f"job-{i}") for i in range(PYTHON_ROWS)]
    rows.sort()
    groups: dict[int, list[str]] = {}
    for _, i, name in rows:
        groups.setdefault(i % 97, []).append(name)
    return sum(len(names) for names in groups.values())


def _numpy_part() -> float:
    rng = np.random.default_rng(0)
    free = rng.integers(0, 1_001, NUMPY_SIZE).astype(np.int64)
    total = 0.0
    for round_ in range(NUMPY_ROUNDS):
        fits = free >= (round_ % 1_000)
        best = int(np.argmin(np.where(fits, free, np.iinfo(np.int64).max)))
        free[best] = max(0, int(free[best]) - 250)
        total += float(np.cumsum(fits[:1_000])[-1])
    return total


class _SqlitePart:
    def __init__(self, root: Path) -> None:
        self.connection = sqlite3.connect(root / "yardstick.db", isolation_level=None)
        self.connection.execute("PRAGMA journal_mode=WAL")
        self.connection.execute("PRAGMA synchronous=NORMAL")  # as the store opens it
        self.connection.execute("CREATE TABLE rows (id INTEGER PRIMARY KEY, state TEXT NOT NULL)")
        self.states = [
            {"job": f"job-{i}", "state": "running", "workers": [[i % 5_000, [0, 1]]]} for i in range(SQLITE_ROWS)
        ]

    def __call__(self) -> int:
        rows = [(i, json.dumps(state)) for i, state in enumerate(self.states)]
        self.connection.execute("BEGIN IMMEDIATE")
        self.connection.executemany("INSERT OR REPLACE INTO rows (id, state) VALUES (?, ?)", rows)
        self.connection.execute("COMMIT")
        return SQLITE_ROWS


def _best_ms(part: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        part()
        best = min(best, time.perf_counter() - started)
    return round(best * 1_000, 2)


def measure(repeats: int = REPEATS) -> dict[str, float]:
    """The yardstick now: each part's best time of `repeats`, in ms, and their sum (`total_ms`)."""
    root = Path(tempfile.mkdtemp(prefix="gpufleet-yardstick-"))
    # The collector would walk whatever the benchmark keeps alive: the yardstick would time the benchmark's heap.
    collecting = gc.isenabled()
    gc.disable()
    try:
        sqlite_part = _SqlitePart(root)
        try:
            figures = {
                "python_ms": _best_ms(_python_part, repeats),
                "numpy_ms": _best_ms(_numpy_part, repeats),
                "sqlite_ms": _best_ms(sqlite_part, repeats),
            }
        finally:
            sqlite_part.connection.close()
    finally:
        if collecting:
            gc.enable()
        shutil.rmtree(root, ignore_errors=True)
    return figures | {"total_ms": round(sum(figures.values()), 2)}
