"""Mentored decoding: exact thresholds, limits, an independent conic solver, the verifier and its sampler."""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import otspec
from otspec import check_lossless
from otspec.lossy._mentored import _h, kl_divergence
from otspec.testing import chi2_gof
from otspec.testing.strategies import distributions, pairs

P3, Q3 = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
# q has a zero where p > 0 (alpha = 0 regime) and p has a zero where q > 0 (KL(q||p) = inf)
P_ZQ, Q_ZQ = np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.0, 0.1, 0.3, 0.6])
P_ZP, Q_ZP = np.array([0.4, 0.3, 0.2, 0.1, 0.0]), np.array([0.0, 0.1, 0.3, 0.4, 0.2])


def kl_ref(q, pi):
    """Textbook KL(q || pi) (independent of the package's stable form)."""
    m = q > 0
    if np.any(pi[m] <= 0):
        return math.inf
    with np.errstate(over="ignore"):
        ratio = q[m] / pi[m]
    # log(q/pi) is accurate when q ~ pi; log q - log pi avoids the overflow of q/pi
    logs = np.where(np.isfinite(ratio), np.log(np.where(np.isfinite(ratio), ratio, 1.0)), np.log(q[m]) - np.log(pi[m]))
    return math.fsum((q[m] * logs).tolist())


def finite_kl_qp(p, q):
    return max(kl_ref(q, p), 0.0)  # the textbook sum can round below 0


# --------------------------------------------------------------------------- helpers
def test_h_matches_definition_and_is_accurate_near_zero():
    u = np.array([-0.9, -0.3, -0.04, -1e-8, 0.0, 1e-8, 0.04, 0.5, 10.0])
    ref = np.array([float(x) - math.log1p(float(x)) for x in u])
    big = np.abs(u) > 0.01
    np.testing.assert_allclose(_h(u)[big], ref[big], rtol=1e-14)
    # near zero, h(u) = u^2/2 - u^3/3 + ... (where u - log1p(u) cancels)
    np.testing.assert_allclose(_h(np.array([1e-8]))[0], 0.5e-16 - 1e-24 / 3, rtol=1e-15)
    assert _h(np.array([0.0]))[0] == 0.0


def test_kl_divergence_matches_textbook_and_handles_zeros():
    q, pi = np.array([0.2, 0.3, 0.5, 0.0]), np.array([0.25, 0.25, 0.4, 0.1])
    assert kl_divergence(q, pi) == pytest.approx(kl_ref(q, pi), rel=1e-14)
    assert kl_divergence(q, np.array([0.5, 0.5, 0.0, 0.0])) == math.inf
    assert kl_divergence(q, q) == 0.0


def test_kl_divergence_subnormal_entries_of_q():
    """A subnormal q_i against a normal pi_i: pi_i / q_i overflows; KL is finite, as 50-digit arithmetic gives it,
    on both routes (the host's fsum and the profile's batched rows), with no overflow warning."""
    import array_api_compat
    import mpmath
    import torch

    from otspec.profile._quantities_batched import kl_rows

    mpmath.mp.dps = 50
    rng = np.random.default_rng(7)
    for tiny in (2e-309, 5e-324, 1e-310, 3e-300):
        q = rng.random(6)
        q[[1, 4]] = 0.0
        q /= q.sum()
        q[[1, 4]] = tiny  # q sums to 1 within 1e-299
        pi = rng.random(6)
        pi /= pi.sum()
        ref = float(sum(mpmath.mpf(float(a)) * mpmath.log(mpmath.mpf(float(a)) / mpmath.mpf(float(b)))
                        + mpmath.mpf(float(b)) - mpmath.mpf(float(a)) for a, b in zip(q, pi)))
        assert kl_divergence(q, pi) == pytest.approx(ref, rel=1e-14)
        for arr in (np.asarray, torch.as_tensor):
            Q, Pi = arr(np.stack([q, pi])), arr(np.stack([pi, q]))
            got = np.asarray(kl_rows(Q, Pi, array_api_compat.array_namespace(Q)))
            assert got[0] == pytest.approx(ref, rel=1e-12)
            assert got[1] == pytest.approx(kl_divergence(pi, q), rel=1e-12)


