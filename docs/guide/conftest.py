"""The guides' examples run in a temporary directory (the figures guide writes PNG files)."""

import pytest


@pytest.fixture(autouse=True)
def _run_in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
