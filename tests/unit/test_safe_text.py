"""What the CLI prints of the server's strings: control characters escaped, markup shown, never applied."""

from __future__ import annotations

import io

from rich.console import Console

from gpufleet.cli.commands_report import table as usage_table
from gpufleet.cli.safe_text import markup, plain, text_block
from gpufleet.cli.top import frame

ESC = "\x1b"
EVIL = f"{ESC}]0;owned{ESC}\\{ESC}[2J[bold]x[/] \u202e\r\t"


def rendered(renderable: object) -> str:
    out = io.StringIO()
    Console(file=out, width=300, color_system=None, force_terminal=False).print(renderable)
    return out.getvalue()


def test_plain_escapes_every_control_character_and_keeps_the_rest() -> None:
    assert plain(EVIL) == "\\x1b]0;owned\\x1b\\\\x1b[2J[bold]x[/] \\u202e\\x0d\\x09"
    assert plain("café – ok") == "café – ok"
    assert markup("[red]x[/]") == "\\[red]x\\[/]"
    assert text_block("a\tb\nc\x1b[0m") == "a\tb\nc\\x1b[0m"


def test_top_shows_node_model_job_and_queue_names_escaped() -> None:
    gpu = {
        "node": EVIL, "index": 0, "model": EVIL, "util": 50.0, "memory_used": 1, "memory_total": 2,
        "power_w": None, "temperature_c": None, "idle": False, "job_id": EVIL, "jobs": [EVIL], "low_for_s": None,
        "queue": EVIL,
    }  # fmt: skip
    queue = {
        "queue": EVIL, "running": 1, "pending": 0, "oldest_wait_s": None, "median_wait_s": None,
        "allocated_gpus": 1.0, "used_gpus": 0.5, "reserved_idle_gpus": 0, "idle_policy": EVIL,
    }  # fmt: skip
    data = {
        "emulated": True, "sampled_at": 1.0, "now": 2.0, "probe": "emulated", "gpus": [gpu], "interval_s": 5.0,
        "idle_threshold_pct": 5.0, "idle_window_s": 1800.0, "queues": [queue],
    }  # fmt: skip
    text = rendered(frame(data, "http://127.0.0.1:8080"))
    assert ESC not in text
    assert "\u202e" not in text
    assert text.count("\\x1b]0;owned") >= 5
    assert "[bold]x[/]" in text


def test_the_usage_report_shows_queue_names_escaped() -> None:
    row = {"queue": EVIL, "jobs": 1, "allocated_gpu_hours": 1.0, "sampled_gpu_hours": 1.0, "used_gpu_hours": 0.5,
           "reserved_idle_gpu_hours": 0.0, "utilisation": 0.5}  # fmt: skip
    report = {"since": 0.0, "until": 3600.0, "emulated": True, "queues": [row], "total": {**row, "queue": "all"}}
    text = rendered(usage_table(report))
    assert ESC not in text
    assert "\\x1b]0;owned" in text
