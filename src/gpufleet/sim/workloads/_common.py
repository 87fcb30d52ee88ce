"""Helpers shared by the loaders: gang splitting, shared requests, located errors, path resolution."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from gpufleet.domain import SpecError, WorkerRequest
from gpufleet.domain.quotas import DEFAULT_QUEUE
from gpufleet.sim.workload import WorkloadError
from gpufleet.sim.workloads._csv import Row

__all__ = ["DEFAULT_QUEUE", "RequestCache", "largest_remainder", "located", "resolve", "split_gang"]


def split_gang(gpus: int, max_per_worker: int) -> tuple[int, int]:
    """(workers, GPUs per worker) for a job of `gpus` GPUs on nodes of `max_per_worker` GPUs.

    A job that fits one node is one worker. A larger one becomes a gang of equal workers, as few as possible,
    each at most one node: 16 on 8-GPU nodes -> 2 x 8; 12 -> 2 x 6; 24 -> 3 x 8; 6 on 4-GPU nodes -> 2 x 3.
    """
    if gpus <= max_per_worker:
        return 1, gpus
    workers = -(-gpus // max_per_worker)
    while gpus % workers or gpus // workers > max_per_worker:
        workers += 1
    return workers, gpus // workers


class RequestCache:
    """Shares one WorkerRequest per distinct request (a trace has few distinct shapes, many jobs)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[int, int, int, int, frozenset[str]], WorkerRequest] = {}

    def get(
        self,
        *,
        gpus: int,
        gpu_milli: int = 1000,
        cpu_milli: int = 0,
        memory: int = 0,
        models: frozenset[str] = frozenset(),
    ) -> WorkerRequest:
        key = (gpus, gpu_milli, cpu_milli, memory, models)
        request = self._cache.get(key)
        if request is None:
            request = WorkerRequest(gpus=gpus, gpu_milli=gpu_milli, cpu_milli=cpu_milli, memory=memory, models=models)
            self._cache[key] = request
        return request


@contextmanager
def located(row: Row, columns: Mapping[str, str]) -> Iterator[None]:
    """Inside, a SpecError from the domain (building a Job or request for `row`) becomes a WorkloadError that
    names the file, line and column. `columns` maps domain field names (gpus, gpu_fraction, gpu_models, cpu,
    memory, queue, id, workers) to the CSV's column names."""
    try:
        yield
    except SpecError as err:
        raise row.spec_error(err, columns) from None


def resolve(path: str | Path, default_file: str, what: str) -> tuple[Path, Path]:
    """(folder, file): `path` is the file itself, or a folder that holds `default_file`."""
    p = Path(path).expanduser()
    if p.is_dir():
        f = p / default_file
        if not f.is_file():
            raise WorkloadError(
                f"the folder has no {default_file}", f"give the {what} file, or the folder that holds it", path=p
            )
        return p, f
    if p.is_file():
        return p.parent, p
    raise WorkloadError(f"{what} does not exist", f"give the path to the {what} (a file or its folder)", path=p)


def largest_remainder(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Split `total` into integer parts proportional to `weights`, exactly (largest-remainder rounding)."""
    weight_sum = sum(weights.values())
    shares = {k: total * w / weight_sum for k, w in weights.items()}
    counts = {k: int(s) for k, s in shares.items()}
    left = total - sum(counts.values())
    for k in sorted(shares, key=lambda k: (counts[k] - shares[k], k))[:left]:
        counts[k] += 1
    return counts
