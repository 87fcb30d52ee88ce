"""`gpufleet sim --comm-study`: what the communication model changes on a workload (`sim.comm_study`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import typer

from gpufleet.cli.variant_table import variant_table
from gpufleet.sim.comm_study import VARIANTS, CommStudy, run_comm_study
from gpufleet.sim.workload import Workload, WorkloadError


def parse_limit(text: str) -> float | None:
    """`0.25`, `25%` -> 0.25; `score` -> None (no limit: the score alone)."""
    value = text.strip().lower()
    if value == "score":
        return None
    try:
        limit = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        limit = -1.0
    if not 0 < limit < 1:
        raise WorkloadError(f"--comm-study is {text!r}", "give a max_comm_overhead in (0, 1) such as 0.25, or 'score'")
    return limit


def comm_study_command(workload: Workload, limit: str, policy: str, seed: int | None, as_json: bool) -> None:
    report = run_comm_study(workload, CommStudy(parse_limit(limit), seed or 0), policy)
    if as_json:
        typer.echo(json.dumps(report, sort_keys=True))
        return
    print_comm_study(report)


def print_comm_study(report: dict[str, Any]) -> None:
    from gpufleet.cli.sim import stdout_console

    console = stdout_console()
    limit = report["max_comm_overhead"]
    title = (
        f"Communication model on {report['workload']} ({report['policy']}): {report['gangs_with_comm_needs']} gangs, "
        f"max_comm_overhead {'none' if limit is None else f'{100 * limit:g} %'}; "
        f"{report['placements_changed']} of {report['placements_compared']} first placements changed"
    )
    columns = (
        "JCT MEAN H",
        "JCT P95 H",
        "GANG JCT MEAN H",
        "UNFINISHED",
        "HELD BACK",
        "ACROSS NODES",
        "COMM MEAN %",
        "COMM MAX %",
    )
    out = variant_table(title, columns, report, VARIANTS, _comm_cells)
    console.print(out)
    unfinished = report["variants"]["model on"]["jobs_unfinished"]
    if unfinished:
        console.print(f"{unfinished} job(s) never placed with the model on: no placement within their limit")
    console.print(f"JCT over the {report['jobs_in_jct']} jobs both variants finished")
    console.print(f"workload: {report['workload_citation']}")
    for note in report["notes"]:
        console.print(f"- {note}")


def _comm_cells(row: Mapping[str, Any]) -> tuple[str, ...]:
    keys = (
        "jct_mean_h",
        "jct_p95_h",
        "gang_jct_mean_h",
        "jobs_unfinished",
        "gangs_held_back_by_limit",
        "gangs_placed_across_nodes",
        "gang_comm_overhead_mean_pct",
        "gang_comm_overhead_max_pct",
    )
    return tuple(str(row[key]) for key in keys)
