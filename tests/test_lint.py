"""ruff (configured in pyproject.toml) over the package, tests and experiments: CI enforces the lint."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: it is part of the `test` extra (pip install -e '.[test]')")
    out = subprocess.run(
        [ruff, "check", "--no-cache", "otspec", "tests", "experiments", "conftest.py", "docs/conf.py"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
