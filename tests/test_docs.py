"""The documentation builds without a single warning (sphinx -W), API reference included."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("sphinx-build") is None and not (Path(sys.executable).parent / "sphinx-build").exists(),
                    reason="sphinx not installed (install the docs extra)")
def test_docs_build_without_warnings(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q", str(ROOT / "docs"), str(tmp_path / "html")],
        capture_output=True,
        text=True,
        env={"MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert out.returncode == 0, f"sphinx -W failed:\n{out.stdout}\n{out.stderr}"
