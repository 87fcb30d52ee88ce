"""What `gpufleet show JOB` prints of a job's progress reports, and `--png`'s plot (matplotlib, loaded only
when a plot is asked for)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpufleet.cli.safe_text import markup


def _ago(at: float | None, now: float) -> str:
    if at is None:
        return "-"
    seconds = max(0.0, now - at)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def summary_lines(progress: dict[str, Any] | None, now: float | None = None) -> list[str]:
    """A few lines: where training is, throughput at each size, the last checkpoint."""
    if progress is None:
        return ["progress: not reported (the job may call gpufleet.runtime.report)"]
    now = time.time() if now is None else now
    parts = []
    if progress["step"] is not None:
        parts.append(f"step {progress['step']}")
    if progress["samples"] is not None:
        parts.append(f"{progress['samples']:,.0f} samples")
    if progress["loss"] is not None:
        parts.append(f"loss {progress['loss']:.4g}")
    lines = [f"progress: {', '.join(parts) or 'no progress report yet'} ({_ago(progress['last_at'], now)})"]
    # One rate per size and model, over the placements and batches its entries are kept by.
    sums: dict[tuple[int, str], list[float]] = {}
    for entry in progress["throughput"]:
        pair = sums.setdefault((entry["gpus"], entry.get("model") or ""), [0.0, 0.0])
        pair[0] += entry["samples"]
        pair[1] += entry["seconds"]
    rates = [
        f"{gpus} GPU{'s' if gpus != 1 else ''}{' ' + model if model else ''} {samples / seconds:,.1f}/s"
        for (gpus, model), (samples, seconds) in sums.items()
        if seconds > 0
    ]
    if rates:
        lines.append("throughput (samples/s): " + ", ".join(rates))
    if progress["last_checkpoint_at"] is not None:
        lines.append(
            f"last checkpoint: {_ago(progress['last_checkpoint_at'], now)}, took "
            f"{progress['checkpoint_duration_s']:.3g} s ({progress['checkpoints']} so far)"
        )
    return [markup(line) for line in lines]


def detail_lines(progress: dict[str, Any]) -> list[str]:
    """`--progress`: the loss curve (at most 20 points, evenly spread) and every size change."""
    lines = []
    curve = progress["loss_curve"]
    if curve:
        step = max(1, len(curve) // 20)
        shown = curve[::step]
        if shown[-1] != curve[-1]:
            shown.append(curve[-1])
        lines.append(f"loss curve ({len(curve)} points kept):")
        lines.extend(f"  {samples:>14,.0f} samples  loss {loss:.4g}" for samples, loss in shown)
    if progress["sizes"]:
        first = progress["sizes"][0][0]
        lines.append("size over time:")
        lines.extend(f"  +{at - first:>10,.0f} s  {gpus} GPUs" for at, gpus in progress["sizes"])
    grads = [f"{k} {progress[k]:.4g}" for k in ("grad_sqr", "grad_var") if progress[k] is not None]
    grads += [f"{k} {v:.4g}" for k, v in progress["metrics"].items()]
    if grads:
        lines.append("last metrics: " + ", ".join(grads))
    return [markup(line) for line in lines]


def plot(progress: dict[str, Any], job_id: str, path: Path, now: float | None = None) -> None:
    """Loss against samples, and GPUs held against time, one above the other, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    now = time.time() if now is None else now
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), constrained_layout=True)
    curve = progress["loss_curve"]
    if curve:
        top.plot([p[0] for p in curve], [p[1] for p in curve], lw=1.2)
    top.set(xlabel="samples", ylabel="loss", title=f"job {job_id}: loss against samples")
    top.grid(alpha=0.3)
    sizes = progress["sizes"]
    if sizes:
        start = sizes[0][0]
        end = max(progress["last_at"] or start, sizes[-1][0])
        xs = [(at - start) / 60 for at, _ in sizes] + [(end - start) / 60]
        ys = [gpus for _, gpus in sizes] + [sizes[-1][1]]
        bottom.step(xs, ys, where="post", lw=1.5)
    bottom.set(xlabel="minutes since the first report", ylabel="GPUs", title="GPUs held over time")
    bottom.grid(alpha=0.3)
    fig.savefig(path, dpi=110)
    plt.close(fig)
