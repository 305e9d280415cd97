"""Leviathan et al.'s economics of speculative decoding: printed tables, alpha = 1 limits, monotonicity, bad input."""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from otspec import speculative as sp

# Leviathan et al., Table 1 (c = c_hat = 0): alpha, gamma, operations, speed
TABLE1 = [
    (0.6, 2, 1.53, 1.96),
    (0.7, 3, 1.58, 2.53),
    (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69),
    (0.9, 2, 1.11, 2.71),
    (0.9, 10, 1.60, 6.86),
]

# Table 4 rows whose EXP column is reproduced at its printed precision from the printed
# (rounded) alpha and c: (gamma, alpha, c, EXP). The three other rows (ENDE T5-BASE temp 1,
# ENDE T5-LARGE temp 1, CNNDM T5-LARGE temp 1) give 2.35, 1.93, 1.54 against 2.4, 2.0, 1.6;
# see experiments/repro_41_leviathan.py.
TABLE4_MATCHING = [
    (7, 0.75, 0.02, 3.2),
    (7, 0.8, 0.04, 3.3),
    (7, 0.82, 0.11, 2.5),
    (7, 0.62, 0.02, 2.3),
    (5, 0.65, 0.02, 2.4),
    (5, 0.73, 0.04, 2.6),
    (3, 0.74, 0.11, 2.0),
    (5, 0.53, 0.02, 1.9),
    (3, 0.55, 0.04, 1.8),
]


def geometric_exact(alpha, gamma):
    """1 + a + ... + a^gamma in exact rational arithmetic."""
    a = Fraction(alpha)
    return float(sum(a**i for i in range(gamma + 1)))


@pytest.mark.parametrize("alpha,gamma,ops,speed", TABLE1)
def test_table1(alpha, gamma, ops, speed):
    assert round(sp.operations_factor(alpha, gamma, 0.0), 2) == ops
    assert round(sp.walltime_improvement(alpha, gamma, 0.0), 2) == speed


@pytest.mark.parametrize("gamma,alpha,c,exp", TABLE4_MATCHING)
def test_table4_exp(gamma, alpha, c, exp):
    assert round(sp.walltime_improvement(alpha, gamma, c), 1) == exp


def test_text_examples():
    # §3.6: bigram draft, alpha ~ 0.2, gamma = 3, c ~ 0 -> 1.25X
    assert round(sp.walltime_improvement(0.2, 3, 0.0), 2) == 1.25
    # App. A.5 (argmax lenience): alpha = 0.75, 0.8, 0.87 at c = 0.015, gamma = 8 -> 3.3X, 3.9X, 4.9X
    for a, v in [(0.75, 3.3), (0.8, 3.9), (0.87, 4.9)]:
        assert round(sp.walltime_improvement(a, 8, 0.015), 1) == v


@given(st.floats(0.0, 1.0), st.integers(1, 60))
def test_expected_tokens_against_exact_rationals(alpha, gamma):
    assert sp.expected_tokens(alpha, gamma) == pytest.approx(geometric_exact(alpha, gamma), rel=4e-15)


@pytest.mark.parametrize("gamma", [1, 2, 7, 100])
def test_alpha_one_limits(gamma):
    assert sp.expected_tokens(1.0, gamma) == gamma + 1
    assert sp.operations_factor(1.0, gamma, 0.0) == 1.0
    assert sp.walltime_improvement(1.0, gamma, 0.5) == (gamma + 1) / (0.5 * gamma + 1)
    # continuity from below, accurate near 1 (no cancellation in 1 - alpha^(gamma+1))
    a = 1 - 1e-12
    assert sp.expected_tokens(a, gamma) == pytest.approx(geometric_exact(a, gamma), rel=1e-14)
    assert sp.expected_tokens(a, gamma) == pytest.approx(gamma + 1, rel=gamma**2 * 1e-12)


def test_alpha_zero():
    assert sp.expected_tokens(0.0, 5) == 1.0
    assert sp.walltime_improvement(0.0, 3, 0.1) == pytest.approx(1 / 1.3, rel=1e-15)


def test_vectorised():
    a = np.linspace(0, 1, 11)
    out = sp.expected_tokens(a, 3)
    assert out.shape == (11,)
    np.testing.assert_allclose(out, [geometric_exact(x, 3) for x in a], rtol=1e-15)
    g = sp.walltime_improvement(0.8, np.array([1, 2, 3]), np.array([[0.0], [0.1]]))
    assert g.shape == (2, 3)
    assert isinstance(sp.expected_tokens(0.5, 2), float)


