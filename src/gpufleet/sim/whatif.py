"""What-if changes to a workload's cluster, as `gpufleet sim` takes them on the command line.

    add_nodes_spec("8xH100@4", workload)        4 nodes of 8 H100 (`COUNTxMODEL[-MEMGB][,…][@NODES]`)
    quota_spec("team-a:gpu=32,borrowing=8", q)  the queue's spec with those quotas (GPUs in whole GPUs)
    event_spec("3600:down:node-12", workload)   a timed cluster event (down, up, quota, add)
    apply_what_if(workload, add_nodes=…, quotas=…, events=…)
                                                the workload with nodes added and quotas set at time 0 and the
                                                timed events attached, plus one line per change for the report

Every bad value raises a `WorkloadError` that names the flag, what is wrong and how to fix it. Times are
seconds on the workload's clock (the trace's arrival times, which start at or near 0); `2h`, `30m` and
`90s` are accepted too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from gpufleet.adapters.inventory.emulated_inventory import parse_emulate
from gpufleet.domain import GPU, Node, QueueSpec, Quota
from gpufleet.domain.errors import GpufleetError, SpecError
from gpufleet.domain.quotas import GPU_MODEL_PREFIX
from gpufleet.domain.throughput_table import model_key
from gpufleet.domain.windows import Window
from gpufleet.sim.events import AddNodes, ClusterEvent, NodeDown, NodeUp, QuotaChange, describe, quota_text
from gpufleet.sim.workload import Workload, WorkloadError

MAX_ADDED_NODES = 100_000
ADD_NODES_EXAMPLE = "e.g. 8xH100 (one node of 8 H100), 8xA100-80GB@4 (4 such nodes) or 4xL4,4xT4@2"
QUOTA_EXAMPLE = "e.g. team-a:gpu=32, team-a:gpu=16,gpu:A100-80GB=8,borrowing=4 or team-a:gpu=unlimited"
EVENT_EXAMPLE = (
    "e.g. 3600:down:NODE, 7200:up:NODE, 7200:quota:QUEUE:gpu=32 or 1h:add:8xH100@2 (TIME:KIND:WHAT, time in s)"
)
DEFAULT_CPU_MILLI_PER_GPU = 12_000
DEFAULT_MEMORY_PER_GPU = 128 * 1024**3
_DURATION = re.compile(r"^\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[smhd]?)\s*$", re.IGNORECASE)
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _family(model: str) -> str:
    """`H100-80GB` -> `H100`: a model name without its memory suffix, upper case."""
    return re.sub(r"-\d+GB$", "", model.strip().upper())


def _per_gpu(workload: Workload) -> tuple[int, int]:
    """CPU (milli-cores) and memory (bytes) per GPU of the roomiest GPU node, so added nodes can host what
    the workload's nodes host; defaults when the cluster has no GPU node."""
    gpu_nodes = [n for n in workload.nodes if n.gpus]
    if not gpu_nodes:
        return DEFAULT_CPU_MILLI_PER_GPU, DEFAULT_MEMORY_PER_GPU
    cpu = max(n.cpu_milli // len(n.gpus) for n in gpu_nodes)
    memory = max(n.memory // len(n.gpus) for n in gpu_nodes)
    return cpu, memory


def add_nodes_spec(text: str, workload: Workload, taken: Collection[str] = (), flag: str = "--add-nodes") -> AddNodes:
    """Nodes from `COUNTxMODEL[-MEMGB][,COUNTxMODEL…][@NODES]` (at time 0; `AddNodes.at` is 0).

    The GPU part is read as `gpufleet up --emulate` reads it. A model written without its memory that the
    workload has under a memory-suffixed name (`H100` for `H100-80GB`) is taken to be that model. Added nodes
    get the CPU and memory per GPU of the workload's roomiest GPU node; they are named `added-<model>-<i>`.
    """
    gpu_text, at_sign, count_text = text.strip().partition("@")
    count = 1
    if at_sign:
        if not count_text.strip().isdigit() or not 1 <= int(count_text) <= MAX_ADDED_NODES:
            raise WorkloadError(
                f"{flag} {text!r}: the node count after @ is {count_text!r}",
                f"give a whole number of nodes from 1 to {MAX_ADDED_NODES:,}, {ADD_NODES_EXAMPLE}",
            )
        count = int(count_text)
    try:
        (shape,) = parse_emulate(gpu_text, "added")
    except SpecError as error:
        problems = "; ".join(f"{f.problem} ({f.fix})" for f in error.fields)
        raise WorkloadError(f"{flag} {text!r}: {problems}", ADD_NODES_EXAMPLE) from None
    known = {m: m for m in workload.models}
    by_family: dict[str, list[str]] = {}
    for model in sorted(workload.models):
        by_family.setdefault(_family(model), []).append(model)
    memory_of = {g.model: g.memory for n in workload.nodes for g in n.gpus}
    gpus = []
    for gpu in shape.gpus:
        model, memory = gpu.model, gpu.memory
        same = by_family.get(_family(model), [])
        if model not in known and _family(model) == model.upper() and len(same) == 1:
            model, memory = same[0], memory_of[same[0]]
        gpus.append(replace(gpu, model=model, memory=memory))
    table = workload.throughput
    if table is not None:
        missing = sorted({g.model for g in gpus if model_key(g.model) not in table.models})
        if missing:
            raise WorkloadError(
                f"{flag} {text!r}: the workload's throughput table ({table.source or 'its table'}) has no "
                f"measurements for {', '.join(missing)}, so jobs could not be timed on it",
                f"add nodes of a measured model ({', '.join(table.models)}), or give a throughput table with it",
            )
    cpu_per_gpu, memory_per_gpu = _per_gpu(workload)
    taken_names = set(taken) | {n.name for n in workload.nodes}
    stem = "added-" + re.sub(r"[^a-z0-9]+", "-", _family(gpus[0].model).lower()).strip("-")
    nodes: list[Node] = []
    i = 0
    while len(nodes) < count:
        name = f"{stem}-{i:03d}"
        i += 1
        if name in taken_names:
            continue
        taken_names.add(name)
        nodes.append(
            Node(
                name=name,
                gpus=tuple(replace(g, uuid=f"GPU-sim-{name}-{g.index}") for g in gpus),
                cpu_milli=cpu_per_gpu * len(gpus),
                memory=memory_per_gpu * len(gpus),
                rack="added",
            )
        )
    return AddNodes(0.0, tuple(nodes))


def _gpus_milli(value: str, what: str, flag: str, text: str) -> int | None:
    if value.strip().lower() in ("unlimited", "none"):
        return None
    try:
        gpus = float(value)
    except ValueError:
        gpus = math.nan
    if not (math.isfinite(gpus) and gpus >= 0):
        raise WorkloadError(
            f"{flag} {text!r}: {what} is {value!r}", f"give a number of GPUs >= 0 (or unlimited), {QUOTA_EXAMPLE}"
        )
    return round(gpus * 1000)


def quota_spec(
    text: str, queues: Mapping[str, QueueSpec], models: Collection[str] = (), flag: str = "--quota"
) -> QueueSpec:
    """`QUEUE:KEY=VALUE,…` applied to that queue's current spec. Keys: `gpu` (nominal GPUs of any model, or
    `unlimited`), `gpu:MODEL` (nominal GPUs of one model), `borrowing` and `lending` (limits, in GPUs, of the
    `gpu` quota), `weight` (fair-share weight). What the text does not name stays as it was."""
    name, colon, rest = text.partition(":")
    name = name.strip()
    if not colon or not rest.strip() or not name:
        raise WorkloadError(f"{flag} {text!r} is not QUEUE:KEY=VALUE[,KEY=VALUE…]", QUOTA_EXAMPLE)
    spec = queues.get(name)
    if spec is None:
        raise WorkloadError(
            f"{flag} {text!r}: the workload has no queue {name!r}",
            f"name one of its queues: {', '.join(sorted(queues)) or '(none)'}",
        )
    quotas = dict(spec.quotas)
    weight = spec.weight
    limits: dict[str, int | None] = {}
    for item in (p.strip() for p in rest.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key or not value.strip():
            raise WorkloadError(f"{flag} {text!r}: {item!r} is not KEY=VALUE", QUOTA_EXAMPLE)
        if key == GPU or key.startswith(GPU_MODEL_PREFIX):
            model = key[len(GPU_MODEL_PREFIX) :] if key != GPU else ""
            if key != GPU and model not in models:
                raise WorkloadError(
                    f"{flag} {text!r}: the cluster has no GPU model {model!r}",
                    f"use one of its models: {', '.join(sorted(models))}",
                )
            nominal = _gpus_milli(value, key, flag, text)
            old = quotas.get(key, Quota())
            if nominal is None and key == GPU:
                quotas.pop(GPU, None)  # no `gpu` quota: unlimited
            elif nominal is None:
                quotas[key] = Quota()  # the model stays allowed, without a limit
            else:
                lending = None if old.lending_limit is None else min(old.lending_limit, nominal)
                quotas[key] = Quota(nominal, old.borrowing_limit, lending)
        elif key in ("borrowing", "lending"):
            limits[key] = _gpus_milli(value, key, flag, text)
        elif key == "weight":
            try:
                weight = float(value)
            except ValueError:
                weight = math.nan
            if not (math.isfinite(weight) and weight > 0):
                raise WorkloadError(f"{flag} {text!r}: weight is {value!r}", "give a weight > 0, e.g. weight=2")
        else:
            raise WorkloadError(
                f"{flag} {text!r}: {key!r} is not a quota key",
                f"use gpu, gpu:MODEL, borrowing, lending or weight; {QUOTA_EXAMPLE}",
            )
    if limits:
        base = quotas.get(GPU)
        if base is None or base.nominal is None:
            raise WorkloadError(
                f"{flag} {text!r}: borrowing and lending limit the gpu quota, which queue {name!r} does not have",
                "set one in the same flag, e.g. gpu=16,borrowing=4",
            )
        quotas[GPU] = Quota(
            base.nominal,
            limits.get("borrowing", base.borrowing_limit),
            limits.get("lending", base.lending_limit),
        )
    try:
        return QueueSpec(name, quotas, spec.cohort, weight)
    except SpecError as error:
        raise WorkloadError(f"{flag} {text!r}: {error.message}", QUOTA_EXAMPLE) from None


RESERVATION_EXAMPLE = (
    "write NAME:NODES:START:END[:QUEUE], e.g. fw:node-1,node-2:2h:6h (maintenance) or demo:node-3:1d:1d4h:team-a "
    "(held for queue team-a); times on the workload's clock"
)


def reservation_spec(text: str) -> Window:
    """`NAME:NODES:START:END[:QUEUE]`: nodes (comma-separated) held for QUEUE, or for maintenance without one."""
    parts = text.split(":")
    if len(parts) not in (4, 5) or not all(p.strip() for p in parts):
        raise WorkloadError(f"--reservation {text!r} is not NAME:NODES:START:END[:QUEUE]", RESERVATION_EXAMPLE)
    name, nodes, start, end = (p.strip() for p in parts[:4])
    queue = parts[4].strip() if len(parts) == 5 else None
    try:
        return Window(
            name,
            tuple(n.strip() for n in nodes.split(",") if n.strip()),
            parse_time(start, "--reservation", text),
            parse_time(end, "--reservation", text),
            queue,
        )
    except SpecError as error:
        raise WorkloadError(f"--reservation {text!r}: {error.message}", RESERVATION_EXAMPLE) from None


def parse_time(text: str, flag: str, whole: str) -> float:
    match = _DURATION.match(text)
    if match is None:
        raise WorkloadError(
            f"{flag} {whole!r}: the time {text!r} is not a number of seconds",
            f"give seconds >= 0 on the workload's clock (or 30m, 2h, 1d); {EVENT_EXAMPLE}",
        )
    return float(match["num"]) * _UNIT_S[match["unit"].lower()]


def event_spec(
    text: str,
    workload: Workload,
    queues: Mapping[str, QueueSpec],
    taken: Collection[str] = (),
    flag: str = "--event",
) -> ClusterEvent:
    """`TIME:down:NODE[:REASON]`, `TIME:up:NODE`, `TIME:quota:QUEUE:KEY=VALUE,…`, `TIME:add:NODES-SPEC`.
    `queues` are the queue specs a quota event starts from (as they will be at its time)."""
    parts = text.split(":", 2)
    if len(parts) < 3 or not parts[2].strip():
        raise WorkloadError(f"{flag} {text!r} is not TIME:KIND:WHAT", EVENT_EXAMPLE)
    at = parse_time(parts[0], flag, text)
    kind, what = parts[1].strip().lower(), parts[2].strip()
    if kind in ("down", "up"):
        node, _, reason = what.partition(":")
        node = node.strip()
        names = {n.name for n in workload.nodes} | set(taken)
        if node not in names:
            shown = sorted(names)
            listed = ", ".join(shown[:8]) + (f" … ({len(shown)} in all)" if len(shown) > 8 else "")
            raise WorkloadError(f"{flag} {text!r}: the cluster has no node {node!r}", f"name one of: {listed}")
        if kind == "up":
            return NodeUp(at, node)
        return NodeDown(at, node, reason.strip() or "--event")
    if kind == "quota":
        models = workload.models | {g.model for n in taken_nodes(workload) for g in n.gpus}
        return QuotaChange(at, quota_spec(what, queues, models, flag=f"{flag} {text!r}, in"))
    if kind == "add":
        added = add_nodes_spec(what, workload, taken, flag=f"{flag} {text!r}, in")
        return AddNodes(at, added.nodes)
    raise WorkloadError(
        f"{flag} {text!r}: {parts[1]!r} is not an event kind", f"use down, up, quota or add; {EVENT_EXAMPLE}"
    )


def taken_nodes(workload: Workload) -> tuple[Node, ...]:
    """Nodes the workload's own `AddNodes` events bring."""
    return tuple(n for e in workload.events if isinstance(e, AddNodes) for n in e.nodes)


def _quotas_for_growth(specs: dict[str, QueueSpec], before: int, after: int, grow: bool) -> list[str]:
    """Grow the queues' nominal `gpu` quotas by after/before GPUs (in place), or, when not asked to, say when
    the quotas leave the added GPUs out of reach (quotas cap use even when GPUs are idle)."""
    limited = {name: spec.quotas[GPU].nominal for name, spec in specs.items() if GPU in spec.quotas}
    finite = {name: nominal for name, nominal in limited.items() if nominal is not None}
    if not finite:
        return []
    if grow and before > 0:
        factor = after / before
        for name, nominal in finite.items():
            spec = specs[name]
            old = spec.quotas[GPU]
            grown = round(nominal * factor / 1000) * 1000
            lending = None if old.lending_limit is None else min(old.lending_limit, grown)
            specs[name] = replace(spec, quotas={**spec.quotas, GPU: Quota(grown, old.borrowing_limit, lending)})
        shown = ", ".join(
            f"{name} {finite[name] / 1000:g}->{(specs[name].quotas[GPU].nominal or 0) / 1000:g}" for name in finite
        )
        return [f"--grow-quotas: nominal GPU quotas grown x{factor:.3g} with the cluster ({shown} GPUs)"]
    total = sum(finite.values()) / 1000
    if len(finite) == len(specs) and total < after:
        return [
            f"note: the queues' nominal GPU quotas total {total:g} of the {after} GPUs now installed; quotas cap "
            "what queues use (borrowing included), so added GPUs may stay idle. Add --grow-quotas to grow every "
            "queue's quota with the cluster, or --quota QUEUE:gpu=N"
        ]
    return []


@dataclass(frozen=True)
class WhatIf:
    """The workload as changed, and one line per change (for the report and results.json)."""

    workload: Workload
    changes: tuple[str, ...]


def apply_what_if(
    workload: Workload,
    *,
    add_nodes: Sequence[str] = (),
    quotas: Sequence[str] = (),
    events: Sequence[str] = (),
    grow_quotas: bool = False,
    reservations: Sequence[str] = (),
) -> WhatIf:
    """Nodes added and quotas set at time 0 (part of the cluster from the start), then timed events attached
    (in time order; a quota event starts from the queue's spec as it is by then). `grow_quotas`: every
    queue's nominal `gpu` quota grows in proportion to the GPUs added (before `quotas` apply)."""
    changes: list[str] = []
    nodes = list(workload.nodes)
    for text in add_nodes:
        added = add_nodes_spec(text, workload, {n.name for n in nodes})
        nodes += added.nodes
        models = ", ".join(sorted({g.model for n in added.nodes for g in n.gpus}))
        changes.append(
            f"--add-nodes {text}: {len(added.nodes)} node(s) with {sum(len(n.gpus) for n in added.nodes)} GPUs "
            f"({models}) added from the start ({added.nodes[0].name} …)"
        )
    grown = replace(workload, nodes=tuple(nodes))
    specs = {q.name: q for q in grown.queues}
    if add_nodes:
        changes += _quotas_for_growth(specs, workload.gpu_count, grown.gpu_count, grow_quotas)
    for text in quotas:
        spec = quota_spec(text, specs, grown.models)
        specs[spec.name] = spec
        changes.append(f"--quota {text}: queue {spec.name} quota {quota_text(spec)} from the start")
    grown = replace(grown, queues=tuple(specs.values()))
    timed: list[ClusterEvent] = list(workload.events)
    parsed: list[tuple[float, int, str]] = []
    for i, text in enumerate(events):
        at = parse_time(text.split(":", 1)[0], "--event", text) if ":" in text else 0.0
        parsed.append((at, i, text))
    taken = {n.name for n in nodes} | {n.name for n in taken_nodes(grown)}
    current = dict(specs)
    for _, _, text in sorted(parsed):
        event = event_spec(text, grown, current, taken)
        if isinstance(event, QuotaChange):
            current[event.queue.name] = event.queue
        if isinstance(event, AddNodes):
            taken |= {n.name for n in event.nodes}
        timed.append(event)
        changes.append(f"--event {text}: {describe(event)}")
    windows = list(grown.windows)
    for text in reservations:
        window = reservation_spec(text)
        windows.append(window)
        changes.append(f"--reservation {text}: {window.describe()} on {', '.join(window.nodes)}")
    try:
        result = replace(grown, events=tuple(timed), windows=tuple(windows))
    except GpufleetError as error:
        raise WorkloadError(f"the what-if changes do not fit the workload: {error.message}", error.fix) from None
    return WhatIf(result, tuple(changes))
