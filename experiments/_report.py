"""Building blocks of results/report.md: every reproduced figure or table beside the paper's values.

Each ``experiments/repro_*.py`` module defines ``TITLE`` (str) and
``run(out: pathlib.Path) -> Section``; ``experiments/reproduce.py`` runs them
in file-name order and assembles the report. A new reproduction is a new
module: nothing else has to change.
"""

from __future__ import annotations

import csv
import io
import numbers
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "Row", "Section", "fmt", "fmt_error", "ROUNDOFF", "SIG_DIGITS", "csv_number", "save_figure", "write_csv",
    "write_text_atomic",
]

#: Significant digits of every float in a results CSV. otspec's values are exact to
#: about 1e-12 relative (LPs re-checked at 1e-9 absolute are rounded to fewer digits
#: by the scripts that print them); 10 digits keep every meaningful digit and drop the
#: last-bit noise that differs between BLAS builds and summation orders, so a rerun
#: on the same versions rewrites byte-identical files.
SIG_DIGITS = 10


def csv_number(v, digits: int = SIG_DIGITS):
    """A CSV cell: floats (Python or numpy) with ``digits`` significant digits, the rest unchanged.

    ``-0.0`` is written as ``0`` so that a sign of zero never shows as a change.
    """
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return "" if v is None else v
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        x = float(v)
        if x == 0.0:
            return "0"
        return f"{x:.{digits}g}"
    return v


def write_text_atomic(path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename.

    A reader (or a crash halfway) never sees a half-written file, and an
    earlier file is only replaced once the new one is complete.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


#: Magnitude below which an error or gap is round-off: its digits depend on summation order, SIMD
#: alignment and BLAS threads, so a report prints it as "below 1e-13", never its noise digits.
ROUNDOFF = 1e-13


def fmt_error(x, floor: float = ROUNDOFF) -> str:
    """An error, gap or difference for a report cell: ``.1e``, or "below <floor>" at round-off level.

    Values of magnitude below ``floor`` (either sign, zero included) all print the same, so a rerun
    that sums in another order writes the same report. Verdicts still compare the unrounded value.
    """
    x = float(x)
    if abs(x) < floor:
        return f"below {floor:.0e}"
    return f"{x:.1e}"


def fmt_argmax(values, where, *, what: str, at: str, floor: float = ROUNDOFF, digits: int = 4) -> str:
    """"largest <what> <value> at <at> = <where>", or, when every value is round-off, that there is none.

    Where the largest value is zero to rounding, its location is noise (one machine's summation order puts
    it at k = 1, another's at k = 6): say that there is no such gap instead of where it lies. Ties at the
    maximum (within ``floor``) report the first location.
    """
    values = [float(v) for v in values]
    top = max(values)
    if abs(top) < floor and all(abs(v) < floor for v in values):
        return f"no {what} (every value below {floor:.0e} in magnitude)"
    i = next(i for i, v in enumerate(values) if v >= top - floor)
    return f"largest {what} {top:.{digits}f} at {at} = {list(where)[i]}"


#: Metadata matplotlib would otherwise stamp into a figure file (its version; dates for PDF and SVG),
#: by format: ``None`` leaves the key out, so the bytes depend only on what is drawn.
_NO_METADATA = {
    ".png": {"Software": None},
    ".pdf": {"Creator": None, "Producer": None, "CreationDate": None},
    ".svg": {"Creator": None, "Date": None},
}


def save_figure(fig, path, *, dpi: int) -> str:
    """Lay out (unless the figure has its own layout engine), save and close ``fig``; return the file name.

    otspec's plotting functions make constrained-layout figures (room for an
    outside legend); ``tight_layout`` over them would warn and could clip it.
    The file carries no metadata (no matplotlib version, no creation date; SVG
    element ids from a fixed salt), so a rerun writes identical bytes. Written
    through a temporary file and a rename, as the CSVs are.
    """
    import matplotlib as mpl
    import matplotlib.pyplot as plt

    path = Path(path)
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    os.close(fd)
    try:
        with mpl.rc_context({"svg.hashsalt": "otspec"}):
            fig.savefig(tmp, dpi=dpi, metadata=_NO_METADATA.get(path.suffix.lower()))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    finally:
        plt.close(fig)
    return path.name


def write_csv(path, header, rows, *, digits: int = SIG_DIGITS, roundoff=()) -> None:
    """Write a results CSV atomically, floats with ``digits`` significant digits (see :data:`SIG_DIGITS`).

    ``roundoff`` names columns of errors and gaps: there a value of magnitude below
    :data:`ROUNDOFF` is written as ``0``, since its digits are summation-order noise
    (they change with BLAS threads or SIMD alignment) and would make a rerun differ.
    """
    header = list(header)
    unknown = sorted(set(roundoff) - set(header))
    if unknown:
        raise ValueError(f"`roundoff` names columns not in the header: {unknown}")
    flush = [name in roundoff for name in header]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in rows:
        w.writerow([0 if f and isinstance(v, numbers.Real) and not isinstance(v, bool) and abs(v) < ROUNDOFF
                    else csv_number(v, digits) for f, v in zip(flush, r)])
    write_text_atomic(path, buf.getvalue())


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
    #: Wall times (seconds) of named steps: written to ``timings.json`` (volatile, not tracked), never
    #: into report.md or a CSV, so that a rerun rewrites byte-identical tracked files.
    timings: dict[str, float] = field(default_factory=dict)

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