@given(st.floats(0.0, 0.999), st.integers(1, 50))
def test_monotonicity(alpha, gamma):
    # more acceptance, more drafts: more tokens; more cost: less speed
    assert sp.expected_tokens(min(alpha + 1e-3, 1.0), gamma) > sp.expected_tokens(alpha, gamma)
    # (non-strict: alpha^(gamma+1) can fall below the resolution of the sum)
    assert sp.expected_tokens(alpha, gamma + 1) >= sp.expected_tokens(alpha, gamma)
    assert sp.walltime_improvement(alpha, gamma, 0.1) < sp.walltime_improvement(alpha, gamma, 0.05)
    assert sp.operations_factor(alpha, gamma, 0.1) > sp.operations_factor(alpha, gamma, 0.0)


@given(st.floats(0.0, 0.99), st.floats(0.001, 1.0))
def test_optimal_gamma_brute_force(alpha, c):
    g = sp.optimal_gamma(alpha, c, max_gamma=400)
    gs = np.arange(1, 401)
    # float partial sums of the powers (an independent route; Fractions would be slow here)
    partial = np.cumsum(alpha ** np.arange(0, 401))
    vals = partial[gs] / (gs * c + 1)
    assert vals[g - 1] >= vals.max() * (1 - 1e-13)
    # improvement exists iff alpha > c (Corollary 3.9); the bound is the gamma = 1 value
    best = sp.walltime_improvement(alpha, g, c)
    bound = sp.improvement_lower_bound(alpha, c)
    assert best >= bound * (1 - 1e-15)
    assert (bound > 1) == (alpha > c) or math.isclose(alpha, c, rel_tol=1e-12)


def test_optimal_gamma_edge_cases():
    assert sp.optimal_gamma(0.0, 0.1) == 1
    assert sp.optimal_gamma(0.5, 0.0, max_gamma=37) == 37  # c = 0: more drafts always help
    assert sp.optimal_gamma(1.0, 0.5, max_gamma=50) == 50
    assert sp.optimal_gamma(1.0, 2.0) == 1
    np.testing.assert_array_equal(sp.optimal_gamma([0.5, 0.9], [0.01, 0.01]), [5, 24])


def test_expected_acceptance():
    P = np.array([[0.5, 0.5], [1.0, 0.0]])
    Q = np.array([[0.25, 0.75], [0.5, 0.5]])
    assert sp.expected_acceptance(P, Q) == pytest.approx((0.75 + 0.5) / 2, abs=1e-15)
    # lenience: sum min(q/l, p) per context
    assert sp.expected_acceptance(P, Q, l=0.5) == pytest.approx((1.0 + 1.0) / 2, abs=1e-15)
    with pytest.raises(ValueError, match="same shape"):
        sp.expected_acceptance(P, Q[:1])
    with pytest.raises(ValueError, match="`l`"):
        sp.expected_acceptance(P, Q, l=0.0)


@pytest.mark.parametrize("alpha", [-0.1, 1.0000001, float("nan"), [0.5, 2.0]])
def test_bad_alpha(alpha):
    with pytest.raises(ValueError, match="`alpha`"):
        sp.expected_tokens(alpha, 2)
    with pytest.raises(ValueError, match="`alpha`"):
        sp.optimal_gamma(alpha, 0.1)


@pytest.mark.parametrize("gamma", [0, -3, [1, 0]])
def test_bad_gamma(gamma):
    with pytest.raises(ValueError, match="`gamma`"):
        sp.walltime_improvement(0.5, gamma, 0.1)


@pytest.mark.parametrize("gamma", [1.5, "3", None])
def test_gamma_type(gamma):
    with pytest.raises(TypeError, match="`gamma`"):
        sp.expected_tokens(0.5, gamma)


@pytest.mark.parametrize("c", [-0.01, float("inf"), float("nan")])
def test_bad_c(c):
    with pytest.raises(ValueError, match="`c`"):
        sp.walltime_improvement(0.5, 2, c)
    with pytest.raises(ValueError, match="`c`"):
        sp.optimal_gamma(0.5, c)
    with pytest.raises(ValueError, match="`c`"):
        sp.improvement_lower_bound(0.5, c)
    with pytest.raises(ValueError, match="`c_hat`"):
        sp.operations_factor(0.5, 2, c)


def test_bad_max_gamma():
    with pytest.raises(ValueError, match="`max_gamma`"):
        sp.optimal_gamma(0.5, 0.1, max_gamma=0)