def test_mentored_with_subnormal_target_entries():
    """The alpha side's terms (p > q) with a subnormal q: the frontier stays finite and the KL budget is met."""
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([1e-309, 0.6, 0.4 - 1e-309])  # p_1 / q_1 = 5e308 overflows
    for D in (0.0, 0.01, 0.3):
        res = otspec.mentored(p, q, D)
        assert np.all(np.isfinite(res.law)) and math.isfinite(res.acceptance)
        assert res.kl == pytest.approx(D, abs=1e-12)
    assert otspec.mentored(p, q, 0.0).acceptance == pytest.approx(float(np.minimum(p, q).sum()), rel=1e-15)


# --------------------------------------------------------------------------- worked example
def test_worked_example_structure():
    res = otspec.mentored(P3, Q3, 0.05)
    assert res.kl == pytest.approx(0.05, rel=1e-14)
    assert res.alpha < 1 < res.beta
    ratio = Q3 / P3
    # q/pi = alpha below alpha, q/p in between, beta above (the note's summary table)
    qpi = Q3 / res.law
    lo, hi = ratio <= res.alpha, ratio >= res.beta
    np.testing.assert_allclose(qpi[lo], res.alpha, rtol=1e-13)
    np.testing.assert_allclose(qpi[hi], res.beta, rtol=1e-13)
    mid = ~lo & ~hi
    np.testing.assert_allclose(qpi[mid], ratio[mid], rtol=1e-13)
    # 1 - R = sum (p - q/alpha)_+ = sum (q/beta - p)_+ (eqs. 25 and 28)
    one_minus_R = 1 - res.acceptance
    assert np.maximum(P3 - Q3 / res.alpha, 0).sum() == pytest.approx(one_minus_R, rel=1e-12)
    assert np.maximum(Q3 / res.beta - P3, 0).sum() == pytest.approx(one_minus_R, rel=1e-12)
    assert res.kl == pytest.approx(kl_ref(Q3, res.law), rel=1e-13)


