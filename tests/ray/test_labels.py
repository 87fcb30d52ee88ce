"""Ray node labels give a node its rack, zone and pool; a label that names no pool is refused with its fix and
changes nothing (a typo must not move a node to another price or out of its pool)."""

from __future__ import annotations

import logging

import pytest

from gpufleet.adapters.ray.ray_inventory import POOL_LABEL, RACK_LABEL, ZONE_LABEL, labelled
from gpufleet.domain.cluster import Gpu, Node

NODE = Node("gpu-a", gpus=(Gpu(0, "GPU-a-0", "A100-80GB", 80 << 30),), rack="r1", zone="us-a", pool="on-demand")


def test_labels_override_rack_zone_and_pool() -> None:
    node = labelled(NODE, {RACK_LABEL: "r9", ZONE_LABEL: "us-b", POOL_LABEL: "spot", "other": "x"})
    assert (node.rack, node.zone, node.pool, node.name) == ("r9", "us-b", "spot", "gpu-a")


def test_no_labels_keep_the_inventory_values() -> None:
    assert labelled(NODE, {}) == NODE
    assert labelled(NODE, {RACK_LABEL: "", POOL_LABEL: ""}) == NODE


def test_a_pool_label_that_is_no_pool_is_logged_with_its_fix_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        node = labelled(NODE, {POOL_LABEL: "spott", ZONE_LABEL: "us-b"})
    assert (node.pool, node.zone) == ("on-demand", "us-b")
    [record] = caplog.records
    assert "gpufleet.io/pool='spott' is not a pool" in record.getMessage()
    assert "to fix: label it one of on-demand, spot, reserved" in record.getMessage()
