"""alpha_k: the sort-based closed form against the LPs, Lemma 1 and Lemma 3, and edge cases."""

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import otspec
from otspec.closed_form import bernoulli_alpha_k, uniform_alpha_k
from otspec.testing.strategies import pairs

# Guaranteed agreement between routes: the LP is re-checked to 1e-9, the closed
# form is exact to a few n*eps.
TOL = 1e-9


def brute_force_cut(p, q, k):
    """min over all 2^n subsets of 1 + q(A) - p(A)^k (no prefix property used)."""
    n = len(p)
    best = np.inf
    for mask in itertools.product((False, True), repeat=n):
        m = np.array(mask)
        best = min(best, 1.0 + q[m].sum() - p[m].sum() ** k)
    return best


@given(pairs(max_n=5), st.integers(1, 3))
def test_exact_equals_reduced_lp(pq, k):
    p, q = pq
    res = otspec.otm_lp(p, q, k)
    assert res.success, res.message
    np.testing.assert_allclose(otspec.alpha_k(p, q, k), res.alpha, rtol=0, atol=TOL)


@given(pairs(max_n=3), st.integers(1, 2))
def test_exact_equals_tuple_lp(pq, k):
    p, q = pq
    np.testing.assert_allclose(
        otspec.alpha_k(p, q, k), otspec.alpha_k(p, q, k, method="lp-tuples"), rtol=0, atol=TOL
    )


@given(pairs(max_n=6), st.integers(1, 5))
def test_prefix_property_against_all_subsets(pq, k):
    p, q = pq
    np.testing.assert_allclose(otspec.alpha_k(p, q, k), brute_force_cut(p, q, k), rtol=0, atol=1e-12)


@given(pairs(max_n=8))
def test_alpha_1_is_one_minus_tv(pq):
    p, q = pq
    np.testing.assert_allclose(otspec.alpha_k(p, q, 1), 1 - 0.5 * np.abs(p - q).sum(), rtol=0, atol=1e-12)


@given(pairs(max_n=8))
def test_monotone_in_k_lemma1(pq):
    p, q = pq
    a = otspec.alpha_k(p, q, list(range(1, 12)))
    assert np.all(np.diff(a) >= -1e-12)
    assert np.all((a >= 0) & (a <= 1))


@given(pairs(max_n=6), st.lists(st.integers(1, 6), min_size=1, max_size=4))
def test_sequence_of_k_matches_scalar_calls(pq, ks):
    p, q = pq
    vec = otspec.alpha_k(p, q, ks)
    assert isinstance(vec, np.ndarray) and vec.shape == (len(ks),)
    np.testing.assert_allclose(vec, [otspec.alpha_k(p, q, k) for k in ks], rtol=0, atol=0)


@pytest.mark.parametrize("seed", range(6))
def test_lemma1_limits(seed):
    rng = np.random.default_rng(seed)
    n = 6
    p = rng.dirichlet(np.ones(n)) * 0.99 + 0.01 / n  # min p > 1e-3
    q = rng.dirichlet(np.ones(n))
    # bounded ratio: alpha_k -> 1
    np.testing.assert_allclose(otspec.alpha_k(p, q, 100_000), 1.0, rtol=0, atol=1e-12)
    # unbounded ratio (p has zeros where q does not): alpha_k -> q(supp p)
    p2 = p.copy()
    p2[:2] = 0
    p2 /= p2.sum()
    np.testing.assert_allclose(otspec.alpha_k(p2, q, 100_000), q[2:].sum(), rtol=0, atol=1e-12)


@given(pairs(max_n=4), st.integers(1, 3))
def test_lemma3_upper_bound_is_tight(pq, k):
    p, q = pq
    ub = otspec.alpha_k_upper_bound(p, q, k)
    np.testing.assert_allclose(ub, otspec.alpha_k(p, q, k), rtol=0, atol=1e-12)
    lb = otspec.alpha_k_lower_bound(p, q, k)
    assert lb <= otspec.alpha_k(p, q, k) + 1e-12


@given(pairs(max_n=4), st.integers(1, 3))
def test_lp_plan_is_an_optimal_lossless_verifier(pq, k):
    p, q = pq
    res = otspec.otm_lp(p, q, k)
    chk = otspec.check_lossless(res.verifier)
    assert chk.max_marginal_error <= 1e-9
    assert chk.max_row_error <= 1e-12
    np.testing.assert_allclose(chk.acceptance, otspec.alpha_k(p, q, k), rtol=0, atol=1e-9)
    np.testing.assert_allclose(chk.acceptance, res.verifier.acceptance(), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "p, q, k, expected",
    [
        ([1.0], [1.0], 3, 1.0),  # n = 1
        ([1, 0, 0], [0, 0, 1], 4, 0.0),  # point masses, different
        ([0, 1, 0], [0, 1, 0], 2, 1.0),  # point masses, equal
        ([0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5], 5, 0.0),  # disjoint supports
        ([0.2, 0.3, 0.5], [0.2, 0.3, 0.5], 1, 1.0),  # p == q
        ([1 - 1e-300, 1e-300], [0.5, 0.5], 1, 0.5 + 1e-300),
    ],
)
def test_edge_cases(p, q, k, expected):
    np.testing.assert_allclose(otspec.alpha_k(p, q, k), expected, rtol=0, atol=1e-15)


