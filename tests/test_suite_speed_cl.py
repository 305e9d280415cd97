"""The test suite's own helpers and settings that the speed-ups rest on (docs/perf/testing.rst).

The shared ``no_loading`` fixture (tests/conftest.py) of the CLI tests that check errors come before any model is
loaded: each way to a model fails the test, and a valid call that would load one fails it too.
"""

from __future__ import annotations

import pytest

LOADERS = ("_load_pair", "load_pair", "smollm2_pair", "toy_pair", "checkpoint_vocab", "execute")


@pytest.mark.parametrize("name", LOADERS)
def test_no_loading_fails_the_test_at_every_loader(no_loading, name):
    # pytest.fail's exception is a BaseException: the CLI's `except (ValueError, ...)` cannot turn it into rc 2
    with pytest.raises(pytest.fail.Exception, match=name):
        getattr(no_loading, name)("toy:3", "toy:3", "cpu")


def test_no_loading_fails_a_valid_profile_call(no_loading, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input_ids": [1, 2]}\n')
    with pytest.raises(pytest.fail.Exception, match="_load_pair"):
        no_loading.main(["profile", "--draft", "toy:3", "--target", "toy:3", "--prompts", str(prompts), "--out",
                         str(tmp_path / "out"), "--k-max", "2", "--L-max", "2", "--max-new-tokens", "3",
                         "--no-progress"])
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_suite_writes_its_bytecode():
    # tests/conftest.py: with PYTHONDONTWRITEBYTECODE=1 every run and every xdist worker rewrote the asserts of all of
    # tests/ and compiled otspec anew (collection 23.2 CPU-s per worker, 11.3 with the bytecode cached)
    import sys

    assert sys.dont_write_bytecode is False
