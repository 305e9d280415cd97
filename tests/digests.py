"""Digests of floats pinned bit for bit: their bits depend on the machine as well as the code.

numpy's vectorised sums and numba's compiled loops dispatch to the processor's widest vector instructions
(AVX-512 on one machine, AVX2 on the next), and the order of a sum's additions changes its last bits. A test that
pins a computation bit for bit (a refactor that must not move a single float) keeps one digest per kind of machine,
keyed by :func:`machine`; on a kind with no digest it skips, saying which it has (the values themselves are checked
on every machine by the tests' independent routes).
"""

from __future__ import annotations

import platform

import numpy as np
import pytest


def vector_isa() -> str:
    """The widest vector instruction set numpy dispatches to here: ``AVX512``, ``AVX2``, ``NEON``, ... ."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as feats
    except ImportError:  # numpy 1.x
        from numpy.core._multiarray_umath import __cpu_features__ as feats
    for name, flag in (("AVX512", "AVX512F"), ("AVX2", "AVX2"), ("AVX", "AVX"), ("SVE", "SVE"), ("NEON", "ASIMD")):
        if feats.get(flag):
            return name
    return "baseline"


def machine(*extra: str) -> str:
    """The kind of machine a digest was taken on: processor, vector instructions, numpy and ``extra`` versions."""
    return " ".join((platform.machine(), vector_isa(), f"numpy {np.__version__}") + extra)


def for_machine(table: dict, key: str):
    """What ``table`` holds for the machine ``key`` (a digest, a table of pinned floats); a skip where it holds
    nothing, naming the kinds it has."""
    if key not in table:
        pytest.skip(f"nothing pinned on {key!r} (pinned on {', '.join(map(repr, sorted(table)))})")
    return table[key]


def check_digest(got: str, table: dict[str, str], key: str) -> None:
    """``got`` equals the digest ``table`` holds for the machine ``key``; a skip where it holds none."""
    assert got == for_machine(table, key), f"digest on {key!r}"
