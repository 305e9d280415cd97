"""A hypothesis property run twice: fewer examples in the default suite, the full run under ``-m slow``."""

from __future__ import annotations

import pytest
from hypothesis import settings


def fast_and_slow(given_, body, *, fast: int, slow: int, **other):
    """``given_(body)`` as two tests: ``max_examples=fast`` (the default suite) and ``max_examples=slow`` marked
    slow (``make test-slow``). Assign them to two ``test_`` names; ``other`` settings (``deadline=None``...) go to
    both, the rest are the loaded profile's."""
    if not 0 < fast < slow:
        raise ValueError(f"fast_and_slow: expected 0 < fast < slow, received fast={fast!r}, slow={slow!r}")
    return (settings(max_examples=fast, **other)(given_(body)),
            pytest.mark.slow(settings(max_examples=slow, **other)(given_(body))))
