"""The documentation builds without a single warning (sphinx -W), API reference included."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


_NO_SPHINX = pytest.mark.skipif(
    shutil.which("sphinx-build") is None and not (Path(sys.executable).parent / "sphinx-build").exists(),
    reason="sphinx not installed (install the docs extra)")


def _sphinx(src, out, builder, home):
    """``sphinx -W --keep-going -b builder`` of ``src`` into ``out`` in a fresh interpreter: the completed process."""
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", builder, "-q", str(src), str(out)],
        capture_output=True,
        text=True,
        env={"MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin", "HOME": str(home)},
    )


#: The default suite reads the docs with Sphinx's ``dummy`` builder: every warning of reading (docutils' markup,
#: autodoc's imports and signatures, numpydoc) and of resolving references (the builder's write phase resolves every
#: page's references before it writes nothing) fails it, as the HTML build does; the HTML writer itself (about a third
#: of the build's CPU) runs under ``-m slow``. Checked on a copy of these docs with a title underline too short and
#: an unknown ``:doc:`` and ``:ref:``: the dummy build failed on all three warnings (and on a small project in
#: test_fast_docs_build_fails_on_markup_and_references below).
FAST_BUILDER = "dummy"


@_NO_SPHINX
def test_docs_build_without_warnings(tmp_path):
    out = _sphinx(ROOT / "docs", tmp_path / FAST_BUILDER, FAST_BUILDER, tmp_path)
    assert out.returncode == 0, f"sphinx -W failed:\n{out.stdout}\n{out.stderr}"


@pytest.mark.slow
@_NO_SPHINX
def test_docs_html_build_without_warnings(tmp_path):
    """The whole HTML build (the writer's own warnings too); its reading is the default suite's dummy build."""
    out = _sphinx(ROOT / "docs", tmp_path / "html", "html", tmp_path)
    assert out.returncode == 0, f"sphinx -W failed:\n{out.stdout}\n{out.stderr}"


@_NO_SPHINX
def test_fast_docs_build_fails_on_markup_and_references(tmp_path):
    """The default build fails where the docs would: a title underline too short, an unknown document and an
    unknown label (a builder that read without resolving references would pass the last two)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text('project = "t"\nextensions = []\n', encoding="utf-8")
    good = ".. _here:\n\nTitle\n=====\n\nText, :ref:`here` and :doc:`index`.\n"
    (src / "index.rst").write_text(good, encoding="utf-8")
    ok = _sphinx(src, tmp_path / "ok", FAST_BUILDER, tmp_path)
    assert ok.returncode == 0, ok.stderr
    (src / "index.rst").write_text("A longer title\n=====\n\nText, :doc:`no_such_page` and :ref:`no-such-label`.\n",
                                   encoding="utf-8")
    bad = _sphinx(src, tmp_path / "bad", FAST_BUILDER, tmp_path)
    assert bad.returncode != 0
    for warning in ("Title underline too short", "unknown document: 'no_such_page'",
                    "undefined label: 'no-such-label'"):
        assert warning in bad.stderr, (warning, bad.stderr)


#: What a reader of the package, its docs or the reproduction report does not have: the project's
#: planning documents (its mathematical brief and conventions, a helper's brief, the issue tracker).
#: They cite papers (authors, title, arXiv id, section) and the docs pages (docs/theory/..., docs/guide/...).
#: A public tracker cited with its project and number ("SGLang issue #35771") is fine.
_PLANNING = re.compile(
    r"MATH\.md|CONVENTIONS\.md|brief §|\bthe brief\b|\bthe issue\b|\bissue report\b|(?<![#\w])issues? \d+\b"
    r"|\bseed convention\b|\bthe seed paper\b",
    re.IGNORECASE,
)


def _cited_planning(paths):
    hits = []
    for path in paths:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _PLANNING.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return hits


def test_no_citation_of_planning_documents():
    paths = [*sorted((ROOT / "otspec").rglob("*.py")), *sorted((ROOT / "experiments").glob("*.py")),
             *sorted(p for p in (ROOT / "docs").rglob("*.rst") if "_build" not in p.parts),
             ROOT / "README.md", ROOT / "results" / "report.md"]
    hits = _cited_planning(p for p in paths if p.exists())
    assert not hits, "cite the paper or the docs page instead:\n" + "\n".join(hits)


def test_planning_pattern_catches_what_it_should(tmp_path):
    bad = ["the proof (MATH.md §9)", "10/9 (brief §6)", "see the issue report", "the issue asks for 200",
           "Target (issue 4): n = 1000", "as in CONVENTIONS.md"]
    good = ["SGLang issue #35771", "Hu et al., arXiv:2502.18779, §3", "docs/theory/without_replacement.rst",
            "a brief note", "no issue here"]
    assert all(_PLANNING.search(s) for s in bad)
    assert not any(_PLANNING.search(s) for s in good)
