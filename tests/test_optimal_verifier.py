"""Tests of the exactly optimal k-draft verifier (mixture of priority orders + speculative step).

Every check compares against an independent route: exact enumeration of
the draft tuples (check_lossless), the closed form alpha_k, the OTM LP in
HiGHS (otm_lp), brute force over all subsets for membership in B(g), and a
chi-square test of the sampler against the exact conditional law.
"""

import importlib
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import otspec
from otspec.multidraft import _submodular as sm
from otspec.testing import chi2_gof
from otspec.testing.strategies import pairs
from tests.experiment import load_experiment


def _mixture(p, q, k, **kw):
    """The mixture-of-priority-orders construction (this file tests its structure)."""
    kw.setdefault("method", "direct")
    return otspec.optimal_verifier(p, q, k, **kw)

TOL = 1e-9
# four chi-square tests below; a false failure rate of 1e-4 each keeps the
# suite's spurious-failure chance under 1e-3 (union bound)
ALPHA_FAIL = 1e-4


def _g(p, A, k):
    return 1.0 - (1.0 - float(np.sum(p[list(A)]))) ** k


def _brute_force_violation(p, z, k):
    """max over all subsets A of z(A) - g(A), and |z(Omega) - 1| (independent of the prefix scan)."""
    n = p.shape[0]
    worst = abs(float(z.sum()) - 1.0)
    for r in range(1, n + 1):
        for A in itertools.combinations(range(n), r):
            worst = max(worst, float(z[list(A)].sum()) - _g(p, A, k))
    return worst


def _prefix_violation(p, z, k):
    """Prefix test: z in B(g) iff z(Omega) = 1 and z(first j) <= g(first j) along z/p descending."""
    supp = p > 0
    if np.any(z[~supp] > 0):
        return float(np.max(z[~supp]))
    ps, zs = p[supp], z[supp]
    order = np.argsort(-(zs / ps), kind="stable")
    P = np.cumsum(ps[order])
    Z = np.cumsum(zs[order])
    return float(max(np.max(Z - (1.0 - (1.0 - np.minimum(P, 1.0)) ** k)), abs(Z[-1] - 1.0)))


def _check_exact(v, p, q, k):
    chk = otspec.check_lossless(v)
    alpha = float(otspec.alpha_k(p, q, k))
    assert chk.max_marginal_error <= TOL
    assert chk.max_row_error <= TOL
    assert chk.acceptance_error <= TOL
    assert abs(chk.acceptance - alpha) <= TOL
    assert abs(v.acceptance() - alpha) <= TOL
    assert v.status == "optimal", v
    assert v.gap <= TOL
    return chk


def _check_structure(v, p, k):
    n = p.shape[0]
    m = v.n_orders
    assert v.orders.shape == (m, n)
    assert np.all(np.sort(v.orders, axis=1) == np.arange(n)[None, :])
    assert np.all(v.weights > 0)
    np.testing.assert_allclose(v.weights.sum(), 1.0, rtol=0, atol=1e-12)
    # z is the mixture of the greedy vertices of the orders (recomputed here by prefix powers)
    z = np.zeros(n)
    for w, o in zip(v.weights, v.orders):
        G = 1.0 - (1.0 - np.minimum(np.cumsum(p[o]), 1.0)) ** k
        z[o] += w * np.diff(np.concatenate([[0.0], G]))
    np.testing.assert_allclose(v.z, z, rtol=0, atol=1e-12)
    assert _prefix_violation(p, v.z, k) <= 1e-12


@settings(max_examples=60)
@given(pq=pairs(1, 4), k=st.integers(1, 4), method=st.sampled_from(["direct", "colgen"]))
def test_exact_on_small_inputs(pq, k, method):
    p, q = pq
    v = _mixture(p, q, k, method=method)
    _check_exact(v, p, q, k)
    _check_structure(v, p, k)
    assert _brute_force_violation(p, v.z, k) <= 1e-12


@settings(max_examples=40)
@given(pq=pairs(2, 4), k=st.integers(1, 3))
def test_agrees_with_otm_lp(pq, k):
    p, q = pq
    v = _mixture(p, q, k)
    lp = otspec.otm_lp(p, q, k, raise_on_failure=True)
    assert abs(v.acceptance() - lp.alpha) <= TOL


