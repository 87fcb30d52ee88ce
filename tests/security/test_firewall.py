"""The engine firewall on the local executor: a job's processes cannot open a TCP connection to a port listed
as an engine port (nftables owner match on the job users, `adapters/local/firewall.py`), while root (the
control plane, the engine itself) can, and the job still reaches ports that are not the engine's (a gang's
own rendezvous, gpufleet's API). Real users, a real nftables table of the test's own, a real listening socket.
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.adapters.local.firewall import EngineFirewall, ephemeral_range
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.jobs import RunSpec
from gpufleet.ports import ObservationKind
from tests.kit.jobusers import JOB_PYTHON, share
from tests.local.conftest import ended, only, wait_for
from tests.local.isolation_kit import Isolated, isolated_setup, read_out, require_root

K = ObservationKind

CONNECT = r"""
import json, os, socket, sys
out, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
found = {}
for port in ports:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        found[port] = "connected"
    except OSError as error:
        found[port] = type(error).__name__
with open(out + ".tmp", "w") as f:
    json.dump({"uid": os.getuid(), "found": found}, f)
os.replace(out + ".tmp", out)
"""


def _free_below(high: int) -> int:
    for port in range(high - 1, 20000, -7):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise AssertionError(f"no free port below {high}")


class _Listener:
    """A TCP port on 127.0.0.1 that root listens on and accepts every connection of."""

    def __init__(self, below: int = 0) -> None:
        """`below`: a port under this (an engine's ports lie below the kernel's ephemeral range); 0: any."""
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", _free_below(below) if below else 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def iso(tmp_path: Path) -> Iterator[Isolated]:
    require_root()
    with isolated_setup(tmp_path) as found:
        yield found


@pytest.fixture
def firewall() -> Iterator[EngineFirewall]:
    require_root()
    wall = EngineFirewall(table=f"gpufleet-test-{secrets.token_hex(3)}")
    try:
        yield wall
    finally:
        wall.remove()


def test_a_job_cannot_connect_to_an_engine_port_while_root_and_other_ports_can(
    iso: Isolated, firewall: EngineFirewall
) -> None:
    engine, other = _Listener(below=ephemeral_range()[0]), _Listener()
    try:
        firewall.apply(ports=[engine.port])
        isolation = iso.per_queue_users(firewall=firewall)
        backend = iso.backend(isolation)
        program = share(iso.shared / "connect.py", CONNECT)
        out = iso.out("fw")
        run = RunSpec((JOB_PYTHON, str(program), out, str(engine.port), str(other.port)))
        backend.launch(iso.launch("fw", run, queue="fw-a"))
        seen = wait_for(backend, ended("fw"), timeout=30)
        assert only(seen, "fw", K.EXITED).exit_code == 0
        found = read_out(out)
        assert found["uid"] != 0
        assert found["found"][str(engine.port)] == "ConnectionRefusedError", found  # reset by the rule
        assert found["found"][str(other.port)] == "connected", found
        # Root (the engine's own user, the control plane) is not held.
        socket.create_connection(("127.0.0.1", engine.port), timeout=5).close()
        assert firewall.active()
        assert found["uid"] in firewall._uids
        assert any("engine firewall: jobs cannot connect" in note for note in isolation.report().notes)
    finally:
        engine.close()
        other.close()


def test_without_nft_the_firewall_says_how_to_fix_it() -> None:
    wall = EngineFirewall(table="gpufleet-test-missing", nft="/nonexistent/nft")
    with pytest.raises(GpufleetError) as raised:
        wall.apply(ports=[12345])
    assert "nftables" in raised.value.fix
    assert "not enforced" in wall.describe()


def test_applying_twice_keeps_one_rule_and_adds_ports(firewall: EngineFirewall) -> None:
    firewall.apply(ports=[(21000, 21063)], uids=[65534])
    firewall.apply(ports=[21100])
    again = EngineFirewall(table=firewall.table)  # another control plane sharing the table
    again.apply(ports=[(21000, 21063)])
    listed = subprocess.run(
        ["nft", "list", "table", "inet", firewall.table], capture_output=True, text=True, check=True
    ).stdout
    assert listed.count("reject with tcp reset") == 1
    assert "21000-21063" in listed
    assert "21100" in listed
    assert "65534" in listed


def test_ports_in_the_ephemeral_range_are_left_to_the_jobs_own_connections(firewall: EngineFirewall) -> None:
    """gloo and NCCL listen on ports the kernel picks from its ephemeral range: an engine port seen there (a
    joined cluster's random one) must not refuse a gang's rendezvous, and the report says it is not covered."""
    low, high = ephemeral_range()
    firewall.apply(ports=[21000, low + 5, (high - 1, high + 2)])
    listed = subprocess.run(
        ["nft", "list", "set", "inet", firewall.table, "engine_ports"], capture_output=True, text=True, check=True
    ).stdout
    assert "21000" in listed
    assert str(low + 5) not in listed
    assert f"{high + 1}-{high + 2}" in listed
    assert "ephemeral range" in firewall.describe()
    assert str(low + 5) in firewall.describe()
