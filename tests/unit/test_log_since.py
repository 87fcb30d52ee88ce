"""`logs --since`: where a time falls in a worker's log, from the marks its shim keeps beside it, and the times
a user may write."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.adapters.local.logs import read_log_file, since_offset
from gpufleet.client.sdk import parse_since
from gpufleet.domain.errors import GpufleetError


def _log(tmp_path: Path, marks: str, text: bytes = b"0123456789" * 10) -> Path:
    log = tmp_path / "worker-0.log"
    log.write_bytes(text)
    (tmp_path / "worker-0.log.times").write_text(marks)
    return log


def test_the_offset_is_the_first_mark_less_than_a_second_before_the_time(tmp_path: Path) -> None:
    log = _log(tmp_path, "100.000 0\n101.500 30\n105.000 60\n")
    assert since_offset(log, 50.0) == 0
    assert since_offset(log, 100.5) == 0  # written within a second of 100: may be at 100.5
    assert since_offset(log, 101.2) == 30  # what lies before 30 was written before 101.0
    assert since_offset(log, 102.4) == 30
    assert since_offset(log, 102.6) == 60
    assert since_offset(log, 106.5) == 100  # nothing since: the end
    data, start, size = read_log_file(log, 0, 1000, since=102.6)
    assert (data, start, size) == (b"0123456789" * 4, 60, 100)


def test_a_log_without_marks_starts_at_0_and_a_damaged_mark_is_skipped(tmp_path: Path) -> None:
    log = tmp_path / "worker-0.log"
    log.write_bytes(b"old\n")
    assert since_offset(log, 1e9) == 0
    damaged = _log(tmp_path, "garbage\n100.0 x\n200.0 40\n")
    assert since_offset(damaged, 150.0) == 40


def test_times_a_user_writes() -> None:
    assert parse_since("90s", now=1000.0) == 910.0
    assert parse_since("10m", now=1000.0) == 400.0
    assert parse_since("2h", now=10_000.0) == 2800.0
    assert parse_since("1d", now=100_000.0) == 13_600.0
    assert parse_since("1796600000") == 1796600000.0
    assert parse_since("2026-12-07T09:30:00+00:00") == 1796635800.0
    for bad in ("yesterday", "-5m", "", "10x"):
        with pytest.raises(GpufleetError, match="90s, 10m, 2h or 1d"):
            parse_since(bad)
