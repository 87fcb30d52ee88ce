"""Gavel job for job: our policies on the very job lists Gavel's own simulator generated, beside the average JCT
Gavel's simulator reached on each list (`gavel-osdi20/generated/`).

Gavel's published continuous-job figures are one seed of its own simulator, and its seeds differ by far more than
5 % (28.96, 26.76 and 23.53 h at 5.6 single-GPU jobs/h), while `--reproduce gavel` draws its own jobs. So a
reproduction is judged here on the same jobs: each row puts Gavel's policy in our simulator (`gavel-mmf` for
`max_min_fairness_perf`) beside Gavel's own figure for that list, with the error; then ours against it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufleet.sim.engine import SimSettings
from gpufleet.sim.experiment import Comparison, Progress, run_experiment
from gpufleet.sim.prices import PriceTable
from gpufleet.sim.reproduce_base import chosen_policies, data_folder, ratio, rounded
from gpufleet.sim.workload import WorkloadError
from gpufleet.sim.workloads import gavel as gavel_source
from gpufleet.sim.workloads._csv import CsvTable

GENERATED = "generated"
OWN_RESULTS = "gavel_own_results.csv"
OWN_COLUMNS = ("file", "trace", "input_job_rate_jobs_per_hr", "seed", "policy", "avg_jct_hours")
# Our profile -> Gavel's policy, where ours is that policy (as in `--reproduce gavel`).
SAME_POLICY: Mapping[str, str] = {"gavel-mmf": "max_min_fairness_perf", "max-min": "max_min_fairness"}
DEFAULT_POLICIES = ("gavel-mmf", "gavel")
MEASURED = (4000, 5000)  # Gavel's window: jobs 4000..4999


@dataclass(frozen=True, slots=True)
class OwnResult:
    """Gavel's own simulator on one job list."""

    file: str
    trace: str
    rate: float
    seed: int
    policy: str
    avg_jct_hours: float


def load_own_results(folder: Path) -> tuple[OwnResult, ...]:
    """`gavel_own_results.csv` of a folder of generated job lists."""
    table = CsvTable(folder / OWN_RESULTS, "Gavel's own results", OWN_COLUMNS)
    return tuple(
        OwnResult(
            row.text("file"),
            row.text("trace"),
            row.number("input_job_rate_jobs_per_hr", positive=True),
            row.integer("seed", minimum=0),
            row.text("policy"),
            row.number("avg_jct_hours", positive=True),
        )
        for row in table
    )


def reproduce_gavel_jobs(
    traces_root: Path,
    *,
    policies: Sequence[str] | None = None,
    prices: PriceTable | None = None,
    lists: str | Path | None = None,
    only: str = "",
    window: tuple[int, int] = MEASURED,
    progress: Progress | None = None,
) -> Comparison:
    """Every job list of `lists` (default: `gavel-osdi20/generated` under the traces) that Gavel's own results
    name, or those whose file name contains `only`; metrics over Gavel's jobs `window` (4000-4999, the end
    excluded), stopping once they are done."""
    folder = Path(lists).expanduser() if lists else data_folder(traces_root, gavel_source.FOLDER) / GENERATED
    if not (folder / OWN_RESULTS).is_file():
        raise WorkloadError(
            f"no {OWN_RESULTS} in the folder",
            "give the folder of Gavel's generated job lists (--set lists=DIR, e.g. gavel-osdi20/generated)",
            path=folder,
        )
    own = [r for r in load_own_results(folder) if only in r.file]
    if not own:
        raise WorkloadError(f"no job list named like {only!r}", "drop --set only=, or give part of a file name")
    names = chosen_policies(policies, DEFAULT_POLICIES)
    rows = []
    experiments = []
    started = time.monotonic()
    for index, theirs in enumerate(own):
        workload = gavel_source.load_gavel_jobs(folder / theirs.file)
        measured = frozenset(gavel_source.gavel_job_id(n) for n in range(*window))
        missing = measured - {tj.id for tj in workload.jobs}
        if missing:
            raise WorkloadError(
                f"lists no job {sorted(missing)[0]} of Gavel's window (jobs {window[0]}-{window[1] - 1})",
                "give a list Gavel's simulator generated up to the end of its window",
                path=folder / theirs.file,
            )
        experiment = run_experiment(
            workload,
            names,
            prices=prices,
            job_ids=measured,
            settings=SimSettings(until_done=measured),
            progress=_per_list(progress, theirs.file, index, len(own), time.monotonic() - started),
        )
        experiments.append(experiment)
        by_policy = {r.policy: r for r in experiment.results}
        same = next((by_policy[n] for n in names if SAME_POLICY.get(n) == theirs.policy), None)
        same_h = _jct_hours(same.metrics.jct.avg) if same is not None else None
        for r in experiment.results:
            jct_h = _jct_hours(r.metrics.jct.avg)
            faithful = SAME_POLICY.get(r.policy) == theirs.policy
            rows.append(
                (
                    theirs.file,
                    theirs.rate,
                    theirs.seed,
                    r.policy,
                    theirs.policy if faithful else "-",
                    theirs.avg_jct_hours,
                    rounded(jct_h, 2),
                    rounded(_error_pct(jct_h, theirs.avg_jct_hours), 1) if faithful else None,
                    ratio(jct_h, same_h) if same is not None and r is not same else None,
                    r.metrics.jobs_finished,
                )
            )
    return Comparison(
        "gavel-jobs",
        "Gavel job for job: avg JCT (hours) of jobs 4000-4999 on the lists Gavel's own simulator generated",
        (
            "list",
            "rate_jobs_per_hour",
            "gavel_seed",
            "policy",
            "same_as_gavel_policy",
            "gavel_own_avg_jct_hours",
            "avg_jct_hours",
            "error_vs_gavel_pct",
            "jct_vs_gavel_policy_here",
            "measured_jobs_finished",
        ),
        tuple(rows),
        tuple(experiments),
        f"{folder / OWN_RESULTS} (Gavel's simulator, stanford-futuredata/gavel); {gavel_source.CITATION}",
        (
            "Each list is replayed as Gavel generated it (arrival, job type, scale factor, duration on V100); the "
            "JCT is the mean over jobs 4000-4999, and the run stops once they are done, as Gavel's does.",
            "error_vs_gavel_pct: our run of Gavel's own policy against Gavel's simulator on the same jobs. "
            "jct_vs_gavel_policy_here: a policy's JCT over that of Gavel's policy in our simulator, same jobs: "
            "the like-for-like comparison.",
            "Our round mechanism is not Gavel's (see `--reproduce gavel`'s notes): the error column measures that "
            "difference.",
            f"Workload: {gavel_source.CITATION} License: {gavel_source.LICENSE}",
        ),
    )


def _jct_hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / 3600.0


def _error_pct(ours: float | None, theirs: float) -> float | None:
    return None if ours is None else 100.0 * (ours - theirs) / theirs


def _per_list(progress: Progress | None, file: str, index: int, lists: int, elapsed_s: float) -> Progress | None:
    if progress is None:
        return None
    label = f"[{index + 1}/{lists}] {file} ({elapsed_s:.0f} s so far): "
    return lambda policy, arrived, total: progress(label + policy, arrived, total)
