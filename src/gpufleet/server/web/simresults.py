"""Reading a `results.json` written by `gpufleet sim --out` for the Simulator page: one experiment, several
(`experiments`), or a comparison with published figures (`reproduce`). The file is data: anything that is
not that shape is refused with what was wrong and how to fix it."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from gpufleet.domain.errors import GpufleetError

MAX_RESULTS_BYTES = 64 * 2**20
FIX = "give the results.json that `gpufleet sim --out DIR` wrote"


class ResultsError(GpufleetError):
    """A file that is not a simulation's results.json (422)."""


@dataclass(frozen=True)
class Workload:
    name: str
    citation: str
    license: str
    assumptions: list[str]
    nodes: int | None
    gpus: int | None
    jobs: int | None
    fgd_protocol: bool


@dataclass(frozen=True)
class Experiment:
    workload: Workload
    policies: list[str]
    metrics: list[tuple[str, list[Any]]]  # (metric key, one value per policy), every one-value metric
    queues: list[tuple[str, str, dict[str, Any]]]  # (policy, queue, its figures)
    plots: dict[str, Any]  # what app.js draws: the report's four plots
    notes: list[str] = field(default_factory=list)
    what_if: list[str] = field(default_factory=list)
    has_series: bool = True  # False: written before results.json carried the curves (CDF, allocation)


@dataclass(frozen=True)
class Results:
    source: str
    title: str
    experiments: list[Experiment]
    comparison_columns: list[str] = field(default_factory=list)
    comparison_rows: list[list[Any]] = field(default_factory=list)
    published_source: str = ""
    comparison_notes: list[str] = field(default_factory=list)

    def plots(self) -> list[dict[str, Any]]:
        return [e.plots for e in self.experiments]


def parse_results(raw: bytes, source: str) -> Results:
    if len(raw) > MAX_RESULTS_BYTES:
        raise ResultsError(f"{source} is larger than {MAX_RESULTS_BYTES // 2**20} MiB", FIX)
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ResultsError(f"{source} is not text (UTF-8)", FIX) from None
    except json.JSONDecodeError as error:
        raise ResultsError(f"{source} is not JSON ({error.msg} at line {error.lineno})", FIX) from None
    if not isinstance(data, dict):
        raise ResultsError(f"{source} holds a JSON {type(data).__name__}, not an object", FIX)
    published: dict[str, Any] = {}
    if "reproduce" in data:
        series = data.get("series")
        published = _published(series if isinstance(series, dict) else {})
    if "experiments" in data:
        items = data["experiments"]
        if not isinstance(items, list) or not items:
            raise ResultsError(f"{source}: `experiments` is not a list of experiments", FIX)
        experiments = [_experiment(item, f"{source}: experiments[{i}]", published) for i, item in enumerate(items)]
    else:
        experiments = [_experiment(data, source, published)]
    found_rows = data.get("comparison")
    rows: list[Any] = found_rows if isinstance(found_rows, list) else []
    columns: list[str] = []
    for row in rows:
        if isinstance(row, dict):
            columns += [str(c) for c in row if str(c) not in columns]
    title = str(data.get("title") or ", ".join(e.workload.name for e in experiments))
    return Results(
        source=source,
        title=title,
        experiments=experiments,
        comparison_columns=columns,
        comparison_rows=[[row.get(c) for c in columns] for row in rows if isinstance(row, dict)],
        published_source=str(data.get("published_source") or ""),
        comparison_notes=[str(n) for n in data.get("notes", [])] if "reproduce" in data else [],
    )


def _published(series: dict[str, Any]) -> dict[str, Any]:
    curves = series.get("fgd_published")
    names = series.get("policy_names")
    return {
        "fgd_published": curves if isinstance(curves, dict) else {},
        "policy_names": names if isinstance(names, dict) else {},
    }


def _experiment(data: Any, where: str, published: dict[str, Any]) -> Experiment:
    if not isinstance(data, dict) or not isinstance(data.get("policies"), dict) or not data["policies"]:
        raise ResultsError(f"{where} has no `policies` (the metrics of each policy)", FIX)
    info = data.get("workload")
    if not isinstance(info, dict) or not info.get("name"):
        raise ResultsError(f"{where} has no `workload` (its name, citation and license)", FIX)
    policies: dict[str, dict[str, Any]] = {}
    for name, metrics in data["policies"].items():
        if not isinstance(metrics, dict):
            raise ResultsError(f"{where}: the metrics of policy {name!r} are not an object", FIX)
        policies[str(name)] = metrics
    names = list(policies)
    keys: list[str] = []
    for metrics in policies.values():
        keys += [k for k, v in metrics.items() if _scalar(v) and k not in keys and k not in ("policy", "workload")]
    table = [(key, [policies[p].get(key) for p in names]) for key in keys]
    queues = [
        (p, str(q), figures)
        for p in names
        for q, figures in sorted((policies[p].get("queues") or {}).items())
        if isinstance(figures, dict)
    ]
    stored = data.get("plots") if isinstance(data.get("plots"), dict) else None
    workload = Workload(
        name=str(info["name"]),
        citation=str(info.get("citation") or "no citation given"),
        license=str(info.get("license") or "no license given"),
        assumptions=[str(a) for a in info.get("assumptions") or []],
        nodes=info.get("nodes"),
        gpus=info.get("gpus"),
        jobs=info.get("jobs"),
        fgd_protocol=bool(info.get("fgd_protocol")),
    )
    plots = {
        "workload": workload.name,
        "citation": f"Workload {workload.name}: {workload.citation} License: {workload.license}",
        "policies": names,
        "jct_cdf": (stored or {}).get("jct_cdf") or {},
        "gpu_allocation": (stored or {}).get("gpu_allocation") or {},
        "fgd_steps": {p: policies[p].get("fgd_steps") or [] for p in names} if workload.fgd_protocol else {},
        "queue_time": _queue_time(names, policies) if not workload.fgd_protocol else {},
        **published,
    }
    return Experiment(
        workload=workload,
        policies=names,
        metrics=table,
        queues=queues,
        plots=_finite(plots),
        notes=[str(n) for n in data.get("notes") or []],
        what_if=[str(w) for w in data.get("what_if") or []],
        has_series=stored is not None,
    )


def _queue_time(names: list[str], policies: dict[str, dict[str, Any]]) -> dict[str, Any]:
    queues = sorted(
        {q for p in names for q, f in (policies[p].get("queues") or {}).items() if _number(f, "avg_queueing_s")}
    )
    if not queues:
        return {}
    return {
        "queues": queues,
        "values": {
            p: [((policies[p].get("queues") or {}).get(q) or {}).get("avg_queueing_s") or 0.0 for q in queues]
            for p in names
        },
    }


def _number(figures: Any, key: str) -> bool:
    return isinstance(figures, dict) and isinstance(figures.get(key), int | float)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def _finite(value: Any) -> Any:
    """JSON for the browser: NaN and infinities (which Python's JSON writes but browsers refuse) become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