def test_result_is_frozen_readonly_and_inputs_untouched():
    p, q = P3.copy(), Q3.copy()
    res = otspec.mentored(p, q, 0.1)
    np.testing.assert_array_equal(p, P3)
    np.testing.assert_array_equal(q, Q3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.acceptance = 1.0
    for a in (res.r, res.s, res.law):
        assert not a.flags.writeable
    assert "MentoredResult" in repr(res)


# --------------------------------------------------------------------------- limits
@given(pairs(1, 6))
def test_D_zero_is_speculative_sampling_exactly(pq):
    p, q = pq
    v = otspec.mentored_verifier(p, q, 0.0)
    mc = otspec.maximal_coupling(p, q)
    assert v.acceptance() == pytest.approx(mc.acceptance(), abs=1e-15)
    for x in np.flatnonzero(p > 0):
        np.testing.assert_array_equal(v.conditional([x]), mc.conditional([x]))
    assert v.result.kl == 0.0 and v.lossless
    np.testing.assert_array_equal(v.output_law(), q)


@given(pairs(1, 6))
def test_D_at_least_kl_accepts_everything(pq):
    p, q = pq
    kl = finite_kl_qp(p, q)
    D = kl * (1 + 1e-12) + 1e-300 if math.isfinite(kl) else 1e6
    res = otspec.mentored(p, q, D)
    if math.isfinite(kl):
        assert res.acceptance == 1.0
        np.testing.assert_allclose(res.law, p, rtol=0, atol=1e-15)
        np.testing.assert_array_equal(res.r[p > 0], 1.0)
        assert otspec.mentored(p, q, 2 * kl + 1).acceptance == 1.0
        # at D = KL(q || p) itself the two KL formulas may differ by rounding
        assert otspec.mentored(p, q, kl).acceptance >= 1 - 1e-12
    elif np.any(q < p):  # target mass where p = 0: R < 1 for every finite budget, but close
        assert res.kl <= D
        assert res.acceptance > 1 - 1e-12
    else:
        # q >= p everywhere yet q has mass where p = 0: possible only through the rounding
        # of the normalisation (q sums to 1 + that mass); no draft is over-proposed, so the
        # threshold rule rejects nothing and pi = p
        np.testing.assert_allclose(q[p == 0], 0.0, atol=1e-15)
        assert res.acceptance == 1.0


def test_limit_D_to_kl():
    kl = finite_kl_qp(P3, Q3)
    gaps = 10.0 ** -np.arange(2, 12)
    fr = otspec.mentored_frontier(P3, Q3, kl * (1 - gaps))
    one_minus_R = 1 - fr.acceptance
    assert np.all(np.diff(one_minus_R) < 0)
    # near R = 1 the frontier has the finite slope 1/(beta - alpha) -> 1/(max ratio - min ratio)
    slope = one_minus_R / (kl * gaps)
    np.testing.assert_allclose(slope[-4:], 1 / (2.5 - 0.4), rtol=1e-3)


def test_limit_D_to_zero():
    R0 = float(np.minimum(P3, Q3).sum())
    Ds = 10.0 ** -np.arange(2, 16, 2.0)
    fr = otspec.mentored_frontier(P3, Q3, Ds)
    gain = fr.acceptance - R0
    assert np.all(gain > 0) and np.all(np.diff(gain) < 0)
    # KL is quadratic in the extra acceptance near D = 0: gain ~ c sqrt(D)
    c = gain / np.sqrt(Ds)
    np.testing.assert_allclose(c[-3:], c[-1], rtol=1e-3)
    np.testing.assert_allclose(fr.kl, Ds, rtol=1e-9)


def test_limits_with_zeros_in_q_alpha_zero_regime():
    kl = finite_kl_qp(P_ZQ, Q_ZQ)
    res = otspec.mentored(P_ZQ, Q_ZQ, 1.0)  # between KL at alpha -> 0+ and KL(q||p)
    assert res.alpha == 0.0
    # every token with q > 0 is accepted, the q = 0 token partly
    np.testing.assert_array_equal(res.r[1:], 1.0)
    assert 0 < res.r[0] < 1
    assert res.kl == pytest.approx(1.0, rel=1e-14)
    assert otspec.mentored(P_ZQ, Q_ZQ, kl).acceptance == 1.0
    assert otspec.mentored(P_ZQ, Q_ZQ, kl * (1 - 1e-9)).acceptance == pytest.approx(1.0, abs=1e-8)


def test_zeros_in_p_make_kl_infinite():
    res = otspec.mentored(P_ZP, Q_ZP, 20.0)
    assert res.kl == pytest.approx(20.0, rel=1e-13)
    # 1 - R is about 1e-43: R rounds to 1, but the law keeps the mass s * t on token 4
    assert res.acceptance > 1 - 1e-15
    assert 0 < res.law[4] < 1e-40  # the token the draft never proposes gets its mass through s
    assert otspec.mentored(P_ZP, Q_ZP, math.inf).acceptance == 1.0


def test_p_equals_q_and_n_one():
    res = otspec.mentored([1.0], [1.0], 0.3)
    assert res.acceptance == 1.0 and res.kl == 0.0
    res = otspec.mentored(P3, P3, 0.0)
    assert res.acceptance == 1.0


# --------------------------------------------------------------------------- properties
@given(pairs(1, 6), st.floats(0.0, 1.0))
def test_kl_tight_and_verifier_exact(pq, frac):
    p, q = pq
    kl = finite_kl_qp(p, q)
    D = frac * (kl if math.isfinite(kl) else 5.0)
    res = otspec.mentored(p, q, D)
    if not np.any(q < p):
        # nothing is over-proposed (see test_D_at_least_kl_accepts_everything): R = 1, pi = p
        assert res.acceptance == 1.0
        return
    # the KL constraint is tight below KL(q || p), and never violated beyond rounding
    if D < kl and res.acceptance < 1 - 4e-16:
        # (when the optimal rejection mass underflows, R rounds to 1 and KL stays below D)
        assert res.kl == pytest.approx(D, rel=1e-9, abs=1e-15)
    assert res.kl <= D * (1 + 1e-9) + 1e-15
    # r, s are probabilities, s is a law, s > 0 only where r = 1
    assert np.all((res.r >= 0) & (res.r <= 1))
    assert np.all(res.s >= 0) and math.isclose(res.s.sum(), 1.0, abs_tol=1e-12)
    # (up to rounding: when p and q differ only by rounding, the guarded residual of
    # speculative sampling falls back to q, which may put ~1e-300 where r_i < 1)
    assert np.all(res.r[res.s > 1e-12] >= 1 - 1e-12)
    # the verifier is exactly what the result says (enumeration of the draft)
    chk = check_lossless(res.verifier)
    assert chk.max_law_error <= 1e-12
    assert chk.acceptance_error <= 1e-12
    assert chk.max_row_error <= 1e-12
    assert res.kl == pytest.approx(kl_ref(q, res.law), rel=1e-9, abs=1e-15) or res.kl == math.inf


@given(pairs(2, 6), st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6), st.integers(0, 2**32 - 1))
def test_optimal_against_random_feasible_rules(pq, rs, seed):
    """Any (r, s) with KL(q || pi) = d accepts at most the mentored optimum at budget d."""
    p, q = pq
    n = p.shape[0]
    r = np.array(rs[:n])
    s = np.random.default_rng(seed).dirichlet(np.ones(n))
    R = float(np.dot(p, r))
    pi = p * r + s * (1 - R)
    d = kl_ref(q, pi)
    if not math.isfinite(d):
        return
    assert otspec.mentored(p, q, d).acceptance >= R - 1e-12


