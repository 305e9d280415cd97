"""Root pytest configuration: the torch-dependent doctests need the `decoding` extra.

`make test` installs it; a plain `pip install -e .[test]` does not, and then the
doctests of `otspec.decoding` and its guide are not collected (tests/test_decoding.py
skips itself through pytest.importorskip).
"""

import importlib.util

collect_ignore_glob = []
if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    collect_ignore_glob += ["otspec/decoding/*", "docs/guide/decoding.rst"]