def test_tiny_probabilities_stay_exact():
    p = np.array([1 - 2e-300, 1e-300, 1e-300])
    q = np.array([1e-300, 0.5, 0.5 - 1e-300])
    # only the first token can be matched: alpha_1 = min(p0, q0) + ... = 1e-300 + 2e-300
    assert otspec.alpha_k(p, q, 1) == pytest.approx(3e-300, rel=1e-12)
    # with many drafts the rare tokens appear with probability ~ k * 1e-300
    a = otspec.alpha_k(p, q, 1000)
    assert 0 < a < 1e-296


@pytest.mark.parametrize("pb", [Fraction(1, 4), Fraction(1, 2), Fraction(9, 10)])
@pytest.mark.parametrize("qb", [Fraction(1, 10), Fraction(3, 4), Fraction(1, 3)])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_bernoulli_closed_form(pb, qb, k):
    exact = bernoulli_alpha_k(pb, qb, k)
    assert isinstance(exact, Fraction)
    p = np.array([1 - float(pb), float(pb)])
    q = np.array([1 - float(qb), float(qb)])
    np.testing.assert_allclose(otspec.alpha_k(p, q, k), float(exact), rtol=0, atol=1e-15)
    np.testing.assert_allclose(otspec.otm_lp(p, q, k).alpha, float(exact), rtol=0, atol=TOL)


def test_bernoulli_closed_form_sympy_rationals():
    sympy = pytest.importorskip("sympy")
    val = bernoulli_alpha_k(sympy.Rational(1, 4), sympy.Rational(3, 4), 2)
    assert val == sympy.Rational(11, 16)


@pytest.mark.parametrize("d_p, d_q", [(8, 2), (8, 4), (6, 6), (12, 3), (3, 6), (2, 8)])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_uniform_closed_form(d_p, d_q, k):
    n = max(d_p, d_q)
    p = np.zeros(n)
    q = np.zeros(n)
    p[:d_p] = 1.0 / d_p
    q[:d_q] = 1.0 / d_q
    expected = uniform_alpha_k(d_p, d_q, k, exact=True)
    np.testing.assert_allclose(otspec.alpha_k(p, q, k), float(expected), rtol=0, atol=1e-14)
    if n <= 8 and k <= 2:
        np.testing.assert_allclose(otspec.otm_lp(p, q, k).alpha, float(expected), rtol=0, atol=TOL)


def test_closed_form_errors():
    with pytest.raises(ValueError, match=r"`p` must lie in \[0, 1\]"):
        bernoulli_alpha_k(1.5, 0.5, 2)
    with pytest.raises(TypeError, match=r"`q` must be a real number"):
        bernoulli_alpha_k(0.5, "x", 2)
    with pytest.raises(ValueError, match=r"`d_q` must be an integer >= 1"):
        uniform_alpha_k(4, 0, 2)
    with pytest.raises(ValueError, match=r"2\*\*n \* n\*\*k"):
        otspec.alpha_k_upper_bound(np.full(20, 0.05), np.full(20, 0.05), 3)


def test_min_cut_structure():
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(7)), rng.dirichlet(np.ones(7))
    cut = otspec.min_cut(p, q, 3)
    assert cut.size == cut.omega0.shape[0]
    np.testing.assert_allclose(cut.alpha, 1 + q[cut.omega0].sum() - p[cut.omega0].sum() ** 3, atol=1e-15)
    ratios = q / p
    inside, outside = ratios[cut.omega0], np.delete(ratios, cut.omega0)
    assert inside.size == 0 or outside.size == 0 or inside.max() <= outside.min()
    with pytest.raises(TypeError, match=r"single integer"):
        otspec.min_cut(p, q, [1, 2])


@given(pairs(max_n=6), st.integers(1, 4))
def test_validate_false_gives_the_same_value(pq, k):
    p, q = pq
    assert otspec.alpha_k(p, q, k, validate=False) == otspec.alpha_k(p, q, k)


def test_validate_false_still_checks_k_and_method():
    with pytest.raises(ValueError, match=r"`k` must be an integer >= 1"):
        otspec.alpha_k([0.5, 0.5], [0.5, 0.5], 0, validate=False)
    with pytest.raises(ValueError, match=r"`method` must be one of"):
        otspec.alpha_k([0.5, 0.5], [0.5, 0.5], 1, method="x", validate=False)
    # the LP routes validate regardless
    with pytest.raises(ValueError, match=r"`p` must sum to 1"):
        otspec.alpha_k([0.5, 0.4], [0.5, 0.5], 1, method="lp", validate=False)
