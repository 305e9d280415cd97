"""Tests of the priority-key verifier (the default construction of optimal_verifier).

Independent routes: the layout's interval sums against the law it was asked
to realise (random points of the base polytope, built as mixtures of greedy
vertices); exact enumeration of every draft tuple (check_lossless) against
q and alpha_k; the closed form alpha_k and the OTM LP; the sampler against
its exact conditional law (chi-square, false-failure rate 1e-4 per test,
fixed seeds).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import otspec
from otspec.multidraft import _submodular as sm
from otspec.multidraft._priority_keys import PriorityKeyVerifier, key_layout
from otspec.testing import check_sampler, chi2_gof
from otspec.testing.strategies import pairs


def _random_base(rng, p, k, b=0.0):
    """A random point of B(g_D): a mixture of greedy vertices of random orders."""
    n = p.shape[0]
    m = int(rng.integers(1, 5))
    w = rng.dirichlet(np.ones(m))
    z = np.zeros(n)
    for i in range(m):
        o = rng.permutation(n)
        z[o] += w[i] * sm.vertex(p[o], b, k)
    return z


def _check_tiling(tok, top, ln, p, b):
    lo = top - ln
    srt = np.argsort(-top, kind="stable")
    c = b + p.sum()
    assert abs(top[srt[0]] - c) <= 1e-15
    assert np.all(np.abs(lo[srt[:-1]] - top[srt[1:]]) <= 4e-16)  # contiguous, no overlap
    assert abs(lo[srt[-1]] - b) <= 1e-15
    tot = np.bincount(tok, weights=ln, minlength=p.shape[0])
    assert np.allclose(tot, p, rtol=0, atol=4e-16)
    assert tok.shape[0] <= 2 * p.shape[0] + 1


@pytest.mark.parametrize("jit", [True, False])
def test_layout_realises_any_base_point(jit):
    rng = np.random.default_rng(20261123)
    for _ in range(400):
        n = int(rng.integers(1, 12))
        k = int(rng.integers(1, 9))
        b = float(rng.choice([0.0, rng.random()]))
        p = rng.dirichlet(np.ones(n) * rng.choice([0.3, 1.0, 3.0])) * rng.uniform(0.05, 1.0)
        z = _random_base(rng, p, k, b)
        tok, top, ln = key_layout(p, z, b, k, jit=jit)
        _check_tiling(tok, top, ln, p, b)
        zl = np.bincount(tok, weights=sm.increments(ln, top, k), minlength=n)
        assert np.max(np.abs(zl - z)) <= 1e-14 * max(1.0, k)


def test_layout_vertex_is_one_interval_per_token():
    # a greedy vertex is realised by the order itself: one interval per token
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(9))
    o = rng.permutation(9)
    z = np.zeros(9)
    z[o] = sm.vertex(p[o], 0.0, 5)
    tok, top, ln = key_layout(p, z, 0.0, 5)
    assert tok.shape[0] == 9
    assert list(tok[np.argsort(-top)]) == list(o)


def test_compiled_and_plain_kernels_agree():
    rng = np.random.default_rng(7)
    p = rng.dirichlet(np.full(300, 0.5))
    z = _random_base(rng, p, 6)
    a = key_layout(p, z, 0.0, 6, jit=True)
    b = key_layout(p, z, 0.0, 6, jit=False)
    assert np.array_equal(a[0], b[0])
    assert np.allclose(a[1], b[1], rtol=0, atol=1e-15) and np.allclose(a[2], b[2], rtol=0, atol=1e-15)


@settings(max_examples=60, deadline=None)
@given(pair=pairs(1, 6, near_equal=True), k=st.integers(1, 4))
def test_keys_verifier_is_lossless_and_optimal_by_enumeration(pair, k):
    p, q = pair
    v = otspec.optimal_verifier(p, q, k)
    assert isinstance(v, PriorityKeyVerifier) and v.method == "keys"
    assert v.status == "optimal"
    alpha = float(otspec.alpha_k(p, q, k))
    chk = otspec.check_lossless(v)  # every draft tuple, exact
    assert chk.max_marginal_error <= 1e-12
    assert abs(chk.acceptance - alpha) <= 1e-12
    assert abs(v.acceptance() - alpha) <= 1e-12
    # the selection law summed over tuples is z
    assert np.allclose(v.z.sum(), 1.0, atol=1e-13)


def test_keys_against_lp_and_mixture():
    rng = np.random.default_rng(11)
    for _ in range(20):
        n = int(rng.integers(3, 7))
        k = int(rng.integers(2, 4))
        p, q = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(n))
        v = otspec.optimal_verifier(p, q, k)
        lp = otspec.otm_lp(p, q, k)
        mix = otspec.optimal_verifier(p, q, k, method="direct")
        assert lp.success
        assert abs(v.acceptance() - lp.alpha) <= 1e-9
        assert abs(v.acceptance() - mix.acceptance()) <= 1e-12


def test_sampler_follows_conditional_and_q():
    p = np.array([0.4, 0.25, 0.2, 0.1, 0.05])
    q = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
    v = otspec.optimal_verifier(p, q, 3)
    rng = np.random.default_rng(5)
    drafts = (0, 0, 3)
    ys = np.array([v.sample(drafts, rng=rng) for _ in range(40_000)])
    law = v.conditional(drafts)
    assert chi2_gof(np.bincount(ys, minlength=5), law).pvalue > 1e-4
    res = check_sampler(lambda x, r: v.sample(x, rng=r), p, q, k=3, tv=0.03, rng=9)
    assert res.passed, res.message


def test_special_cases():
    # k = 1: z = p, acceptance 1 - TV
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    v = otspec.optimal_verifier(p, q, 1)
    assert np.allclose(v.z, p, atol=1e-15) and abs(v.acceptance() - 0.7) <= 1e-15
    # p = q: alpha = 1, nothing rejected
    v = otspec.optimal_verifier(p, p, 3)
    assert v.status == "optimal" and abs(v.acceptance() - 1.0) <= 1e-15
    # zeros in p (never drafted) and in q (never output)
    p, q = np.array([0.5, 0.0, 0.5, 0.0]), np.array([0.0, 0.4, 0.3, 0.3])
    v = otspec.optimal_verifier(p, q, 2)
    chk = otspec.check_lossless(v)
    assert chk.max_marginal_error <= 1e-12 and abs(chk.acceptance - float(otspec.alpha_k(p, q, 2))) <= 1e-12
    assert v.z[1] == 0.0 and v.z[3] == 0.0


def test_many_drafts_alpha_one_is_fast_and_exact():
    rng = np.random.default_rng(3)
    n = 2000
    p = rng.dirichlet(np.ones(n))
    q = rng.dirichlet(np.ones(n))
    q = 0.5 * p + 0.5 * q  # bounded ratio: alpha_k -> 1
    t0 = time.perf_counter()
    v = otspec.optimal_verifier(p, q, 64)
    dt = time.perf_counter() - t0
    assert v.status == "optimal" and v.method == "keys"
    assert abs(v.acceptance() - float(otspec.alpha_k(p, q, 64))) <= v.tol
    assert dt < 5.0  # the mixture construction needed ~2 s, the LP fallback 127 s


def test_read_only_and_repr():
    v = otspec.optimal_verifier([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 2)
    with pytest.raises(ValueError):
        v.z[0] = 1.0
    with pytest.raises(ValueError):
        v.pieces[1][0] = 0.0
    assert "PriorityKeyVerifier" in repr(v) and v.n_pieces == v.pieces[0].shape[0]


def test_method_validation():
    with pytest.raises(ValueError, match="`method`"):
        otspec.optimal_verifier([0.5, 0.5], [0.5, 0.5], 2, method="layout")


def test_drafts_outside_the_support():
    # tokens with p = 0 have no key set: they lose to any drafted token with p > 0
    p, q = np.array([0.5, 0.0, 0.5, 0.0]), np.array([0.1, 0.4, 0.2, 0.3])
    v = otspec.optimal_verifier(p, q, 2)
    assert v.selection_law([1, 2])[2] == 1.0
    assert v.selection_law([3, 1])[1] == 1.0
    assert v.sample([3, 1], rng=0) in range(4)
    np.testing.assert_allclose(v.conditional([1, 3]).sum(), 1.0)