@pytest.mark.parametrize(
    "p, q, k",
    [
        ([1.0], [1.0], 3),  # n = 1
        ([1.0, 0.0, 0.0], [0.0, 0.0, 1.0], 2),  # point masses, disjoint
        ([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5], 3),  # disjoint supports
        ([0.2, 0.3, 0.5], [0.2, 0.3, 0.5], 2),  # p == q
        ([0.25, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25], 3),  # uniform, all ratios tied
        ([0.25, 0.25, 0.5], [0.5, 0.25, 0.25], 2),  # tied ratios in the cut
        ([0.0, 0.5, 0.5], [0.6, 0.2, 0.2], 2),  # q mass where p = 0
        ([1e-300, 0.5, 0.5 - 1e-300], [0.5, 0.25, 0.25], 3),  # tiny probabilities
        ([1e-12, 1 - 1e-12], [0.5, 0.5], 4),
        ([0.7, 0.2, 0.1], [0.0, 0.0, 1.0], 5),
        ([0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], 1),  # k = 1: speculative sampling
    ],
)
@pytest.mark.parametrize("method", ["direct", "colgen"])
def test_edge_cases(p, q, k, method):
    p, q = np.array(p), np.array(q)
    v = _mixture(p, q, k, method=method)
    _check_exact(v, p, q, k)
    _check_structure(v, p, k)


def test_k1_is_speculative_sampling():
    p, q = np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.4, 0.3, 0.2, 0.1])
    v = _mixture(p, q, 1)
    mc = otspec.maximal_coupling(p, q)
    np.testing.assert_allclose(v.z, p, rtol=0, atol=1e-15)
    for x in range(4):
        np.testing.assert_allclose(v.conditional([x]), mc.conditional([x]), rtol=0, atol=1e-15)


def _llm_pair(n, seed, sigma=3.0, noise=1.0):
    rng = np.random.default_rng(seed)
    lq = rng.normal(0.0, sigma, n)
    lp = lq + rng.normal(0.0, noise, n)
    q = np.exp(lq - lq.max())
    p = np.exp(lp - lp.max())
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize("n, k, seed", [(30, 4, 0), (200, 8, 1), (120, 16, 2), (150, 2, 3)])
def test_llm_like_pairs_reach_alpha(n, k, seed):
    p, q = _llm_pair(n, seed)
    v = _mixture(p, q, k)
    alpha = float(otspec.alpha_k(p, q, k))
    assert v.status == "optimal"
    assert abs(v.acceptance() - alpha) <= TOL
    _check_structure(v, p, k)
    # optimality certificate: z(H) = g(H), z <= q on H, z >= q on the min cut
    cut = otspec.min_cut(p, q, k)
    in0 = np.zeros(n, dtype=bool)
    in0[cut.omega0] = True
    assert np.all(v.z[~in0] <= q[~in0] + 1e-12)
    assert np.all(v.z[in0] >= q[in0] - 1e-12)


def test_direct_and_colgen_agree():
    p, q = _llm_pair(40, 7)
    a = _mixture(p, q, 3)
    b = _mixture(p, q, 3, method="colgen")
    assert a.method == "direct" and b.method == "colgen"
    assert abs(a.acceptance() - b.acceptance()) <= TOL


def test_budget_exhaustion_is_reported_not_hidden():
    p, q = _llm_pair(60, 3)
    v = _mixture(p, q, 4, method="colgen", max_iter=1)
    # the verifier is still lossless, but says it is not optimal
    assert v.status != "optimal"
    assert v.gap > v.tol
    np.testing.assert_allclose(v.acceptance(), v.alpha - v.gap, rtol=0, atol=1e-15)
    assert not v.success


def test_suboptimal_mixture_exact_acceptance():
    # a non-optimal mixture: the residual can land on a draft after a rejection,
    # and acceptance() must count it exactly (checked by enumeration)
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.5, 0.3])
    v = _mixture(p, q, 2, method="colgen", max_iter=1)
    chk = otspec.check_lossless(v)
    assert chk.max_marginal_error <= TOL
    assert chk.acceptance_error <= TOL


