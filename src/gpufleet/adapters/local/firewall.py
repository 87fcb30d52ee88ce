"""The engine firewall: a job's processes cannot open a TCP connection to the execution engine's ports.

An engine such as Ray runs daemons as root on every node (its GCS, raylets, object managers, dashboard agents,
runtime-env agents, metrics exporters, workers): whoever reaches them runs code as root or reads the cluster.
The job users (one per queue) get no route to them at all, on any node:

    table inet gpufleet {
        set job_uids { type uid; }                                      # every job user of this node
        set engine_ports { type inet_service; flags interval; }         # every port of the engine, any node
        chain output { type filter hook output priority filter; policy accept;
            meta skuid @job_uids tcp dport @engine_ports reject with tcp reset }
    }

A netfilter owner match rather than a network namespace per job: a gang's workers on different nodes talk
to each other (gloo, NCCL) over the nodes' own addresses, which a namespace would cut off unless every node
ran an overlay network and gpufleet wired each job into it; the owner match leaves job-to-job traffic (and the
job's calls to gpufleet's API, which checks its own token) alone and shuts exactly the engine's doors.
Matching the destination port only (any address) also covers a node's other addresses and the other nodes.

Ports in the kernel's ephemeral range (`ip_local_port_range`, 32768-60999 by default) are never added: gloo
and NCCL listen on ports the kernel picks from that range, and a gang's rendezvous must never hit a port that
once was an engine's. A cluster that gpufleet starts pins every port below it; on a cluster it joins, a port
Ray picked at random there is left to Ray's token authentication, and `describe` names it with the fix.

Everything is added, never flushed: several control planes on one machine (tests, emulated clusters) share
the table, and a port or a uid added twice is one element. Applied with the `nft` binary (package nftables).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.domain.errors import GpufleetError

log = logging.getLogger(__name__)

TABLE = "gpufleet"
NFT_FIX = "install nftables (`apt-get install nftables`) and run gpufleet as root on a kernel with nf_tables"
PortSpan = tuple[int, int]  # an inclusive range of TCP ports; (p, p) is one port


def spans(ports: Iterable[int | PortSpan]) -> tuple[PortSpan, ...]:
    """`ports` as sorted, merged inclusive ranges."""
    given = sorted((p, p) if isinstance(p, int) else (int(p[0]), int(p[1])) for p in ports)
    merged: list[PortSpan] = []
    for low, high in given:
        if not 1 <= low <= high <= 65535:
            raise GpufleetError(f"{low}-{high} is not a range of TCP ports", "give ports between 1 and 65535")
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(high, merged[-1][1]))
        else:
            merged.append((low, high))
    return tuple(merged)


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> PortSpan:
    """The ports the kernel hands out for binds to port 0 (and outgoing connections)."""
    try:
        low, high = (int(word) for word in Path(path).read_text().split())
    except (OSError, ValueError):
        return (32768, 60999)
    return (low, high)


def outside(given: Iterable[PortSpan], excluded: PortSpan) -> tuple[list[PortSpan], list[PortSpan]]:
    """`given` split into what lies outside `excluded` and what lies inside it."""
    kept: list[PortSpan] = []
    inside: list[PortSpan] = []
    low_x, high_x = excluded
    for low, high in given:
        if high < low_x or low > high_x:
            kept.append((low, high))
            continue
        if low < low_x:
            kept.append((low, low_x - 1))
        if high > high_x:
            kept.append((high_x + 1, high))
        inside.append((max(low, low_x), min(high, high_x)))
    return kept, inside


def _element(span: PortSpan) -> str:
    return str(span[0]) if span[0] == span[1] else f"{span[0]}-{span[1]}"


@dataclass
class EngineFirewall:
    """The engine firewall of this node, in table `inet <table>`. Every method is idempotent."""

    table: str = TABLE
    nft: str = "nft"
    _uids: set[int] = field(default_factory=set)
    _ports: set[PortSpan] = field(default_factory=set)
    error: str | None = None  # why it is not active, once it failed
    uncovered: set[PortSpan] = field(default_factory=set)  # engine ports in the ephemeral range (not added)

    def apply(self, ports: Iterable[int | PortSpan] = (), uids: Iterable[int] = ()) -> None:
        """Make sure the table and its rule exist and hold `ports` and `uids` (besides what they held).
        Raises GpufleetError (with the fix) when nft is missing or the kernel refuses."""
        kept, inside = outside(spans(ports), ephemeral_range())
        self.uncovered.update(inside)
        new_ports = [s for s in kept if s not in self._ports]
        new_uids = sorted({int(u) for u in uids} - self._uids)
        script = [
            f"table inet {self.table} {{",
            "  set job_uids { type uid; }",
            "  set engine_ports { type inet_service; flags interval; auto-merge; }",
            "  chain output { type filter hook output priority filter; policy accept; }",
            "}",
            # The chain is rebuilt in the same transaction, so the rule is there once, never missing.
            f"flush chain inet {self.table} output",
            f"add rule inet {self.table} output meta skuid @job_uids tcp dport @engine_ports reject with tcp reset",
        ]
        if new_ports:
            script.append(f"add element inet {self.table} engine_ports {{ {', '.join(map(_element, new_ports))} }}")
        if new_uids:
            script.append(f"add element inet {self.table} job_uids {{ {', '.join(map(str, new_uids))} }}")
        self._run("\n".join(script) + "\n")
        self._ports.update(new_ports)
        self._uids.update(new_uids)
        self.error = None

    def add_uid(self, uid: int) -> None:
        """A job user about to run a worker here: it must not reach the engine. Raises GpufleetError."""
        if uid in self._uids or uid == 0:
            return
        self.apply(uids=(uid,))

    def add_ports(self, ports: Iterable[int | PortSpan]) -> None:
        if all(s in self._ports or s in self.uncovered for s in spans(ports)):
            return
        self.apply(ports=ports)

    def remove(self) -> None:
        """Drop the whole table (every control plane's on this machine sharing it)."""
        if shutil.which(self.nft) is None:
            return
        subprocess.run([self.nft, "delete", "table", "inet", self.table], capture_output=True, check=False)
        self._ports.clear()
        self._uids.clear()

    def active(self) -> bool:
        """Whether the kernel holds the table with its rule now."""
        if shutil.which(self.nft) is None:
            return False
        done = subprocess.run(
            [self.nft, "list", "chain", "inet", self.table, "output"], capture_output=True, text=True, check=False
        )
        return done.returncode == 0 and "@engine_ports" in done.stdout and "reject" in done.stdout

    @property
    def ports(self) -> tuple[PortSpan, ...]:
        return spans(self._ports)

    def describe(self) -> str:
        if self.error is not None:
            return f"not enforced: jobs may connect to the engine's ports ({self.error})"
        shown = ", ".join(map(_element, self.ports[:6])) + (", …" if len(self.ports) > 6 else "")
        said = (
            f"jobs cannot connect to the engine's ports ({shown or 'none yet'}): nftables table inet {self.table}, "
            f"{len(self._uids)} job user(s)"
        )
        if self.uncovered:
            low, high = ephemeral_range()
            left = ", ".join(map(_element, spans(self.uncovered)[:6]))
            said += (
                f"; not the engine's ports in the kernel's ephemeral range {low}-{high} ({left}), which jobs' own "
                "connections use: only Ray's token guards them (start Ray with every port pinned below it)"
            )
        return said

    def _run(self, script: str) -> None:
        if shutil.which(self.nft) is None:
            self.error = "the nft program is missing"
            raise GpufleetError(f"cannot shut jobs out of the engine's ports: {self.error}", NFT_FIX)
        done = subprocess.run([self.nft, "-f", "-"], input=script, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            self.error = f"nft refused: {done.stderr.strip()[:300]}"
            raise GpufleetError(f"cannot shut jobs out of the engine's ports: {self.error}", NFT_FIX)
