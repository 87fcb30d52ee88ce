"""Resource requests: CPU, memory, whole or fractional GPUs, GPU memory and GPU model constraints.

Units are base units throughout: CPU in milli-cores, memory in bytes, GPU shares in milli-GPU
(1000 = one whole GPU, as `gpu_milli` in Alibaba's openb trace).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.domain.errors import FieldProblem, check

MILLI_PER_GPU = 1000
GiB = 1024**3
MiB = 1024**2


def parse_models(text: str) -> frozenset[str]:
    """`"A100-80GB|H100"` -> {"A100-80GB", "H100"}; an empty string means any model."""
    return frozenset(part.strip() for part in text.split("|") if part.strip())


SPOT_USES = ("never", "allowed", "preferred")


@dataclass(frozen=True, slots=True)
class WorkerRequest:
    """What one worker of a job needs.

    `gpus` whole GPUs, or, with `gpus == 1` and `gpu_milli < 1000`, a share of one GPU that other
    fractional workers may share. `gpu_memory` is the GPU memory needed on each GPU (bytes);
    `models` the allowed GPU models (empty: any).
    """

    gpus: int = 0
    gpu_milli: int = MILLI_PER_GPU
    gpu_memory: int = 0
    cpu_milli: int = 0
    memory: int = 0
    models: frozenset[str] = field(default_factory=frozenset)
    # Spot capacity (nodes of the `spot` pool): `never` (default), `allowed`, or `preferred` (placed there first).
    spot: str = "never"
    # Whether the job resumes from checkpoints (it declared a checkpoint interval): an open spot breaker still
    # admits such workers.
    checkpoints: bool = False
    # Requests key many per-cycle caches: hash once, not on every look-up.
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        return self._hash

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "_hash",
            hash(
                (
                    self.gpus,
                    self.gpu_milli,
                    self.gpu_memory,
                    self.cpu_milli,
                    self.memory,
                    self.models,
                    self.spot,
                    self.checkpoints,
                )
            ),
        )
        problems: list[FieldProblem] = []
        if self.spot not in SPOT_USES:
            problems.append(FieldProblem("spot", f"is {self.spot!r}", f"give one of: {', '.join(SPOT_USES)}"))
        if self.gpus < 0:
            problems.append(FieldProblem("gpus", f"is {self.gpus}", "ask for 0 or more GPUs"))
        if not 1 <= self.gpu_milli <= MILLI_PER_GPU:
            problems.append(
                FieldProblem(
                    "gpu_fraction",
                    f"is {self.gpu_milli / MILLI_PER_GPU:g} of a GPU",
                    "give a fraction in (0, 1], e.g. 0.5, or whole GPUs with `gpus`",
                )
            )
        elif self.gpu_milli < MILLI_PER_GPU and self.gpus != 1:
            problems.append(
                FieldProblem(
                    "gpu_fraction",
                    f"a fraction ({self.gpu_milli / MILLI_PER_GPU:g}) with gpus={self.gpus}",
                    "a fraction applies to exactly one GPU: set gpus=1, or ask for whole GPUs",
                )
            )
        if self.gpu_memory < 0:
            problems.append(FieldProblem("gpu_memory", f"is {self.gpu_memory}", "give 0 or more bytes"))
        if self.gpu_memory > 0 and self.gpus == 0:
            problems.append(FieldProblem("gpu_memory", "set on a job without GPUs", "ask for GPUs, or drop gpu_memory"))
        if self.cpu_milli < 0:
            problems.append(FieldProblem("cpu", f"is {self.cpu_milli} milli-cores", "give 0 or more"))
        if self.memory < 0:
            problems.append(FieldProblem("memory", f"is {self.memory} bytes", "give 0 or more"))
        if self.models and self.gpus == 0:
            problems.append(FieldProblem("gpu_models", "set on a job without GPUs", "ask for GPUs, or drop the models"))
        for model in self.models:
            if not model or model != model.strip() or "|" in model:
                problems.append(FieldProblem("gpu_models", f"{model!r} is not a model name", "e.g. A100-80GB|H100"))
        check(problems, "resource request")

    @property
    def fractional(self) -> bool:
        return self.gpus == 1 and self.gpu_milli < MILLI_PER_GPU

    @property
    def gpu_milli_total(self) -> int:
        """Milli-GPUs this worker takes: 1000 per whole GPU, the share for a fraction."""
        return self.gpus * self.gpu_milli

    def describe(self) -> str:
        parts: list[str] = []
        if self.fractional:
            parts.append(f"{self.gpu_milli / MILLI_PER_GPU:g} GPU")
        elif self.gpus:
            parts.append(f"{self.gpus} GPU{'s' if self.gpus > 1 else ''}")
        if self.models:
            parts.append("|".join(sorted(self.models)))
        if self.gpu_memory:
            parts.append(f"{self.gpu_memory / GiB:g} GiB GPU memory")
        if self.cpu_milli:
            parts.append(f"{self.cpu_milli / 1000:g} CPU")
        if self.memory:
            parts.append(f"{self.memory / GiB:g} GiB memory")
        if self.spot != "never":
            parts.append(f"spot {self.spot}")
        return ", ".join(parts) or "nothing"
