"""What every published-result reproduction shares: where its data folder is, which policies it runs, and
how its figures are rounded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpufleet.domain.errors import UnknownNameError
from gpufleet.policies.catalog import PROFILES
from gpufleet.sim.workload import WorkloadError


def data_folder(traces_root: Path, name: str) -> Path:
    folder = Path(traces_root).expanduser() / name
    if not folder.is_dir():
        raise WorkloadError(f"the {name} data folder is missing", f"put {name}/ under {traces_root}", path=folder)
    return folder


def chosen_policies(given: Sequence[str] | None, default: Sequence[str]) -> tuple[str, ...]:
    names = tuple(given) if given else tuple(p for p in default if p in PROFILES)
    if not names:
        raise UnknownNameError("none of the policies to compare is available", f"give some of {', '.join(PROFILES)}")
    return names


def rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or theirs is None or theirs == 0:
        return None
    return round(ours / theirs, 3)
