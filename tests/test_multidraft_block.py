"""Multi-draft block OT: the LP, the level-wise bound, the exact counterexample, verifiers and schemes."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import otspec
from otspec.block import (
    level_alphas,
    level_bound,
    multidraft_exact,
    multidraft_ot,
    theorem1_length,
)
from otspec.models import MemorylessModel, random_markov_model, random_table_model

TOL = 1e-9


def _pair(V, seed, c=1.0):
    return (random_markov_model(V, 1, concentration=c, rng=seed),
            random_markov_model(V, 1, concentration=c, rng=seed + 1000))


@pytest.mark.parametrize("V,L", [(2, 1), (2, 2), (2, 3), (3, 2), (2, 4)])
@pytest.mark.parametrize("seed", [0, 1])
def test_k1_is_theorem1(V, L, seed):
    d, t = _pair(V, seed)
    res = multidraft_ot(d, t, L, 1)
    ref = theorem1_length(d, t, L)
    np.testing.assert_allclose(res.value, ref, atol=TOL, rtol=0)
    np.testing.assert_allclose(res.bound, ref, atol=TOL, rtol=0)
    np.testing.assert_allclose(res.plan_value, ref, atol=TOL, rtol=0)


@pytest.mark.parametrize("V,k", [(2, 2), (3, 2), (3, 3), (4, 2), (2, 5)])
@pytest.mark.parametrize("seed", [0, 1])
def test_l1_is_alpha_k(V, k, seed):
    d, t = _pair(V, seed, c=0.5)
    p, q = d.next_dist(()), t.next_dist(())
    res = multidraft_ot(d, t, 1, k)
    np.testing.assert_allclose(res.value, otspec.alpha_k(p, q, k), atol=TOL, rtol=0)
    np.testing.assert_allclose(res.bound, otspec.alpha_k(p, q, k), atol=TOL, rtol=0)


def test_plan_marginals_exact():
    d, t = _pair(2, 3)
    res = multidraft_ot(d, t, 3, 2)
    np.testing.assert_allclose(res.plan.sum(axis=1), res.weights, atol=1e-15, rtol=0)
    np.testing.assert_allclose(res.plan.sum(axis=0), res.target_law, atol=1e-15, rtol=0)
    assert res.plan.min() >= 0.0
    np.testing.assert_allclose(res.plan_value, res.value, atol=TOL, rtol=0)


def test_counterexample_exact():
    """Draft Ber(1/4), target Ber(1/2), L = 2, k = 2: OPT = 231/128 < B = 463/256."""
    d, t = MemorylessModel([3 / 4, 1 / 4]), MemorylessModel([1 / 2, 1 / 2])
    ex = multidraft_exact(d, t, 2, 2)
    assert ex.level_alphas == (Fraction(15, 16), Fraction(223, 256))
    assert ex.bound == Fraction(463, 256)
    assert ex.opt == Fraction(231, 128)
    assert ex.gap == Fraction(1, 256)
    assert ex.gap_proved and ex.upper == ex.opt  # the rounded dual certifies the optimum itself
    res = multidraft_ot(d, t, 2, 2)
    np.testing.assert_allclose(res.value, 231 / 128, atol=TOL, rtol=0)
    np.testing.assert_allclose(level_bound(d, t, 2, 2), 463 / 256, atol=1e-15, rtol=0)


def test_exact_alpha_matches_float():
    d, t = _pair(3, 5)
    ex = multidraft_exact(d, t, 2, 2)
    np.testing.assert_allclose([float(a) for a in ex.level_alphas], level_alphas(d, t, 2, 2), atol=1e-14, rtol=0)
    assert float(ex.upper) >= multidraft_ot(d, t, 2, 2).value - TOL


def test_exact_opt_agrees_with_highs_on_markov():
    d, t = _pair(2, 7)
    ex = multidraft_exact(d, t, 2, 2)
    np.testing.assert_allclose(float(ex.opt), multidraft_ot(d, t, 2, 2).value, atol=TOL, rtol=0)
    assert ex.opt <= ex.upper


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 3), st.integers(1, 3), st.integers(1, 3), st.sampled_from([0.3, 1.0, 3.0]),
       st.integers(0, 2**31))
def test_opt_below_bound_hypothesis(V, L, k, c, seed):
    if V == 3 and L == 3 and k == 3:
        k = 2  # keep the default suite fast
    d = random_markov_model(V, 1, concentration=c, rng=seed)
    t = random_markov_model(V, 1, concentration=c, rng=seed + 1)
    res = multidraft_ot(d, t, L, k)
    assert res.success
    assert res.value <= res.bound + TOL
    # more drafts never hurt; and OPT >= the single-draft optimum (Theorem 1)
    assert res.value >= theorem1_length(d, t, L) - TOL
    if k == 1 or L == 1:
        np.testing.assert_allclose(res.value, res.bound, atol=TOL, rtol=0)


def test_table_models():
    d = random_table_model(2, 3, concentration=0.5, rng=1)
    t = random_table_model(2, 3, concentration=0.5, rng=2)
    res = multidraft_ot(d, t, 3, 2)
    assert res.success and res.value <= res.bound + TOL


def test_bad_input():
    d, t = _pair(2, 0)
    with pytest.raises(ValueError, match="`max_variables`"):
        multidraft_ot(d, t, 4, 4, max_variables=1000)
    with pytest.raises(ValueError, match="`k`"):
        multidraft_ot(d, t, 2, 0)
    with pytest.raises(ValueError, match="`L`"):
        level_bound(d, t, 0, 2)
    with pytest.raises(TypeError, match="`k`"):
        level_alphas(d, t, 2, 2.0)
    with pytest.raises(TypeError, match="`raise_on_failure`"):
        multidraft_ot(d, t, 2, 2, raise_on_failure=1)
    with pytest.raises(ValueError, match="`max_denominator`"):
        multidraft_exact(d, t, 2, 2, max_denominator=0)
    with pytest.raises(ValueError, match="vocab"):
        multidraft_ot(d, random_markov_model(3, 1, rng=0), 2, 2)
