"""`gpufleet bench sim`: speed of the simulator on two public-trace runs, as one JSON object.

Cases: `openb_fgd`, the FGD protocol on openb (seed 42, pods sampled to 130 % of the 1213-node cluster's 6212
GPUs, pods never leave; `pods` picks the pod list, default or gpuspec33); `philly`, the whole Philly trace
(82,247 jobs on Helios' 352-node VC cluster). Each case runs under each policy asked for (by default its
baseline, best-fit or strict fifo, and gpufleet's `default`) and reports simulated events, reconciler steps,
wall seconds of the simulation (the engine, the control loop and the core; loading the trace is timed
apart), events per second and the goal. Goals: openb_fgd <= 10 s, philly <= 60 s per policy, on one core of
a 2-core CI machine; the simulator's recorder and metrics are not part of these runs.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

from gpufleet.policies.catalog import profile
from gpufleet.sim.engine import Simulation
from gpufleet.sim.experiment import for_protocol, is_fgd_protocol, policy_data
from gpufleet.sim.workload import Workload
from gpufleet.sim.workloads import fgd_workload, load_philly
from gpufleet.sim.workloads import openb as openb_source
from gpufleet.sim.workloads import philly as philly_source

GOALS_S = {"openb_fgd": 10.0, "philly": 60.0}
BASELINES = {"openb_fgd": "best-fit", "philly": "fifo"}


def _case(name: str, workload: Workload, policy: str, load_s: float) -> dict[str, object]:
    prof = for_protocol(profile(policy, policy_data(workload)), is_fgd_protocol(workload))
    run = Simulation(workload, prof).run()
    wall = run.wall_seconds
    return {
        "case": name,
        "workload": workload.name,
        "policy": policy,
        "jobs": len(workload.jobs),
        "nodes": len(workload.nodes),
        "gpus": workload.gpu_count,
        "events": run.events,
        "steps": run.steps,
        "load_s": round(load_s, 3),
        "wall_s": round(wall, 3),
        "core_s": round(run.core_seconds, 3),
        "events_per_s": round(run.events / wall, 1) if wall > 0 else None,
        "goal_s": GOALS_S[name],
        "meets_goal": wall <= GOALS_S[name],
    }


def run(
    traces_root: Path,
    cases: tuple[str, ...] = tuple(GOALS_S),
    policies: tuple[str, ...] = (),
    pods: str = "default",
) -> dict[str, object]:
    """Each case under `policies` (empty: its baseline and `default`); results keyed `case/policy`."""
    results = []
    for name in cases:
        started = time.perf_counter()
        if name == "openb_fgd":
            workload = fgd_workload(traces_root / openb_source.FOLDER, seed=42, pods=pods)
        else:
            workload = load_philly(traces_root / philly_source.FOLDER)
        load_s = time.perf_counter() - started
        for policy in policies or (BASELINES[name], "default"):
            results.append(_case(name, workload, policy, load_s))
    return {
        "benchmark": "sim",
        "cases": {f"{r['case']}/{r['policy']}": r for r in results},
        "all_meet_goals": all(r["meets_goal"] for r in results),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
