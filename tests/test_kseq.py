"""k-Seq (SpecTr Algorithm 2): exact rho*, exact acceptance, validity, samplers."""

import importlib
import itertools
from unittest import mock

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import otspec
from otspec.closed_form import bernoulli_alpha_k, uniform_alpha_k
from otspec.multidraft._kseq import _f
from otspec.testing import chi2_gof
from otspec.testing.strategies import pairs
from tests.gof import assert_end_to_end_sampler

KSEQ_MODULE = importlib.import_module("otspec.multidraft._kseq")

# False-failure rate of each chi-square test below. This file runs at most 12 such
# tests (slow ones included), so it fails spuriously with probability <= 1.2e-3;
# the seeds are fixed, so in practice the outcome is deterministic.
ALPHA_FAIL = 1e-4

ks = st.integers(min_value=1, max_value=4)


def lemma3_constant(k):
    return 1.0 - (1.0 - 1.0 / k) ** k


# --------------------------------------------------------------------------- validity and acceptance


@given(pairs(max_n=5), ks)
def test_kseq_at_rho_star_is_lossless_with_exact_acceptance(pq, k):
    p, q = pq
    v = otspec.kseq(p, q, k)
    chk = otspec.check_lossless(v)
    assert chk.max_marginal_error <= 1e-9
    assert chk.max_row_error <= 1e-12
    assert chk.acceptance_error <= 1e-12
    # at rho* the residual never lands on a rejected draft: acceptance == p_acc
    np.testing.assert_allclose(v.acceptance(), v.p_acc, rtol=0, atol=1e-12)
    np.testing.assert_allclose(v.p_acc, otspec.kseq_p_acc(p, q, k, v.rho), rtol=0, atol=1e-15)


@given(pairs(max_n=5), ks)
def test_theorem1_bounds(pq, k):
    p, q = pq
    acc = otspec.kseq(p, q, k).acceptance()
    a_k = float(otspec.alpha_k(p, q, k))
    assert acc <= a_k + 1e-12  # no verifier beats OTM-k
    assert acc >= lemma3_constant(k) * a_k - 1e-12  # SpecTr Theorem 1 (proof: eq. 11)
    assert acc >= (1 - np.exp(-1)) * a_k - 1e-12


@given(pairs(max_n=4), ks, st.floats(min_value=1.0, max_value=3.0))
def test_kseq_above_rho_star_is_lossless_and_acceptance_exact(pq, k, factor):
    p, q = pq
    rho_star = otspec.kseq_rho_star(p, q, k)
    v = otspec.kseq(p, q, k, rho=rho_star * factor)
    chk = otspec.check_lossless(v)
    assert chk.max_marginal_error <= 1e-9
    assert chk.max_row_error <= 1e-12
    assert chk.acceptance_error <= 1e-12
    assert v.acceptance() >= v.p_acc - 1e-15
    assert v.acceptance() <= float(otspec.alpha_k(p, q, k)) + 1e-12


def test_acceptance_strictly_above_p_acc_for_large_rho():
    # p = q: at rho = 2 a draft is accepted w.p. 1/2, and the residual (= q) can land on a draft
    p = np.array([0.5, 0.5])
    v = otspec.kseq(p, p, 2, rho=2.0)
    chk = otspec.check_lossless(v)
    assert v.acceptance() > v.p_acc + 0.05
    np.testing.assert_allclose(v.acceptance(), chk.acceptance, rtol=0, atol=1e-15)
    # by hand: beta = 1/2, p_acc = 3/4; all rejected (1/4): residual q hits a draft w.p.
    # P(Y in S | both rejected) = 1/2 * 1 (same token twice) + 1/2 * 1 (both tokens) ... = 3/4
    np.testing.assert_allclose(v.acceptance(), 0.75 + 0.25 * 0.75, rtol=0, atol=1e-15)


