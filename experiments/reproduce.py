"""Regenerate every figure and table otspec can reproduce into results/, with results/report.md.

Usage: ``python experiments/reproduce.py [--out results] [--only NAME ...]``.
Runs every ``experiments/repro_*.py`` module in name order (each returns a
report Section) and writes ``report.md`` beside the figures and tables.

Byte-stable: a rerun on the same machine and versions rewrites identical
``report.md``, CSVs and PNGs (floats to ``_report.SIG_DIGITS`` significant
digits, figures without metadata). Wall times vary on every run, so they go
only to ``timings.json`` (per section and per named step), which is not
tracked.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _report import Row, Section, write_text_atomic  # noqa: E402


class KeptSection:
    """A section of an earlier report.md kept verbatim (its module was not run this time, ``--only``)."""

    def __init__(self, title: str, text: str):
        self.title = title
        self.text = text
        self.rows = [Row("", "", "", v) for v in _verdicts(text)]

    def to_markdown(self) -> str:
        return self.text


def _verdicts(block: str) -> list[str]:
    """The verdict (last cell) of every row of the markdown tables in ``block``."""
    out = []
    for line in block.splitlines():
        if not (line.startswith("| ") and line.endswith(" |")) or line.startswith(("| item |", "|---")):
            continue
        cells = re.split(r"(?<!\\)\|", line)[1:-1]  # cells escape their own pipes as \|
        out.append(cells[-1].strip().replace("\\|", "|"))
    return out


def earlier_sections(report: Path) -> dict[str, str]:
    """``title -> markdown block`` of each section of an existing report (empty when there is none)."""
    if not report.exists():
        return {}
    text = report.read_text(encoding="utf-8")
    blocks = {}
    for part in re.split(r"\n(?=## )", text)[1:]:  # assemble() puts "\n\n" after each section's own "\n"
        blocks[part[3:].split("\n", 1)[0]] = part.removesuffix("\n")
    return blocks


def assemble(sections, failed=()) -> str:
    """The text of report.md: headline counts, contents, then every section in order."""
    summary = [r.verdict.split(":")[0].strip().lower() for s in sections for r in s.rows]
    head = [
        "# otspec reproduction report",
        "",
        "Every figure and table of the source papers that otspec reproduces, each beside the "
        "paper's printed values (or described shape) with a one-line verdict. Regenerate with "
        "`make reproduce`. Values computed by otspec are exact (closed forms, LPs re-checked, "
        "enumeration) unless a row gives a confidence interval. Wall times are not part of the report "
        "(they change on every run): `make reproduce` writes them to `timings.json`, which is not tracked.",
        "",
        f"Rows: {len(summary)}; matches: {sum(v.startswith('match') for v in summary)}; "
        f"shape matches: {sum(v.startswith('shape') for v in summary)}; "
        f"differs: {sum(v.startswith('differ') for v in summary)}; failed: {len(failed)}.",
        "",
        "Contents: " + ", ".join(f"[{s.title}](#{_anchor(s.title)})" for s in sections),
        "",
    ]
    return "\n".join(head) + "\n" + "\n\n".join(s.to_markdown() for s in sections) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="results", help="output folder (default: results)")
    ap.add_argument("--only", nargs="*", default=None,
                    help="run only these repro_* modules (names without prefix); the other sections of an "
                         "existing report.md in --out are kept as they are")
    args = ap.parse_args(argv)
    out = Path(args.out)
    modules = sorted(p.stem for p in HERE.glob("repro_*.py"))
    if args.only:
        unknown = sorted(set(args.only) - {m.removeprefix("repro_") for m in modules})
        if unknown:
            ap.error(f"--only: no module named {', '.join(unknown)} (known: "
                     f"{', '.join(m.removeprefix('repro_') for m in modules)})")
    out.mkdir(parents=True, exist_ok=True)
    earlier = earlier_sections(out / "report.md") if args.only else {}
    sections: list = []
    failed = []
    timings: dict[str, dict[str, float]] = {}
    for name in modules:
        if args.only and name.removeprefix("repro_") not in args.only:
            try:
                title = importlib.import_module(name).TITLE
            except Exception:  # a module that cannot even be imported keeps nothing
                continue
            if title in earlier:
                sections.append(KeptSection(title, earlier[title]))
            continue
        t0 = time.perf_counter()
        print(f"[reproduce] {name} ...", flush=True)
        try:
            mod = importlib.import_module(name)
            sec = mod.run(out)
        except Exception:  # report the failure in the report and in the exit code
            failed.append(name)
            sec = Section(title=name, source="(failed)", notes="```\n" + traceback.format_exc() + "\n```")
            sec.rows.append(Row(name, "-", "-", "FAILED"))
        sections.append(sec)
        dt = time.perf_counter() - t0
        timings[name] = {"total": round(dt, 3), **{k: round(v, 3) for k, v in sec.timings.items()}}
        print(f"[reproduce] {name} done in {dt:.1f} s", flush=True)
    write_text_atomic(out / "report.md", assemble(sections, failed))
    write_text_atomic(out / "timings.json", json.dumps(timings, indent=1) + "\n")
    print(f"[reproduce] wrote {out / 'report.md'} (wall times: {out / 'timings.json'})")
    if failed:
        print(f"[reproduce] FAILED sections: {failed}", file=sys.stderr)
        return 1
    return 0


def _anchor(title: str) -> str:
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return keep.replace(" ", "-")


if __name__ == "__main__":
    raise SystemExit(main())
