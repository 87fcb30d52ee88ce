"""The dashboard's number filters: what a figure looks like on a page."""

from __future__ import annotations

import pytest

from gpufleet.server.web import common


@pytest.mark.parametrize(
    ("gpu_hours", "shown"),
    [(0.05, "0.05"), (0.2167, "0.22"), (3.46, "3.5"), (1234.4, "1,234")],
)
def test_gpu_hour_budgets_keep_the_digits_their_size_needs(gpu_hours: float, shown: str) -> None:
    # a 0.05 GPU-hour budget was shown as "0.1" (and a spend of 0.2 against it as over four times it)
    assert common._env.from_string("{{ x | gpu_hours }}").render(x=gpu_hours) == shown