def test_rho_star_maximises_p_acc_not_the_exact_acceptance():
    # Ber(0.25) draft, Ber(0.75) target, k = 2, rho = 2 (> rho* = 1.593): by hand, a(0) = 1/6,
    # a(1) = 1, beta = 3/8, p_acc = 39/64, residual = (0.12, 0.88), e = (5/8, 0), and the residual
    # hits a rejected draft with probability 0.12 * (5/8)^2 = 3/64: acceptance 42/64 = 21/32
    p, q = [0.75, 0.25], [0.25, 0.75]
    at_star = otspec.kseq(p, q, 2)
    w = otspec.kseq(p, q, 2, rho=2.0)
    np.testing.assert_allclose(w.p_acc, 39 / 64, rtol=0, atol=1e-15)
    np.testing.assert_allclose(w.residual, [0.12, 0.88], rtol=0, atol=1e-15)
    np.testing.assert_allclose(w.acceptance(), 21 / 32, rtol=0, atol=1e-15)
    np.testing.assert_allclose(otspec.check_lossless(w).acceptance, 21 / 32, rtol=0, atol=1e-15)
    assert w.p_acc < at_star.p_acc < w.acceptance() <= float(otspec.alpha_k(p, q, 2))


# --------------------------------------------------------------------------- rho*


@given(pairs(max_n=6), st.integers(min_value=1, max_value=12))
def test_exact_rho_star_agrees_with_bisection(pq, k):
    p, q = pq
    tol = 1e-10
    exact = otspec.kseq_rho_star(p, q, k)
    bis = otspec.kseq_rho_star(p, q, k, tol=tol)
    # Lemma 4: rho* in [1, min(k, max q/p)]
    ratios = np.where(p > 0, q / np.where(p > 0, p, 1.0), np.where(q > 0, np.inf, 0.0))
    assert (exact >= 1.0 and exact <= min(k, ratios.max()) * (1 + 1e-12)) or exact == 1.0
    if abs(bis - exact) > tol * (1 + 1e-9):
        # only where f is flat at its root (p close to q): f vanishes to rounding on the gap
        assert abs(_f(p, q, k, exact)) <= 1e-14 and abs(_f(p, q, k, bis)) <= 1e-14
    # the p_acc of both agree whatever the conditioning
    np.testing.assert_allclose(
        otspec.kseq_p_acc(p, q, k, exact), otspec.kseq_p_acc(p, q, k, bis), rtol=0, atol=1e-9
    )
    # a bisection result is always usable as rho
    otspec.kseq(p, q, k, rho=bis)
    # the bracket-narrowing bisection steps before the sort (SORT_MIN = 0: narrow to the end)
    with mock.patch.object(KSEQ_MODULE, "SORT_MIN", 0):
        narrowed = otspec.kseq_rho_star(p, q, k)
    if abs(narrowed - exact) > 4e-16 * exact:
        assert abs(_f(p, q, k, exact)) <= 1e-14 and abs(_f(p, q, k, narrowed)) <= 1e-14


def rho_star_mpmath(p, q, k: int, *, bits: int = 1200, steps: int = 140):
    """SpecTr eq. (6)'s smallest valid rho in [1, k]: bisection of the non-increasing
    f(rho) = 1 - (1-beta)^k - rho*beta at ``bits`` bits (1,200 resolve 1 - (1-beta)^k for beta down to 1e-300,
    2**-997, with 60 bits left; 140 steps narrow [1, k] below 2**-130 relative). Entries of p and q below the
    smallest normal double count as 0, as the package's validation sets them."""
    tiny = float(np.finfo(np.float64).tiny)
    with mpmath.workprec(bits):
        P = [mpmath.mpf(float(x)) if x >= tiny else mpmath.mpf(0) for x in np.asarray(p, dtype=np.float64)]
        Q = [mpmath.mpf(float(x)) if x >= tiny else mpmath.mpf(0) for x in np.asarray(q, dtype=np.float64)]

        def f(rho):
            beta = mpmath.fsum(min(a, b / rho) for a, b in zip(P, Q))
            return 1 - (1 - beta) ** k - rho * beta

        lo, hi = mpmath.mpf(1), mpmath.mpf(k)
        if f(lo) <= 0:
            return lo
        for _ in range(steps):
            mid = (lo + hi) / 2
            if f(mid) <= 0:
                hi = mid
            else:
                lo = mid
        return hi


