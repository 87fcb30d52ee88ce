"""Write a simulation's results to a folder: results.json, results.csv, PNG plots and report.md.

Every file that shows results names the workload's source: results.json carries `citation`, `license` and
`assumptions` per workload; report.md prints them under the tables; each plot's footer names the workload.

    results.json        the experiment (or the comparison with published results, and its experiments)
    results.csv         one row per (workload, policy) with every one-value metric
    comparison.csv      with --reproduce: our figures beside the published ones
    jct_cdf.png         CDF of job completion time per policy (jobs that finished)
    fgd_allocation.png  FGD protocol: GPU allocation % vs arrived load, with the published curves if given
    queue_time.png      mean queueing delay per queue and policy
    gpu_allocation.png  GPU allocation % over simulated time per policy
    report.md           all of the above, with the citation, license and assumptions
"""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.sim.experiment import Comparison, Experiment
from gpufleet.sim.plot_series import gpu_allocation, jct_cdf
from gpufleet.sim.workload import WorkloadError

SUMMARY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("avg_jct_s", "avg JCT (s)"),
    ("p95_jct_s", "p95 JCT (s)"),
    ("avg_queueing_s", "avg queueing (s)"),
    ("p95_queueing_s", "p95 queueing (s)"),
    ("makespan_s", "makespan (s)"),
    ("gpu_alloc_pct", "GPU alloc %"),
    ("fragmentation_pct_of_capacity", "frag % cap"),
    ("preemptions", "preemptions"),
    ("cost_usd", "cost (USD)"),
    ("jain_slowdown", "Jain (slowdown)"),
    ("avg_ftf_rho", "avg rho"),
)
# Shown when some run had cluster changes (node failures, quota changes, nodes added).
EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("node_failures", "node failures"),
    ("jobs_lost_to_failures", "jobs lost to failures"),
    ("failure_lost_gpu_hours", "GPU-h lost to failures"),
    ("node_down_gpu_hours", "GPU-h down"),
)
FGD_REPORT_STEPS = (50, 80, 90, 95, 100, 110, 120, 130)


def has_cluster_events(experiment: Experiment) -> bool:
    return any(r.metrics.cluster_events for r in experiment.results)


