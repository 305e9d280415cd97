"""Shared pytest configuration: hypothesis profiles (derandomized in CI)."""

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

# PYTHONDONTWRITEBYTECODE=1 (set on the machines this project runs on) left every run, and every xdist worker in it,
# to rewrite the asserts of all ~40,000 lines of tests/ and compile otspec anew (pytest reads a cached rewrite even
# then, but never writes one), and every subprocess a test starts (the docs build, the fresh-interpreter import
# checks) to compile otspec again: about 9 CPU-s of a worker's 20 CPU-s of collection (docs/perf/testing.rst). The
# suite writes its bytecode (into the ignored __pycache__ folders) whatever that variable says.
sys.dont_write_bytecode = False

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("dev", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    # under pytest-xdist the workers already fill the cores (one per core with -n auto): one torch thread per
    # worker, so two workers' intra-op threads do not spin against each other (tiny models' attention calls
    # were 3x slower with torch's default of one thread per core in every worker)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        try:
            import torch
        except ImportError:  # the decoding extra is optional
            return
        torch.set_num_threads(1)


@pytest.fixture
def no_loading(monkeypatch):
    """The CLI (:mod:`otspec.__main__`) with every way to a model patched to fail the test: the errors under test come
    before any loading. Patched: the CLI's ``_load_pair``, the loaders it calls (``load_pair``, ``smollm2_pair``,
    ``toy_pair``), the checkpoint read of ``checkpoint_vocab`` and the run itself (``execute``). Returns the module."""
    import otspec.__main__ as cli

    def refuse(name):
        def fail(*args, **kwargs):
            # pytest.fail raises a BaseException: no ``except Exception`` on the way can swallow it
            pytest.fail(f"a model was loaded before the error was reported ({name} called)")

        return fail

    for name in ("_load_pair", "load_pair", "smollm2_pair", "toy_pair", "checkpoint_vocab", "execute"):
        monkeypatch.setattr(cli, name, refuse(name))
    return cli
