"""`load_workload(spec)`: a workload by name (looked up under a traces folder) or by path (format detected)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.sim.workload import Workload, WorkloadError
from gpufleet.sim.workloads import gavel, openb, openb_fgd, philly, pollux, synthetic, tiresias
from gpufleet.sim.workloads._csv import read_header
from gpufleet.sim.workloads.live_cluster import is_snapshot, load_snapshot


@dataclass(frozen=True, slots=True)
class Source:
    name: str
    folder: str | None  # under the traces root; None: needs no data
    loader: Callable[..., Workload]
    summary: str


SOURCES: Mapping[str, Source] = {
    s.name: s
    for s in (
        Source("openb", openb.FOLDER, openb.load_openb, "Alibaba openb 2023: 1523 nodes, 8152 GPU-sharing pods"),
        Source("fgd", openb.FOLDER, openb_fgd.fgd_workload, "openb sampled as in the FGD paper (needs seed=)"),
        Source("philly", philly.FOLDER, philly.load_philly, "Microsoft Philly 2017: 82,247 jobs in 15 VCs"),
        Source("gavel", gavel.FOLDER, gavel.load_gavel, "Gavel OSDI'20 generated jobs (needs rate_per_hour=)"),
        Source("pollux", pollux.FOLDER, pollux.load_pollux, "Pollux OSDI'21 160-job workloads (workload=1..8)"),
        Source("tiresias", tiresias.FOLDER, tiresias.load_tiresias, "Tiresias NSDI'19 60-job trace"),
        Source("synthetic", None, synthetic.generate_synthetic, "seeded synthetic generator (no data needed)"),
    )
}
NAMES = tuple(SOURCES)
# Formats read from a path only (no data folder to look them up by name): `PREFIX:FILE`, or detected.
PATH_SOURCES: Mapping[str, Source] = {
    "gavel-jobs": Source("gavel-jobs", None, gavel.load_gavel_jobs, "a job list Gavel's own simulator generated"),
}

# Header columns that identify each kind of CSV file (all must be present).
_FILE_SIGNATURES: tuple[tuple[str, frozenset[str]], ...] = (
    ("openb", frozenset(openb.POD_COLUMNS)),
    ("openb", frozenset(openb.NODE_COLUMNS)),
    ("philly", frozenset(philly.JOB_COLUMNS)),
    ("gavel", frozenset(gavel.THROUGHPUT_COLUMNS)),
    ("gavel-jobs", frozenset(gavel.JOB_LIST_COLUMNS)),
    ("pollux", frozenset(pollux.COLUMNS)),
    ("tiresias", frozenset(tiresias.JOB_COLUMNS)),
)
# Files that identify each kind of trace folder.
_FOLDER_MARKERS: tuple[tuple[str, str], ...] = (
    ("openb", openb.NODE_FILE),
    ("philly", philly.JOBS_FILE),
    ("gavel", gavel.THROUGHPUT_FILE),
    ("pollux", "workloads/workload-1.csv"),
    ("pollux", "workload-1.csv"),
    ("tiresias", tiresias.JOBS_FILE),
)


def _valid_names() -> str:
    return "; ".join(f"{s.name} ({s.summary})" for s in SOURCES.values())


def detect_format(path: Path) -> str:
    """The source name for a trace folder or CSV file, from its file names or header columns."""
    if path.is_dir():
        for name, marker in _FOLDER_MARKERS:
            if (path / marker).is_file():
                return name
        raise WorkloadError(
            "is not a folder of a known trace",
            "give a folder holding one of " + ", ".join(sorted({m for _, m in _FOLDER_MARKERS})) + ", or a trace CSV",
            path=path,
        )
    header = frozenset(read_header(path))
    for name, columns in _FILE_SIGNATURES:
        if columns <= header:
            return name
    raise WorkloadError(
        f"has columns ({', '.join(sorted(header)) or 'none'}) of no known trace format",
        "give a CSV of a known format: "
        + "; ".join(f"{name}: {', '.join(sorted(cols))}" for name, cols in _FILE_SIGNATURES),
        path=path,
        line=1,
    )


def _call(source: Source, path: Path | None, options: Mapping[str, Any]) -> Workload:
    signature = inspect.signature(source.loader)
    accepted = [
        p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "spec"
    ]
    if source.loader is not synthetic.generate_synthetic:
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise WorkloadError(
                f"{source.name} takes no option {unknown[0]!r}", f"its options are: {', '.join(accepted) or 'none'}"
            )
        missing = [
            p.name
            for p in signature.parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
            and p.default is inspect.Parameter.empty
            and p.name not in options
        ]
        if missing:
            raise WorkloadError(f"{source.name} needs the option {missing[0]!r}", f"give {missing[0]}=VALUE")
    if path is None:
        return source.loader(**options)
    return source.loader(path, **options)


def load_workload(spec: str | Path, *, traces_root: str | Path | None = None, **options: Any) -> Workload:
    """Load a workload by name or path.

    `spec` is a name (openb, fgd, philly, gavel, pollux, tiresias, synthetic), whose data is looked for in
    its folder under `traces_root` (e.g. `../shared/traces`), or a path to a trace folder or CSV file, whose
    format is detected from file names or header columns. `options` go to the loader (e.g. seed=42,
    rate_per_hour=4.0, workload=3, pods="gpuspec33").
    """
    text = str(spec).strip()
    source = SOURCES.get(text.lower())
    if source is not None:
        if source.folder is None:
            return _call(source, None, options)
        if traces_root is None:
            raise WorkloadError(
                f"workload {text!r} needs its data folder", f"pass traces_root=DIR, the folder holding {source.folder}/"
            )
        folder = Path(traces_root).expanduser() / source.folder
        if not folder.is_dir():
            raise WorkloadError(
                f"the {source.name} data folder is missing", f"put {source.folder}/ under {traces_root}", path=folder
            )
        return _call(source, folder, options)
    for name, path_source in PATH_SOURCES.items():
        if text.lower().startswith(f"{name}:"):
            return _call(path_source, Path(text[len(name) + 1 :].strip()).expanduser(), options)
    path = Path(text).expanduser()
    if is_snapshot(path):
        if options:
            raise WorkloadError(f"a snapshot takes no option {sorted(options)[0]!r}", "drop the option", path=path)
        return load_snapshot(path)
    if path.exists():
        name = detect_format(path)
        return _call(SOURCES.get(name) or PATH_SOURCES[name], path, options)
    if path.suffix or len(path.parts) > 1:
        raise WorkloadError("does not exist", "give the path to a trace folder or CSV file", path=path)
    raise WorkloadError(
        f"unknown workload {text!r}",
        f"use one of: {_valid_names()}; or a path to a trace; or {gavel.JOB_LIST_PREFIX}FILE (a Gavel job list)",
    )
