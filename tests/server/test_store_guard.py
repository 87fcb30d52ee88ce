"""`gpufleet up` on a store that was emptied, corrupted or lost while jobs ran: it refuses to start, in one
line with a fix, and the jobs keep running; `--reset-store` starts over on purpose, moving the old file
aside. Real server processes, real SQLite files, real job processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.bench.api import TOKEN
from tests.server.live import Live, alive, kill_quietly, start

pytestmark = pytest.mark.slow


def up_once(live: Live, *extra: str) -> subprocess.CompletedProcess[str]:
    """`gpufleet up` on the live data directory, expected to refuse. Its port is taken, so that a start that
    does not refuse fails too, soon after it opened the store, instead of serving until killed."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        return subprocess.run(
            [sys.executable, "-m", "gpufleet", "up", "--data-dir", str(live.root / "data"), "--emulate",
             "8xA100-80GB", "--port", port, *extra],
            check=False, capture_output=True, text=True, timeout=120,
        )  # fmt: skip


def running_job(live: Live, gate: Path, **spec: object) -> int:
    with live.http() as client:
        job = live.submit(client, "wait-file", str(gate), **spec)
        live.wait_state(client, job, "running")
    return int(live.wait_events("start", job)[0]["pid"])


def refused(result: subprocess.CompletedProcess[str], said: str) -> None:
    assert result.returncode == 2, result.stderr
    assert said in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert "restore" in result.stderr
    assert "--reset-store" in result.stderr


def test_an_emptied_store_is_refused_and_reset_store_starts_over_keeping_the_old_file(tmp_path: Path) -> None:
    live = start(tmp_path)
    gate = live.shared / "go"  # where the job (its queue's own user) can see it
    store = live.root / "data" / "state.db"
    pid = running_job(live, gate, name="long", gpus=2)
    try:
        live.server.kill()
        os.truncate(store, 0)
        refused(up_once(live), "is empty (0 bytes)")
        assert alive(pid)  # nothing stopped the job the emptied store no longer lists
        assert store.stat().st_size == 0

        live.restart("--reset-store")
        output = live.server.output()
        assert "store reset" in output
        assert "admin token" in output  # a new store: a new first admin token
        found = TOKEN.search(output)
        assert found is not None
        live.server.token = found.group(1)
        moved = [p for p in store.parent.glob("state.db.reset-*") if p.name.endswith("Z")]
        assert [p.stat().st_size for p in moved] == [0]  # the emptied file, kept as it was
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid)  # started over on purpose: the old store's jobs are stopped
        with live.http() as client:
            assert client.get("/v1/jobs", params={"state": "running"}).json()["jobs"] == []
            audit = client.get("/v1/audit").json()["entries"]
        assert [e["action"] for e in audit] == ["store.reset"]
        assert audit[0]["actor"].startswith("local:")
    finally:
        gate.touch()
        live.server.stop()
        kill_quietly(pid)


def test_a_corrupt_or_lost_store_is_refused_while_its_jobs_keep_running(tmp_path: Path) -> None:
    live = start(tmp_path)
    gate = live.shared / "go"  # where the job (its queue's own user) can see it
    store = live.root / "data" / "state.db"
    pid = running_job(live, gate, name="long", gpus=1)
    try:
        with live.http() as client:
            for i in range(150):  # pages enough that garbage in the middle hits rows, not free space
                # 8 GPUs: they wait while the long job holds one of the node's 8 (9 is refused at submit)
                live.submit(client, "exit", "0", name=f"filler-{i}-" + "x" * 150, gpus=8)
        assert live.server.stop() == 0  # a clean stop: everything is in the main file, the WAL is gone
        kept = store.read_bytes()
        data = bytearray(kept)
        middle = len(data) // 2
        data[middle : middle + 4096] = os.urandom(4096)
        store.write_bytes(bytes(data))
        result = up_once(live)
        assert result.returncode == 2
        assert "corrupt" in result.stderr or "integrity check" in result.stderr, result.stderr
        refused(result, "gpufleet did not start")
        assert alive(pid)

        # Lost altogether (deleted): a new store would not know the job; the data directory remembers.
        store.unlink()
        refused(up_once(live), "state.db is missing, but this data directory")
        refused(up_once(live), "state.db is missing, but this data directory")  # the refusal made no file
        assert alive(pid)

        # The good file back: the job is adopted, never stopped, and finishes.
        for side in ("state.db", "state.db-wal", "state.db-shm"):
            (store.parent / side).unlink(missing_ok=True)
        store.write_bytes(kept)
        live.restart()
        with live.http() as client:
            job = live.events("start")[0]["job"]
            assert live.job(client, job)["state"] == "running"
            gate.touch()
            assert live.wait_state(client, job, "succeeded")["attempt"] == 1
    finally:
        gate.touch()
        live.server.stop()
        kill_quietly(pid)
