"""The host's yardstick times fixed work that is done in full, and the benchmarks print it around what they measure."""

from __future__ import annotations

import gc
import sqlite3
from pathlib import Path

import pytest

from gpufleet.bench import yardstick


def test_each_part_does_all_of_its_work() -> None:
    assert yardstick._python_part() == yardstick.PYTHON_ROWS
    assert yardstick._numpy_part() == yardstick._numpy_part() > 0  # the same fixed work every time


def test_the_sqlite_part_commits_every_row(tmp_path: Path) -> None:
    part = yardstick._SqlitePart(tmp_path)
    try:
        assert part() == yardstick.SQLITE_ROWS
        assert part() == yardstick.SQLITE_ROWS  # a second run rewrites the same rows
    finally:
        part.connection.close()
    with sqlite3.connect(tmp_path / "yardstick.db") as reader:
        assert reader.execute("SELECT count(*) FROM rows").fetchone()[0] == yardstick.SQLITE_ROWS
        assert reader.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_measure_reports_each_part_and_their_sum() -> None:
    figures = yardstick.measure(repeats=1)
    parts = {"python_ms", "numpy_ms", "sqlite_ms"}
    assert set(figures) == parts | {"total_ms"}
    assert all(figures[name] > 0 for name in parts)
    assert figures["total_ms"] == pytest.approx(sum(figures[name] for name in parts), abs=0.02)


def test_measure_leaves_the_collector_as_it_found_it() -> None:
    assert gc.isenabled()
    yardstick.measure(repeats=1)
    assert gc.isenabled()
    gc.disable()
    try:
        yardstick.measure(repeats=1)
        assert not gc.isenabled()
    finally:
        gc.enable()