def test_conditional_is_mixture_of_orders():
    p, q = _llm_pair(6, 11)
    v = _mixture(p, q, 2)
    for x in itertools.product(range(6), repeat=2):
        law = v.selection_law(x)
        expect = np.zeros(6)
        for w, o in zip(v.weights, v.orders):
            first = next(t for t in o if t in x)
            expect[first] += w
        np.testing.assert_allclose(law, expect, rtol=0, atol=1e-15)
        c = v.conditional(x)
        assert c.min() >= 0
        np.testing.assert_allclose(c.sum(), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("drafts", [(0, 0, 0), (0, 1, 2), (3, 1, 1)])
def test_sampler_chi2(drafts):
    p, q = np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.1, 0.2, 0.3, 0.4])
    v = _mixture(p, q, 3)
    gen = np.random.default_rng(12345)
    N = 20_000
    counts = np.bincount([v.sample(drafts, rng=gen) for _ in range(N)], minlength=4)
    res = chi2_gof(counts, v.conditional(drafts), alpha_fail=ALPHA_FAIL)
    assert res.passed, res


def test_sampler_chi2_llm_like_rejection_path():
    # all drafts on the token most often rejected: the output comes from the
    # residual (drawn by inverse CDF) with real probability
    p, q = _llm_pair(200, 8)
    v = _mixture(p, q, 4)
    t = int(np.argmax(np.maximum(v.z - q, 0.0) / np.maximum(v.z, 1e-300)))
    drafts = [t, t, t, t]
    law = v.conditional(drafts)
    assert law[t] < 0.9  # the residual path carries real mass here
    gen = np.random.default_rng(2024)
    N = 20_000
    counts = np.bincount([v.sample(drafts, rng=gen) for _ in range(N)], minlength=200)
    res = chi2_gof(counts, law, alpha_fail=ALPHA_FAIL)
    assert res.passed, res


def test_sample_is_reproducible_and_fast_path():
    p, q = _llm_pair(50, 5)
    v = _mixture(p, q, 4)
    a = [v.sample([1, 2, 3, 4], rng=7) for _ in range(3)]
    b = [v.sample([1, 2, 3, 4], rng=7) for _ in range(3)]
    assert a == b
    assert all(0 <= t < 50 for t in a)


def test_inputs_not_mutated():
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([0.2, 0.3, 0.5])
    p0, q0 = p.copy(), q.copy()
    v = _mixture(p, q, 2)
    np.testing.assert_array_equal(p, p0)
    np.testing.assert_array_equal(q, q0)
    assert not np.shares_memory(v.p, p)
    with pytest.raises(ValueError):
        v.z[0] = 1.0
    with pytest.raises(ValueError):
        v.orders[0, 0] = 1


