"""The verifier interface, check_lossless and the maximal coupling (k = 1)."""

import numpy as np
import pytest
from hypothesis import given

import otspec
from otspec.multidraft._maximal_coupling import residual
from otspec.testing import chi2_gof
from otspec.testing.strategies import pairs

# False-failure rate of each chi-square test below; 6 such tests in this file,
# so the file fails spuriously with probability <= 6e-4 (fixed seeds make it deterministic).
ALPHA_FAIL = 1e-4


@given(pairs(max_n=8))
def test_maximal_coupling_is_lossless_and_optimal(pq):
    p, q = pq
    v = otspec.maximal_coupling(p, q)
    chk = otspec.check_lossless(v)
    assert chk.max_marginal_error <= 1e-12
    assert chk.max_row_error <= 1e-12
    np.testing.assert_allclose(chk.acceptance, otspec.alpha_k(p, q, 1), rtol=0, atol=1e-12)
    np.testing.assert_allclose(v.acceptance(), chk.acceptance, rtol=0, atol=1e-12)


def test_maximal_coupling_equals_lp_plan_acceptance():
    rng = np.random.default_rng(0)
    for _ in range(10):
        p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
        np.testing.assert_allclose(
            otspec.maximal_coupling(p, q).acceptance(), otspec.otm_lp(p, q, 1).alpha, atol=1e-9
        )


def test_residual_guard_when_p_equals_q():
    p = np.array([0.3, 0.7])
    np.testing.assert_array_equal(residual(p, p), p)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_maximal_coupling_sampler_chi2(seed):
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
    v = otspec.maximal_coupling(p, q)
    gen = np.random.default_rng(100 + seed)
    N = 20_000
    drafts = gen.choice(5, size=N, p=p)
    out = np.array([v.sample([d], rng=gen) for d in drafts])
    # the output marginal is q
    assert chi2_gof(np.bincount(out, minlength=5), q, alpha_fail=ALPHA_FAIL).passed
    # the joint law of (draft, output) is p(x) K(y|x)
    joint = np.array([p[x] * v.conditional([x]) for x in range(5)]).ravel()
    counts = np.bincount(drafts * 5 + out, minlength=25)
    assert chi2_gof(counts, joint, alpha_fail=ALPHA_FAIL).passed


def test_default_sample_uses_conditional():
    # the base-class sampler (inverse CDF on the conditional) through the LP plan verifier
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6])
    v = otspec.otm_lp(p, q, 2).verifier
    gen = np.random.default_rng(7)
    N = 20_000
    drafts = gen.choice(3, size=(N, 2), p=p)
    out = np.array([v.sample(d, rng=gen) for d in drafts])
    assert chi2_gof(np.bincount(out, minlength=3), q, alpha_fail=ALPHA_FAIL).passed


def test_sample_is_reproducible_with_seed():
    v = otspec.maximal_coupling([0.5, 0.5], [0.1, 0.9])
    a = [v.sample([0], rng=np.random.default_rng(5)) for _ in range(3)]
    b = [v.sample([0], rng=np.random.default_rng(5)) for _ in range(3)]
    assert a == b


def test_check_lossless_errors():
    with pytest.raises(TypeError, match=r"`verifier` must be an otspec Verifier"):
        otspec.check_lossless(object())
    v = otspec.otm_lp(np.full(4, 0.25), np.full(4, 0.25), 3).verifier
    with pytest.raises(ValueError, match=r"exceeds `max_tuples`=10"):
        otspec.check_lossless(v, max_tuples=10)


def test_check_lossless_detects_a_lossy_verifier():
    class Identity(otspec.Verifier):
        """Always outputs the draft: lossless only when p == q."""

        def __init__(self, p, q):
            self.k, self.p, self.q = 1, np.asarray(p), np.asarray(q)

        def conditional(self, drafts):
            (x,) = self._drafts(drafts)
            return np.eye(self.n)[x]

        def acceptance(self):
            return 1.0

    chk = otspec.check_lossless(Identity([0.5, 0.5], [0.2, 0.8]))
    np.testing.assert_allclose(chk.max_marginal_error, 0.3, atol=1e-15)
    np.testing.assert_allclose(chk.acceptance, 1.0)
    assert chk.acceptance_error == 0.0


def test_conditional_rejects_bad_drafts():
    v = otspec.maximal_coupling([0.5, 0.5], [0.1, 0.9])
    with pytest.raises(ValueError, match=r"`drafts` must be a sequence of k=1"):
        v.conditional([0, 1])
    with pytest.raises(ValueError, match=r"token ids in \[0, 2\)"):
        v.sample([2])
    assert "MaximalCoupling(n=2, k=1)" == repr(v)