@given(pairs(2, 6))
def test_frontier_monotone_concave(pq):
    p, q = pq
    kl = finite_kl_qp(p, q)
    top = kl if math.isfinite(kl) else 5.0
    Ds = np.linspace(0, 1.2 * top, 25)
    fr = otspec.mentored_frontier(p, q, Ds)
    assert np.all(np.diff(fr.acceptance) >= -1e-13)
    assert np.all(np.diff(fr.acceptance, 2) <= 1e-9)  # concave (equally spaced budgets)
    assert fr.acceptance[0] == pytest.approx(fr.acceptance0, abs=1e-15)
    assert np.all(fr.alpha <= 1 + 1e-12) and np.all(fr.beta >= 1 - 1e-12)


@given(pairs(2, 6), st.floats(0.01, 0.99))
def test_bisection_agrees_with_exact(pq, frac):
    p, q = pq
    kl = finite_kl_qp(p, q)
    D = frac * (kl if math.isfinite(kl) else 5.0)
    if D == 0 or not np.any(q < p):
        return  # (no token is over-proposed: see test_D_at_least_kl_accepts_everything)
    tol = 1e-6
    try:
        rb = otspec.mentored(p, q, D, method="bisection", tol=tol)
    except RuntimeError as exc:
        # the note's parametrisation by alpha fixes 1 - R = sum (p_i - q_i/alpha)_+ only to
        # about eps / (1 - R) relatively (the ratios q_i/p_i are rounded), so KL(alpha) cannot
        # meet a 1e-6 tolerance once the optimal rejection mass is below ~1e-9
        assert "one ulp" in str(exc)
        assert otspec.mentored(p, q, D).acceptance > 1 - 1e-8
        return
    assert rb.method == "bisection"
    assert rb.kl <= D * (1 + tol) * (1 + 1e-9)
    # below (1 - tol) D only when the optimal rejection mass underflows: then R = 1 up to the
    # floor on the rejection mass that keeps pi > 0 where p = 0 (<= 2**10 * 5e-324 / min q there)
    assert rb.kl >= D * (1 - tol) * (1 - 1e-9) or rb.acceptance >= 1 - 1e-15
    lo = otspec.mentored(p, q, D * (1 - tol)).acceptance
    hi = otspec.mentored(p, q, D * (1 + tol)).acceptance
    assert lo - 1e-12 <= rb.acceptance <= hi + 1e-12


def test_bisection_deviation_from_seed_does_not_stall():
    # the note's update (alpha_max <- new alpha) stalls when KL is too small then too large;
    # the corrected bisection converges in a few dozen steps
    res = otspec.mentored(P3, Q3, 0.1, method="bisection", tol=1e-10)
    assert res.kl == pytest.approx(0.1, rel=1e-10)
    assert res.iterations < 60
    with pytest.raises(RuntimeError, match="max_iter"):
        otspec.mentored(P3, Q3, 0.1, method="bisection", tol=1e-12, max_iter=3)


# --------------------------------------------------------------------------- independent conic solver
def cvxpy_acceptance(p, q, D):
    """max sum(a) s.t. 0 <= a <= p, b >= 0, sum(a + b) = 1, KL(q || a + b) <= D (mentored decoding, convex form)."""
    cp = pytest.importorskip("cvxpy")
    n = p.shape[0]
    a, b = cp.Variable(n), cp.Variable(n)
    m = q > 0
    neg_entropy = float(np.sum(q[m] * np.log(q[m])))
    cons = [a >= 0, a <= p, b >= 0, cp.sum(a) + cp.sum(b) == 1]
    cons.append(neg_entropy - q[m] @ cp.log((a + b)[m]) <= D)
    prob = cp.Problem(cp.Maximize(cp.sum(a)), cons)
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-9, tol_gap_rel=1e-9, tol_feas=1e-9)
    assert prob.status == "optimal", prob.status
    return float(prob.value)


