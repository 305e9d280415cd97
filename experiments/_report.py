"""Building blocks of results/report.md: every reproduced figure or table beside the paper's values.

Each ``experiments/repro_*.py`` module defines ``TITLE`` (str) and
``run(out: pathlib.Path) -> Section``; ``experiments/reproduce.py`` runs them
in file-name order and assembles the report. A new reproduction is a new
module: nothing else has to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Row", "Section", "fmt"]


def fmt(x, digits: int = 4) -> str:
    """Format a number for a report cell."""
    if isinstance(x, str):
        return x
    if isinstance(x, (int,)) and not isinstance(x, bool):
        return str(x)
    try:
        return f"{float(x):.{digits}f}"
    except (TypeError, ValueError):
        return str(x)


def _cell(text: str) -> str:
    """Escape a markdown table cell (pipes would split it)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


@dataclass
class Row:
    """One reproduced quantity: what it is, the paper's value, ours, and a verdict."""

    item: str
    paper: str
    ours: str
    verdict: str  # "matches" / "differs: <why>" / "shape matches" ...


@dataclass
class Section:
    """A block of the report: a title, the source in the paper, rows, figures and notes."""

    title: str
    source: str
    rows: list[Row] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)  # file names under results/
    notes: str = ""

    def to_markdown(self) -> str:
        lines = [f"## {self.title}", "", f"*Source:* {self.source}", ""]
        if self.notes:
            lines += [self.notes.strip(), ""]
        if self.rows:
            lines += ["| item | paper | otspec | verdict |", "|---|---|---|---|"]
            lines += [
                "| " + " | ".join(_cell(c) for c in (r.item, r.paper, r.ours, r.verdict)) + " |" for r in self.rows
            ]
            lines.append("")
        for fig in self.figures:
            lines += [f"![{fig}]({fig})", ""]
        return "\n".join(lines)
