"""The executor's small parts: the port allocator, folder names for job ids, the process records."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.adapters.local.layout import safe_name
from gpufleet.adapters.local.ports import PortAllocator
from gpufleet.adapters.local.proc import exit_code, is_running, read_json, start_ticks, write_json
from gpufleet.domain.errors import GpufleetError


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 9)), max_size=60))
def test_ports_held_by_live_jobs_are_never_handed_out_twice(ops: list[tuple[bool, int]]) -> None:
    ports = PortAllocator(41000, 41009)
    owners: dict[str, int] = {}
    for acquire, n in ops:
        owner = f"job{n}"
        if acquire and owner not in owners and len(owners) < 10:
            port = ports.acquire(owner)
            assert 41000 <= port <= 41009
            assert port not in owners.values()
            owners[owner] = port
        elif not acquire and owner in owners:
            ports.release(owners.pop(owner), owner)
        assert ports.held == {p: o for o, p in owners.items()}


def test_a_busy_port_is_skipped_and_a_full_range_explained() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert not PortAllocator(port, port).bindable(port)
        with pytest.raises(GpufleetError, match=r"no free port .*; to fix: widen"):
            PortAllocator(port, port).acquire("b")


def test_release_by_another_owner_keeps_the_port() -> None:
    ports = PortAllocator(41100, 41105)
    port = ports.acquire("a#1")
    ports.release(port, "b#1")
    assert ports.held == {port: "a#1"}


def test_bad_port_range() -> None:
    with pytest.raises(GpufleetError, match="to fix"):
        PortAllocator(30000, 29000)


@given(st.text(max_size=30))
def test_job_ids_map_to_distinct_single_folder_names(job_id: str) -> None:
    name = safe_name(job_id)
    assert "/" not in name
    assert "\0" not in name
    assert name not in (".", "..")
    assert not name.startswith(".")
    # Reversible, so distinct ids never share a folder.
    from urllib.parse import unquote

    assert unquote(name) == job_id


def test_process_records(tmp_path: Path) -> None:
    assert start_ticks(os.getpid()) is not None
    assert is_running(os.getpid(), start_ticks(os.getpid()))
    assert not is_running(os.getpid(), (start_ticks(os.getpid()) or 0) + 1)  # same pid, another process
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = start_ticks(proc.pid)
    proc.wait()
    assert not is_running(proc.pid, ticks)
    assert not is_running(None, None)
    assert exit_code(-9) == 137
    assert exit_code(3) == 3
    write_json(tmp_path / "a.json", {"x": 1})
    assert read_json(tmp_path / "a.json") == {"x": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]  # no temporary file left
    (tmp_path / "bad.json").write_text("{not json")
    assert read_json(tmp_path / "bad.json") is None
    assert read_json(tmp_path / "missing.json") is None
