"""Regenerate docs/results/: every published-result comparison, from the `gpufleet sim --reproduce` command.

Each result set is one command (`SETS`), run with `--out docs/results/<set>`; then the index (README.md: the
held-out figures beside the tuned ones) and TUNED.md (`gpufleet.sim.tuned`) are written from what the
commands wrote. Wall-clock timings are dropped from the copies, so a rerun on the same code changes nothing.

    scripts/results                       every set (the Philly windows take long: about an hour in all)
    scripts/results --only fgd-default-tuning --only helios-december
    scripts/results --index               only README.md and TUNED.md, from the committed sets
    scripts/results --check               a slice: re-run FGD seed 42 under `fgd` and compare with the committed
                                          figures, and check README.md and TUNED.md are current (CI runs this)

The traces folder: --traces DIR, else $GPUFLEET_TRACES, else ../shared/traces beside the checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpufleet.sim.reproduce import HELIOS_LOAD_SCALE
from gpufleet.sim.tuned import GAVEL_TUNING_RATES, markdown

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
FGD_POLICIES = "fgd,fgd-plus,default,fgd-bf,best-fit"
SHARE_POLICIES = "fgd,fgd-plus"
SHARES = (40, 60, 80)
GAVEL_BASELINES = "gavel-mmf,max-min,tiresias"
GAVEL_BASELINE_RATES = "4.8,5.6,6.0"
HELIOS_POLICIES = "fifo,sjf,qssf,default"


def _fgd(seeds: str, pods: str, policies: str = FGD_POLICIES, share: int | None = None) -> list[str]:
    extra = ["--set", f"gpushare_pct={share}"] if share is not None else []
    return ["--reproduce", "fgd", "--seeds", seeds, "-p", policies, "--set", f"pods={pods}", *extra]


def _helios(window: str) -> list[str]:
    return ["--reproduce", "helios-philly", "-p", HELIOS_POLICIES, "--set", f"window={window}"]


# set name -> the `gpufleet sim` arguments that make it (besides --traces and --out)
SETS: dict[str, list[str]] = {
    "fgd-default-tuning": _fgd("42-46", "default"),
    "fgd-default-heldout": _fgd("47-51", "default"),
    "fgd-gpuspec33-tuning": _fgd("42-46", "gpuspec33"),
    "fgd-gpuspec33-heldout": _fgd("47-51", "gpuspec33"),
    **{f"fgd-gpushare{p}": _fgd("42-44", "default", SHARE_POLICIES, p) for p in SHARES},
    "helios-calibration": ["--reproduce", "helios-calibration", "-p", "fifo"],
    "helios-oct-nov": _helios("oct-nov"),
    "helios-september": _helios("september"),
    "helios-december": _helios("december"),
    # Every published rate of both of Gavel's continuous traces (the default of --reproduce gavel[-multi]).
    "gavel": ["--reproduce", "gavel", "-p", "gavel"],
    "gavel-multi": ["--reproduce", "gavel-multi", "-p", "gavel"],
    # Gavel's own policies as published (gavel-mmf, max-min) and Tiresias' preemptive LAS, at the loaded rates.
    "gavel-baselines": ["--reproduce", "gavel", "-p", GAVEL_BASELINES, "--rates", GAVEL_BASELINE_RATES],
    "pollux": ["--reproduce", "pollux"],
    # Loads 0.5-2.0 by scaling arrivals (default and Tiresias-like fixed sizes; Pollux's figures for reference).
    "pollux-loads": ["--reproduce", "pollux-loads"],
    # Large jobs behind small ones, with and without reserved starts (our own study: no published figures).
    "starvation": ["--reproduce", "starvation"],
    "starvation-6h": ["--reproduce", "starvation", "--set", "reserve=6h", "--set", "only=gang-stream,philly-december"],
}
CHECK_SET, CHECK_SEED, CHECK_POLICY = "fgd-default-tuning", 42, "fgd"
# Sets whose committed output predates a change of the policy they show: the reason, until they are run again.
OUT_OF_DATE: dict[str, str] = {}


def traces(given: str | None) -> Path:
    root = Path(given or os.environ.get("GPUFLEET_TRACES") or REPO.parent / "shared" / "traces").expanduser()
    if not root.is_dir():
        sys.exit(f"error: no traces folder at {root}; to fix: pass --traces DIR or set GPUFLEET_TRACES")
    return root


def gpufleet(args: Sequence[str], root: Path, out: Path) -> None:
    command = [sys.executable, "-m", "gpufleet", "sim", *args, "--traces", str(root), "--out", str(out)]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"error: {' '.join(command)} failed:\n{done.stderr}")
    print(f"  {out.name}: {time.monotonic() - started:.0f} s", flush=True)


def without_timing(data: Any) -> Any:
    """The results without wall-clock figures (the only ones that change from run to run)."""
    if isinstance(data, dict):
        return {k: without_timing(v) for k, v in data.items() if k != "timing"}
    if isinstance(data, list):
        return [without_timing(v) for v in data]
    return data


def tidy(folder: Path) -> None:
    """What is committed of a set: no wall-clock timing, no plots (the command draws them; PNGs would make
    every regeneration a binary change), JSON without indentation (these files are read by tools)."""
    data = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    (folder / "results.json").write_text(json.dumps(without_timing(data)) + "\n", encoding="utf-8")
    for plot in folder.glob("*.png"):
        plot.unlink()
    report = folder / "report.md"
    lines = report.read_text(encoding="utf-8").split("\n")
    kept = [line for line in lines if not (line.startswith("![") and line.endswith(".png)"))]
    report.write_text("\n".join(kept), encoding="utf-8")


def make_set(name: str, root: Path) -> None:
    with tempfile.TemporaryDirectory(prefix=f"gpufleet-results-{name}-") as scratch:
        fresh = Path(scratch) / name
        gpufleet(SETS[name], root, fresh)
        tidy(fresh)
        target = RESULTS / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(fresh, target)


def load(name: str) -> dict[str, Any]:
    path = RESULTS / name / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run scripts/results --only {name}")
    return dict(json.loads(path.read_text(encoding="utf-8")))


# --- the index ---------------------------------------------------------------------------------------------


def _table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:.2f}"
        return str(v)

    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows),
    ]


def _at100(data: dict[str, Any], policy: str) -> float | None:
    ours = data["series"]["ours"].get(policy)
    if not ours or 100 not in ours["arrived_pct"]:
        return None
    return float(ours["gpu_alloc_pct"][ours["arrived_pct"].index(100)])


def _published_at100(data: dict[str, Any]) -> str:
    published = data["series"]["fgd_published"].get("06-FGD")
    if not published:
        return "-"
    i = published["arrived_pct"].index(100)
    low, high = published["gpu_alloc_pct_min"][i], published["gpu_alloc_pct_max"][i]
    return f"{published['gpu_alloc_pct'][i]:.2f} [{low:.2f}, {high:.2f}]"


def present(name: str) -> bool:
    return (RESULTS / name / "results.json").is_file()


def _fgd_section(lists: Sequence[str]) -> list[str]:
    lines = [
        "## FGD protocol on openb: GPU allocation % at 100 % arrived load",
        "",
        "Mean over the seeds; published: the FGD authors' FGD, mean [min, max] over their seeds 42-51. The "
        "fgd-plus scarcity weight and the fgd-bf best-fit weight were tuned on seeds 42-46 (gpuspec33 and "
        "default): seeds 47-51 are held out. Data: Weng et al., ATC'23; Alibaba cluster-trace-gpu-v2023.",
        "",
    ]
    rows = []
    for pods in lists:
        tuning = load(f"fgd-{pods}-tuning") if present(f"fgd-{pods}-tuning") else None
        held = load(f"fgd-{pods}-heldout") if present(f"fgd-{pods}-heldout") else None
        either = tuning or held
        if either is None:
            continue
        for policy in FGD_POLICIES.split(","):
            rows.append(
                (
                    pods,
                    policy,
                    _at100(tuning, policy) if tuning else None,
                    _at100(held, policy) if held else None,
                    _published_at100(either),
                )
            )
    lines += _table(("pod list", "policy", "seeds 42-46 (tuning)", "seeds 47-51 (held out)", "published FGD"), rows)
    return [*lines, ""]


def _share_section(shares: Sequence[int]) -> list[str]:
    lines = [
        "## More GPU sharing: openb default resampled (all held out)",
        "",
        "Our seeded resamples of the default list with fractional pods at 40-80 % of the GPU request (default: "
        "28.5 %), seeds 42-44. Nothing was tuned on them. Published: the authors' own `gpushare` lists (another "
        "draw of the same kind).",
        "",
    ]
    rows = []
    for share in (s for s in shares if present(f"fgd-gpushare{s}")):
        data = load(f"fgd-gpushare{share}")
        rows.append(
            (
                f"{share} %",
                *(_at100(data, p) for p in SHARE_POLICIES.split(",")),
                _published_at100(data),
            )
        )
    lines += _table(("fractional share", *SHARE_POLICIES.split(","), "published FGD (their list)"), rows)
    return [*lines, ""]


def _comparison(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["policy"]: row for row in data["comparison"]}


def _helios_section(windows: Sequence[str]) -> list[str]:
    calibration = load("helios-calibration") if present("helios-calibration") else None
    windows = [w for w in windows if present(f"helios-{w}")]
    lines = [
        "## Philly on Helios' VC cluster: average JCT, and its ratio to our strict FIFO",
        "",
        f"Arrivals compressed x{HELIOS_LOAD_SCALE:g} (`gpufleet.sim.reproduce.HELIOS_LOAD_SCALE`, calibrated by "
        "[helios-calibration](helios-calibration/report.md)). QSSF's "
        "window, quantile and aging and default's LAS minimum run were tuned on Oct-Nov (Helios' window, the "
        "only one Helios published); September and December are held out, at the same load. September is light "
        "(its strict FIFO queues minutes, not hours), so every policy is within a fraction of a percent of FIFO "
        "there and it says little about ordering; December is the held-out month with contention. Data: Jeon et "
        "al., ATC'19 (Philly), job table via Pollux (OSDI'21), VC sizes and published results from Helios (SC'21).",
        "",
    ]
    rows = []
    per_window = {w: _comparison(load(f"helios-{w}")) for w in windows}
    for policy in HELIOS_POLICIES.split(","):
        cells: list[Any] = [policy]
        for window in windows:
            row = per_window[window].get(policy, {})
            cells += [row.get("avg_jct_s"), row.get("jct_vs_our_fifo")]
        cells.append(per_window.get("oct-nov", {}).get(policy, {}).get("helios_jct_vs_fifo"))
        rows.append(cells)
    columns = ["policy"]
    for window in windows:
        label = f"{window} (tuning)" if window == "oct-nov" else f"{window} (held out)"
        columns += [f"{label} avg JCT s", "vs FIFO"]
    columns.append("Helios' ratio (Oct-Nov)")
    lines += _table(columns, rows)
    if calibration is not None:
        cal_rows = [
            (f"x{r['load_scale']:g}", r["avg_queueing_s"], r["helios_fifo_avg_queue_s"], "yes" if r["chosen"] else "no")
            for r in calibration["comparison"]
        ]
        lines += ["", "Calibration (strict FIFO on Oct-Nov):", ""]
        lines += _table(("load", "our FIFO avg queueing s", "Helios' FIFO avg queueing s", "chosen"), cal_rows)
    return [*lines, ""]


def _gavel_section() -> list[str]:
    lines: list[str] = []
    for name, trace in (("gavel", "single-GPU"), ("gavel-multi", "multi-GPU")):
        if not present(name):
            continue
        lines += [
            f"## Gavel's continuous {trace} trace: average JCT (hours) and rho against Gavel's",
            "",
            f"Tuned on the single-GPU trace at {GAVEL_TUNING_RATES} jobs/h (see TUNED.md); every other rate, and "
            "the whole multi-GPU trace, is held out. rho is Gavel's: each job's JCT over its JCT under Gavel's "
            "isolated allocation (1/n of each GPU model) on the same arrivals, run in rounds as Gavel's simulator "
            "runs it (`gpufleet.sim.isolated`)"
            + (" (this set is out of date, see Out of date below)" if name in OUT_OF_DATE else "")
            + ". Data: Narayanan et al., OSDI'20.",
            "",
        ]
        rows = [
            (
                r["rate_jobs_per_hour"],
                r["policy"],
                r["gavel_policy"],
                r["avg_jct_hours"],
                r["gavel_avg_jct_hours"],
                r["jct_ratio"],
                r["avg_ftf_rho"],
                r["gavel_avg_ftf_rho"],
            )
            for r in load(name)["comparison"]
        ]
        lines += _table(
            ("rate (jobs/h)", "policy", "Gavel's policy", "avg JCT h", "Gavel's avg JCT h", "ratio", "rho", "Gavel's"),
            rows,
        )
        lines += [""]
    if present("gavel-baselines"):
        lines += ["Baselines on the single-GPU trace (each beside the published policy it is, if any):", ""]
        rows = [
            (
                r["rate_jobs_per_hour"],
                r["policy"],
                r["gavel_policy"],
                r["avg_jct_hours"],
                r["gavel_avg_jct_hours"],
                r["avg_ftf_rho"],
                r["gavel_avg_ftf_rho"],
            )
            for r in load("gavel-baselines")["comparison"]
        ]
        lines += _table(
            ("rate (jobs/h)", "policy", "Gavel's policy", "avg JCT h", "Gavel's avg JCT h", "rho", "Gavel's"), rows
        )
        lines += [""]
    return lines


def _pollux_section() -> list[str]:
    if not present("pollux"):
        return []
    lines = [
        "## Pollux's eight workloads: average JCT (s) against Pollux's published figures",
        "",
        "Run times from Pollux's per-application measurements. The baselines run each job at its fixed GPU count "
        "and batch (TunedJobs); default resizes the same jobs as elastic ones (1 to 32 GPUs, batch chosen per "
        "epoch as Pollux's adaptive jobs do, 30 s per resize). The resize constants were tuned on workloads 1-4; "
        "5-8 are held out (their own mean row). Data: Qiao et al., OSDI'21 (petuum/adaptdl osdi21-artifact), "
        "jobs from Philly (Jeon et al., ATC'19).",
        "",
    ]
    rows = [
        (
            r["policy"],
            r["workload"],
            r["avg_jct_s"],
            r["pollux_avg_jct_s"],
            r["tiresias_avg_jct_s"],
            r["ratio_to_tiresias"],
        )
        for r in load("pollux")["comparison"]
        if r["workload"].startswith("mean") or r["policy"] in ("tiresias", "default")
    ]
    header = ("policy", "workload", "avg JCT s", "Pollux's s", "Tiresias' s", "ratio to Tiresias")
    lines += _table(header, rows)
    if present("pollux-loads"):
        lines += [
            "",
            "At other loads (pollux-loads: arrivals scaled, the same 160 jobs per workload; Pollux's published job "
            "loads sample more or fewer jobs over the same 8 hours, so only load 1 is like for like):",
            "",
        ]
        loads = [
            (r["load"], r["policy"], r["avg_jct_s"], r["pollux_avg_jct_s"], r["tiresias_avg_jct_s"])
            for r in load("pollux-loads")["comparison"]
            if r["workloads"] == "mean"
        ]
        lines += _table(("load", "policy", "mean avg JCT s", "Pollux's s", "Tiresias' s"), loads)
    return [*lines, ""]


def _starvation_section() -> list[str]:
    sets = [name for name in ("starvation", "starvation-6h") if present(name)]
    if not sets:
        return []
    lines = [
        "## Large jobs behind small ones: waits with and without a reserved start",
        "",
        "Our own study (`--reproduce starvation`): each workload under default and fifo-backfill, and the same with "
        "`+reserve=2h` (and `+reserve=6h`): a job that has waited that long gets a reserved start (EASY backfill). "
        "Large: jobs of 8 GPUs or more; wait: submission to first start. gang-stream is seeded synthetic (1-GPU jobs "
        "at 0.8x capacity, an 8-GPU job every 3 h), with run time limits known and without; Philly December x8 is "
        "held out (no constant was tuned on it; the thresholds were chosen by judgement; the rule that a job refused by "
        "its queue's quota gets no reserved start was added after a first run on it, see the set's notes); openb runs the FGD "
        "protocol (pods never end; allocation at 100 % arrived load). Data: Philly (Jeon et al., ATC'19; job table via "
        "Pollux, OSDI'21; VC sizes from Helios, SC'21), openb (Weng et al., ATC'23, Alibaba cluster-trace-gpu-v2023).",
        "",
    ]
    columns = ("workload", "policy", "avg_jct_s", "large_jobs", "large_never_started", "large_p99_wait_s",
               "large_max_wait_s", "large_avg_jct_s", "gpu_alloc_pct")  # fmt: skip
    header = ("workload", "policy", "avg JCT s", "large jobs", "never started", "large p99 wait s", "large max wait s",
              "large avg JCT s", "GPU alloc %")  # fmt: skip
    rows = [
        tuple(r[key] for key in columns)
        for name in sets
        for r in load(name)["comparison"]
        if name == "starvation" or "+reserve" in r["policy"]
    ]
    lines += _table(header, rows)
    return [*lines, ""]


def index() -> str:
    missing = [name for name in SETS if not present(name)]
    lines = [
        "# Results",
        "",
        "Generated by `scripts/results`; do not edit. Each folder is the output of one `gpufleet sim --reproduce "
        "... --out DIR` command (report.md, results.json, comparison.csv; the command also draws plots), with "
        "the command in [`scripts/results.py`](../../scripts/results.py). Constants tuned on some of this data, "
        "and on which: [TUNED.md](TUNED.md).",
        "",
        *_fgd_section(("default", "gpuspec33")),
        *_share_section(SHARES),
        *_helios_section(("oct-nov", "september", "december")),
        *_gavel_section(),
        *_pollux_section(),
        *_starvation_section(),
    ]
    if missing:
        lines += [
            "## Not generated yet",
            "",
            "These sets are defined in `scripts/results.py` but their output is not committed; their rows above are "
            "empty. Run `scripts/results --only NAME` for each: " + ", ".join(f"`{m}`" for m in missing) + ".",
            "",
        ]
    stale = {name: why for name, why in OUT_OF_DATE.items() if name not in missing}
    if stale:
        lines += ["## Out of date", "", "These committed sets were made by an earlier version of the code:", ""]
        lines += [f"- `{name}`: {why}" for name, why in stale.items()]
        lines += [""]
    return "\n".join(lines)


def write_index() -> None:
    for name in SETS:
        if present(name):
            tidy(RESULTS / name)
    (RESULTS / "TUNED.md").write_text(markdown(), encoding="utf-8")
    (RESULTS / "README.md").write_text(index(), encoding="utf-8")


# --- the CI slice ------------------------------------------------------------------------------------------


def check(root: Path) -> int:
    """Re-run one seed of one committed set and compare; check the index and TUNED.md are current."""
    problems: list[str] = []
    if (RESULTS / "TUNED.md").read_text(encoding="utf-8") != markdown():
        problems.append("docs/results/TUNED.md differs from gpufleet.sim.tuned")
    if (RESULTS / "README.md").read_text(encoding="utf-8") != index():
        problems.append("docs/results/README.md differs from the committed result sets")
    committed = load(CHECK_SET)
    seeds = committed["series"]["seeds"]
    experiment = committed["experiments"][seeds.index(CHECK_SEED)]
    expected = experiment["policies"][CHECK_POLICY]["fgd_steps"]
    pods = next(a.split("=", 1)[1] for a in SETS[CHECK_SET] if a.startswith("pods="))
    with tempfile.TemporaryDirectory(prefix="gpufleet-results-check-") as scratch:
        out = Path(scratch) / "slice"
        gpufleet(
            [
                "--reproduce",
                "fgd",
                "--seeds",
                f"{CHECK_SEED}-{CHECK_SEED}",
                "-p",
                CHECK_POLICY,
                "--set",
                f"pods={pods}",
            ],
            root,
            out,
        )
        fresh = json.loads((out / "results.json").read_text(encoding="utf-8"))
    got = fresh["experiments"][0]["policies"][CHECK_POLICY]["fgd_steps"]
    if got != expected:
        problems.append(
            f"{CHECK_SET}: {CHECK_POLICY} on seed {CHECK_SEED} gives other figures than committed "
            f"(at 100 %: {fresh['series']['per_seed_gpu_alloc_pct_at_100'][CHECK_POLICY]} vs "
            f"{committed['series']['per_seed_gpu_alloc_pct_at_100'][CHECK_POLICY][str(CHECK_SEED)]})"
        )
    for problem in problems:
        print(f"error: {problem}; to fix: run scripts/results (or --index) and commit docs/results", file=sys.stderr)
    if not problems:
        print(f"docs/results is current: {CHECK_SET} seed {CHECK_SEED} under {CHECK_POLICY} reproduces, index current")
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", help="folder holding the public trace folders")
    parser.add_argument("--only", action="append", choices=sorted(SETS), help="regenerate only this set")
    parser.add_argument("--index", action="store_true", help="only rewrite README.md and TUNED.md")
    parser.add_argument("--check", action="store_true", help="the CI slice (see the module docstring)")
    parser.add_argument("--parallel", type=int, default=1, help="sets run at once (default 1)")
    args = parser.parse_args(argv)
    if args.check:
        return check(traces(args.traces))
    if not args.index:
        root = traces(args.traces)
        names = args.only or list(SETS)
        RESULTS.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
            list(pool.map(make_set, names, [root] * len(names)))
    write_index()
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