def fmt(value: Any) -> str:
    """A table cell: thousands separators for large numbers, 2-4 significant decimals for small ones."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.2f}"
        return f"{value:.3g}" if value else "0"
    return str(value)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "workload"


def citation_line(experiment: Experiment) -> str:
    w = experiment.workload
    return f"Workload {w.name}: {w.citation} License: {w.license}"


# --- files -----------------------------------------------------------------------------------------------


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _write_results_csv(path: Path, experiments: Sequence[Experiment]) -> None:
    rows = [
        {"workload": e.workload.name, "policy": r.policy, **r.metrics.scalars()} for e in experiments for r in e.results
    ]
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})


def _write_comparison_csv(path: Path, comparison: Comparison) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(comparison.columns)
        for row in comparison.rows:
            writer.writerow(["" if v is None else v for v in row])


# --- plots -----------------------------------------------------------------------------------------------

PLOTS_MISSING = "PNG plots were not written: matplotlib is not installed (to fix: pip install 'gpufleet[plots]')."


def plots_available() -> bool:
    """Whether matplotlib (the `plots` extra) is installed; without it a report is written without plots."""
    return importlib.util.find_spec("matplotlib") is not None


def _pyplot() -> Any:
    # matplotlib is heavy: loaded only when a report is written, with the file-only Agg backend.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _footer(fig: Any, experiment: Experiment) -> None:
    w = experiment.workload
    lines = textwrap.wrap(f"Workload {w.name}. Source: {w.citation}", 170)
    if len(lines) > 3:
        lines = [*lines[:2], lines[2][:160] + " [...]"]
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=6, ha="left", va="bottom")


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=110, metadata={"Software": None})
    _pyplot().close(fig)
    return path


def plot_jct_cdf(experiment: Experiment, path: Path) -> Path | None:
    curves = jct_cdf(experiment)
    if not curves:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, curve in curves.items():
        ax.step(np.maximum(curve["jct_s"], 1e-3), curve["fraction"], where="post", label=policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s, log scale)")
    ax.set_ylabel("fraction of finished jobs")
    ax.set_title(f"JCT CDF - {experiment.workload.name}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.subplots_adjust(bottom=0.2)
    _footer(fig, experiment)
    return _save(fig, path)


def plot_fgd_allocation(
    experiment: Experiment, path: Path, published: dict[str, Any] | None = None, names: dict[str, str] | None = None
) -> Path | None:
    """GPU allocation vs arrived load per policy (solid), the published mean of the matching policy (dashed, same
    colour; `names` maps our policy to the published name); right panel: the saturated region."""
    if not experiment.fgd_protocol:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    published = published or {}
    names = names or {}
    top = max((s.arrived_pct for r in experiment.results for s in r.metrics.fgd_steps), default=130)
    for ax in axes:
        shown: set[str] = set()
        for i, r in enumerate(experiment.results):
            colour = colours[i % len(colours)]
            steps = r.metrics.fgd_steps
            ax.plot(
                [s.arrived_pct for s in steps],
                [s.gpu_alloc_pct for s in steps],
                color=colour,
                marker=".",
                label=r.policy,
            )
            theirs = names.get(r.policy)
            if theirs in published:
                curve = published[theirs]
                ax.plot(
                    curve["arrived_pct"],
                    curve["gpu_alloc_pct"],
                    color=colour,
                    linestyle="--",
                    label=f"{theirs} (published)",
                )
                shown.add(theirs)
        for theirs, curve in sorted(published.items()):
            if theirs not in shown:
                ax.plot(
                    curve["arrived_pct"],
                    curve["gpu_alloc_pct"],
                    color="grey",
                    linestyle=":",
                    label=f"{theirs} (published)",
                )
        ax.plot([0, 100], [0, 100], color="grey", linewidth=0.6, linestyle=":")
        ax.grid(True, alpha=0.3)
        ax.set_xlabel("arrived GPU request (% of GPU capacity)")
    axes[0].set_xlim(0, top)
    axes[0].set_ylabel("GPU allocation (% of capacity)")
    axes[0].set_title(f"FGD protocol - {experiment.workload.name}", fontsize=10)
    axes[0].legend(fontsize=7)
    axes[1].set_xlim(80, top)
    axes[1].set_ylim(80, 100)
    axes[1].set_title("saturation (zoom)", fontsize=10)
    fig.subplots_adjust(bottom=0.22, wspace=0.25, left=0.07, right=0.98)
    _footer(fig, experiment)
    return _save(fig, path)


def plot_rate_curve(comparison: Comparison, path: Path) -> Path | None:
    """Average JCT against arrival rate: ours per policy (solid), the published policy it is compared with
    (dashed, same colour), Gavel's agnostic baselines (grey, dotted). For comparisons by rate (Gavel)."""
    columns = comparison.columns
    if "rate_jobs_per_hour" not in columns or "avg_jct_hours" not in columns:
        return None
    rate_i, policy_i, jct_i = (columns.index(c) for c in ("rate_jobs_per_hour", "policy", "avg_jct_hours"))
    ours: dict[str, list[tuple[float, float]]] = {}
    for row in comparison.rows:
        if row[jct_i] is not None:
            ours.setdefault(str(row[policy_i]), []).append((float(row[rate_i]), float(row[jct_i])))
    published: dict[str, Any] = comparison.series.get("published", {})
    names: dict[str, str] = comparison.series.get("policy_names", {})
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    shown: set[str] = set()
    for i, (policy, points) in enumerate(sorted(ours.items())):
        colour = colours[i % len(colours)]
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], color=colour, marker="o", label=f"{policy} (ours)")
        theirs = names.get(policy)
        if theirs in published and theirs not in shown:
            curve = published[theirs]
            ax.plot(
                curve["rate_jobs_per_hour"],
                curve["avg_jct_hours"],
                color=colour,
                linestyle="--",
                marker=".",
                label=f"{theirs} (published)",
            )
            shown.add(theirs)
    for theirs, curve in sorted(published.items()):
        if theirs not in shown and theirs in ("max_min_fairness", "fifo"):  # the baselines, for scale
            ax.plot(
                curve["rate_jobs_per_hour"],
                curve["avg_jct_hours"],
                color="grey",
                linestyle=":",
                linewidth=0.8,
                label=f"{theirs} (published)",
            )
    top = max((p[1] for points in ours.values() for p in points), default=50.0)
    ax.set_ylim(0, min(max(top * 1.3, 50.0), 200.0))
    ax.set_xlabel("arrival rate (jobs/hour)")
    ax.set_ylabel("average JCT (hours)")
    ax.set_title(comparison.title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    if comparison.experiments:
        _footer(fig, comparison.experiments[0])
    return _save(fig, path)


def plot_queue_time(experiment: Experiment, path: Path) -> Path | None:
    if experiment.fgd_protocol:
        return None  # pods never leave: every placed pod started at once, there is no queueing to show
    queues = sorted({q.name for r in experiment.results for q in r.metrics.queues if q.avg_queueing_s is not None})
    if not queues:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(7, 0.6 * len(queues) * len(experiment.results)), 4.5))
    width = 0.8 / max(1, len(experiment.results))
    x = np.arange(len(queues))
    for i, r in enumerate(experiment.results):
        by_queue = {q.name: q.avg_queueing_s or 0.0 for q in r.metrics.queues}
        ax.bar(x + i * width, [by_queue.get(q, 0.0) for q in queues], width, label=r.policy)
    ax.set_xticks(x + width * (len(experiment.results) - 1) / 2)
    ax.set_xticklabels(queues, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("mean queueing delay (s)")
    ax.set_title(f"Queueing delay per queue - {experiment.workload.name}")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    fig.subplots_adjust(bottom=0.3)
    _footer(fig, experiment)
    return _save(fig, path)


def plot_gpu_allocation(experiment: Experiment, path: Path) -> Path | None:
    curves = gpu_allocation(experiment)
    if not curves:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, curve in curves.items():
        ax.step(curve["hours"], curve["pct"], where="post", label=policy)
    ax.set_xlabel("simulated time (hours)")
    ax.set_ylabel("GPU allocation (% of capacity)")
    ax.set_ylim(0, 105)
    ax.set_title(f"GPU allocation over time - {experiment.workload.name}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.subplots_adjust(bottom=0.2)
    _footer(fig, experiment)
    return _save(fig, path)


# --- markdown --------------------------------------------------------------------------------------------


def _md_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return lines


def _experiment_md(experiment: Experiment, images: dict[str, Path], heading: str = "##") -> list[str]:
    w = experiment.workload
    lines = [f"{heading} Workload `{w.name}`", ""]
    models = ", ".join(f"{m} x{n}" for m, n in w.gpus_by_model().items())
    lines += [
        f"{len(w.nodes):,} nodes, {w.gpu_count:,} GPUs ({models}), {len(w.queues)} queue(s), {len(w.jobs):,} jobs"
        + (
            " - FGD protocol (pods never leave, so nothing is preempted; measured at each 5 % of arrived load)."
            if experiment.fgd_protocol
            else "."
        )
        + (
            f" Job-level metrics over {len(experiment.job_ids):,} selected jobs."
            if experiment.job_ids is not None
            else ""
        ),
        "",
    ]
    if experiment.what_if:
        lines += [f"{heading}# What-if changes", ""]
        lines += [f"- {change}" for change in experiment.what_if]
        lines += [""]
    columns = SUMMARY_COLUMNS + (EVENT_COLUMNS if has_cluster_events(experiment) else ())
    rows = [[r.policy, *(r.metrics.as_dict().get(k) for k, _ in columns)] for r in experiment.results]
    lines += _md_table(["policy", *(label for _, label in columns)], rows)
    lines += ["", f"*{citation_line(experiment)}*", ""]
    if experiment.fgd_protocol:
        lines += [f"{heading}# GPU allocation % / FGD fragmentation % of capacity at arrived load", ""]
        steps = list(FGD_REPORT_STEPS)
        fgd_rows = []
        for r in experiment.results:
            at = {s.arrived_pct: s for s in r.metrics.fgd_steps}
            fgd_rows.append(
                [
                    r.policy,
                    *(
                        f"{at[p].gpu_alloc_pct:.2f} / {at[p].frag_gpu_pct_of_capacity:.2f}" if p in at else None
                        for p in steps
                    ),
                ]
            )
        lines += _md_table(["policy", *(f"{p} %" for p in steps)], fgd_rows)
        lines += ["", f"*{citation_line(experiment)}*", ""]
    lines += [f"{heading}# Per queue", ""]
    queue_rows = [
        [r.policy, q.name, q.jobs, q.finished, q.avg_jct_s, q.avg_queueing_s, q.avg_slowdown, q.gpu_share_pct]
        for r in experiment.results
        for q in r.metrics.queues
    ]
    lines += _md_table(
        ["policy", "queue", "jobs", "finished", "avg JCT (s)", "avg queueing (s)", "avg slowdown", "GPU share %"],
        queue_rows,
    )
    lines += [
        "",
        f"{heading}# Source, license and assumptions",
        "",
        f"- Citation: {w.citation}",
        f"- License: {w.license}",
    ]
    lines += [f"- Assumption: {a}" for a in w.assumptions]
    lines += [f"- Note: {n}" for n in experiment.notes]
    if experiment.prices is not None:
        lines += [f"- Prices: {experiment.prices.basis} (from {experiment.prices.source})."]
        unpriced = sorted({m for r in experiment.results for m in r.metrics.unpriced_models})
        if unpriced:
            lines += [f"- No price for GPU model(s) {', '.join(unpriced)}: their GPU-hours are not in `cost_usd`."]
    else:
        lines += ["- Cost: no price table given (`--prices PATH`), so no cost is computed."]
    lines += [""]
    for label, image in images.items():
        lines += [f"![{label}]({image.name})", ""]
    return lines


def _report_md(
    experiments: Sequence[Experiment],
    comparison: Comparison | None,
    images: dict[str, dict[str, Path]],
    plots: bool = True,
) -> str:
    lines = ["# gpufleet simulation report", ""]
    if not plots:
        lines += [PLOTS_MISSING, ""]
    if comparison is not None:
        lines += [f"## {comparison.title}", ""]
        lines += _md_table(comparison.columns, comparison.rows)
        lines += ["", f"*Published figures: {comparison.source}*", ""]
        lines += [f"- {n}" for n in comparison.notes]
        lines += [""]
        for label, path in images.get("_comparison", {}).items():
            lines += [f"![{label}]({path.name})", ""]
    for experiment in experiments:
        lines += _experiment_md(
            experiment, images.get(experiment.workload.name, {}), "##" if comparison is None else "###"
        )
    lines += [
        "## Definitions",
        "",
        "JCT = finish - submit; queueing = first start - submit; pending = all time in state pending (log); "
        "GPU alloc % = time-weighted allocated / capacity over the makespan; fragmentation = FGD measure "
        "(Weng et al., ATC'23) with the workload itself as target workload, time-weighted over its samples; "
        "Jain (slowdown) = Jain's index over queues of their mean slowdown; rho = JCT / run time on a 1/N share "
        "(Themis); node failures, jobs lost to failures (attempts running on a node when it went down) and "
        "GPU-hours lost to them (work since the last checkpoint) come from the simulated backend. "
        "Full definitions: `gpufleet.sim.metrics`.",
        "",
    ]
    return "\n".join(lines)


def write_report(
    out_dir: str | Path, experiments: Sequence[Experiment], comparison: Comparison | None = None
) -> list[Path]:
    """Write every file into `out_dir` (created if missing); returns the paths written."""
    out = Path(out_dir).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise WorkloadError(
            f"cannot create the output folder: {error.strerror}", "give a writable folder", path=out
        ) from None
    if not out.is_dir():
        raise WorkloadError("is not a folder", "give a folder for the results (--out DIR)", path=out)
    written: list[Path] = []
    data = (
        comparison.as_dict()
        if comparison is not None
        else (
            experiments[0].as_dict() if len(experiments) == 1 else {"experiments": [e.as_dict() for e in experiments]}
        )
    )
    _write_json(out / "results.json", data)
    _write_results_csv(out / "results.csv", experiments)
    written += [out / "results.json", out / "results.csv"]
    if comparison is not None:
        _write_comparison_csv(out / "comparison.csv", comparison)
        written.append(out / "comparison.csv")
    images: dict[str, dict[str, Path]] = {}
    several = len(experiments) > 1
    published = comparison.series.get("fgd_published") if comparison is not None else None
    names = comparison.series.get("policy_names") if comparison is not None else None
    plots = plots_available()
    for experiment in experiments:
        suffix = f"-{_slug(experiment.workload.name)}" if several else ""
        if not plots:
            images[experiment.workload.name] = {}
            continue
        made = {
            "JCT CDF": plot_jct_cdf(experiment, out / f"jct_cdf{suffix}.png"),
            "GPU allocation vs arrived load (FGD protocol)": plot_fgd_allocation(
                experiment, out / f"fgd_allocation{suffix}.png", published, names
            ),
            "Queueing delay per queue": plot_queue_time(experiment, out / f"queue_time{suffix}.png"),
            "GPU allocation over time": plot_gpu_allocation(experiment, out / f"gpu_allocation{suffix}.png"),
        }
        kept = {label: p for label, p in made.items() if p is not None}
        images[experiment.workload.name] = kept
        written += kept.values()
    if plots and comparison is not None:
        curve = plot_rate_curve(comparison, out / "jct_vs_rate.png")
        if curve is not None:
            images["_comparison"] = {"Average JCT against arrival rate, ours beside the published": curve}
            written.append(curve)
    (out / "report.md").write_text(_report_md(experiments, comparison, images, plots), encoding="utf-8")
    written.append(out / "report.md")
    return written
