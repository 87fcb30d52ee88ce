"""The node agent's calls in any order: the actor runs calls on several threads, so two sent one after the
other (`kill` then `forget`, when a job is lost with another of its nodes) may run the other way round. The
agent is run here in this process (it does not need Ray), with a real worker process."""

from __future__ import annotations

import time
from pathlib import Path

from gpufleet.adapters.inventory.emulated_inventory import parse_emulate
from gpufleet.adapters.local.isolation import WorkerSpec
from gpufleet.adapters.local.proc import is_running
from gpufleet.adapters.ray.agent import AgentOptions, NodeAgent
from tests.kit.jobusers import reachable_by_jobs, users_created_here


def _wait(condition: object, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_kill_that_runs_after_the_forget_sent_after_it_still_kills_the_workers(tmp_path: Path) -> None:
    node = parse_emulate("8xA100-80GB", "n1")[0]
    root = tmp_path / "agent"
    options = AgentOptions(root=str(root), jobs_home=str(reachable_by_jobs(tmp_path / "homes")), use_cgroups=False)
    with users_created_here():
        agent = NodeAgent("n1", "127.0.0.1", options, emulated=node)
        try:
            spec = WorkerSpec("gang", 1, 0, "default", ("/bin/sleep", "600"), {}, gpus=((0, node.gpus[0].uuid),))
            agent.start([spec], {"job_id": "gang", "attempt": 1, "workers": 2, "nodes": ["n1", "n2"]}, True)
            _wait(lambda: any(state[4] is not None for state in agent.status()), "the worker to start")
            [(_, _, _, _, pid, _, _)] = agent.status()
            assert pid is not None
            assert is_running(pid, None)

            # Its other node was lost: the control plane sent `kill` then `forget`; they ran the other way round.
            agent.forget("gang", 1)
            agent.kill("gang", 1, "node n2 lost")
            _wait(lambda: not is_running(pid, None), "the worker to be killed")
            assert agent.status() == []
        finally:
            agent.close()
        # Given up for good: an agent started again on the node reports it lost, and starts nothing.
        again = NodeAgent("n1", "127.0.0.1", options, emulated=node)
        try:
            _, stops, _ = again.adopt([("gang", 1, None)])
            assert [(job, attempt, record.get("lost")) for job, attempt, record in stops] == [
                ("gang", 1, "node n2 lost")
            ]
        finally:
            again.adopt([])
            again.close()
