"""Every runnable code example of README.md and docs/ is executed by the suite.

* ``>>>`` examples in docs/ run as doctests (``--doctest-glob='*.rst'`` over the paths in
  ``testpaths``); the first test checks that no file holding them lies outside those paths.
* Fenced ```` ```python ```` blocks of README.md and ``.. code-block:: python`` blocks of
  docs/ are executed here, each in a fresh namespace inside a temporary directory. A block
  that loads the real SmolLM2 pair (``smollm2``) is marked ``slow`` (``make test-slow``).
* Blocks in other languages (the ``make`` commands) are not Python and are not run.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_RST_BLOCK = re.compile(r"^\.\. code-block:: python\n((?:[ \t]*\n|[ \t]+\S.*\n)+)", re.M)


def _dedent(block: str) -> str:
    lines = block.splitlines()
    ind = min((len(ln) - len(ln.lstrip()) for ln in lines if ln.strip()), default=0)
    return "\n".join(ln[ind:] for ln in lines).strip("\n") + "\n"


def code_blocks() -> list[tuple[str, str]]:
    """``(id, source)`` of every executable Python block in README.md and docs/."""
    out = []
    for i, m in enumerate(_FENCE.finditer((ROOT / "README.md").read_text())):
        out.append((f"README.md#{i}", m.group(1)))
    for path in sorted((ROOT / "docs").rglob("*.rst")):
        if "_build" in path.parts:
            continue
        for i, m in enumerate(_RST_BLOCK.finditer(path.read_text())):
            out.append((f"{path.relative_to(ROOT)}#{i}", _dedent(m.group(1))))
    return out


def _params():
    out = []
    for ident, src in code_blocks():
        marks = []
        if "smollm2" in src:
            marks.append(pytest.mark.slow)
        if "torch" in src:
            marks.append(pytest.mark.skipif(not _has("torch") or not _has("transformers"),
                                            reason="needs the decoding extra"))
        if "sgl_kernel" in src:  # SGLang's CUDA kernels: only where they are installed (a GPU machine)
            marks.append(pytest.mark.skipif(not _has("sgl_kernel"), reason="needs SGLang's sgl_kernel (CUDA)"))
        if "matplotlib" in src or "plotting" in src:
            marks.append(pytest.mark.skipif(not _has("matplotlib"), reason="needs matplotlib"))
        out.append(pytest.param(src, id=ident, marks=marks))
    return out


def _has(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def test_readme_and_docs_have_code_blocks():
    ids = [i for i, _ in code_blocks()]
    assert any(i.startswith("README.md") for i in ids)
    assert any("decoding.rst" in i for i in ids)


def test_every_doctest_file_is_collected():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    roots = [ROOT / p for p in cfg["testpaths"]]
    assert "--doctest-glob='*.rst'" in cfg["addopts"]
    uncollected = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "docs").rglob("*.rst")
        if "_build" not in p.parts and ">>>" in p.read_text() and not any(p == r or r in p.parents for r in roots)
    ]
    assert not uncollected, f"doctests outside the collected paths {cfg['testpaths']}: {uncollected}"


@pytest.mark.parametrize("source", _params())
def test_code_block_runs(source, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    exec(compile(source, "<doc block>", "exec"), {"__name__": "__doc_block__"})
