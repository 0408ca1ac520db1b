"""The one Markdown table writer (GitHub-flavoured): the bench's summary.md and the analysis tables."""
from __future__ import annotations

from typing import Iterable, Sequence


def escape_cell(text: str) -> str:
    """A cell's text on one line, with its pipes escaped so they do not split the row."""
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[str]],
                   right: Sequence[bool] | None = None) -> str:
    """Header, rule and one line per row of already formatted cells; `right[i]` right-aligns column i
    (numbers). No trailing newline."""
    right = right or [False] * len(columns)
    lines = ["| " + " | ".join(escape_cell(str(c)) for c in columns) + " |",
             "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    lines += ["| " + " | ".join(escape_cell(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