@pytest.mark.parametrize("sort_min", [256, 1])
@pytest.mark.parametrize("seed", range(20))
def test_exact_rho_star_against_mpmath(seed, sort_min, monkeypatch):
    """Independent route: bisection of f(rho) = 1 - (1-beta)^k - rho*beta with mpmath (rho_star_mpmath)."""
    monkeypatch.setattr(KSEQ_MODULE, "SORT_MIN", sort_min)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 40))
    k = int(rng.integers(2, 10))
    p, q = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(n))
    np.testing.assert_allclose(otspec.kseq_rho_star(p, q, k), float(rho_star_mpmath(p, q, k)), rtol=1e-13)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 20])
@pytest.mark.parametrize("d,d_q", [(120, 60), (120, 40), (120, 30), (12, 1), (10, 10), (7, 3)])
def test_uniform_pairs_kseq_is_optimal(d, d_q, k):
    """SpecTr App. B.2: p = U(d), q = U(d_q) nested, r = d/d_q: rho* = r(1 - (1-1/r)^k), optimal."""
    p = np.full(d, 1.0 / d)
    q = np.zeros(d)
    q[:d_q] = 1.0 / d_q
    r = d / d_q
    v = otspec.kseq(p, q, k)
    np.testing.assert_allclose(v.rho_star, r * (1 - (1 - 1 / r) ** k), rtol=1e-13)
    np.testing.assert_allclose(otspec.kseq_rho_star(p, q, k, tol=1e-12), v.rho_star, rtol=0, atol=2e-12)
    np.testing.assert_allclose(v.acceptance(), uniform_alpha_k(d, d_q, k), rtol=0, atol=1e-13)
    np.testing.assert_allclose(v.acceptance(), otspec.alpha_k(p, q, k), rtol=0, atol=1e-13)
    # beta(rho) = 1/max(r, rho)
    for rho in (1.0, 1.5, r, 2 * r + 1):
        np.testing.assert_allclose(otspec.kseq_beta(p, q, rho), 1 / max(r, rho), rtol=1e-13)