@settings(max_examples=12)
@given(
    st.integers(2, 4).flatmap(lambda n: st.tuples(distributions(n, tiny=False), distributions(n, tiny=False))),
    st.floats(0.05, 0.95),
)
def test_matches_cvxpy_exponential_cone(pq, frac):
    p, q = pq
    kl = finite_kl_qp(p, q)
    D = frac * (kl if math.isfinite(kl) else 3.0)
    if D < 1e-6:
        return
    R = otspec.mentored(p, q, D).acceptance
    assert cvxpy_acceptance(p, q, D) == pytest.approx(R, abs=1e-6)


@pytest.mark.parametrize("pq,D", [((P_ZQ, Q_ZQ), 0.05), ((P_ZQ, Q_ZQ), 0.8), ((P_ZP, Q_ZP), 1.5), ((P3, Q3), 0.2)])
def test_matches_cvxpy_on_zero_cases(pq, D):
    p, q = pq
    assert cvxpy_acceptance(p, q, D) == pytest.approx(otspec.mentored(p, q, D).acceptance, abs=1e-6)


# --------------------------------------------------------------------------- sampler
# 4 chi-square tests in this file at alpha_fail = 1e-4: spurious failure <= 4e-4 (fixed seeds anyway)
@pytest.mark.parametrize("pq,D,seed", [((P3, Q3), 0.05, 1), ((P_ZQ, Q_ZQ), 0.8, 2), ((P_ZP, Q_ZP), 1.0, 3)])
def test_sampler_matches_output_law(pq, D, seed):
    p, q = pq
    v = otspec.mentored_verifier(p, q, D)
    rng = np.random.default_rng(seed)
    N = 40_000
    xs = rng.choice(p.shape[0], size=N, p=p)
    ys = np.array([v.sample([x], rng=rng) for x in xs])
    res = chi2_gof(np.bincount(ys, minlength=p.shape[0]), v.output_law(), alpha_fail=1e-4)
    assert res.passed, res
    # acceptance frequency against R (binomial, 5 standard deviations)
    acc = np.mean(xs == ys)
    sd = math.sqrt(v.acceptance() * (1 - v.acceptance()) / N)
    assert abs(acc - v.acceptance()) <= 5 * sd + 1e-12


def test_sampler_joint_law_against_kernel():
    v = otspec.mentored_verifier(P3, Q3, 0.05)
    rng = np.random.default_rng(7)
    N = 30_000
    xs = rng.choice(3, size=N, p=P3)
    ys = np.array([v.sample([x], rng=rng) for x in xs])
    joint = np.array([P3[x] * v.conditional([x]) for x in range(3)]).ravel()
    counts = np.bincount(xs * 3 + ys, minlength=9)
    assert chi2_gof(counts, joint, alpha_fail=1e-4).passed


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("D", [-1e-9, -1.0, float("nan")])
def test_negative_D(D):
    with pytest.raises(ValueError, match="`D`"):
        otspec.mentored(P3, Q3, D)


@pytest.mark.parametrize("D", ["0.1", None, True, [0.1]])
def test_D_type(D):
    with pytest.raises(TypeError, match="`D`"):
        otspec.mentored(P3, Q3, D)


def test_bad_method_tol_max_iter():
    with pytest.raises(ValueError, match="`method`"):
        otspec.mentored(P3, Q3, 0.1, method="newton")
    with pytest.raises(ValueError, match="`tol`"):
        otspec.mentored(P3, Q3, 0.1, tol=0.0)
    with pytest.raises(ValueError, match="`max_iter`"):
        otspec.mentored(P3, Q3, 0.1, max_iter=0)


def test_bad_pairs_and_frontier_budgets():
    with pytest.raises(ValueError, match="`q`"):
        otspec.mentored(P3, [0.5, 0.5, 0.5], 0.1)
    with pytest.raises(ValueError, match="same length"):
        otspec.mentored(P3, [0.5, 0.5], 0.1)
    with pytest.raises(ValueError, match="`Ds`"):
        otspec.mentored_frontier(P3, Q3, [0.1, -0.1])
    with pytest.raises(ValueError, match="`Ds`"):
        otspec.mentored_frontier(P3, Q3, [])
    with pytest.raises(TypeError, match="`result`"):
        otspec.MentoredVerifier("not a result")
    with pytest.raises(ValueError, match="`drafts`"):
        otspec.mentored_verifier(P3, Q3, 0.1).conditional([3])
