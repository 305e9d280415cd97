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


# A test that imports a part of otspec needing an optional dependency (otspec.profile and otspec.decoding: torch;
# otspec.plotting: matplotlib) without pytest.importorskip, at module level, in its body or in a doctest, failed (an error, not a
# skip) in an environment with the core dependencies only. Such a failure is reported as a skip naming the
# dependency, only when it is one of pyproject's extras and indeed not installed; any other failure stays one.
_OPTIONAL = re.compile(r"needs the optional dependency `([\w.]+)`|No module named '([\w.]+)'")
#: The import names of pyproject's optional dependencies (a missing module of another name stays an error: a typo)
_EXTRAS = {"torch", "transformers", "gguf", "accelerate", "tqdm", "matplotlib", "cvxpy", "clarabel", "numba", "ot",
           "pyarrow", "datasets", "dask", "distributed", "sphinx", "numpydoc"}


def _missing_extra(text: str):
    """The optional dependency (not installed) whose absence the error ``text`` reports, else None."""
    found = _OPTIONAL.search(text)
    name = found and (found.group(1) or found.group(2)).split(".")[0]
    return name if name in _EXTRAS and importlib.util.find_spec(name) is None else None


def _as_skip(report, path, name):
    report.outcome = "skipped"
    report.longrepr = (str(path), 0, f"Skipped: needs the optional dependency {name}")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if report.failed and isinstance(collector, pytest.Module):
        name = _missing_extra(str(report.longrepr))
        if name:
            _as_skip(report, collector.path, name)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    exc = None if call.excinfo is None else call.excinfo.value
    exc = getattr(exc, "exc_info", (None, exc))[1]  # a doctest's exception (doctest.UnexpectedException)
    if report.failed and isinstance(exc, ImportError):
        name = _missing_extra(str(exc))
        if name:
            _as_skip(report, item.path, name)
    return report
