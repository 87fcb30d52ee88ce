"""Strings from the control plane (job names, reasons, queue, node and model names, audit entries) printed
so that they cannot drive the terminal: control characters (escape sequences, carriage returns,
bidirectional overrides) are shown escaped, `\\x1b` rather than ESC, and Rich markup in them is shown, not
interpreted. Job output (`gpufleet logs`) gets `text_block` when it goes to a terminal (or with
`--escape-control`), and is written as the job wrote it to a file or a pipe, or with `--raw`."""

from __future__ import annotations

import re

from rich.markup import escape
from rich.text import Text

# C0 and C1 controls, DEL, and the Unicode marks that reorder or hide text (bidi overrides and isolates).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# In a log's text, lines and tabs are what they are.
_CONTROL_IN_TEXT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain(value: object) -> str:
    """One line of text with every control character escaped (for `typer.echo` and error messages)."""
    return _CONTROL.sub(_escaped, str(value))


def markup(value: object) -> str:
    """`plain`, with Rich markup escaped too: for a user string inside a line printed with markup."""
    return escape(plain(value))


def cell(value: object) -> Text:
    """A table cell: escaped, and never read as markup."""
    return Text(plain(value))


def text_block(value: str) -> str:
    """Multi-line text (a log) with control characters escaped but its newlines and tabs kept."""
    return _CONTROL_IN_TEXT.sub(_escaped, value)
