"""The node agent's calls in any order: the actor runs calls on several threads, so two sent one after the
other (`kill` then `forget`, when a job is lost with another of its nodes) may run the other way round. The
agent is run here in this process (it does not need Ray), with a real worker process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpufleet.adapters.inventory.emulated_inventory import parse_emulate
from gpufleet.adapters.local.isolation import WorkerSpec
from gpufleet.adapters.local.proc import is_running
from gpufleet.adapters.ray.agent import AgentOptions, NodeAgent
from gpufleet.domain.errors import GpufleetError
from tests.kit.jobusers import reachable_by_jobs, users_created_here


def _wait(condition: object, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_kill_that_runs_after_the_forget_sent_after_it_still_kills_the_workers(tmp_path: Path) -> None:
    node = parse_emulate("8xA100-80GB", "n1")[0]
    root = tmp_path / "agent"
    options = AgentOptions(root=str(root), use_cgroups=False)
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


def test_a_kill_that_runs_before_the_start_sent_before_it_leaves_nothing_running(tmp_path: Path) -> None:
    """A gang's start went to this node, then the attempt was lost elsewhere and its kill sent here; the actor
    ran the kill first. The start that runs afterwards must start nothing, and the next attempt of the same
    job, on the same GPU, runs and is not touched by the first attempt's late calls."""
    node = parse_emulate("8xA100-80GB", "n1")[0]
    root = tmp_path / "agent"
    options = AgentOptions(root=str(root), use_cgroups=False)
    out = reachable_by_jobs(tmp_path / "out")
    script = 'echo $$ >> "$0/starts-$GPUFLEET_ATTEMPT"; exec sleep 600'
    with users_created_here():
        agent = NodeAgent("n1", "127.0.0.1", options, emulated=node)
        try:

            def spec(attempt: int) -> WorkerSpec:
                argv = ("/bin/sh", "-c", script, str(out))
                env = {"GPUFLEET_ATTEMPT": str(attempt)}
                return WorkerSpec("gang", attempt, 1, "default", argv, env, gpus=((0, node.gpus[0].uuid),))

            info = {"job_id": "gang", "workers": 2, "nodes": ["n0", "n1"]}
            agent.kill("gang", 1, "node n0 lost")
            with pytest.raises(GpufleetError, match="attempt 1 of job gang was given up on node n1"):
                agent.start([spec(1)], {**info, "attempt": 1}, False)
            assert agent.status() == []
            attempt_dir = root / "n1" / "run" / "gang" / "attempt-1"
            assert not list(attempt_dir.glob("worker-*"))  # not even a folder of a worker of it
            time.sleep(0.3)
            assert not (out / "starts-1").exists()

            agent.start([spec(2)], {**info, "attempt": 2}, False)
            _wait((out / "starts-2").exists, "the next attempt's worker to start")
            _wait(lambda: any(state[4] is not None for state in agent.status()), "its command to be seen")
            [(_, attempt, _, _, pid, _, _)] = agent.status()
            assert attempt == 2
            assert pid is not None
            agent.kill("gang", 1, "node n0 lost")  # the first attempt's calls, again and late
            agent.forget("gang", 1)
            time.sleep(0.3)
            assert is_running(pid, None)
            assert [state[1] for state in agent.status()] == [2]
            agent.kill("gang", 2, "done")
            _wait(lambda: not is_running(pid, None), "the next attempt's worker to be killed")
        finally:
            agent.adopt([])
            agent.close()


def test_a_kill_before_the_agent_saw_the_command_start_kills_the_command(tmp_path: Path) -> None:
    """The agent's watcher had not yet seen the worker's command start (its `child.pid` written since its last
    round) when the kill came: the command is killed, not only its shim."""
    node = parse_emulate("8xA100-80GB", "n1")[0]
    options = AgentOptions(root=str(tmp_path / "agent"), use_cgroups=False)
    with users_created_here():
        agent = NodeAgent("n1", "127.0.0.1", options, emulated=node)
        try:
            agent.close()  # its watcher stops: the agent's view of the worker stays as the start left it
            spec = WorkerSpec("quick", 1, 0, "default", ("/bin/sleep", "600"), {}, gpus=((0, node.gpus[0].uuid),))
            agent.start([spec], {"job_id": "quick", "attempt": 1, "workers": 1, "nodes": ["n1"]}, False)
            child = tmp_path / "agent" / "n1" / "run" / "quick" / "attempt-1" / "worker-0" / "child.pid"
            _wait(child.exists, "the command to start")
            pid = int(json.loads(child.read_text())["pid"])
            agent.kill("quick", 1, "lost elsewhere")
            _wait(lambda: not is_running(pid, None), "the command to be killed")
        finally:
            agent.adopt([])
