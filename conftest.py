"""Root pytest configuration: the torch-dependent doctests need the `decoding` extra.

`make test` installs it; a plain `pip install -e .[test]` does not, and then the
doctests of `otspec.decoding` and its guide are not collected (tests/test_decoding.py
skips itself through pytest.importorskip).
"""

import importlib.util
import re

import pytest

collect_ignore_glob = []
if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    collect_ignore_glob += ["otspec/decoding/*", "docs/guide/decoding.rst"]


# A test module that imports a part of otspec needing an optional dependency (otspec.profile and otspec.decoding:
# torch; otspec.plotting: matplotlib) before its own pytest.importorskip failed to collect without that dependency
# (an error, not a skip, in an environment with the core dependencies only). Such a collection error is reported as
# a skip naming the dependency, only when it is one of pyproject's extras and indeed not installed.
_OPTIONAL = re.compile(r"needs the optional dependency `([\w.]+)`|No module named '([\w.]+)'")
#: The import names of pyproject's optional dependencies (a missing module of another name stays an error: a typo)
_EXTRAS = {"torch", "transformers", "gguf", "accelerate", "tqdm", "matplotlib", "cvxpy", "clarabel", "numba", "ot",
           "pyarrow", "datasets", "dask", "distributed", "sphinx", "numpydoc"}


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if report.failed and isinstance(collector, pytest.Module):
        found = _OPTIONAL.search(str(report.longrepr))
        name = found and (found.group(1) or found.group(2)).split(".")[0]
        if name in _EXTRAS and importlib.util.find_spec(name) is None:
            report.outcome = "skipped"
            report.longrepr = (str(collector.path), 0, f"Skipped: needs the optional dependency {name}")
    return report
