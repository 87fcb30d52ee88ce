"""A node of a real Ray cluster dies (SIGKILL to its raylet) while a gang runs on it and on another node: the
gang is stopped everywhere and requeued with the reason `node NAME lost`, runs again on the nodes left, the dead
node's GPUs are offered to nobody until it is back, and its new agent kills what still ran there before it is
offered again. No GPU is ever held by two jobs: checked from the ledger the workers write and the moments each
worker process was seen dead."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.ray.conftest import RayPlane, within
from tests.ray.test_workers import _node_of
from tests.server.live import DeathWatch, intervals

pytestmark = pytest.mark.slow


def test_a_node_lost_under_a_gang_requeues_it_and_no_gpu_is_ever_held_twice(plane: RayPlane) -> None:
    live = plane.live
    watch = DeathWatch(live)
    watched_from = time.time()
    watch.start()
    try:
        with plane.client() as client:
            job = live.submit(client, "sleep", "600", workers=2, gpus=8, checkpoint_interval=2)
            first = live.wait_events("start", job, count=2, timeout_s=60)
            on = {e["rank"]: _node_of(e) for e in first}
            assert on[0] != on[1]
            victim = on[1]  # not rank 0 (MASTER_ADDR): the survivor is the rendezvous node
            killed_at = time.time()
            within(60, f"killing node {victim}", lambda: plane.cluster.kill(victim))

            # Stopped everywhere, requeued, and started again on the two nodes still up.
            again = [e for e in live.wait_events("start", job, count=4, timeout_s=90) if e["attempt"] == 2]
            requeued_after = time.time() - killed_at
            assert {_node_of(e) for e in again} == {n for n in ("node-1", "node-2", "node-3") if n != victim}
            survivor_pid = next(e["pid"] for e in first if e["rank"] == 0)
            assert survivor_pid in watch.died  # rank 0 on the surviving node was killed, not left running
            reasons = [e["reason"] for e in client.get(f"/v1/jobs/{job}/events").json()["events"]]
            lost = [r for r in reasons if f"node {victim} lost" in r]
            assert lost, reasons
            assert "since its last checkpoint lost" in lost[0]
            nodes = plane.nodes()
            assert not nodes[victim]["healthy"]
            assert all(nodes[n]["healthy"] for n in nodes if n != victim)

            # The node comes back: offered again within 10 s, after its agent killed the old worker there.
            orphan_pid = next(e["pid"] for e in first if e["rank"] == 1)
            assert orphan_pid not in watch.died  # a node that only lost its raylet keeps its processes ...
            within(120, f"restarting node {victim}", lambda: plane.cluster.add(victim))
            back_at = time.monotonic()
            while not plane.nodes()[victim]["healthy"]:
                assert time.monotonic() - back_at < 10.0, f"node {victim} not offered again within 10 s"
                time.sleep(0.1)
            healthy_at = time.time()
            assert orphan_pid in watch.died  # ... until its new agent kills them
            assert watch.died[orphan_pid] <= healthy_at
    finally:
        died = watch.stop()

    # No GPU held by two attempts at once, across the loss and the return. Only workers started while the
    # watch ran: one killed earlier in the session (no end line) would seem to run until the watch saw it dead.
    held: dict[str, list[tuple[float, float, tuple[str, int]]]] = {}
    events = [e for e in live.events() if e["event"] != "start" or e["t"] >= watched_from]
    for job_id, attempt, start, end, gpus in intervals(events, died, time.time()):
        for gpu in gpus:
            held.setdefault(gpu, []).append((start, end, (job_id, attempt)))
    assert len(held) == 24  # attempt 1 on two nodes, attempt 2 on two nodes: 3 nodes' GPUs in all, some twice
    for gpu, spans in held.items():
        spans.sort()
        busy_until, holder = spans[0][1], spans[0][2]
        for start, end, owner in spans[1:]:
            assert start >= busy_until, f"GPU {gpu} held by {holder} until {busy_until} and by {owner} from {start}"
            busy_until, holder = max((busy_until, holder), (end, owner))
    assert requeued_after < 45.0


def test_a_removed_node_stays_removed_until_it_joins_again(plane: RayPlane) -> None:
    """`gpufleet nodes remove` on a Ray fleet: the fleet's own node list forgets it too, so the next change of
    the cluster (here another node lost and back) does not write it back; joining Ray again brings it back."""
    gone, other = "node-3", "node-2"
    within(60, f"killing node {gone}", lambda: plane.cluster.kill(gone))
    _until(lambda: not plane.nodes()[gone]["healthy"], f"node {gone} to be seen lost")
    with plane.client() as client:
        assert client.delete(f"/v1/nodes/{gone}").status_code == 204
    assert gone not in plane.nodes()
    within(60, f"killing node {other}", lambda: plane.cluster.kill(other))
    _until(lambda: not plane.nodes()[other]["healthy"], f"node {other} to be seen lost")
    within(120, f"restarting node {other}", lambda: plane.cluster.add(other))
    _until(lambda: plane.nodes()[other]["healthy"], f"node {other} to be back")
    assert gone not in plane.nodes()  # two changes of the cluster later, still removed
    within(120, f"restarting node {gone}", lambda: plane.cluster.add(gone))
    _until(lambda: gone in plane.nodes() and plane.nodes()[gone]["healthy"], f"node {gone} to join again")


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s:g} s for {what}"
        time.sleep(0.2)