def test_normalize():
    v = _mixture([5, 3, 2], [2, 3, 5], 2, normalize=True)
    assert abs(v.acceptance() - float(otspec.alpha_k([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 2))) <= TOL


def test_repr_and_properties():
    v = _mixture([0.5, 0.5], [0.9, 0.1], 2)
    assert "OptimalVerifier" in repr(v) and "optimal" in repr(v)
    assert v.lossless
    assert v.residual.shape == (2,)
    assert v.n_orders == v.weights.shape[0]


def test_errors():
    p, q = [0.5, 0.5], [0.25, 0.75]
    with pytest.raises(ValueError, match="`method`"):
        _mixture(p, q, 2, method="lp")
    with pytest.raises(TypeError, match="`tol`"):
        _mixture(p, q, 2, tol="small")
    with pytest.raises(ValueError, match="`tol`"):
        _mixture(p, q, 2, tol=-1.0)
    with pytest.raises(ValueError, match="`tol`"):
        _mixture(p, q, 2, tol=float("nan"))
    with pytest.raises(TypeError, match="`max_iter`"):
        _mixture(p, q, 2, max_iter=2.0)
    with pytest.raises(ValueError, match="`max_iter`"):
        _mixture(p, q, 2, max_iter=0)
    with pytest.raises(ValueError, match="`k`"):
        _mixture(p, q, 0)
    with pytest.raises(TypeError, match="`k`"):
        _mixture(p, q, 2.0)
    with pytest.raises(ValueError, match="`p`"):
        _mixture([0.5, 0.6], q, 2)
    with pytest.raises(ValueError, match="`q`"):
        _mixture(p, [-0.5, 1.5], 2)
    with pytest.raises(ValueError, match="same length"):
        _mixture(p, [1.0], 2)
    v = _mixture(p, q, 2)
    with pytest.raises(ValueError, match="`drafts`"):
        v.conditional([0])
    with pytest.raises(ValueError, match="`drafts`"):
        v.sample([0, 5])
    with pytest.raises(TypeError, match="`rng`"):
        v.sample([0, 1], rng="seed")


def test_submodular_helpers_against_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = 5
        p = rng.dirichlet(np.ones(n))
        k = int(rng.integers(1, 6))
        order = rng.permutation(n)
        v = sm.order_vertex(p, order, k)
        G = [_g(p, order[: j + 1], k) for j in range(n)]
        np.testing.assert_allclose(v[order], np.diff(np.concatenate([[0.0], G])), rtol=1e-12, atol=1e-15)
        w = rng.dirichlet(np.ones(n))
        brute = max(max(float(w[list(A)].sum()) - _g(p, A, k) for r in range(1, n + 1)
                        for A in itertools.combinations(range(n), r)), 0.0)
        got = sm.max_violation(p, w, 0.0, k)
        assert got >= brute - 1e-12
        assert got <= max(brute, abs(float(w.sum()) - 1.0)) + 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("n, k", [(1000, 8), (2000, 4)])
def test_large_llm_like(n, k):
    p, q = _llm_pair(n, 0)
    v = _mixture(p, q, k)
    assert v.status == "optimal"
    assert abs(v.acceptance() - float(otspec.alpha_k(p, q, k))) <= TOL
    assert _prefix_violation(p, v.z, k) <= 1e-12


@settings(max_examples=60)
@given(pq=pairs(1, 8), k=st.integers(1, 9))
def test_linear_time_passes_match_generic_greedy(pq, k):
    # the O(n) passes against the one-sort-per-token greedy (reference=True)
    p, q = pq
    supp = p > 0
    ps, qs = p[supp], q[supp]
    cut = otspec.min_cut(p, q, k)
    in0 = np.zeros(p.shape[0], dtype=bool)
    in0[cut.omega0] = True
    in0 = in0[supp]
    fast = sm.optimal_selection_law(ps, qs, k, in0)[0]
    ref = sm.optimal_selection_law(ps, qs, k, in0, reference=True)[0]
    np.testing.assert_allclose(fast, ref, rtol=0, atol=1e-12)
    # both are optimal: sum min(z, q) over the support equals alpha_k
    assert abs(float(np.minimum(fast, qs).sum()) - cut.alpha) <= 1e-12
    assert sm.max_violation(ps, fast, 0.0, k) <= 1e-12


@pytest.mark.parametrize("seed", range(4))
def test_linear_time_passes_on_llm_like(seed):
    p, q = _llm_pair(300, seed)
    for k in (2, 8, 16):
        cut = otspec.min_cut(p, q, k)
        in0 = np.zeros(300, dtype=bool)
        in0[cut.omega0] = True
        fast = sm.optimal_selection_law(p, q, k, in0)[0]
        ref = sm.optimal_selection_law(p, q, k, in0, reference=True)[0]
        np.testing.assert_allclose(fast, ref, rtol=0, atol=1e-13)


def test_direct_budget_exhaustion_falls_back_and_reports():
    # one Carathéodory step is not enough here: the direct mixture misses
    # alpha_k, column generation (warm-started with its orders) takes over,
    # and whichever is returned states its method, status and gap honestly
    p, q = _llm_pair(8, 4)
    full = _mixture(p, q, 3)
    assert full.n_iter > 1
    v = _mixture(p, q, 3, max_iter=1)
    assert v.method in ("direct", "direct+colgen")
    chk = otspec.check_lossless(v)
    assert chk.max_marginal_error <= TOL
    assert chk.acceptance_error <= TOL
    np.testing.assert_allclose(v.gap, v.alpha - chk.acceptance, rtol=0, atol=TOL)
    assert (v.status == "optimal") == (v.gap <= v.tol)
    # max_iter = 1 also caps the fallback's pricing rounds: not optimal, and it says so
    assert v.status != "optimal" and v.gap > 1e-9


@pytest.mark.parametrize("k", [2, 3, 8, 16, 40])
def test_increments_against_exact_rationals(k):
    # c^k - (c - x)^k in float64 (both the multiply-add and the log1p/expm1 forms)
    # against exact rational arithmetic, including x = c and x within 1e-12 of c
    from fractions import Fraction

    rng = np.random.default_rng(k)
    n = 600
    c = rng.random(n)
    x = c * rng.random(n) ** rng.choice([1, 5, 20], n)
    x[:10] = c[:10]
    x[10:20] = c[10:20] * (1 - 1e-12)
    got = sm.increments(x, c, k)
    for i in list(range(25)) + rng.choice(n, 40, replace=False).tolist():
        ref = Fraction(c[i]) ** k - (Fraction(c[i]) - Fraction(x[i])) ** k
        assert abs(got[i] - float(ref)) <= 4e-15 * float(ref) + 1e-300


def test_reported_fields_are_read_only():
    v = _mixture([0.5, 0.5], [0.9, 0.1], 2)
    for name in ("alpha", "gap", "status", "method", "n_iter", "tol", "orders", "weights", "z"):
        with pytest.raises(AttributeError):
            setattr(v, name, None)


def test_exact_acceptance_chunking_and_budget_bound(monkeypatch):
    # the pair sum evaluated in tiny chunks equals the one-shot sum, and skipping
    # it under the alpha_k bound (long real-vocabulary tails) stays within tol
    mod = importlib.import_module("otspec.multidraft._optimal_verifier")
    rng = np.random.default_rng(11)
    p, q = rng.dirichlet(np.full(40, 0.3)), rng.dirichlet(np.full(40, 0.3))
    ref = _mixture(p, q, 2)
    monkeypatch.setattr(mod, "_CHUNK", 1)
    chunked = _mixture(p, q, 2)
    np.testing.assert_allclose(chunked.acceptance(), ref.acceptance(), rtol=0, atol=1e-15)
    monkeypatch.setattr(mod, "_PAIR_BUDGET", -1)
    bounded = _mixture(p, q, 2)
    assert abs(bounded.acceptance() - ref.acceptance()) <= bounded.tol
    assert bounded.status == "optimal"


# -- issue 12 / 15: many drafts at alpha_k = 1, ties, no recursion, the chain of blocks ----------


def _fill_low_loop(pO, qO, k):
    """The one-record-at-a-time loop the vectorised pass replaced (reference)."""
    m = pO.shape[0]
    c = sm.suffix_masses(pO, 0.0)
    S = np.empty(m + 1)
    S[0] = 0.0
    np.cumsum(sm.increments(pO, c[:-1], k) - qO, out=S[1:])
    run = np.minimum.accumulate(S[::-1])[::-1]
    z = np.array(qO, dtype=np.float64)
    j = 0
    while j < m:
        tail = S[j + 1 :]
        t = j + 1 + int(np.flatnonzero(tail == run[j + 1])[-1])
        z[j] += max(run[j + 1] - S[j], 0.0)
        j = t
    return z


@given(pq=pairs(1, 12), k=st.integers(1, 8))
def test_vectorised_fill_low_equals_loop(pq, k):
    p, q = pq
    supp = p > 0
    if not supp.any():
        return
    ps, qs = p[supp], q[supp]
    o = np.argsort(-(qs / ps), kind="stable")
    # q scaled into the polymatroid (as on Omega_0) and as given: identical, bit for bit
    for scale in (1.0, 0.3):
        np.testing.assert_array_equal(sm._fill_low(ps[o], scale * qs[o], k), _fill_low_loop(ps[o], scale * qs[o], k))


def _uniform_vs_dirichlet(n, seed=0):
    rng = np.random.default_rng(seed)
    return np.full(n, 1.0 / n), rng.dirichlet(np.full(n, 5.0))


@pytest.mark.parametrize("n, k", [(300, 64), (600, 96)])
def test_many_drafts_at_alpha_one_is_exact_without_fallback(n, k):
    # SpecTr App. B.1's uniform draft (all ratios tied) against a Dirichlet(5)
    # target: alpha_k = 1, z = q is forced and must be decomposed exactly
    p, q = _uniform_vs_dirichlet(n)
    v = _mixture(p, q, k)
    assert v.alpha == 1.0
    assert v.method == "direct" and v.status == "optimal"
    assert abs(v.acceptance() - 1.0) <= 1e-12
    np.testing.assert_allclose(v.z, q, rtol=0, atol=1e-15)


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["uniform", "dirichlet"])
def test_issue_15_reproducer_many_drafts(draft):
    # n = 2000, k = 64 took 127 s (a 1.87e-12 gap against a 1.83e-12 tolerance sent
    # it to column generation); the uniform draft did not finish in five minutes
    p, q = _uniform_vs_dirichlet(2000)
    if draft == "dirichlet":
        p = np.random.default_rng(1).dirichlet(np.full(2000, 5.0))
    v = _mixture(p, q, 64)
    assert v.method == "direct" and v.status == "optimal"
    assert abs(v.acceptance() - float(otspec.alpha_k(p, q, 64))) <= 1e-12