@pytest.mark.parametrize("seed", range(3))
def test_exact_rho_star_large_llm_like(seed):
    """n = 20,000: the bracket is narrowed before the sort; agree with a fine bisection."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, 20_000)
    q = np.exp(logits - logits.max())
    q /= q.sum()
    d = logits + rng.normal(0, 1, 20_000)
    p = np.exp(d - d.max())
    p /= p.sum()
    for k in (2, 8, 64):
        exact = otspec.kseq_rho_star(p, q, k)
        bis = otspec.kseq_rho_star(p, q, k, tol=1e-13)
        assert 0 <= bis - exact <= 1e-13 + 8e-16 * exact
        assert abs(_f(p, q, k, exact)) <= 1e-14


def test_uniform_pair_enumeration():
    p = np.full(4, 0.25)
    q = np.array([0.5, 0.5, 0.0, 0.0])
    v = otspec.kseq(p, q, 3)
    chk = otspec.check_lossless(v)
    assert chk.max_marginal_error <= 1e-15
    np.testing.assert_allclose(chk.acceptance, 1 - 0.5**3, rtol=0, atol=1e-15)


# --------------------------------------------------------------------------- Bernoulli (SpecTr Fig. 4)


@pytest.mark.parametrize("b", [0.1, 0.75])
def test_bernoulli_kseq_strictly_worse_than_otm(b):
    p, q = [0.75, 0.25], [1 - b, b]  # Ber(0.25) and Ber(b): token 1 is "heads"
    gaps = [bernoulli_alpha_k(0.25, b, k) - otspec.kseq(p, q, k).acceptance() for k in range(1, 11)]
    assert abs(gaps[0]) <= 1e-15  # k = 1: both are the maximal coupling
    assert max(gaps) > 1e-3
    assert min(gaps) >= -1e-14


@pytest.mark.parametrize("b", [0.25, 1.0])
def test_bernoulli_kseq_equal_to_otm(b):
    p, q = [0.75, 0.25], [1 - b, b]
    for k in range(1, 11):
        np.testing.assert_allclose(
            otspec.kseq(p, q, k).acceptance(), bernoulli_alpha_k(0.25, b, k), rtol=0, atol=1e-14
        )


def test_k_equal_one_is_maximal_coupling():
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    v, m = otspec.kseq(p, q, 1), otspec.maximal_coupling(p, q)
    assert v.rho_star == 1.0
    for x in range(6):
        np.testing.assert_allclose(v.conditional([x]), m.conditional([x]), rtol=0, atol=1e-15)


# --------------------------------------------------------------------------- pieces of the algorithm


@given(pairs(max_n=6), ks)
def test_residual_is_eq5(pq, k):
    p, q = pq
    v = otspec.kseq(p, q, k)
    res = otspec.kseq_residual(p, q, k)
    np.testing.assert_array_equal(res, v.residual)
    assert np.all(res >= 0)
    np.testing.assert_allclose(res.sum(), 1.0, rtol=0, atol=1e-12)
    if v.p_acc < 1 - 1e-6 and v.beta > 0:
        # SpecTr eq. (5) evaluated as printed
        mins = np.minimum(p, q / v.rho)
        eq5 = (q - mins * v.p_acc / v.beta) / (1 - v.p_acc)
        np.testing.assert_allclose(res, eq5, rtol=0, atol=1e-9 / (1 - v.p_acc))


def test_conditional_by_hand():
    # p = Ber(0.25), q = Ber(0.75) as vectors (token 0 = tails); k = 2
    p, q = np.array([0.75, 0.25]), np.array([0.25, 0.75])
    v = otspec.kseq(p, q, 2)
    a0 = min(1.0, 0.25 / (v.rho * 0.75))
    a1 = 1.0  # q/p = 3 >= rho* (<= 2)
    c = v.conditional([0, 1])
    np.testing.assert_allclose(c, [a0, 1 - a0], rtol=0, atol=1e-15)
    c = v.conditional([0, 0])
    np.testing.assert_allclose(c, np.array([a0 + (1 - a0) * a0, 0]) + (1 - a0) ** 2 * v.residual, atol=1e-15)
    assert a1 == v.accept_probs[1]


def test_conditional_on_zero_probability_drafts():
    v = otspec.kseq([1.0, 0.0, 0.0], [0.2, 0.3, 0.5], 2)
    for x in itertools.product(range(3), repeat=2):
        c = v.conditional(x)
        assert np.all(c >= 0)
        np.testing.assert_allclose(c.sum(), 1.0, rtol=0, atol=1e-15)


def test_beta_and_p_acc_vectorised():
    p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    rhos = np.array([1.0, 1.5, 2.5, 4.0])
    b = otspec.kseq_beta(p, q, rhos)
    assert b.shape == (4,)
    for r, bb in zip(rhos, b):
        assert bb == otspec.kseq_beta(p, q, float(r))
    np.testing.assert_allclose(otspec.kseq_p_acc(p, q, 3, rhos), 1 - (1 - b) ** 3, rtol=1e-14)
    assert np.all(np.diff(b) <= 0)


def test_inputs_not_mutated():
    p = np.array([0.6, 0.4])
    q = np.array([0.1, 0.9])
    p0, q0 = p.copy(), q.copy()
    v = otspec.kseq(p, q, 3)
    otspec.kseq_residual(p, q, 3)
    otspec.kseq_rho_star(p, q, 3, tol=1e-6)
    np.testing.assert_array_equal(p, p0)
    np.testing.assert_array_equal(q, q0)
    assert not v.p.flags.writeable and not v.residual.flags.writeable
    assert "rho_star" in repr(v)


# --------------------------------------------------------------------------- refusal and input errors


def test_rho_below_rho_star_refused_with_rho_star_in_message():
    p, q = [0.75, 0.25], [0.25, 0.75]
    rs = otspec.kseq_rho_star(p, q, 2)
    with pytest.raises(ValueError, match=r"`rho` must be >= rho\* = 1\.59"):
        otspec.kseq(p, q, 2, rho=1.5)
    with pytest.raises(ValueError, match=r"rho\* = "):
        otspec.kseq_residual(p, q, 2, rho=1.0)
    with pytest.raises(ValueError, match=r"rho\* = "):
        otspec.kseq(p, q, 2, rho=0.5)
    # a rounding-level undershoot (a bisection end point) is taken as rho*
    v = otspec.kseq(p, q, 2, rho=rs * (1 - 1e-15))
    assert v.rho == rs
    # for rho slightly below rho* the printed residual (eq. 5) has a negative entry
    rho = rs * 0.99
    b = otspec.kseq_beta(p, q, rho)
    pa = otspec.kseq_p_acc(p, q, 2, rho)
    eq5 = (np.array(q) - np.minimum(p, np.array(q) / rho) * pa / b) / (1 - pa)
    assert eq5.min() < 0


def test_degenerate_case_below_rho_star_is_the_same_plan():
    # every token with q > 0 has ratio 2 >= rho* = 1.5: at rho = 1.2 eq. (5) is still non-negative
    # and every acceptance probability is the one at rho*, so refusing rho = 1.2 loses nothing
    p, q = np.full(4, 0.25), np.array([0.5, 0.5, 0.0, 0.0])
    v = otspec.kseq(p, q, 2)
    rho = 1.2
    accept = np.minimum(1.0, q / (rho * p))
    b, pa = otspec.kseq_beta(p, q, rho), otspec.kseq_p_acc(p, q, 2, rho)
    eq5 = (q - np.minimum(p, q / rho) * pa / b) / (1 - pa)
    np.testing.assert_array_equal(accept, v.accept_probs)
    np.testing.assert_allclose(eq5, v.residual, rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match=r"rho\* = 1\.5 "):
        otspec.kseq(p, q, 2, rho=rho)


@pytest.mark.parametrize(
    "rho,exc,match",
    [
        (float("nan"), ValueError, "`rho` must be finite and > 0"),
        (float("inf"), ValueError, "`rho` must be finite and > 0"),
        (-1.0, ValueError, "`rho` must be finite and > 0"),
        (0, ValueError, "`rho` must be finite and > 0"),
        (True, TypeError, "`rho` must be a real number"),
        ("2", TypeError, "`rho` must be a real number"),
    ],
)
def test_rho_errors(rho, exc, match):
    with pytest.raises(exc, match=match):
        otspec.kseq([0.5, 0.5], [0.3, 0.7], 2, rho=rho)


@pytest.mark.parametrize(
    "tol,exc,match",
    [
        (0.0, ValueError, "`tol` must be finite and > 0"),
        (-1e-3, ValueError, "`tol` must be finite and > 0"),
        (float("nan"), ValueError, "`tol` must be finite and > 0"),
        ("1e-3", TypeError, "`tol` must be a real number or None"),
        (False, TypeError, "`tol` must be a real number or None"),
    ],
)
def test_tol_errors(tol, exc, match):
    with pytest.raises(exc, match=match):
        otspec.kseq_rho_star([0.5, 0.5], [0.3, 0.7], 2, tol=tol)


def test_tiny_tol_terminates():
    r = otspec.kseq_rho_star([0.75, 0.25], [0.25, 0.75], 2, tol=1e-300)
    np.testing.assert_allclose(r, otspec.kseq_rho_star([0.75, 0.25], [0.25, 0.75], 2), rtol=1e-15)


def test_other_input_errors():
    with pytest.raises(ValueError, match="`k` must be an integer >= 1"):
        otspec.kseq([0.5, 0.5], [0.5, 0.5], 0)
    with pytest.raises(TypeError, match="`k` must be an integer"):
        otspec.kseq_rho_star([0.5, 0.5], [0.5, 0.5], 2.0)
    with pytest.raises(ValueError, match="`q` must sum to 1"):
        otspec.kseq([0.5, 0.5], [0.5, 0.6], 2)
    with pytest.raises(ValueError, match="same length"):
        otspec.kseq_beta([0.5, 0.5], [1.0], 1.0)
    v = otspec.kseq([0.5, 0.5], [0.3, 0.7], 2)
    with pytest.raises(ValueError, match="`drafts` must be a sequence of k=2"):
        v.conditional([0])
    with pytest.raises(ValueError, match=r"`drafts` must be token ids in \[0, 2\)"):
        v.sample([0, 2], rng=0)
    with pytest.raises(TypeError, match="`rng` must be"):
        v.sample([0, 1], rng="seed")
    np.testing.assert_allclose(otspec.kseq([2, 2], [1, 3], 2, normalize=True).q, [0.25, 0.75])


# --------------------------------------------------------------------------- samplers (chi-square)


def _case():
    rng = np.random.default_rng(11)
    return rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))


@pytest.mark.parametrize("factor", [1.0, 1.4])
def test_sampler_given_drafts_chi2(factor):
    p, q = _case()
    k = 3
    v = otspec.kseq(p, q, k, rho=otspec.kseq_rho_star(p, q, k) * factor)
    gen = np.random.default_rng(5)
    drafts = (4, 0, 4)
    N = 20_000
    out = np.array([v.sample(drafts, rng=gen) for _ in range(N)])
    assert chi2_gof(np.bincount(out, minlength=5), v.conditional(drafts), alpha_fail=ALPHA_FAIL).passed


def test_sampler_end_to_end_chi2():
    """Drafts from p^k, output from the sampler: the output law is q, acceptance as stated."""
    p, q = _case()
    k = 3
    v = otspec.kseq(p, q, k, rho=otspec.kseq_rho_star(p, q, k) * 1.2)
    assert_end_to_end_sampler(v, 20_000, 6, ALPHA_FAIL)


def test_sample_drafts_chi2():
    p, q = _case()
    v = otspec.kseq(p, q, 2)
    gen = np.random.default_rng(7)
    N = 10_000
    xs = np.array([v.sample_drafts(rng=gen) for _ in range(N)])
    counts = np.bincount(xs[:, 0] * 5 + xs[:, 1], minlength=25)
    assert chi2_gof(counts, np.outer(p, p).ravel(), alpha_fail=ALPHA_FAIL).passed


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_sampler_joint_law_chi2_large(seed):
    """Joint law of (drafts, output) against p^k(x) K(y|x) over all 5^2 * 5 cells."""
    rng = np.random.default_rng(100 + seed)
    p, q = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
    k = 2
    v = otspec.kseq(p, q, k)
    gen = np.random.default_rng(200 + seed)
    N = 200_000
    counts = np.zeros(125, dtype=np.int64)
    for _ in range(N):
        x = v.sample_drafts(rng=gen)
        y = v.sample(x, rng=gen)
        counts[(x[0] * 5 + x[1]) * 5 + y] += 1
    law = np.concatenate([p[a] * p[b] * v.conditional([a, b]) for a in range(5) for b in range(5)])
    assert chi2_gof(counts, law, alpha_fail=ALPHA_FAIL).passed
