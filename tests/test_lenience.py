"""Leviathan's lenience: exact acceptance, output law, distances, and how far it is from the KL-optimal frontier."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import otspec
from otspec import check_lossless
from otspec.testing import chi2_gof
from otspec.testing.strategies import pairs

P3, Q3 = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])


def law_by_hand(p, q, l):
    """The output law written out token by token (independent of the vectorised code)."""
    n = p.shape[0]
    res = np.maximum(q - p, 0)
    res = res / res.sum() if res.sum() > 0 else q
    law = np.zeros(n)
    for x in range(n):
        if p[x] == 0:
            continue
        a = 1.0 if l * p[x] <= q[x] else q[x] / (l * p[x])
        law[x] += p[x] * a
        law += p[x] * (1 - a) * res
    return law


def test_worked_example():
    v = otspec.lenient_verifier(P3, Q3, 0.5)
    assert v.acceptance() == pytest.approx(0.9, abs=1e-15)
    np.testing.assert_allclose(v.output_law(), [0.4, 0.3, 0.3], atol=1e-15)
    assert v.tv() == pytest.approx(0.2, abs=1e-15)
    assert v.kl() == pytest.approx(0.2 * math.log(0.5) + 0.5 * math.log(0.5 / 0.3), rel=1e-14)
    assert not v.lossless
    assert "l=0.5" in repr(v)


@given(pairs(1, 6), st.floats(1e-3, 1.0))
def test_verifier_exact(pq, l):
    p, q = pq
    v = otspec.lenient_verifier(p, q, l)
    chk = check_lossless(v)
    assert chk.max_law_error <= 1e-12
    assert chk.acceptance_error <= 1e-12
    assert chk.max_row_error <= 1e-12
    # acceptance sum min(q/l, p) (Leviathan App. A.5, letters swapped)
    assert v.acceptance() == pytest.approx(float(np.minimum(q / l, p).sum()), abs=1e-14)
    np.testing.assert_allclose(v.output_law(), law_by_hand(p, q, l), atol=1e-14)
    # the paper's guarantee: no token above q/l (up to rounding)
    assert np.all(v.output_law() <= q / l + 1e-14)


@given(pairs(1, 6))
def test_l_one_is_speculative_sampling(pq):
    p, q = pq
    v = otspec.lenient_verifier(p, q, 1.0)
    mc = otspec.maximal_coupling(p, q)
    assert v.lossless and v.tv() == 0.0 and v.kl() == 0.0
    for x in np.flatnonzero(p > 0):
        np.testing.assert_allclose(v.conditional([x]), mc.conditional([x]), atol=1e-15)


@given(pairs(2, 6))
def test_acceptance_monotone_and_mentored_dominates(pq):
    """Lenience buys acceptance with KL; mentored decoding buys at least as much for the same KL."""
    p, q = pq
    ls = np.geomspace(1e-3, 1, 12)
    c = otspec.lenience_curve(p, q, ls)
    assert np.all(np.diff(c.acceptance) <= 1e-15)  # smaller l, larger acceptance
    for a, d in zip(c.acceptance, c.kl):
        if math.isfinite(d):
            assert otspec.mentored(p, q, d).acceptance >= a - 1e-12


def test_coincides_with_mentored_with_one_token_per_threshold():
    # P3, Q3, l = 0.5: q/pi = (0.5, 1, 5/3) has the thresholds' structure, so lenience is optimal
    c = otspec.lenience_curve(P3, Q3, [0.5])
    assert otspec.mentored(P3, Q3, float(c.kl[0])).acceptance == pytest.approx(c.acceptance[0], abs=1e-12)


def test_strictly_worse_than_mentored_example():
    p, q = [0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]
    c = otspec.lenience_curve(p, q, [0.5])
    assert c.acceptance[0] == pytest.approx(0.8, abs=1e-15)
    best = otspec.mentored(p, q, float(c.kl[0])).acceptance
    assert best > c.acceptance[0] + 0.007  # 0.80779 vs 0.8: lenience is not KL-optimal here


# 2 chi-square tests at alpha_fail = 1e-4 (fixed seeds)
@pytest.mark.parametrize("l,seed", [(0.5, 11), (0.2, 12)])
def test_sampler_matches_output_law(l, seed):
    p = np.array([0.4, 0.3, 0.2, 0.1, 0.0])
    q = np.array([0.1, 0.2, 0.3, 0.2, 0.2])
    v = otspec.lenient_verifier(p, q, l)
    rng = np.random.default_rng(seed)
    N = 40_000
    xs = rng.choice(5, size=N, p=p)
    ys = np.array([v.sample([x], rng=rng) for x in xs])
    assert chi2_gof(np.bincount(ys, minlength=5), v.output_law(), alpha_fail=1e-4).passed
    sd = math.sqrt(v.acceptance() * (1 - v.acceptance()) / N)
    assert abs(np.mean(xs == ys) - v.acceptance()) <= 5 * sd


def test_kl_infinite_when_law_misses_target_mass():
    # p = 0 where q > 0 and l small enough to accept every draft: the residual is never used
    v = otspec.lenient_verifier([0.5, 0.5, 0.0], [0.3, 0.3, 0.4], 0.1)
    assert v.acceptance() == 1.0
    assert v.kl() == math.inf
    assert v.tv() == pytest.approx(0.4, abs=1e-15)


@pytest.mark.parametrize("l", [0.0, -0.5, 1.5, float("nan"), float("inf")])
def test_bad_lenience(l):
    with pytest.raises(ValueError, match="`l`"):
        otspec.lenient_verifier(P3, Q3, l)
    with pytest.raises(ValueError, match="`l`"):
        otspec.lenience_curve(P3, Q3, [1.0, l])


@pytest.mark.parametrize("l", ["0.5", None, True])
def test_bad_lenience_type(l):
    with pytest.raises(TypeError, match="`l`"):
        otspec.lenient_verifier(P3, Q3, l)


def test_bad_pair_and_curve_shape():
    with pytest.raises(ValueError, match="same length"):
        otspec.lenient_verifier(P3, [0.5, 0.5], 0.5)
    with pytest.raises(ValueError, match="`ls`"):
        otspec.lenience_curve(P3, Q3, [])
