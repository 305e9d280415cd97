"""Two drafts without replacement in closed form: ``1 - f(A_j) = (c_j / T) (1 + sum_{i<j} p_i / (T - p_i))``.

Checked against exact rational enumeration of the ordered pairs (small ``n``) and against the race integral
(``closed_two=False``, the route every other ``k`` takes) at full vocabulary; and ``alpha_k(replacement=False)``
at ``k = 2`` against the membership LP.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import otspec
from otspec.otm import uncovered_prefixes, wor_lp
from otspec.otm._without_replacement import _race


def _enumerated(p: list[Fraction]) -> list[Fraction]:
    """``1 - P(both draws in the first j tokens)`` for ``j = 0..n``, by every ordered pair of distinct tokens."""
    T = sum(p)
    out = []
    for j in range(len(p) + 1):
        inside = sum((p[a] / T) * (p[b] / (T - p[a])) for a, b in itertools.permutations(range(j), 2) if T - p[a] > 0)
        out.append(1 - inside)
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=2, max_size=7).filter(lambda w: sum(x > 0 for x in w) >= 1))
def test_closed_form_equals_rational_enumeration(weights):
    # a wrong second-draw law (p_b / T instead of p_b / (T - p_a): with replacement) or a c_j taken as 1 - P_j on
    # unnormalised masses fails here by far more than the tolerance
    p = [Fraction(w) for w in weights]
    x = np.array([float(w) for w in weights])
    got = uncovered_prefixes(x, 2)
    want = [float(v) for v in _enumerated(p)]
    np.testing.assert_allclose(got, want, rtol=0, atol=8 * len(p) * np.finfo(float).eps)


@pytest.mark.parametrize("n", [50, 4_096, 49_152])
@pytest.mark.parametrize("kind", ["flat", "peaked", "zeros"])
def test_closed_form_equals_the_race_integral(n, kind):
    rng = np.random.default_rng(n)
    p = rng.dirichlet(np.full(n, 1.0 if kind == "flat" else 0.02))
    if kind == "zeros":
        p[rng.choice(n, n // 3, replace=False)] = 0.0
        p /= p.sum()
    p = np.sort(p)[::-1] if kind == "peaked" else p
    ks = np.array([1, 2, 3])
    closed, info = _race(p, ks)
    integral, _ = _race(p, ks, closed_two=False)
    # the race's own guarantee is 1e-13 + 4 n eps absolute; the closed form is within a few n eps of exact
    np.testing.assert_allclose(closed[1], integral[1], rtol=0, atol=1e-13 + 4 * n * np.finfo(float).eps)
    np.testing.assert_array_equal(closed[0], integral[0])  # k = 1: c exactly on both routes
    # k = 3 is integrated on both, its grid refined with or without k = 2's prefixes: the same to the race's tolerance
    np.testing.assert_allclose(closed[2], integral[2], rtol=0, atol=1e-13 + 4 * n * np.finfo(float).eps)
    assert info["nodes"] > 0  # k = 3 still integrated


def test_two_only_needs_no_race_pass():
    p = np.random.default_rng(1).dirichlet(np.ones(1_000))
    _, info = _race(p, np.array([2]))
    assert info == {"nodes": 0, "halvings": 0, "work": 0}


@pytest.mark.parametrize("p", [[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.0, 0.25, 0.75], [1e-300, 0.5, 0.5 - 1e-300]])
def test_edge_laws(p):
    p = np.array(p)
    got = uncovered_prefixes(p, 2)
    want = [float(v) for v in _enumerated([Fraction(x) for x in p])]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)
    assert np.all((got >= 0) & (got <= 1))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 6))
def test_alpha_two_without_replacement_equals_the_lp(seed, n):
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.full(n, 0.5)), rng.dirichlet(np.full(n, 0.5))
    p[rng.integers(n)] = 0.0 if np.count_nonzero(p) > 2 else p[0]
    p /= p.sum()
    got = otspec.alpha_k(p, q, 2, replacement=False)
    assert got == pytest.approx(wor_lp(p, q, 2), abs=1e-9)  # the LP's re-check tolerance
