"""`gpufleet sim --checkpoint-sweep [--checkpoint-setting C_S:MTBF_H …]`: time lost to failures and checkpoints
over a sweep of checkpoint intervals, and where its least lies against the control plane's Young/Daly interval
(see `gpufleet.sim.checkpoint_sweep`); a table or one JSON object, and with --out a JSON file and a plot."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli.safe_text import cell
from gpufleet.sim.checkpoint_sweep import DEFAULT_SETTINGS, SweepResult, parse_setting, plot, sweep
from gpufleet.sim.report import PLOTS_MISSING, plots_available
from gpufleet.sim.workload import WorkloadError


def checkpoint_sweep(settings: list[str], seed: int | None, out: Path | None, as_json: bool) -> None:
    chosen = [parse_setting(text) for text in settings] if settings else list(DEFAULT_SETTINGS)
    results = [sweep(setting, seed=0 if seed is None else seed) for setting in chosen]
    notes: list[str] = []
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / "checkpoint_sweep.json").write_text(json.dumps([r.to_dict() for r in results], indent=1) + "\n")
            if plots_available():
                plot(results, str(out / "checkpoint_sweep.png"))
                notes.append(f"written: {out / 'checkpoint_sweep.json'}, {out / 'checkpoint_sweep.png'}")
            else:
                notes.append(f"written: {out / 'checkpoint_sweep.json'}; {PLOTS_MISSING}")
        except OSError as error:
            raise WorkloadError(f"cannot write to {out}: {error}", "give a writable --out folder") from None
    if as_json:
        typer.echo(json.dumps({"results": [_brief(r) for r in results], "notes": notes}, indent=1))
        return
    console = Console(soft_wrap=True)
    console.print(_table(results))
    for note in notes:
        console.print(cell(note))


def _brief(result: SweepResult) -> dict[str, object]:
    data = result.to_dict()
    del data["intervals_s"], data["lost_fraction"]
    return data


def _table(results: list[SweepResult]) -> Table:
    table = Table(title="Checkpoint interval sweep vs Young/Daly sqrt(2CM) (seeded exponential failures)")
    for name in ("setting", "C", "MTBF", "sqrt(2CM)", "best in sweep", "best/pred.", "lost at best", "lost at pred."):
        table.add_column(name, justify="left" if name == "setting" else "right")
    for r in results:
        data = r.to_dict()
        table.add_row(
            cell(r.setting.name),
            f"{r.setting.cost_s:g} s",
            f"{r.setting.mtbf_s / 3600:,.2f} h",
            f"{r.predicted_s:,.0f} s",
            f"{r.best_s:,.0f} s",
            f"{r.ratio:.3f}" + ("" if r.within_tolerance else " (off by > 20 %)"),
            f"{100 * float(data['lost_fraction_at_best']):.2f} %",  # type: ignore[arg-type]
            f"{100 * float(data['lost_fraction_at_predicted']):.2f} %",  # type: ignore[arg-type]
        )
    return table
