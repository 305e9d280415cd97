"""The public API: every name in __all__ resolves, and `import otspec` stays light."""

import subprocess
import sys

import otspec


def test_all_names_resolve():
    assert len(otspec.__all__) == len(set(otspec.__all__)), "duplicate names in __all__"
    for name in otspec.__all__:
        assert hasattr(otspec, name), f"otspec.__all__ lists {name!r}, which does not resolve"


def test_import_does_not_pull_heavy_dependencies():
    code = (
        "import sys, otspec; "
        "bad = [m for m in ('torch', 'matplotlib', 'transformers', 'cvxpy') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"`import otspec` imported {out.stdout.strip()}"


def test_version():
    assert isinstance(otspec.__version__, str)
