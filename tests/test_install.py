"""The distribution name on the package index: pyproject, README, docs and every install hint agree."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from otspec._deps import DISTRIBUTION, install_hint

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_names_the_distribution_of_the_hints():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["name"] == DISTRIBUTION != "otspec"
    assert install_hint("plot") == "pip install 'otspec-verifiers[plot]' (from a clone: pip install -e '.[plot]')"
    torch = [r for r in meta["optional-dependencies"]["decoding"] if r.startswith("torch")]
    assert torch == ["torch>=2.4"]  # a range; constraints.txt pins the tested version
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text()
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()


def _sources():
    for pattern in ("otspec/**/*.py", "docs/**/*.rst", "README.md", "tests/*.py"):
        for path in ROOT.glob(pattern):
            if "_build" not in path.parts:
                yield path


def test_every_install_hint_uses_the_index_name():
    # `pip install 'otspec[...]'` (or unquoted) would install the unrelated `otspec` from the index
    stale = re.compile(r"pip install\s+(-e\s+)?['\"]?otspec[\[\s'\"`]")
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in _sources() if p.name != "test_install.py"
           for i, line in enumerate(p.read_text().splitlines(), 1) if stale.search(line)]
    assert not bad, f"install hints naming the wrong distribution: {bad}"
    readme = (ROOT / "README.md").read_text()
    assert "pip install 'otspec-verifiers[plot]'" in readme and "pip install -e '.[plot]'" in readme


@pytest.mark.parametrize("module,extra", [("matplotlib", "plot"), ("torch", "decoding")])
def test_a_missing_optional_dependency_names_the_install_command(module, extra):
    code = (
        "import sys; sys.modules[%r] = None\n"
        "import importlib.util as u; real = u.find_spec\n"
        "u.find_spec = lambda name, *a: None if name == %r else real(name, *a)\n"
        "import otspec\n"
        "try:\n"
        "    getattr(otspec, %r)\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    ) % (module, module, "plotting" if extra == "plot" else "decoding")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert f"pip install '{DISTRIBUTION}[{extra}]'" in out.stdout, out.stdout + out.stderr
