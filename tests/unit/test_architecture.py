"""docs/ARCHITECTURE.md says which package imports which; the import graph must say the same, edge for edge,
and every module of gpufleet has a name no other module of it shares (its file name)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "domain",
    "ports",
    "scheduling",
    "policies",
    "control",
    "adapters",
    "sim",
    "server",
    "client",
    "bench",
    "cli",
)


def documented() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = re.search(r"<!-- imports: .*?-->\n(.*?)<!-- /imports -->", text, re.S)
    assert block is not None, "ARCHITECTURE.md lost its table of imports"
    table: dict[str, set[str]] = {}
    for line in block.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        table[cells[0].strip("`")] = set(re.findall(r"`(\w+)`", cells[1])) & set(PACKAGES)
    return table


def imported() -> dict[str, set[str]]:
    graph = grimp.build_graph("gpufleet")
    edges: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for module in graph.modules:
        parts = module.split(".")
        if len(parts) < 2 or parts[1] not in edges:
            continue
        for target in graph.find_modules_directly_imported_by(module):
            other = target.split(".")
            if len(other) > 1 and other[0] == "gpufleet" and other[1] in edges and other[1] != parts[1]:
                edges[parts[1]].add(other[1])
    return edges


def test_the_documented_imports_are_the_imports() -> None:
    assert documented() == imported()


def test_no_two_modules_share_a_name() -> None:
    # Plugins are the exception: a module is named after its plugin, and one name may serve two extension
    # points (`fgd` scores and selects, `las` and `priority` order and preempt); the folder says which.
    source = ROOT / "src" / "gpufleet"
    names = Counter(
        path.stem
        for path in source.rglob("*.py")
        if path.stem not in ("__init__", "__main__") and path.parent.parent != source / "policies"
    )
    assert [name for name, n in names.items() if n > 1] == []