def test_ties_in_p_and_q_are_exact():
    # tie groups in p and in q (uniform draft, q with repeated values) at k up to 32
    rng = np.random.default_rng(5)
    for n, k in [(7, 2), (40, 8), (120, 32)]:
        p = np.full(n, 1.0 / n)
        q = rng.choice([1.0, 2.0, 3.0], size=n)
        q /= q.sum()
        v = _mixture(p, q, k)
        assert v.status == "optimal" and v.method == "direct", v
        assert abs(v.acceptance() - float(otspec.alpha_k(p, q, k))) <= 1e-12
        if n ** k <= 2_000_000:
            _check_exact(v, p, q, k)


def test_construction_uses_no_recursion():
    # a deep decomposition (hundreds of Carathéodory steps) under a tiny recursion limit
    import sys

    p, q = _uniform_vs_dirichlet(200)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(120)
    try:
        v = _mixture(p, q, 32)
        w, orders = v.weights, v.orders
    finally:
        sys.setrecursionlimit(limit)
    assert v.n_iter > 100 and v.status == "optimal"
    assert sys.getrecursionlimit() == limit
    assert orders.shape == (w.shape[0], 200)


@given(pq=pairs(2, 6), k=st.integers(2, 4))
def test_chain_of_blocks_equals_materialised_mixture(pq, k):
    # the sampler and conditional read the chain of blocks; the materialised global
    # mixture (every block at one shared quantile) must give the same selection law
    p, q = pq
    v = _mixture(p, q, k)
    supp = np.flatnonzero(p > 0)
    for x in itertools.product(supp.tolist(), repeat=k):
        S = sorted(set(x))
        law = np.zeros(v.n)
        for w, o in zip(v.weights, v.orders):
            rank = np.empty(v.n, dtype=np.int64)
            rank[o] = np.arange(v.n)
            law[min(S, key=rank.__getitem__)] += w
        np.testing.assert_allclose(v.selection_law(x), law, rtol=0, atol=1e-15)
    assert v.n_orders == v.weights.shape[0]
    assert v.n_blocks >= 1 and v.n_blocks <= v.n


