"""`gpufleet sim … --spot-pool ZONE[:FRACTION]`: what spot capacity saves and what its breaker buys back, on
the chosen workload (see `gpufleet.sim.spot_study`), printed as a table or one JSON object."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from gpufleet.cli.safe_text import cell
from gpufleet.cli.variant_table import variant_table
from gpufleet.domain.costs import Pool, Price, PriceTable, read_price_csv
from gpufleet.domain.throughput_table import model_key
from gpufleet.sim.spot_study import VARIANTS, SpotStudy, load_spot_trace, parse_spot_pool, run_spot_study
from gpufleet.sim.workload import Workload, WorkloadError

COSTS_ENV = "GPUFLEET_COSTS"
PRICE_FILE = Path("gcp-gpu-prices-skypilot") / "gcp_gpu_prices_us.csv"
SPOT_FOLDER = "spot-traces-nsdi24"
_MEMORY_SUFFIX = re.compile(r"[-_ ]+\d+\s*GB$", re.IGNORECASE)


def costs_root(traces: Path | None, what: str = "--spot-pool needs the cost inputs (spot statistics, prices)") -> Path:
    """Where the cost inputs are: $GPUFLEET_COSTS, else the `costs` folder beside the traces folder."""
    if os.environ.get(COSTS_ENV):
        return Path(os.environ[COSTS_ENV]).expanduser()
    if traces is not None:
        return traces.parent / "costs"
    raise WorkloadError(
        what,
        f"set {COSTS_ENV} to the folder holding {SPOT_FOLDER}/ and {PRICE_FILE.parent}/, or give --traces",
    )


def workload_prices(path: Path, workload: Workload) -> PriceTable:
    """The price file's prices (gpufleet's CSV or the GCP catalog cut, host VM share included), with each of the
    workload's models that only a memory suffix keeps from a row (`H100-80GB` -> `H100`) priced as that row."""
    file = path
    if path.is_dir():
        file = path / PRICE_FILE.name if (path / PRICE_FILE.name).exists() else path / PRICE_FILE
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as error:
        raise WorkloadError(f"cannot read the prices: {error.strerror}", "give --prices FILE.csv", path=file) from None
    table = PriceTable(read_price_csv(text, source=file.name))
    extra = []
    for model in sorted(workload.models):
        base = _MEMORY_SUFFIX.sub("", model)
        for pool in Pool:
            price = table.usd_per_gpu_hour(base, pool)
            if (
                table.usd_per_gpu_hour(model, pool) is None
                and price is not None
                and model_key(base) != model_key(model)
            ):
                extra.append(Price(model, pool, price, f"{file.name} ({base})"))
    return table.with_prices(extra)


def spot_study(
    workload: Workload,
    spot_pool: str,
    traces: Path | None,
    spot_traces: Path | None,
    prices: Path | None,
    policy: str,
    seed: int | None,
    checkpointing_share: float,
    as_json: bool,
) -> None:
    zone, fraction = parse_spot_pool(spot_pool)
    root = None if spot_traces is not None and prices is not None else costs_root(traces)
    trace = load_spot_trace(spot_traces or (root or Path()) / SPOT_FOLDER, zone)
    table = workload_prices(prices or (root or Path()) / PRICE_FILE, workload)
    study = SpotStudy(zone, fraction, checkpointing_share, seed=seed or 0)
    report = run_spot_study(workload, study, trace, table, policy)
    report["prices"] = sorted({p.source for p in table.prices})
    if as_json:
        typer.echo(json.dumps(report, sort_keys=True))
        return
    print_spot_study(report)


def print_spot_study(report: dict[str, Any]) -> None:
    from gpufleet.cli.sim import stdout_console

    console = stdout_console()
    spot = report["spot_pool"]
    trace = spot["trace"]
    title = (
        f"Spot on {report['workload']} ({report['policy']}): {100 * spot['fraction_of_nodes']:.0f} % of nodes spot in "
        f"{spot['zone']}, {trace['interruptions_per_hour']:g} interruptions/node-h, down {trace['mean_down_hours']:g} h"
    )
    columns = ("COST $", "SAVING", "JCT MEAN H", "JCT P95 H", "INTERRUPTIONS", "LOST GPU-H", "BREAKER EVENTS")
    out = variant_table(title, columns, report, VARIANTS, _spot_cells)
    console.print(out)
    console.print(cell(f"workload: {report['workload_citation']}"))
    for line in (*report["citations"], "prices: " + "; ".join(report["prices"]), *report["notes"]):
        console.print(cell(line))


def _spot_cells(row: Mapping[str, Any]) -> tuple[str, ...]:
    saving = row.get("saving_vs_spot_off_pct")
    return (
        f"{row['cost_usd']:,.2f}",
        "-" if saving is None else f"{saving:g} %",
        f"{row['jct_mean_h']}",
        f"{row['jct_p95_h']}",
        str(row["spot_interruptions"]),
        f"{row['lost_gpu_hours']:,.2f}",
        str(row["breaker_events"]),
    )