def test_chain_keeps_singletons_out_of_the_matrix():
    # an LLM-like pair at n = 4096: the tight chain holds most tokens as fixed
    # singletons, so the blocks store far fewer than n_orders x n entries
    rng = np.random.default_rng(2)
    logits = rng.normal(0.0, 3.0, 4096)
    q = np.exp(logits - logits.max())
    q /= q.sum()
    p = np.exp(logits + rng.normal(0.0, 1.0, 4096) - logits.max())
    p /= p.sum()
    v = _mixture(p, q, 2)
    stored = sum(blk.orders.size for blk in v._blocks)
    assert v.status == "optimal"
    assert stored < 0.5 * v.n_orders * v.n


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 4, 8, 16])
def test_real_pairs_full_vocabulary_exact(k):
    # the cached SmolLM2 next-token laws (experiments/real_pair_dists.py), full vocabulary
    pytest.importorskip("torch")
    rpd = load_experiment("real_pair_dists")
    try:
        pairs_ = rpd.load_real_pairs(2)
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"real pair unavailable: {exc}")
    for p, q in pairs_:
        v = _mixture(p, q, k)
        assert v.status == "optimal" and v.method == "direct"
        assert abs(v.acceptance() - float(otspec.alpha_k(p, q, k))) <= 1e-9
        assert _prefix_violation(p, v.z, k) <= 1e-12
